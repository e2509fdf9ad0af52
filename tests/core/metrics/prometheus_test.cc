#include "core/metrics/prometheus.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/run_dtrain.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;

TEST(PrometheusTest, GaugesAndCountersCarryTheCommonLabelsFirst) {
  MetricsRegistry registry(MetricLabels{{"rank", "1"}, {"node", "0"}, {"job", "demo"}});
  registry.SetGauge("dtrain_loss", "loss, nats", 2.5);
  registry.SetGauge("dtrain_loss", "loss, nats", 2.25);  // a gauge keeps the last value
  registry.AddCounter("dtrain_sent_bytes_total", "bytes sent", 100, {{"group", "dp"}});
  registry.AddCounter("dtrain_sent_bytes_total", "bytes sent", 28, {{"group", "dp"}});
  registry.AddCounter("dtrain_sent_bytes_total", "bytes sent", 0, {{"group", "tp"}});
  EXPECT_EQ(registry.Render(),
            "# HELP dtrain_loss loss, nats\n"
            "# TYPE dtrain_loss gauge\n"
            "dtrain_loss{rank=\"1\",node=\"0\",job=\"demo\"} 2.25\n"
            "# HELP dtrain_sent_bytes_total bytes sent\n"
            "# TYPE dtrain_sent_bytes_total counter\n"
            "dtrain_sent_bytes_total{rank=\"1\",node=\"0\",job=\"demo\",group=\"dp\"} 128\n"
            "dtrain_sent_bytes_total{rank=\"1\",node=\"0\",job=\"demo\",group=\"tp\"} 0\n");
}

TEST(PrometheusTest, EscapesLabelValuesAndHelp) {
  MetricsRegistry registry(MetricLabels{{"job", "a\"b\\c\nd"}});
  registry.SetGauge("dtrain_step", "steps \\ done\nso far", 3);
  const std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("# HELP dtrain_step steps \\\\ done\\nso far\n"));
  EXPECT_THAT(text, HasSubstr("dtrain_step{job=\"a\\\"b\\\\c\\nd\"} 3\n"));
}

TEST(PrometheusTest, SpecialValuesUseGoSpelling) {
  MetricsRegistry registry(MetricLabels{});
  registry.SetGauge("a", "", 0.1);
  registry.SetGauge("b", "", std::numeric_limits<double>::infinity());
  registry.SetGauge("c", "", std::nan(""));
  const std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("\na 0.1\n"));
  EXPECT_THAT(text, HasSubstr("\nb +Inf\n"));
  EXPECT_THAT(text, HasSubstr("\nc NaN\n"));
}

TEST(PrometheusTest, HistogramBucketsAreCumulativeWithInfSumAndCount) {
  MetricsRegistry registry(MetricLabels{{"rank", "0"}});
  for (const double value : {0.05, 0.5, 0.5, 7.0}) {
    registry.Observe("dtrain_step_seconds", "step time", {0.1, 1}, value);
  }
  EXPECT_EQ(registry.Render(),
            "# HELP dtrain_step_seconds step time\n"
            "# TYPE dtrain_step_seconds histogram\n"
            "dtrain_step_seconds_bucket{rank=\"0\",le=\"0.1\"} 1\n"
            "dtrain_step_seconds_bucket{rank=\"0\",le=\"1\"} 3\n"
            "dtrain_step_seconds_bucket{rank=\"0\",le=\"+Inf\"} 4\n"
            "dtrain_step_seconds_sum{rank=\"0\"} 8.05\n"
            "dtrain_step_seconds_count{rank=\"0\"} 4\n");
}

// A value on a bucket's bound counts in that bucket (le is "less than or equal").
TEST(PrometheusTest, ValueOnABoundCountsInItsBucket) {
  MetricsRegistry registry(MetricLabels{});
  registry.Observe("h", "", {1, 2}, 1);
  EXPECT_THAT(registry.Render(), HasSubstr("h_bucket{le=\"1\"} 1\n"));
}

// Prometheus's own parser and lint rules: promtool check metrics reads the exposition from stdin
// and exits non-zero on a parse error or a convention it rejects.
TEST(PrometheusTest, PromtoolAcceptsTheExposition) {
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "promtool is not installed (apt-get install prometheus)";
  }
  MetricsRegistry registry(
      MetricLabels{{"rank", "0"}, {"node", "0"}, {"job", "quote\" and \\ slash"}});
  registry.SetGauge("dtrain_step", "training steps done", 7);
  registry.SetGauge("dtrain_tokens_per_second", "tokens per second", 1234.5);
  registry.AddCounter("dtrain_sent_bytes_total", "bytes sent", 4096, {{"group", "dp"}});
  registry.Observe("dtrain_step_seconds", "wall time of a step", SecondsBuckets(), 0.2);
  const std::string path = testing::WriteTempFile("exposition.txt", registry.Render());
  const std::string output_path = testing::TempPath("promtool.txt");
  const int status = std::system(
      absl::StrCat("promtool check metrics < ", path, " > ", output_path, " 2>&1").c_str());
  std::ifstream output(output_path);
  const std::string said(std::istreambuf_iterator<char>(output), {});
  EXPECT_EQ(status, 0) << said << "\n" << registry.Render();
  EXPECT_EQ(said, "");
}

}  // namespace
}  // namespace dtrain
