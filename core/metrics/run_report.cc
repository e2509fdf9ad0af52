#include "core/metrics/run_report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/metrics/svg_chart.h"
#include "core/model/model_config.h"
#include "core/util/files.h"
#include "core/util/log.h"
#include "core/util/status.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;

constexpr const char* kStyle =
    "body{font-family:sans-serif;max-width:960px;margin:24px auto;padding:0 12px;color:#222}"
    "h1{font-size:22px}h2{font-size:17px;margin:28px 0 4px}"
    "table.summary{border-collapse:collapse}table.summary th{text-align:left;padding:2px 16px 2px "
    "0;color:#555;font-weight:normal}table.summary td{padding:2px 0}"
    "p.note{background:#fff4e0;border-left:4px solid #f0a030;padding:6px 10px;margin:6px 0}"
    "p.caption{color:#555;font-size:13px;margin:2px 0}svg.chart{width:100%;height:auto}";

// The "compute" layer of the time chart: the step's time less the waits measured inside it
// (never below 0: the parts are timed separately and can overlap a little).
double ComputeMs(const StepMetrics& m) {
  return std::max(0.0, m.step_ms - m.data_wait_ms - m.exposed_comm_ms - m.pp_wait_ms);
}

std::vector<ChartMarker> Markers(const std::vector<StepMetrics>& steps) {
  std::vector<ChartMarker> markers;
  for (const StepMetrics& m : steps) {
    if (m.resumed_from_step || m.restart) {
      const int64_t from = m.resumed_from_step.value_or(0);
      markers.push_back({ChartMarker::Kind::kRestart, static_cast<double>(from),
                         absl::StrCat(m.restart ? "restart: " : "", "resumed from ",
                                      from == 0 ? "the start" : absl::StrCat(from))});
    }
    if (m.ckpt_blocked_ms) {
      markers.push_back({ChartMarker::Kind::kCheckpoint, static_cast<double>(m.step),
                         absl::StrCat("ckpt ", m.step)});
    }
  }
  return markers;
}

// A series of one field over every step.
template <typename Field>
ChartSeries SeriesOf(const std::vector<StepMetrics>& steps, std::string name, std::string color,
                     Field field) {
  ChartSeries series{.name = std::move(name), .color = std::move(color)};
  for (const StepMetrics& m : steps) {
    series.x.push_back(m.step);
    series.y.push_back(field(m));
  }
  return series;
}

// A chart and the sentence under its heading that says what it shows.
struct ReportChart {
  Chart chart;
  const char* caption;
};

std::vector<ReportChart> Charts(const std::vector<StepMetrics>& steps) {
  const std::vector<ChartMarker> markers = Markers(steps);
  Chart loss{.id = "loss", .title = "Loss", .y_label = "loss (nats/token)", .markers = markers};
  loss.series.push_back(
      SeriesOf(steps, "train loss", "#1f77b4", [](const StepMetrics& m) { return m.loss; }));
  ChartSeries val{.name = "validation loss", .color = "#ff7f0e", .dots = true};
  for (const StepMetrics& m : steps) {
    if (!m.val_loss) continue;
    val.x.push_back(m.step);
    val.y.push_back(*m.val_loss);
  }
  if (!val.x.empty()) loss.series.push_back(std::move(val));

  Chart tokens{.id = "tokens", .title = "Throughput", .y_label = "tokens/s", .markers = markers};
  tokens.series.push_back(
      SeriesOf(steps, "tokens/s", "#9467bd", [](const StepMetrics& m) { return m.tokens_per_s; }));
  Chart mfu{.id = "mfu", .title = "MFU", .y_label = "MFU (%)", .markers = markers};
  mfu.series.push_back(
      SeriesOf(steps, "MFU", "#8c564b", [](const StepMetrics& m) { return m.mfu_percent; }));

  Chart time{
      .id = "time", .title = "Time per step", .y_label = "ms", .markers = markers, .stacked = true};
  time.series = {
      SeriesOf(steps, "compute", "#1f77b4", ComputeMs),
      SeriesOf(steps, "data wait", "#ff7f0e", [](const StepMetrics& m) { return m.data_wait_ms; }),
      SeriesOf(steps, "exposed comm", "#9467bd",
               [](const StepMetrics& m) { return m.exposed_comm_ms; }),
      SeriesOf(steps, "pp wait", "#e377c2", [](const StepMetrics& m) { return m.pp_wait_ms; }),
      SeriesOf(steps, "checkpoint wait", "#17becf",
               [](const StepMetrics& m) { return m.ckpt_blocked_ms.value_or(0.0); }),
  };
  return {
      {loss, "Mean token cross-entropy of each step's batch; dots: validation loss."},
      {tokens, "Tokens trained per second in each step, all ranks together."},
      {mfu,
       "Model FLOP/s over the peak the run's log states: the best GEMM its backend measured "
       "at the start of each process, or a step that outran it (metrics' peak_gflops)."},
      {time,
       "Each step's time by part: compute (the rest of the step), waits for data, for exposed "
       "communication and for pipeline neighbours, and the time a checkpoint save blocked "
       "training."},
  };
}

