// Charts over the training step as inline SVG, for the run report (core/metrics/run_report.h):
// line charts and stacked areas with axes, tick labels, a legend, and labelled vertical markers
// (checkpoint saves, restarts). Each chart is one self-contained <svg> element: no script, no
// style, font or image from anywhere else, so the page renders offline.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dtrain {

// One line: the value y[i] at step x[i] (x ascending; x and y of one size). Points whose value
// is not finite (a diverged run's NaN loss) are left out.
struct ChartSeries {
  std::string name;   // the legend's text
  std::string color;  // a CSS colour, e.g. "#1f77b4"
  std::vector<double> x, y;
  bool dots = false;  // a circle on every point too: a sparse series (validation loss)
};

// A vertical line across the plot at step `x`, labelled along it.
struct ChartMarker {
  enum class Kind { kCheckpoint, kRestart };
  Kind kind = Kind::kCheckpoint;
  double x = 0;
  std::string label;  // e.g. "ckpt 200", "resumed from 200"
};

struct Chart {
  std::string id;       // the <svg>'s id is "chart-<id>"
  std::string title;    // the <svg>'s aria-label
  std::string y_label;  // with its unit: "tokens/s", "ms"
  std::vector<ChartSeries> series;
  std::vector<ChartMarker> markers;
  // The series are the layers of one total (a step's time by part), drawn as filled areas each
  // on top of the ones before it; the y axis starts at 0. All layers share the x of the first.
  bool stacked = false;
};

// The chart's drawing: a viewBox of kChartWidth x kChartHeight, the plot inside kPlotFrame. The
// x axis spans the series' and markers' steps exactly; the y axis spans the values, widened to
// the nearest tick. Each series is a <polyline class="series"> (stacked: <polygon class="layer">)
// with data-series="<name>" and one point per finite value, up to 1,600 of them (past that, each
// of 800 equal spans of steps keeps its lowest and highest point; a stacked chart its layers'
// averages); each marker a <g class="marker checkpoint|restart"> holding its line and its <text>
// label, except checkpoints closer than 12 units to the one drawn before (the legend then says
// how many are drawn).
std::string ChartSvg(const Chart& chart);

inline constexpr double kChartWidth = 900;
inline constexpr double kChartHeight = 280;
struct PlotFrame {
  double left, top, right, bottom;  // in viewBox units; y grows downwards
};
inline constexpr PlotFrame kPlotFrame = {72, 34, kChartWidth - 24, kChartHeight - 40};

// An axis from `lo` to `hi` with ticks every `step`: 1, 2 or 5 times a power of ten, at most
// about `max_ticks` of them, lo and hi multiples of step. A span of zero widens to one step
// either side.
struct NiceAxis {
  double lo = 0, hi = 1, step = 1;
};
NiceAxis MakeNiceAxis(double lo, double hi, int max_ticks);

// `text` with &, <, >, " and ' as character references: safe inside HTML or SVG text and
// attribute values.
std::string EscapeMarkup(std::string_view text);

}  // namespace dtrain
