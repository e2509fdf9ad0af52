#include "core/metrics/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dtrain {
namespace {

constexpr const char* kCheckpointColor = "#2ca02c";
constexpr const char* kRestartColor = "#d62728";

double NiceStep(double raw) {
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  const double fraction = raw / power;
  const double nice = fraction <= 1 ? 1 : fraction <= 2 ? 2 : fraction <= 5 ? 5 : 10;
  return nice * power;
}

// A tick's text: four significant digits, with k, M or G for large values (tokens/s reach
// millions on a cluster).
std::string TickLabel(double value) {
  if (std::abs(value) < 1e-12) return "0";
  const double magnitude = std::abs(value);
  if (magnitude >= 1e9) return absl::StrFormat("%.4gG", value / 1e9);
  if (magnitude >= 1e6) return absl::StrFormat("%.4gM", value / 1e6);
  if (magnitude >= 1e4) return absl::StrFormat("%.4gk", value / 1e3);
  return absl::StrFormat("%.4g", value);
}

// Maps steps and values into the plot frame.
struct Scale {
  double x_lo, x_hi;
  NiceAxis y;

  double X(double x) const {
    return kPlotFrame.left + (x - x_lo) / (x_hi - x_lo) * (kPlotFrame.right - kPlotFrame.left);
  }
  double Y(double value) const {
    return kPlotFrame.bottom -
           (value - y.lo) / (y.hi - y.lo) * (kPlotFrame.bottom - kPlotFrame.top);
  }
};

std::string Point(const Scale& scale, double x, double y) {
  return absl::StrFormat("%.2f,%.2f", scale.X(x), scale.Y(y));
}

// Drawn points are bounded: the plot is about 800 units wide, so more than two points a unit show
// nothing more, and a run of a million steps made a page of 177 MB. Past 2 * kColumns points a
// line keeps, in each of kColumns equal spans of steps, its lowest and highest point (in step
// order), so its extremes stay; a stacked chart averages each layer over a span (the averages
// still add up).
constexpr size_t kColumns = 800;

size_t ColumnOf(const Scale& scale, double x) {
  const double at = (x - scale.x_lo) / (scale.x_hi - scale.x_lo) * kColumns;
  return std::min(kColumns - 1, static_cast<size_t>(std::max(0.0, at)));
}

// The indices of `series`' points to draw: every finite one, or the extremes of each column.
std::vector<size_t> DrawnPoints(const ChartSeries& series, const Scale& scale) {
  std::vector<size_t> finite;
  for (size_t k = 0; k < series.x.size(); ++k) {
    if (std::isfinite(series.y[k])) finite.push_back(k);
  }
  if (finite.size() <= 2 * kColumns) return finite;
  std::vector<size_t> drawn;
  size_t low = finite.front(), high = low;
  const auto flush = [&] {
    drawn.push_back(std::min(low, high));
    if (high != low) drawn.push_back(std::max(low, high));
  };
  for (size_t i = 1; i < finite.size(); ++i) {
    const size_t k = finite[i];
    if (ColumnOf(scale, series.x[k]) != ColumnOf(scale, series.x[low])) {
      flush();
      low = high = k;
    } else if (series.y[k] < series.y[low]) {
      low = k;
    } else if (series.y[k] > series.y[high]) {
      high = k;
    }
  }
  flush();
  return drawn;
}

// The running sums of the layers: totals[i][k] is layers 0..i at point k.
std::vector<std::vector<double>> StackedTotals(const std::vector<ChartSeries>& layers) {
  std::vector<std::vector<double>> totals;
  for (const ChartSeries& layer : layers) {
    std::vector<double> sum =
        totals.empty() ? std::vector<double>(layer.y.size(), 0.0) : totals.back();
    for (size_t k = 0; k < sum.size() && k < layer.y.size(); ++k) {
      if (std::isfinite(layer.y[k])) sum[k] += layer.y[k];
    }
    totals.push_back(std::move(sum));
  }
  return totals;
}

Scale MakeScale(const Chart& chart, const std::vector<std::vector<double>>& totals) {
  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo;
  double y_lo = x_lo, y_hi = -x_lo;
  for (const ChartSeries& series : chart.series) {
    for (size_t k = 0; k < series.x.size(); ++k) {
      if (!std::isfinite(series.y[k])) continue;
      x_lo = std::min(x_lo, series.x[k]);
      x_hi = std::max(x_hi, series.x[k]);
      y_lo = std::min(y_lo, series.y[k]);
      y_hi = std::max(y_hi, series.y[k]);
    }
  }
  for (const ChartMarker& marker : chart.markers) {
    x_lo = std::min(x_lo, marker.x);
    x_hi = std::max(x_hi, marker.x);
  }
  if (chart.stacked) {
    y_lo = 0;
    y_hi = 0;
    for (const double total : totals.empty() ? std::vector<double>{} : totals.back()) {
      y_hi = std::max(y_hi, total);
    }
  }
  if (!std::isfinite(x_lo)) x_lo = x_hi = 0;  // nothing to draw: an empty frame
  if (!std::isfinite(y_lo)) y_lo = y_hi = 0;
  if (x_hi <= x_lo) x_lo -= 1, x_hi += 1;
  // A stacked chart of zeros still gets an axis from 0 up.
  if (chart.stacked) y_hi = std::max(y_hi, 1e-3);
  return {x_lo, x_hi, MakeNiceAxis(y_lo, y_hi, 5)};
}

void AppendAxes(const Chart& chart, const Scale& scale, std::string& svg) {
  const PlotFrame& f = kPlotFrame;
  absl::StrAppend(&svg, "<g class=\"axes\" font-size=\"11\" fill=\"#444\">\n");
  const NiceAxis& y = scale.y;
  // Ticks as lo + i * step: adding step up would gather rounding errors into the labels.
  const int y_ticks = static_cast<int>(std::lround((y.hi - y.lo) / y.step));
  for (int i = 0; i <= y_ticks; ++i) {
    const double tick = y.lo + i * y.step;
    const double py = scale.Y(tick);
    absl::StrAppendFormat(
        &svg,
        "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#e5e5e5\"/>"
        "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"end\">%s</text>\n",
        f.left, py, f.right, py, f.left - 6, py + 4, TickLabel(tick));
  }
  NiceAxis x = MakeNiceAxis(scale.x_lo, scale.x_hi, 8);
  x.step = std::max(x.step, 1.0);  // steps are whole numbers
  const double first_x_tick = std::ceil(scale.x_lo / x.step) * x.step;
  for (int i = 0; first_x_tick + i * x.step <= scale.x_hi; ++i) {
    const double tick = first_x_tick + i * x.step;
    const double px = scale.X(tick);
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#888\"/>"
                          "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\">%s</text>\n",
                          px, f.bottom, px, f.bottom + 5, px, f.bottom + 18, TickLabel(tick));
  }
  absl::StrAppendFormat(&svg,
                        "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"none\" "
                        "stroke=\"#888\"/>\n"
                        "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\">step</text>\n"
                        "<text x=\"14\" y=\"%.2f\" text-anchor=\"middle\" "
                        "transform=\"rotate(-90 14 %.2f)\">%s</text>\n</g>\n",
                        f.left, f.top, f.right - f.left, f.bottom - f.top, (f.left + f.right) / 2,
                        f.bottom + 34, (f.top + f.bottom) / 2, (f.top + f.bottom) / 2,
                        EscapeMarkup(chart.y_label));
}