// "42.0 s", "12.5 min (750.0 s)", "72.9 h (262522.5 s)".
std::string Duration(double seconds) {
  if (seconds < 60) return absl::StrFormat("%.1f s", seconds);
  if (seconds < 3600) return absl::StrFormat("%.1f min (%.1f s)", seconds / 60, seconds);
  return absl::StrFormat("%.1f h (%.1f s)", seconds / 3600, seconds);
}

// "3, 6, 9": up to 12 steps, and past that the first and last five around "…" (a checkpoint
// every few steps of a long run made a row of tens of thousands).
template <typename Step>
std::string StepList(const std::vector<Step>& steps) {
  if (steps.size() <= 12) return absl::StrJoin(steps, ", ");
  return absl::StrCat(absl::StrJoin(steps.begin(), steps.begin() + 5, ", "), ", …, ",
                      absl::StrJoin(steps.end() - 5, steps.end(), ", "));
}

// Whether the peaks a run's MFU is of lie more than 5% apart.
bool PeaksApart(const RunSummary& s) {
  if (s.peaks.empty()) return false;
  const auto [low, high] = absl::c_minmax_element(
      s.peaks, [](const auto& a, const auto& b) { return a.second < b.second; });
  return high->second > 1.05 * low->second;
}

// What the run's MFU is stated against, for its row: " of 126.3 GFLOP/s per rank", or where the
// peaks lie apart, a pointer to the note that names them.
std::string PeakOf(const RunSummary& s) {
  if (s.peaks.empty()) return "";
  if (PeaksApart(s)) return " of peaks apart (see the note)";
  return absl::StrFormat(" of %.1f GFLOP/s per rank", s.peaks.front().second);
}

// "ddp over 2 ranks: dp 2, tp 1, pp 1 (steps 1 to 40); zero2 over 4 ranks: dp 4, tp 1, pp 1
// (from step 41)".
std::string LayoutChanges(const std::vector<std::pair<int64_t, std::string>>& layouts) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < layouts.size(); ++i) {
    const auto& [step, layout] = layouts[i];
    parts.push_back(i + 1 < layouts.size() ? absl::StrCat(layout, " (steps ", step, " to ",
                                                          layouts[i + 1].first - 1, ")")
                                           : absl::StrCat(layout, " (from step ", step, ")"));
  }
  return absl::StrJoin(parts, "; ");
}

