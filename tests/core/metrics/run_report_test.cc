// The run report from a run folder: lines cut short are skipped and noted, missing folders and
// files are named with the fix, the summary and the page say what the metrics say.
#include "core/metrics/run_report.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/run_dtrain.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

StepMetrics Step(int step, double tokens_per_s) {
  StepMetrics m;
  m.step = step;
  m.loss = 5.0 - 0.1 * step;
  m.step_ms = 100;
  m.data_wait_ms = 10;
  m.tokens_per_s = tokens_per_s;
  m.mfu_percent = tokens_per_s / 100;
  return m;
}

// Steps 1..4: a checkpoint at 2, evaluations at 2 and 4, a restart from 2 before step 3.
std::vector<StepMetrics> FourSteps() {
  std::vector<StepMetrics> steps = {Step(1, 100), Step(2, 200), Step(3, 300), Step(4, 400)};
  steps[1].ckpt_blocked_ms = 20;
  steps[1].val_loss = 4.9;
  steps[3].val_loss = 4.7;
  steps[2].resumed_from_step = 2;
  steps[2].restart = 1;
  return steps;
}

std::string MetricsText(const std::vector<StepMetrics>& steps) {
  std::string text;
  for (const StepMetrics& m : steps) absl::StrAppend(&text, StepMetricsJson(m), "\n");
  return text;
}

// A run folder holding `metrics` as metrics.jsonl (and no recipe.yaml).
std::string RunFolderWith(const std::string& name, const std::string& metrics) {
  const std::string dir = testing::FreshTempDir(name);
  fs::create_directories(dir);
  std::ofstream(dir + "/metrics.jsonl") << metrics;
  return dir;
}

TEST(RunReportTest, ACutShortLastLineIsSkippedWithANote) {
  const std::string full = MetricsText(FourSteps());
  const std::string dir = RunFolderWith("report_cut", full + R"({"step":5,"loss":3.)");
  const absl::StatusOr<MetricsLog> log = ReadMetricsLog(dir + "/metrics.jsonl");
  ASSERT_TRUE(log.ok()) << log.status();
  ASSERT_EQ(log->steps.size(), 4u);
  EXPECT_EQ(log->steps.back().step, 4);
  ASSERT_EQ(log->skipped.size(), 1u);
  EXPECT_THAT(log->skipped[0], HasSubstr("line 5 (the last)"));
  EXPECT_THAT(log->skipped[0], HasSubstr("cut short"));
}

TEST(RunReportTest, ABadLineInTheMiddleIsSkippedNamingIt) {
  const std::vector<StepMetrics> steps = FourSteps();
  const std::string text =
      absl::StrCat(StepMetricsJson(steps[0]), "\n{\"step\":2,\"loss\":\"x\"}\n",
                   StepMetricsJson(steps[2]), "\n");
  const absl::StatusOr<MetricsLog> log =
      ReadMetricsLog(RunFolderWith("report_bad", text) + "/metrics.jsonl");
  ASSERT_TRUE(log.ok()) << log.status();
  ASSERT_EQ(log->steps.size(), 2u);
  ASSERT_EQ(log->skipped.size(), 1u);
  EXPECT_THAT(log->skipped[0], HasSubstr("line 2 of"));
  EXPECT_THAT(log->skipped[0], HasSubstr("\"loss\" is not a number"));
}

// A metrics file of garbage names its first bad lines and counts the rest: one note a line made
// a 10 MB page of 100,000 bad lines.
TEST(RunReportTest, SkippedLinesAreNamedUpToTenThenCounted) {
  std::string text;
  for (int i = 0; i < 25; ++i) absl::StrAppend(&text, "garbage\n");
  const absl::StatusOr<RunFolder> run = ReadRunFolder(RunFolderWith("report_garbage", text));
  ASSERT_TRUE(run.ok()) << run.status();
  const std::vector<std::string> notes = ReportNotes(*run);
  // The missing recipe, 10 lines, the count, and "holds no steps".
  ASSERT_EQ(notes.size(), 13u);
  EXPECT_THAT(notes[1], HasSubstr("line 1 of"));
  EXPECT_THAT(notes[11], HasSubstr("and 15 more lines of "));
}

