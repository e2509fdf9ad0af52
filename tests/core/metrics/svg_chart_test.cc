// The report's SVG charts: one point per step, scaled into the plot frame, markers where the
// steps are, stacked layers that add up.
#include "core/metrics/svg_chart.h"

#include <cmath>
#include <limits>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;

struct Point {
  double x, y;
};

// The points="..." of the first element in `svg` whose opening tag starts with `tag_start`.
std::vector<Point> PointsOf(const std::string& svg, const std::string& tag_start) {
  const size_t tag = svg.find(tag_start);
  EXPECT_NE(tag, std::string::npos) << tag_start;
  if (tag == std::string::npos) return {};
  const size_t begin = svg.find("points=\"", tag) + 8;
  const std::string points = svg.substr(begin, svg.find('"', begin) - begin);
  std::vector<Point> parsed;
  for (const absl::string_view pair : absl::StrSplit(points, ' ', absl::SkipEmpty())) {
    const std::pair<std::string, std::string> xy = absl::StrSplit(pair, ',');
    Point p{};
    EXPECT_TRUE(absl::SimpleAtod(xy.first, &p.x) && absl::SimpleAtod(xy.second, &p.y)) << pair;
    parsed.push_back(p);
  }
  return parsed;
}

ChartSeries Series(std::string name, std::vector<double> y) {
  ChartSeries series{.name = std::move(name), .color = "#000"};
  for (size_t i = 0; i < y.size(); ++i) series.x.push_back(static_cast<double>(i + 1));
  series.y = std::move(y);
  return series;
}

// Points print with two decimals.
constexpr double kPrinted = 0.006;

TEST(SvgChartTest, APolylineHasOnePointPerStepInsideTheFrame) {
  std::vector<double> loss;
  for (int i = 0; i < 50; ++i) loss.push_back(5.0 / (1 + 0.1 * i) + 0.3 * std::sin(i));
  const std::string svg = ChartSvg(
      {.id = "loss", .title = "Loss", .y_label = "nats", .series = {Series("train", loss)}});
  EXPECT_THAT(svg, HasSubstr("id=\"chart-loss\""));
  EXPECT_THAT(svg, HasSubstr("viewBox=\"0 0 900 280\""));
  const std::vector<Point> points =
      PointsOf(svg, "<polyline class=\"series\" data-series=\"train\"");
  ASSERT_EQ(points.size(), loss.size());
  EXPECT_NEAR(points.front().x, kPlotFrame.left, kPrinted);  // step 1 at the left edge
  EXPECT_NEAR(points.back().x, kPlotFrame.right, kPrinted);  // step 50 at the right
  for (size_t i = 0; i < points.size(); ++i) {
    EXPECT_GE(points[i].y, kPlotFrame.top - kPrinted) << i;
    EXPECT_LE(points[i].y, kPlotFrame.bottom + kPrinted) << i;
    if (i > 0) {
      EXPECT_GT(points[i].x, points[i - 1].x);
      // Larger values are drawn higher (smaller y).
      EXPECT_EQ(loss[i] > loss[i - 1], points[i].y < points[i - 1].y) << i;
    }
  }
}

TEST(SvgChartTest, ValuesOnTicksScaleExactlyIntoTheFrame) {
  // 0..10 makes a y axis of exactly 0..10 (ticks every 2): 0 at the bottom, 10 at the top.
  const std::string svg = ChartSvg({.id = "c", .series = {Series("s", {0, 5, 10})}});
  const std::vector<Point> points = PointsOf(svg, "<polyline");
  ASSERT_EQ(points.size(), 3u);
  const double middle_x = (kPlotFrame.left + kPlotFrame.right) / 2;
  const double middle_y = (kPlotFrame.top + kPlotFrame.bottom) / 2;
  EXPECT_NEAR(points[0].x, kPlotFrame.left, kPrinted);
  EXPECT_NEAR(points[0].y, kPlotFrame.bottom, kPrinted);
  EXPECT_NEAR(points[1].x, middle_x, kPrinted);
  EXPECT_NEAR(points[1].y, middle_y, kPrinted);
  EXPECT_NEAR(points[2].x, kPlotFrame.right, kPrinted);
  EXPECT_NEAR(points[2].y, kPlotFrame.top, kPrinted);
  for (const char* tick : {">0<", ">2<", ">4<", ">6<", ">8<", ">10<"}) {
    EXPECT_THAT(svg, HasSubstr(tick));
  }
}