std::string SummaryRows(const RunFolder& run, const RunSummary& s) {
  std::vector<std::pair<std::string, std::string>> rows;
  if (run.recipe) {
    const Recipe& r = *run.recipe;
    rows.emplace_back("model", ModelShapeLine(ModelConfigFromRecipe(r.model, r.d_ff())));
    // The layout metrics.jsonl records, with its ranks (each one where a resume changed it), else
    // the recipe's.
    std::string layout = s.layouts.empty()
                             ? absl::StrFormat("strategy %s, tp %d, pp %d", r.parallel.strategy,
                                               r.parallel.tp, r.parallel.pp)
                         : s.layouts.size() == 1 ? s.layouts.front().second
                                                 : LayoutChanges(s.layouts);
    if (r.parallel.pp > 1) {
      absl::StrAppendFormat(&layout, " (schedule %s, %d virtual stages)", r.parallel.pp_schedule,
                            r.parallel.pp_virtual_stages);
    }
    absl::StrAppendFormat(&layout, ", recompute %s, device %s", r.parallel.recompute, r.run.device);
    rows.emplace_back("layout", layout);
    rows.emplace_back(
        "batch", absl::StrFormat("%d sequences x %d tokens = %d tokens/step", r.train.batch_size,
                                 r.train.seq_len, int64_t{r.train.batch_size} * r.train.seq_len));
  }
  if (s.steps > 0) {
    std::string steps = absl::StrFormat("%d to %d (%d %s)", s.first_step, s.last_step, s.steps,
                                        s.steps == 1 ? "line" : "lines");
    if (run.recipe) absl::StrAppendFormat(&steps, " of train.steps %d", run.recipe->train.steps);
    rows.emplace_back("steps", steps);
    rows.emplace_back("final loss", absl::StrFormat("%.4f (step %d)", s.final_loss, s.last_step));
    rows.emplace_back("best validation loss",
                      s.best_val_loss
                          ? absl::StrFormat("%.4f (step %d)", *s.best_val_loss, s.best_val_step)
                          : "none (no evaluation ran)");
    rows.emplace_back("tokens/s", absl::StrFormat("%.0f", s.tokens_per_s));
    rows.emplace_back("MFU", absl::StrCat(absl::StrFormat("%.2f%%", s.mfu_percent), PeakOf(s)));
    rows.emplace_back("time in steps", Duration(s.train_time_s));
    rows.emplace_back(
        "checkpoints saved",
        s.checkpoint_steps.empty()
            ? "none"
            : absl::StrCat(s.checkpoint_steps.size(), ", at steps ", StepList(s.checkpoint_steps)));
    std::vector<std::string> restarts;
    for (const int64_t from : s.restarted_from_steps) {
      restarts.push_back(from == 0 ? "the start" : absl::StrCat(from));
    }
    rows.emplace_back("restarts",
                      restarts.empty()
                          ? "none"
                          : absl::StrCat(restarts.size(), ", resumed from ", StepList(restarts)));
    if (!s.resumed_from_steps.empty()) {
      rows.emplace_back("runs resumed", absl::StrCat(s.resumed_from_steps.size(), ", from ",
                                                     StepList(s.resumed_from_steps)));
    }
  }
  std::string html = "<table class=\"summary\">\n";
  for (const auto& [key, value] : rows) {
    absl::StrAppend(&html, "<tr><th>", EscapeMarkup(key), "</th><td>", EscapeMarkup(value),
                    "</td></tr>\n");
  }
  return html + "</table>\n";
}

}  // namespace

absl::StatusOr<MetricsLog> ReadMetricsLog(const std::string& path) {
  ASSIGN_OR_RETURN(std::ifstream in, OpenInputFile(path));
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(std::move(line));
  MetricsLog log;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].empty()) continue;
    absl::StatusOr<StepMetrics> m = ParseStepMetricsJson(lines[i]);
    if (m.ok()) {
      log.steps.push_back(*std::move(m));
      continue;
    }
    const bool last = i + 1 == lines.size();
    log.skipped.push_back(absl::StrCat(
        "line ", i + 1, last ? " (the last)" : "", " of ", path, " skipped: ", m.status().message(),
        last ? "; a run killed while writing a line leaves it cut short" : ""));
  }
  return log;
}

