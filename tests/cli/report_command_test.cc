// `dtrain report` end to end: a run trained, checkpointed, resumed and killed mid-line, its
// report written and rendered in headless Chromium.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/run_dtrain.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;

class ReportCommandTest : public ::testing::Test {
 protected:
  // Once for the suite: 6 steps with checkpoints at 3 and 6, then the same run to step 8
  // (resumed from 6, a checkpoint at 8), then a line cut short as a killed run leaves it.
  static void SetUpTestSuite() {
    std::string text;
    for (int i = 0; i < 300; ++i)
      absl::StrAppend(&text, "Pack my box with five dozen jugs ", i, ".\n");
    const std::string data = testing::WriteTempFile("report_text.txt", text);
    const std::string recipe = testing::WriteTempFile("report_recipe.yaml", absl::StrCat(R"(
run: {name: rep, seed: 5, threads: 1}
model: {n_layer: 2, n_head: 2, d_model: 32, max_seq_len: 32}
data: {train: [)",
                                                                                         data, R"(]}
train: {steps: 6, batch_size: 8, micro_batch: 4, seq_len: 16, warmup_steps: 1, eval_every: 3,
        eval_batches: 1, export_to: ""}
checkpoint: {interval: 3}
logging: {sample_tokens: 0}
parallel: {sequence_parallel: true}  # a key that only warns, at the run's start
)"));
    out_dir_ = new std::string(testing::FreshTempDir("report_runs"));
    const std::string train = absl::StrCat("train ", recipe, " --set run.out_dir=", *out_dir_);
    first_ = new testing::Outcome(testing::RunDtrain(train));
    resumed_ = new testing::Outcome(testing::RunDtrain(train + " --set train.steps=8"));
  }
  static void TearDownTestSuite() {
    delete out_dir_;
    delete first_;
    delete resumed_;
  }

  void SetUp() override {
    ASSERT_EQ(first_->exit_code, 0) << first_->stderr_text;
    ASSERT_EQ(resumed_->exit_code, 0) << resumed_->stderr_text;
  }

  static std::string RunDir() { return *out_dir_ + "/rep"; }

  static std::string* out_dir_;
  static testing::Outcome* first_;
  static testing::Outcome* resumed_;
};

std::string* ReportCommandTest::out_dir_ = nullptr;
testing::Outcome* ReportCommandTest::first_ = nullptr;
testing::Outcome* ReportCommandTest::resumed_ = nullptr;

TEST_F(ReportCommandTest, TheResumedStepRecordsTheRestartInMetrics) {
  std::ifstream in(RunDir() + "/metrics.jsonl");
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 8u);
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i]["step"], i + 1);
    // Only step 7, the first the resumed process trained, says where it came from; the first
    // step of each process says its layout, and none was restarted by an agent.
    EXPECT_EQ(lines[i].contains("resumed_from_step"), i + 1 == 7) << "step " << i + 1;
    EXPECT_EQ(lines[i].contains("layout"), i + 1 == 1 || i + 1 == 7) << "step " << i + 1;
    EXPECT_FALSE(lines[i].contains("restart")) << "step " << i + 1;
  }
  EXPECT_EQ(lines[6]["resumed_from_step"], 6);
  EXPECT_EQ(lines[0]["layout"], "ddp over 1 rank: dp 1, tp 1, pp 1");
}

TEST_F(ReportCommandTest, AMissingRunFolderOrMetricsIsExit2NamingIt) {
  const std::string missing = testing::FreshTempDir("report_no_run");
  const testing::Outcome no_dir = testing::RunDtrain("report " + missing);
  EXPECT_EQ(no_dir.exit_code, 2);
  EXPECT_THAT(no_dir.stderr_text, HasSubstr("no run folder " + missing));
  const std::string file = testing::WriteTempFile("report_a_file.yaml", "run: {}\n");
  const testing::Outcome a_file = testing::RunDtrain("report " + file);
  EXPECT_EQ(a_file.exit_code, 2);
  EXPECT_THAT(a_file.stderr_text,
              HasSubstr(file + " is a file, not a run folder: pass the folder"));
  std::filesystem::create_directories(missing);
  const testing::Outcome no_metrics = testing::RunDtrain("report " + missing);
  EXPECT_EQ(no_metrics.exit_code, 2);
  EXPECT_THAT(no_metrics.stderr_text, HasSubstr(missing + "/metrics.jsonl"));
}

// --out's folders that do not exist yet are made; one that cannot be (under a regular file, for
// whoever runs the test, root included) is a usage error naming it, exit 2.
TEST_F(ReportCommandTest, AnOutInNewFoldersIsWrittenAndOneUnderAFileIsAUsageError) {
  const std::string nested = testing::FreshTempDir("report_new_folders") + "/a/b/report.html";
  const testing::Outcome written =
      testing::RunDtrain(absl::StrCat("report ", RunDir(), " --out ", nested));
  EXPECT_EQ(written.exit_code, 0) << written.stderr_text;
  EXPECT_TRUE(std::filesystem::is_regular_file(nested));
  // The run's recipe warned at its start: the report reads it without warning again.
  EXPECT_THAT(first_->stderr_text, HasSubstr("has no effect with parallel.tp: 1"));
  EXPECT_THAT(written.stderr_text, ::testing::Not(HasSubstr("has no effect")));
  const std::string file = testing::WriteTempFile("report_not_a_folder", "x");
  const testing::Outcome report =
      testing::RunDtrain(absl::StrCat("report ", RunDir(), " --out ", file, "/report.html"));
  EXPECT_EQ(report.exit_code, 2) << report.stderr_text;
  EXPECT_THAT(report.stderr_text, HasSubstr("cannot make the folder " + file));
  // A folder for --out: the page needs a file's path.
  const std::string folder = testing::FreshTempDir("report_into_folder");
  std::filesystem::create_directories(folder);
  const testing::Outcome into =
      testing::RunDtrain(absl::StrCat("report ", RunDir(), " --out ", folder));
  EXPECT_EQ(into.exit_code, 2) << into.stderr_text;
  EXPECT_THAT(into.stderr_text, HasSubstr("--out " + folder +
                                          " is a folder: give the page a file "
                                          "path, such as " +
                                          folder + "/report.html"));
}