void AppendLines(const Chart& chart, const Scale& scale, std::string& svg) {
  for (const ChartSeries& series : chart.series) {
    std::string points;
    std::string dots;
    size_t count = 0;
    for (const size_t k : DrawnPoints(series, scale)) {
      absl::StrAppend(&points, count++ == 0 ? "" : " ", Point(scale, series.x[k], series.y[k]));
      absl::StrAppendFormat(&dots, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"3\"/>",
                            scale.X(series.x[k]), scale.Y(series.y[k]));
    }
    const std::string name = EscapeMarkup(series.name);
    absl::StrAppendFormat(&svg,
                          "<polyline class=\"series\" data-series=\"%s\" fill=\"none\" "
                          "stroke=\"%s\" stroke-width=\"1.5\" points=\"%s\"/>\n",
                          name, series.color, points);
    // A lone point draws no line: its dot shows it.
    if (series.dots || count == 1) {
      absl::StrAppendFormat(&svg, "<g class=\"dots\" data-series=\"%s\" fill=\"%s\">%s</g>\n", name,
                            series.color, dots);
    }
  }
}

// The layers' steps and totals averaged over each column that holds any, when there are more
// than 2 * kColumns of them.
void AverageColumns(const Scale& scale, std::vector<double>& x,
                    std::vector<std::vector<double>>& totals) {
  if (x.size() <= 2 * kColumns) return;
  std::vector<double> column_x;
  std::vector<std::vector<double>> column_totals(totals.size());
  for (size_t begin = 0, end; begin < x.size(); begin = end) {
    const size_t column = ColumnOf(scale, x[begin]);
    for (end = begin + 1; end < x.size() && ColumnOf(scale, x[end]) == column; ++end) {
    }
    const auto mean = [&](const std::vector<double>& values) {
      double sum = 0;
      for (size_t k = begin; k < end; ++k) sum += values[k];
      return sum / static_cast<double>(end - begin);
    };
    column_x.push_back(mean(x));
    for (size_t i = 0; i < totals.size(); ++i) column_totals[i].push_back(mean(totals[i]));
  }
  x = std::move(column_x);
  totals = std::move(column_totals);
}