// Past 1,600 points a line keeps each of 800 spans' lowest and highest point, in step order:
// its extremes stay where they were.
TEST(SvgChartTest, ALongLineKeepsItsExtremesInBoundedPoints) {
  std::vector<double> values;
  for (int i = 0; i < 100000; ++i) values.push_back(i == 54321 ? 10 : std::sin(i * 0.001));
  const std::string svg = ChartSvg({.id = "c", .series = {Series("s", values)}});
  const std::vector<Point> points = PointsOf(svg, "<polyline");
  EXPECT_LE(points.size(), 1600u);
  EXPECT_GE(points.size(), 800u);
  double top = kPlotFrame.bottom;
  for (size_t i = 1; i < points.size(); ++i) {
    EXPECT_GE(points[i].x, points[i - 1].x) << i;
    top = std::min(top, points[i].y);
  }
  EXPECT_NEAR(top, kPlotFrame.top, kPrinted) << "the spike at 54321, the axis' top, is drawn";
}

// A stacked chart of many steps averages each layer over a span: the layers still add up.
TEST(SvgChartTest, ALongStackedChartAveragesItsLayers) {
  std::vector<double> compute, wait;
  for (int i = 0; i < 50000; ++i) {
    compute.push_back(i % 2 == 0 ? 6 : 8);  // averages 7
    wait.push_back(i % 2 == 0 ? 4 : 2);     // averages 3: totals of 10
  }
  Chart chart{
      .id = "t", .series = {Series("compute", compute), Series("wait", wait)}, .stacked = true};
  const std::vector<Point> top =
      PointsOf(ChartSvg(chart), "<polygon class=\"layer\" data-series=\"wait\"");
  ASSERT_LE(top.size(), 2 * 1600u);
  for (size_t k = 0; k < top.size() / 2; ++k) EXPECT_NEAR(top[k].y, kPlotFrame.top, kPrinted) << k;
}

// Checkpoints closer than 12 units to the one drawn before are left out, and the legend says
// how many are drawn; restarts are all drawn.
TEST(SvgChartTest, FrequentCheckpointsAreThinnedAndCounted) {
  std::vector<double> values(10000, 1.0);
  Chart chart{.id = "c", .series = {Series("s", values)}};
  for (int step = 10; step <= 10000; step += 10) {
    chart.markers.push_back(
        {ChartMarker::Kind::kCheckpoint, static_cast<double>(step), absl::StrCat("ckpt ", step)});
  }
  chart.markers.push_back({ChartMarker::Kind::kRestart, 5000, "restart: resumed from 5000"});
  chart.markers.push_back({ChartMarker::Kind::kRestart, 5010, "restart: resumed from 5010"});
  const std::string svg = ChartSvg(chart);
  size_t drawn = 0;
  for (size_t at = svg.find("class=\"marker checkpoint\""); at != std::string::npos;
       at = svg.find("class=\"marker checkpoint\"", at + 1)) {
    ++drawn;
  }
  EXPECT_GE(drawn, 60u);
  EXPECT_LE(drawn, 68u);  // 804 units / 12
  EXPECT_THAT(svg, HasSubstr(absl::StrCat(">checkpoint (", drawn, " of 1000 drawn)</text>")));
  EXPECT_THAT(svg, HasSubstr(">restart: resumed from 5000</text>"));
  EXPECT_THAT(svg, HasSubstr(">restart: resumed from 5010</text>"));
}

TEST(SvgChartTest, NotFiniteValuesAreLeftOut) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::string svg = ChartSvg({.id = "c", .series = {Series("s", {3, 2, nan, 1})}});
  EXPECT_EQ(PointsOf(svg, "<polyline").size(), 3u);
  EXPECT_THAT(svg, ::testing::Not(HasSubstr("nan")));
}