absl::StatusOr<RunFolder> ReadRunFolder(const std::string& dir) {
  std::error_code error;
  if (!fs::is_directory(dir, error)) {
    return absl::NotFoundError(
        absl::StrCat(fs::exists(dir, error) ? absl::StrCat(dir, " is a file, not a run folder")
                                            : absl::StrCat("no run folder ", dir),
                     ": pass the folder a run wrote, <run.out_dir>/<run.name> (e.g. "
                     "runs/tiny), which holds its metrics.jsonl and recipe.yaml"));
  }
  RunFolder run{.dir = dir, .name = fs::path(dir).lexically_normal().filename().string()};
  if (run.name.empty())
    run.name = fs::path(dir).lexically_normal().parent_path().filename().string();
  const fs::path recipe_path = fs::path(dir) / "recipe.yaml";
  std::string metrics_file = "metrics.jsonl";
  if (!fs::exists(recipe_path, error)) {
    run.recipe_note = absl::StrCat("no recipe.yaml in ", dir, ": the model and layout are unknown");
  } else if (absl::StatusOr<Recipe> recipe =
                 [&] {
                   const QuietLogScope quiet;  // its warnings are the run's, given at its start
                   return LoadRecipe(recipe_path.string());
                 }();
             recipe.ok()) {
    run.name = recipe->run.name;
    metrics_file = recipe->logging.metrics_file;
    run.recipe = *std::move(recipe);
  } else {
    run.recipe_note = absl::StrCat(
        "the run's recipe does not read (the model and layout are "
        "unknown): ",
        recipe.status().message());
  }
  run.metrics_path = (fs::path(dir) / metrics_file).string();
  if (!fs::exists(run.metrics_path, error)) {
    return absl::NotFoundError(
        absl::StrCat("no ", run.metrics_path,
                     ": the run folder holds no metrics yet (a run writes a line "
                     "after each step); pass the folder of a run that trained at least one step"));
  }
  ASSIGN_OR_RETURN(run.metrics, ReadMetricsLog(run.metrics_path));
  return run;
}

RunSummary SummarizeRun(const std::vector<StepMetrics>& steps) {
  RunSummary s;
  if (steps.empty()) return s;
  s.steps = static_cast<int>(steps.size());
  s.first_step = steps.front().step;
  s.last_step = steps.back().step;
  s.final_loss = steps.back().loss;
  // Rates over time, weighting each step by its time: the tokens the steps trained over the
  // time they took (a mean of the steps' rates would let fast steps count as much as slow ones).
  double tokens = 0, mfu_time = 0, time_s = 0;
  const auto add_rates = [&](const StepMetrics& m) {
    const double step_s = m.step_ms / 1e3;
    tokens += m.tokens_per_s * step_s;
    mfu_time += m.mfu_percent * step_s;
    time_s += step_s;
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    const StepMetrics& m = steps[i];
    if (m.val_loss && std::isfinite(*m.val_loss) &&
        (!s.best_val_loss || *m.val_loss < *s.best_val_loss)) {
      s.best_val_loss = m.val_loss;
      s.best_val_step = m.step;
    }
    s.train_time_s += (m.step_ms + m.ckpt_blocked_ms.value_or(0.0)) / 1e3;
    if (m.ckpt_blocked_ms) s.checkpoint_steps.push_back(m.step);
    if (m.restart) {
      s.restarted_from_steps.push_back(m.resumed_from_step.value_or(0));
    } else if (m.resumed_from_step) {
      s.resumed_from_steps.push_back(*m.resumed_from_step);
    }
    if (!m.layout.empty() && (s.layouts.empty() || s.layouts.back().second != m.layout)) {
      s.layouts.emplace_back(m.step, m.layout);
    }
    if (m.peak_gflops && (s.peaks.empty() || s.peaks.back().second != *m.peak_gflops)) {
      s.peaks.emplace_back(m.step, *m.peak_gflops);
    }
    const bool first_of_process = m.resumed_from_step || m.restart || !m.layout.empty();
    if (i > 0 && !first_of_process) add_rates(m);
  }
  if (time_s == 0) {
    for (const StepMetrics& m : steps) add_rates(m);
  }
  if (time_s > 0) {
    s.tokens_per_s = tokens / time_s;
    s.mfu_percent = mfu_time / time_s;
  }
  return s;
}