void AppendLayers(const Chart& chart, const Scale& scale, std::vector<std::vector<double>> totals,
                  std::string& svg) {
  if (chart.series.empty()) return;
  std::vector<double> x = chart.series.front().x;
  AverageColumns(scale, x, totals);
  for (size_t i = 0; i < chart.series.size(); ++i) {
    std::string points;
    for (size_t k = 0; k < x.size(); ++k) {
      absl::StrAppend(&points, k == 0 ? "" : " ", Point(scale, x[k], totals[i][k]));
    }
    for (size_t k = x.size(); k-- > 0;) {
      absl::StrAppend(&points, " ", Point(scale, x[k], i == 0 ? 0.0 : totals[i - 1][k]));
    }
    absl::StrAppendFormat(&svg,
                          "<polygon class=\"layer\" data-series=\"%s\" fill=\"%s\" "
                          "fill-opacity=\"0.85\" stroke=\"none\" points=\"%s\"/>\n",
                          EscapeMarkup(chart.series[i].name), chart.series[i].color, points);
  }
}

// Checkpoint markers closer than this to the last one drawn are left out: their labels would
// overlap, and a checkpoint every few steps of a long run drew tens of thousands. Restarts are
// all drawn.
constexpr double kCheckpointSpacing = 12;

// The markers to draw, in their order.
std::vector<const ChartMarker*> DrawnMarkers(const Chart& chart, const Scale& scale) {
  std::vector<const ChartMarker*> drawn;
  double last_checkpoint = -std::numeric_limits<double>::infinity();
  for (const ChartMarker& marker : chart.markers) {
    if (marker.kind == ChartMarker::Kind::kCheckpoint) {
      if (scale.X(marker.x) - last_checkpoint < kCheckpointSpacing) continue;
      last_checkpoint = scale.X(marker.x);
    }
    drawn.push_back(&marker);
  }
  return drawn;
}

void AppendMarkers(const std::vector<const ChartMarker*>& markers, const Scale& scale,
                   std::string& svg) {
  const PlotFrame& f = kPlotFrame;
  for (const ChartMarker* drawn : markers) {
    const ChartMarker& marker = *drawn;
    const bool checkpoint = marker.kind == ChartMarker::Kind::kCheckpoint;
    const char* color = checkpoint ? kCheckpointColor : kRestartColor;
    const double px = scale.X(marker.x);
    // The label reads upwards along the line, so that the markers of frequent saves stay
    // legible: a checkpoint's left of its line, a restart's right of it (a run resumes at a
    // checkpoint's step, so the two often share a line).
    const double label_x = checkpoint ? px - 3 : px + 11;
    const double label_y = f.top + 6;
    const std::string label = EscapeMarkup(marker.label);
    absl::StrAppendFormat(&svg,
                          "<g class=\"marker %s\"><title>%s</title>"
                          "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"%s\" "
                          "stroke-dasharray=\"%s\"/>"
                          "<text x=\"%.2f\" y=\"%.2f\" font-size=\"10\" fill=\"%s\" "
                          "text-anchor=\"end\" transform=\"rotate(-90 %.2f %.2f)\">%s</text></g>\n",
                          checkpoint ? "checkpoint" : "restart", label, px, f.top, px, f.bottom,
                          color, checkpoint ? "4 3" : "none", label_x, label_y, color, label_x,
                          label_y, label);
  }
}

