// The run report (`dtrain report RUN_DIR`): one self-contained HTML page about a run folder
// (<run.out_dir>/<run.name>/): a summary from its recipe.yaml and metrics.jsonl, then charts of
// the loss and validation loss, tokens/s, MFU and each step's time by part, with checkpoint saves
// and restarts marked. The page fetches nothing: its charts are inline SVG
// (core/metrics/svg_chart.h), its style is inline, it has no script.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/metrics/step_metrics.h"
#include "core/recipe/recipe.h"

namespace dtrain {

struct MetricsLog {
  std::vector<StepMetrics> steps;  // in file order
  // Each line skipped and why, e.g. "line 21 (the last) ...": a run killed while writing leaves
  // its last line cut short; the report shows these and never fails on them.
  std::vector<std::string> skipped;
};

// Reads a metrics.jsonl (core/metrics/step_metrics.h: one StepMetricsJson object a line). An
// error (NotFound) only when the file cannot be opened, naming it.
absl::StatusOr<MetricsLog> ReadMetricsLog(const std::string& path);

struct RunFolder {
  std::string dir;
  std::string name;              // run.name, or the folder's name without a recipe
  std::optional<Recipe> recipe;  // its recipe.yaml, when that reads
  std::string recipe_note;       // without one: why (missing, or its error)
  std::string metrics_path;      // logging.metrics_file of the recipe, else metrics.jsonl
  MetricsLog metrics;
};

// Reads the run folder `dir`. Errors (NotFound) name the path and the fix: `dir` is not a
// folder, or it holds no metrics file (a run writes it at its first step).
absl::StatusOr<RunFolder> ReadRunFolder(const std::string& dir);

// The run at a glance, from its metrics.
struct RunSummary {
  int steps = 0;  // metrics lines read
  int first_step = 0, last_step = 0;
  double final_loss = 0;
  std::optional<double> best_val_loss;
  int best_val_step = 0;
  // Over the steps that are not the first of their process (the first pays for first-touch
  // allocation and warm-up), or every step when that leaves none: the tokens they trained over
  // the time they took, and MFU weighted by each step's time.
  double tokens_per_s = 0;
  double mfu_percent = 0;
  // The steps' time plus what checkpoint saves blocked (not start-up, evaluations or restarts).
  double train_time_s = 0;
  std::vector<int> checkpoint_steps;
  // Each later start of the run's processes, in order, by the step it resumed from (0: the
  // start): restarts of the job (dtrain launch's agent's, a requeued Slurm job's), and runs
  // launched again that resumed. Logs written before restarts were told apart hold only the second.
  std::vector<int64_t> restarted_from_steps;
  std::vector<int64_t> resumed_from_steps;
  // The layout of each stretch of steps that ran one (metrics' "layout"), by its first step.
  std::vector<std::pair<int64_t, std::string>> layouts;
  // The peak (GFLOP/s per rank) MFU is stated against in each stretch of steps (metrics'
  // "peak_gflops"), by its first step: each process measures its own.
  std::vector<std::pair<int64_t, double>> peaks;
};
RunSummary SummarizeRun(const std::vector<StepMetrics>& steps);

// What the reader should know before the charts: no or an unreadable recipe, skipped lines, no
// steps at all. The page shows them at its top; `dtrain report` prints them too.
std::vector<std::string> ReportNotes(const RunFolder& run);

// The HTML page: a complete document, UTF-8, that starts with kReportPageStart.
inline constexpr absl::string_view kReportPageStart = "<!DOCTYPE html>";
std::string RunReportHtml(const RunFolder& run);

// Writes RunReportHtml(run) to `path`; an error names the path when it cannot be written.
absl::Status WriteRunReport(const RunFolder& run, const std::string& path);

}  // namespace dtrain