std::vector<std::string> ReportNotes(const RunFolder& run) {
  std::vector<std::string> notes;
  if (!run.recipe_note.empty()) notes.push_back(run.recipe_note);
  // The first few skipped lines name the problem; a file of garbage would make a page of them.
  constexpr size_t kSkippedShown = 10;
  const std::vector<std::string>& skipped = run.metrics.skipped;
  notes.insert(notes.end(), skipped.begin(),
               skipped.begin() + std::min(skipped.size(), kSkippedShown));
  if (skipped.size() > kSkippedShown) {
    notes.push_back(absl::StrCat("and ", skipped.size() - kSkippedShown, " more lines of ",
                                 run.metrics_path, " skipped"));
  }
  if (run.metrics.steps.empty()) {
    notes.push_back(
        absl::StrCat(run.metrics_path, " holds no steps: the run has not finished its first step"));
  }
  // Each process measures its own peak at its start, and a step that outruns it raises it: one
  // measured on a busy machine (a restart beside other work) stated MFU nearly twice another's.
  if (const RunSummary s = SummarizeRun(run.metrics.steps); PeaksApart(s)) {
    std::vector<std::string> stretches;
    for (const auto& [step, gflops] : s.peaks) {
      stretches.push_back(absl::StrFormat("%.1f from step %d", gflops, step));
    }
    notes.push_back(absl::StrCat(
        "MFU is stated against peaks that the run's processes measured or raised apart, in "
        "GFLOP/s per rank: ",
        StepList(stretches), "; MFU under one does not compare with MFU under another"));
  }
  return notes;
}

std::string RunReportHtml(const RunFolder& run) {
  const std::vector<StepMetrics>& steps = run.metrics.steps;
  const std::string name = EscapeMarkup(run.name);
  std::string html = absl::StrCat(
      kReportPageStart,
      "\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>dtrain report: ", name,
      "</title>\n<style>", kStyle, "</style>\n</head>\n<body>\n<h1>dtrain report: ", name,
      "</h1>\n<p class=\"caption\">", EscapeMarkup(run.dir), "</p>\n");
  absl::StrAppend(&html, SummaryRows(run, SummarizeRun(steps)));
  for (const std::string& note : ReportNotes(run)) {
    absl::StrAppend(&html, "<p class=\"note\">", EscapeMarkup(note), "</p>\n");
  }
  if (!steps.empty()) {
    for (const auto& [chart, caption] : Charts(steps)) {
      absl::StrAppend(&html, "<section id=\"", chart.id, "\">\n<h2>", EscapeMarkup(chart.title),
                      "</h2>\n<p class=\"caption\">", caption, "</p>\n", ChartSvg(chart),
                      "</section>\n");
    }
  }
  absl::StrAppend(&html, "</body>\n</html>\n");
  return html;
}

absl::Status WriteRunReport(const RunFolder& run, const std::string& path) {
  // The folders of a path that do not exist yet are made, as ckpt export --out's are.
  std::error_code error;
  if (const std::filesystem::path parent = std::filesystem::path(path).parent_path();
      !parent.empty() && (std::filesystem::create_directories(parent, error), error)) {
    return FileError(error.value(), absl::StrCat("cannot make the folder ", parent.string()),
                     "pass --out a path in a writable folder");
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << RunReportHtml(run);
  out.close();
  if (!out) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write ", path, ": pass --out a path in a writable folder"));
  }
  return absl::OkStatus();
}

}  // namespace dtrain