// The page over a file the report reads would cost the run its record: refused, exit 2.
TEST_F(ReportCommandTest, AnOutOverTheRunsOwnFilesIsRefused) {
  const std::string metrics = RunDir() + "/metrics.jsonl";
  const auto contents = [](const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string before = contents(metrics);
  for (const std::string& out : {metrics, RunDir() + "/recipe.yaml"}) {
    const testing::Outcome report =
        testing::RunDtrain(absl::StrCat("report ", RunDir(), " --out ", out));
    EXPECT_EQ(report.exit_code, 2) << report.stderr_text;
    EXPECT_THAT(report.stderr_text, HasSubstr("which the report reads: write the page elsewhere"));
  }
  EXPECT_EQ(contents(metrics), before);
  // Nor over another file named by mistake; a page replaces a page.
  const std::string other = testing::WriteTempFile("report_over_recipe.yaml", "run: {}\n");
  const testing::Outcome over =
      testing::RunDtrain(absl::StrCat("report ", RunDir(), " --out ", other));
  EXPECT_EQ(over.exit_code, 2) << over.stderr_text;
  EXPECT_THAT(over.stderr_text, HasSubstr("--out " + other + " exists and is no HTML page"));
  EXPECT_EQ(contents(other), "run: {}\n");
  const std::string page = testing::FreshTempDir("report_again") + ".html";
  for (int run = 0; run < 2; ++run) {
    const testing::Outcome again =
        testing::RunDtrain(absl::StrCat("report ", RunDir(), " --out ", page));
    EXPECT_EQ(again.exit_code, 0) << again.stderr_text;
  }
}

TEST_F(ReportCommandTest, RendersInHeadlessChromium) {
  // A copy of the run whose metrics end in a line cut short, as a run killed mid-write leaves.
  const std::string killed = testing::FreshTempDir("report_killed");
  std::filesystem::copy(RunDir(), killed, std::filesystem::copy_options::recursive);
  std::ofstream(killed + "/metrics.jsonl", std::ios::app) << R"({"step":9,"loss":2.)";
  const std::string page = testing::TempPath("report.html");
  const testing::Outcome report =
      testing::RunDtrain(absl::StrCat("report ", killed, " --out ", page));
  ASSERT_EQ(report.exit_code, 0) << report.stderr_text;
  EXPECT_THAT(report.stdout_text, HasSubstr("wrote " + page + " (8 steps)"));
  EXPECT_THAT(report.stderr_text, HasSubstr("note: line 9 (the last)"));

  if (std::system("command -v chromium >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "chromium is not installed (scripts/setup.sh installs Debian's chromium)";
  }
  // As root Chromium runs only without its sandbox; the page is our own file.
  const std::string command =
      absl::StrCat("timeout 300 chromium --headless --disable-gpu --no-sandbox --dump-dom file://",
                   page, " 2>", testing::TempPath("chromium_stderr.txt"));
  std::string dom;
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) dom.append(buffer, n);
  ASSERT_EQ(pclose(pipe), 0) << "chromium failed; see " << testing::TempPath("chromium_stderr.txt");

  // The DOM as Chromium parsed the page: the title, every chart an SVG element with its
  // series, the markers' labels, the note on the cut line.
  EXPECT_THAT(dom, HasSubstr("<title>dtrain report: rep</title>"));
  for (const char* id : {"chart-loss", "chart-tokens", "chart-mfu", "chart-time"}) {
    EXPECT_THAT(dom, HasSubstr(absl::StrCat(
                         "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" id=\"", id)));
  }
  EXPECT_THAT(dom, HasSubstr("<polyline class=\"series\" data-series=\"train loss\""));
  EXPECT_THAT(dom, HasSubstr("data-series=\"validation loss\""));
  EXPECT_THAT(dom, HasSubstr("<polygon class=\"layer\" data-series=\"compute\""));
  for (const char* label :
       {">ckpt 3</text>", ">ckpt 6</text>", ">ckpt 8</text>", ">resumed from 6</text>"}) {
    EXPECT_THAT(dom, HasSubstr(label));
  }
  EXPECT_THAT(dom, HasSubstr("line 9 (the last)"));
  EXPECT_THAT(dom, HasSubstr("<td>3, at steps 3, 6, 8</td>"));
  // The second launch resumed the run; nothing restarted it.
  EXPECT_THAT(dom, HasSubstr("<th>restarts</th><td>none</td>"));
  EXPECT_THAT(dom, HasSubstr("<th>runs resumed</th><td>1, from 6</td>"));
  EXPECT_THAT(dom, HasSubstr("<th>layout</th><td>ddp over 1 rank: dp 1, tp 1, pp 1, recompute "
                             "none, device cpu</td>"));
}

}  // namespace
}  // namespace dtrain