TEST(SvgChartTest, MarkersAreLabelledLinesAtTheirStep) {
  Chart chart{.id = "c", .series = {Series("s", {1, 2, 3, 4, 5})}};
  chart.markers = {{ChartMarker::Kind::kCheckpoint, 3, "ckpt 3"},
                   {ChartMarker::Kind::kRestart, 5, "restart: resumed from 5"}};
  const std::string svg = ChartSvg(chart);
  const std::regex checkpoint(
      "<g class=\"marker checkpoint\"><title>ckpt 3</title><line x1=\"([0-9.]+)\"[^>]*>"
      "<text[^>]*>ckpt 3</text></g>");
  std::smatch match;
  ASSERT_TRUE(std::regex_search(svg, match, checkpoint)) << svg;
  // Step 3 of 1..5 is the middle of the frame.
  EXPECT_NEAR(std::stod(match[1]), (kPlotFrame.left + kPlotFrame.right) / 2, kPrinted);
  EXPECT_THAT(svg, HasSubstr("<g class=\"marker restart\">"));
  EXPECT_THAT(svg, HasSubstr(">restart: resumed from 5</text>"));
  // The legend names the marker kinds shown.
  EXPECT_THAT(svg, HasSubstr(">checkpoint</text>"));
  EXPECT_THAT(svg, HasSubstr(">restart or resume</text>"));
}

TEST(SvgChartTest, StackedLayersAddUp) {
  // Totals 10 at every step: the top layer's upper edge is the frame's top (axis 0..10).
  Chart chart{.id = "t",
              .series = {Series("compute", {8, 6, 4}), Series("wait", {2, 4, 6})},
              .stacked = true};
  const std::string svg = ChartSvg(chart);
  const std::vector<Point> compute =
      PointsOf(svg, "<polygon class=\"layer\" data-series=\"compute\"");
  const std::vector<Point> wait = PointsOf(svg, "<polygon class=\"layer\" data-series=\"wait\"");
  ASSERT_EQ(compute.size(), 6u);  // upper edge forwards, lower edge back
  ASSERT_EQ(wait.size(), 6u);
  const double per_unit = (kPlotFrame.bottom - kPlotFrame.top) / 10;
  for (int k = 0; k < 3; ++k) {
    EXPECT_NEAR(wait[k].y, kPlotFrame.top, kPrinted) << k;
    // The wait layer sits on the compute layer: its lower edge is compute's upper edge.
    EXPECT_NEAR(wait[5 - k].y, compute[k].y, kPrinted) << k;
    EXPECT_NEAR(compute[5 - k].y, kPlotFrame.bottom, kPrinted) << k;
  }
  EXPECT_NEAR(compute[0].y, kPlotFrame.bottom - 8 * per_unit, kPrinted);
}

TEST(SvgChartTest, NiceAxesEndOnTicks) {
  const NiceAxis a = MakeNiceAxis(0.3, 9.1, 5);
  EXPECT_EQ(a.lo, 0);
  EXPECT_EQ(a.hi, 10);
  EXPECT_EQ(a.step, 2);
  // A span of 0.56 over 5 ticks: 0.112 a tick rounds up to 0.2.
  const NiceAxis b = MakeNiceAxis(2.31, 2.87, 5);
  EXPECT_NEAR(b.lo, 2.2, 1e-12);
  EXPECT_NEAR(b.hi, 3.0, 1e-12);
  EXPECT_NEAR(b.step, 0.2, 1e-12);
  const NiceAxis flat = MakeNiceAxis(3, 3, 5);  // a span of zero still has an axis
  EXPECT_LT(flat.lo, 3);
  EXPECT_GT(flat.hi, 3);
}

TEST(SvgChartTest, TextIsEscaped) {
  EXPECT_EQ(EscapeMarkup("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&#39;");
  const std::string svg =
      ChartSvg({.id = "c", .y_label = "x<y", .series = {Series("<script>", {1, 2})}});
  EXPECT_THAT(svg, ::testing::Not(HasSubstr("<script>")));
  EXPECT_THAT(svg, HasSubstr("&lt;script&gt;"));
  EXPECT_THAT(svg, HasSubstr("x&lt;y"));
}

}  // namespace
}  // namespace dtrain