// One row above the plot: a swatch and the name of every series, then the marker kinds shown
// (with how many of the checkpoints, when not all).
void AppendLegend(const Chart& chart, const std::vector<const ChartMarker*>& drawn,
                  std::string& svg) {
  std::vector<std::pair<std::string, std::string>> entries;  // name, colour
  for (const ChartSeries& series : chart.series) entries.emplace_back(series.name, series.color);
  size_t checkpoints = 0, checkpoints_drawn = 0;
  bool restarts = false;
  for (const ChartMarker& marker : chart.markers) {
    checkpoints += marker.kind == ChartMarker::Kind::kCheckpoint;
    restarts |= marker.kind == ChartMarker::Kind::kRestart;
  }
  for (const ChartMarker* marker : drawn) {
    checkpoints_drawn += marker->kind == ChartMarker::Kind::kCheckpoint;
  }
  if (checkpoints > 0) {
    entries.emplace_back(
        checkpoints_drawn == checkpoints
            ? std::string("checkpoint")
            : absl::StrCat("checkpoint (", checkpoints_drawn, " of ", checkpoints, " drawn)"),
        kCheckpointColor);
  }
  if (restarts) entries.emplace_back("restart or resume", kRestartColor);
  absl::StrAppend(&svg, "<g class=\"legend\" font-size=\"12\">\n");
  double x = kPlotFrame.left;
  for (const auto& [name, color] : entries) {
    absl::StrAppendFormat(&svg,
                          "<rect x=\"%.2f\" y=\"10\" width=\"12\" height=\"12\" fill=\"%s\"/>"
                          "<text x=\"%.2f\" y=\"20\">%s</text>\n",
                          x, color, x + 16, EscapeMarkup(name));
    x += 16 + 7.0 * name.size() + 18;  // about 7 units a character at this font size
  }
  absl::StrAppend(&svg, "</g>\n");
}

}  // namespace

NiceAxis MakeNiceAxis(double lo, double hi, int max_ticks) {
  if (hi <= lo) {
    const double step = NiceStep(std::abs(lo) > 0 ? std::abs(lo) / max_ticks : 1.0);
    return {lo - step, lo + step, step};
  }
  const double step = NiceStep((hi - lo) / max_ticks);
  // The slack keeps a value a rounding error past a tick (0.30000000000000004) on it.
  return {std::floor(lo / step + 1e-9) * step, std::ceil(hi / step - 1e-9) * step, step};
}

std::string ChartSvg(const Chart& chart) {
  const std::vector<std::vector<double>> totals =
      chart.stacked ? StackedTotals(chart.series) : std::vector<std::vector<double>>{};
  const Scale scale = MakeScale(chart, totals);
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" id=\"chart-%s\" "
      "viewBox=\"0 0 %.0f %.0f\" role=\"img\" aria-label=\"%s\" "
      "font-family=\"sans-serif\">\n",
      EscapeMarkup(chart.id), kChartWidth, kChartHeight, EscapeMarkup(chart.title));
  AppendAxes(chart, scale, svg);
  if (chart.stacked) {
    AppendLayers(chart, scale, totals, svg);
  } else {
    AppendLines(chart, scale, svg);
  }
  const std::vector<const ChartMarker*> markers = DrawnMarkers(chart, scale);
  AppendMarkers(markers, scale, svg);
  AppendLegend(chart, markers, svg);
  absl::StrAppend(&svg, "</svg>\n");
  return svg;
}

std::string EscapeMarkup(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace dtrain