TEST(RunReportTest, AMissingFolderOrMetricsFileIsNamedWithTheFix) {
  const std::string missing = testing::FreshTempDir("report_missing");
  const absl::StatusOr<RunFolder> no_dir = ReadRunFolder(missing);
  EXPECT_EQ(no_dir.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(no_dir.status().message(), HasSubstr(missing));
  EXPECT_THAT(no_dir.status().message(), HasSubstr("<run.out_dir>/<run.name>"));

  fs::create_directories(missing);
  const absl::StatusOr<RunFolder> no_metrics = ReadRunFolder(missing);
  EXPECT_EQ(no_metrics.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(no_metrics.status().message(), HasSubstr(missing + "/metrics.jsonl"));
  EXPECT_THAT(no_metrics.status().message(), HasSubstr("trained at least one step"));
}

TEST(RunReportTest, AnEmptyRunSaysSo) {
  const absl::StatusOr<RunFolder> run = ReadRunFolder(RunFolderWith("report_empty", ""));
  ASSERT_TRUE(run.ok()) << run.status();
  const std::string html = RunReportHtml(*run);
  EXPECT_THAT(html, HasSubstr("holds no steps: the run has not finished its first step"));
  EXPECT_THAT(html, HasSubstr("no recipe.yaml"));
  EXPECT_THAT(html, Not(HasSubstr("<svg")));
}

TEST(RunReportTest, TheSummaryLeavesOutEachProcesssFirstStep) {
  const RunSummary s = SummarizeRun(FourSteps());
  EXPECT_EQ(s.steps, 4);
  EXPECT_EQ(s.first_step, 1);
  EXPECT_EQ(s.last_step, 4);
  EXPECT_EQ(s.final_loss, 5.0 - 0.4);
  EXPECT_EQ(s.best_val_loss, 4.7);
  EXPECT_EQ(s.best_val_step, 4);
  // Steps 1 and 3 (the first after the restart) are warm-up: (200 + 400) / 2.
  EXPECT_NEAR(s.tokens_per_s, 300, 1e-9);
  EXPECT_NEAR(s.mfu_percent, 3, 1e-12);
  EXPECT_EQ(s.checkpoint_steps, std::vector<int>{2});
  EXPECT_EQ(s.restarted_from_steps, std::vector<int64_t>{2});
  EXPECT_TRUE(s.resumed_from_steps.empty());
  EXPECT_NEAR(s.train_time_s, 0.42, 1e-12);  // 4 x 100 ms + 20 ms of checkpoint
}

// A restart of the job (its count in the line) and a run launched again to resume are told apart;
// a layout that changed at a resume is listed by the steps it ran, and each process's first
// step, a restart from the start's included, is left out of the rates.
TEST(RunReportTest, RestartsResumedRunsAndLayoutChangesAreToldApart) {
  std::vector<StepMetrics> steps = {Step(1, 100), Step(2, 200), Step(3, 1000),
                                    Step(4, 400), Step(5, 500), Step(6, 600)};
  steps[0].layout = "ddp over 2 ranks: dp 2, tp 1, pp 1";
  steps[2].layout = steps[0].layout;  // restarted from the start, same layout
  steps[2].restart = 1;
  steps[4].layout = "zero2 over 4 ranks: dp 4, tp 1, pp 1";
  steps[4].resumed_from_step = 4;
  const RunSummary s = SummarizeRun(steps);
  EXPECT_EQ(s.restarted_from_steps, std::vector<int64_t>{0});
  EXPECT_EQ(s.resumed_from_steps, std::vector<int64_t>{4});
  ASSERT_EQ(s.layouts.size(), 2u);
  EXPECT_EQ(s.layouts[1], (std::pair<int64_t, std::string>{5, steps[4].layout}));
  EXPECT_NEAR(s.tokens_per_s, (200 + 400 + 600) / 3.0, 1e-9);

  const std::string dir = RunFolderWith("report_layouts", MetricsText(steps));
  std::ofstream(dir + "/recipe.yaml") << "data: {train: [corpus.txt]}\n";
  const absl::StatusOr<RunFolder> run = ReadRunFolder(dir);
  ASSERT_TRUE(run.ok()) << run.status();
  const std::string html = RunReportHtml(*run);
  EXPECT_THAT(
      html, HasSubstr("<td>ddp over 2 ranks: dp 2, tp 1, pp 1 (steps 1 to 4); zero2 over "
                      "4 ranks: dp 4, tp 1, pp 1 (from step 5), recompute none, device cpu</td>"));
  EXPECT_THAT(html, HasSubstr("<th>restarts</th><td>1, resumed from the start</td>"));
  EXPECT_THAT(html, HasSubstr("<th>runs resumed</th><td>1, from 4</td>"));
  EXPECT_THAT(html, HasSubstr(">restart: resumed from the start</text>"));
  EXPECT_THAT(html, HasSubstr(">resumed from 4</text>"));
}

// Each process states MFU against the peak it measured: the summary says which, and where a
// restart measured another (a machine busy at one start), that the figures do not compare (a
// time-weighted MFU over both read as one run's).
TEST(RunReportTest, TheMfuSaysWhichPeaksItIsOf) {
  std::vector<StepMetrics> steps = {Step(1, 100), Step(2, 200), Step(3, 300), Step(4, 400)};
  steps[0].peak_gflops = 126.3;
  const auto summary_of = [](const std::vector<StepMetrics>& run) {
    const std::string dir = RunFolderWith("report_peaks", MetricsText(run));
    const absl::StatusOr<RunFolder> folder = ReadRunFolder(dir);
    EXPECT_TRUE(folder.ok()) << folder.status();
    return folder.ok() ? RunReportHtml(*folder) : "";
  };
  EXPECT_THAT(summary_of(steps), HasSubstr("<th>MFU</th><td>3.00% of 126.3 GFLOP/s per rank</td>"));
  EXPECT_THAT(summary_of({steps[0]}), HasSubstr("<th>steps</th><td>1 to 1 (1 line)</td>"));
  steps[2].restart = 1;
  steps[2].peak_gflops = 69.8;
  const RunSummary s = SummarizeRun(steps);
  EXPECT_EQ(s.peaks, (std::vector<std::pair<int64_t, double>>{{1, 126.3}, {3, 69.8}}));
  const std::string apart = summary_of(steps);
  EXPECT_THAT(apart, HasSubstr("<th>MFU</th><td>3.00% of peaks apart (see the note)</td>"));
  EXPECT_THAT(apart, HasSubstr("<p class=\"note\">MFU is stated against peaks that the run&#39;s "
                               "processes measured or raised apart, in GFLOP/s per rank: 126.3 "
                               "from step 1, 69.8 from step 3; MFU under one does not compare "
                               "with MFU under another</p>"));
  // Within 5% they are one machine's.
  steps[2].peak_gflops = 124;
  EXPECT_THAT(summary_of(steps), HasSubstr("% of 126.3 GFLOP/s per rank</td>"));
}

// Tokens over time, not a mean of the steps' rates: 100 tokens in 0.1 s and 90 in 0.9 s are
// 190 tokens/s (the mean of 1000 and 100 tokens/s would say 550), MFU weighted alike.
TEST(RunReportTest, TheSummaryRatesAreTokensOverTime) {
  std::vector<StepMetrics> steps = {Step(1, 50), Step(2, 1000), Step(3, 100)};
  steps[2].step_ms = 900;
  const RunSummary s = SummarizeRun(steps);
  EXPECT_NEAR(s.tokens_per_s, 190, 1e-9);
  EXPECT_NEAR(s.mfu_percent, 1.9, 1e-12);
}

TEST(RunReportTest, ThePageHasEveryChartAndMarkerAndFetchesNothing) {
  const absl::StatusOr<RunFolder> run =
      ReadRunFolder(RunFolderWith("report_page", MetricsText(FourSteps())));
  ASSERT_TRUE(run.ok()) << run.status();
  const std::string html = RunReportHtml(*run);
  EXPECT_THAT(html, HasSubstr("<title>dtrain report: " + fs::path(run->dir).filename().string()));
  for (const char* id : {"chart-loss", "chart-tokens", "chart-mfu", "chart-time"}) {
    EXPECT_THAT(html, HasSubstr(absl::StrCat("id=\"", id, "\""))) << id;
  }
  EXPECT_THAT(html, HasSubstr("data-series=\"validation loss\""));
  for (const char* layer : {"compute", "data wait", "exposed comm", "pp wait", "checkpoint wait"}) {
    EXPECT_THAT(html, HasSubstr(absl::StrCat("<polygon class=\"layer\" data-series=\"", layer)));
  }
  EXPECT_THAT(html, HasSubstr(">ckpt 2</text>"));
  EXPECT_THAT(html, HasSubstr(">restart: resumed from 2</text>"));
  EXPECT_THAT(html, HasSubstr("<td>1, at steps 2</td>"));
  // Self-contained: nothing that a browser would fetch.
  for (const char* fetch : {"<script", "<link", "<img", "src=", "href=", "url(", "@import"}) {
    EXPECT_THAT(html, Not(HasSubstr(fetch))) << fetch;
  }
}

// A long run's page stays small: a checkpoint every 2 of 200,000 steps (and one restart) made
// a page of tens of MB; the charts draw at most 1,600 points a series, and the summary lists the
// first and last five checkpoints.
TEST(RunReportTest, ALongRunsPageIsBounded) {
  std::vector<StepMetrics> steps;
  for (int step = 1; step <= 200000; ++step) {
    StepMetrics m = FourSteps()[0];
    m.step = step;
    m.loss = 3 + std::sin(step);
    m.ckpt_blocked_ms =
        step % 2 == 0 ? std::optional<double>(1.0) : std::optional<double>(std::nullopt);
    m.resumed_from_step =
        step == 1001 ? std::optional<int64_t>(1000) : std::optional<int64_t>(std::nullopt);
    m.val_loss = std::nullopt;
    steps.push_back(m);
  }
  const absl::StatusOr<RunFolder> run =
      ReadRunFolder(RunFolderWith("report_long", MetricsText(steps)));
  ASSERT_TRUE(run.ok()) << run.status();
  const std::string html = RunReportHtml(*run);
  EXPECT_LT(html.size(), 1u << 20);
  EXPECT_THAT(html, HasSubstr("<td>100000, at steps 2, 4, 6, 8, 10, …, 199992, 199994, 199996, "
                              "199998, 200000</td>"));
  EXPECT_THAT(html, HasSubstr(">resumed from 1000</text>"));
  EXPECT_THAT(html, HasSubstr(" of 100000 drawn)</text>"));
  // 200000 steps of 100 ms and 100000 saves that blocked 1 ms, in hours (and seconds).
  EXPECT_THAT(html, HasSubstr("<th>time in steps</th><td>5.6 h (20100.0 s)</td>"));
}

TEST(RunReportTest, TheRecipeGivesTheNameModelAndLayout) {
  const std::string dir = RunFolderWith("report_recipe", MetricsText(FourSteps()));
  std::ofstream(dir + "/recipe.yaml")
      << "run: {name: my<run>}\nmodel: {n_layer: 2, n_head: 2, d_model: 64}\n"
         "data: {train: [corpus.txt]}\nparallel: {strategy: zero1}\ntrain: {steps: 10, "
         "warmup_steps: 1}\n";
  const absl::StatusOr<RunFolder> run = ReadRunFolder(dir);
  ASSERT_TRUE(run.ok()) << run.status();
  const std::string html = RunReportHtml(*run);
  EXPECT_THAT(html, HasSubstr("<title>dtrain report: my&lt;run&gt;</title>"));
  EXPECT_THAT(html, HasSubstr("gpt2, 2 layers, d_model 64, 2 heads (2 kv)"));
  EXPECT_THAT(html, HasSubstr("strategy zero1, tp 1, pp 1"));
  EXPECT_THAT(html, HasSubstr("of train.steps 10"));
}

}  // namespace
}  // namespace dtrain
