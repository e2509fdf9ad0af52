// `dtrain report RUN_DIR [--out FILE]`: one self-contained HTML page of a run's curves, speed,
// time per step, checkpoints and restarts (core/metrics/run_report.h).
#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "cli/commands.h"
#include "core/metrics/run_report.h"
#include "core/util/files.h"

namespace dtrain::cli {

void AddReportCommand(CLI::App& app) {
  struct ReportArgs {
    std::string run_dir, out;
  };
  auto args = std::make_shared<ReportArgs>();
  CLI::App* report = app.add_subcommand(
      "report",
      "Write one self-contained HTML page of a run folder: loss and validation curves, tokens/s, "
      "MFU, the time of each step by part, checkpoints and restarts marked");
  report->add_option("run_dir", args->run_dir, "The run folder, <run.out_dir>/<run.name>")
      ->required();
  report->add_option("--out", args->out, "The HTML file to write (default: RUN_DIR/report.html)");
  report->callback([args] {
    absl::StatusOr<RunFolder> run = ReadRunFolder(args->run_dir);
    if (!run.ok()) Fail(run.status(), kExitUsage);
    const std::string out = args->out.empty()
                                ? (std::filesystem::path(args->run_dir) / "report.html").string()
                                : args->out;
    // The page over a file it reads would cost the run its record.
    for (const std::string& input : {run->metrics_path, run->dir + "/recipe.yaml"}) {
      if (IsSameOrInside(out, input)) {
        Fail(absl::InvalidArgumentError(absl::StrCat("--out ", out, " is the run's ", input,
                                                     ", which the report reads: write the page "
                                                     "elsewhere")),
             kExitUsage);
      }
    }
    std::error_code error;
    if (std::filesystem::is_directory(out, error)) {
      Fail(absl::InvalidArgumentError(
               absl::StrCat("--out ", out,
                            " is a folder: give the page a file path, "
                            "such as ",
                            (std::filesystem::path(out) / "report.html").string())),
           kExitUsage);
    }
    // A page replaces a page (or an empty file), not another file named by mistake.
    if (const std::optional<std::string> start = RegularFileHead(out, kReportPageStart.size());
        start && !start->empty() && *start != kReportPageStart) {
      Fail(absl::InvalidArgumentError(absl::StrCat(
               "--out ", out,
               " exists and is no HTML page, which the report would write over: give the page a "
               "path of its own")),
           kExitUsage);
    }
    if (absl::Status status = WriteRunReport(*run, out); !status.ok()) Fail(status, kExitFailure);
    for (const std::string& note : ReportNotes(*run)) std::cerr << "note: " << note << "\n";
    const size_t steps = run->metrics.steps.size();
    std::cout << "wrote " << out << " (" << steps << (steps == 1 ? " step)\n" : " steps)\n");
  });
}

}  // namespace dtrain::cli
