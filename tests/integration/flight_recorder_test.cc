// The flight recorder on 4 local `dtrain train` ranks (data parallel, the dp group is 'world'):
// a rank that skips an all-reduce, one that calls a different size at the same sequence number
// (DTRAIN_TEST_COLLECTIVE_FAULT, flight_recorder.h) and a stopped rank; rank 0, which hosts the
// store, prints the diagnosis naming the rank and the operation. SIGUSR2 dumps without failing.
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/comm/flight_recorder_diagnosis.h"
#include "tests/testing/multi_process.h"
#include "tests/testing/run_dtrain.h"

namespace dtrain {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;

std::string Recipe() {
  std::string text;
  for (int i = 0; i < 300; ++i) absl::StrAppend(&text, "Pack my box with ", i % 7, " jugs.\n");
  const std::string data = testing::WriteTempFile("fr_text.txt", text);
  return testing::WriteTempFile("fr.yaml", absl::StrCat(R"(
run: {name: fr, seed: 5, threads: 1}
model: {n_layer: 2, n_head: 2, d_model: 32, max_seq_len: 32}
data: {train: [)",
                                                        data, R"(]}
train: {steps: 6, batch_size: 8, micro_batch: 2, seq_len: 16, warmup_steps: 1, eval_every: 0,
        export_to: ""}
parallel: {bucket_mb: 0.01, timeout_s: 5}
logging: {sample_tokens: 0}
)"));
}

// 4 ranks of `dtrain train`, each with DTRAIN_TEST_COLLECTIVE_FAULT=`fault` (which names the rank
// it applies to), within 120 s.
std::vector<testing::RankResult> RunWithFault(const std::string& out, const std::string& fault) {
  const std::vector<std::string> argv = {DTRAIN_BINARY, "train", Recipe(), "--set",
                                         "run.out_dir=" + out};
  return testing::RunRanksAsProcesses(4, testing::FreeTcpPort(), absl::Seconds(120), [&](int) {
    setenv("DTRAIN_TEST_COLLECTIVE_FAULT", fault.c_str(), 1);
    std::vector<char*> args;
    for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    return 127;
  });
}

// Every rank failed within its timeout, and rank 0's diagnosis lists every rank's dump.
void ExpectFailedWithDumps(const std::vector<testing::RankResult>& ranks, const std::string& out,
                           const std::vector<int>& dumped) {
  ASSERT_EQ(ranks.size(), 4u);
  EXPECT_FALSE(ranks[0].timed_out) << ranks[0].output;
  EXPECT_EQ(ranks[0].exit_code, 1) << ranks[0].output;
  for (const int rank : dumped) {
    const std::string path = absl::StrCat(out, "/fr/flight_recorder/rank-", rank, ".jsonl");
    EXPECT_TRUE(std::filesystem::exists(path)) << path;
    EXPECT_THAT(ranks[0].output, HasSubstr(absl::StrCat("rank ", rank, " ", path)));
  }
}

TEST(FlightRecorderMultiProcessTest, ARankThatSkipsAnAllReduceIsNamedWithTheOperation) {
  const std::string out = testing::FreshTempDir("fr_skip");
  const auto ranks = RunWithFault(out, "skip:2:world:23");
  ExpectFailedWithDumps(ranks, out, {0, 1, 2, 3});
  EXPECT_THAT(ranks[0].output,
              ContainsRegex("flight recorder: rank 2 never entered all_reduce #[0-9]+ on group "
                            "'world' \\([0-9]+ (f32|f64) elements\\), which ranks 0, 1, 3 entered"))
      << ranks[0].output;
}

TEST(FlightRecorderMultiProcessTest, ARankCallingAnotherSizeIsNamedAsADesync) {
  const std::string out = testing::FreshTempDir("fr_resize");
  const auto ranks = RunWithFault(out, "resize:1:world:23");
  ExpectFailedWithDumps(ranks, out, {0, 1, 2, 3});
  EXPECT_THAT(
      ranks[0].output,
      ContainsRegex("flight recorder: desynchronised program: at collective #[0-9]+ on "
                    "group 'world' the ranks disagree: ranks 0, 2, 3 called all_reduce of "
                    "[0-9]+ (f32|f64) elements; rank 1 called all_reduce of [0-9]+ (f32|f64)"))
      << ranks[0].output;
}

TEST(FlightRecorderMultiProcessTest, AStoppedRankIsNamedAsNeverHavingEntered) {
  const std::string out = testing::FreshTempDir("fr_stop");
  const std::vector<std::string> argv = {
      DTRAIN_BINARY,       "train", Recipe(), "--set", "run.out_dir=" + out, "--set",
      "train.steps=100000"};
  const auto ranks = testing::SignalRankMidRun(argv, 4, 1, SIGSTOP, absl::Seconds(120), [&] {
    return testing::MetricsLosses(out + "/fr/metrics.jsonl").size() >= 2;
  });
  ExpectFailedWithDumps(ranks, out, {0, 2, 3});
  EXPECT_THAT(ranks[0].output,
              ContainsRegex("flight recorder: rank 1 never entered [a-z_]+ #[0-9]+ on group "
                            "'world'.*which ranks 0, 2, 3 entered"))
      << ranks[0].output;
  EXPECT_THAT(ranks[0].output, HasSubstr("rank 1 (no dump"));
}

// SIGUSR2 dumps the ring of the rank it reaches, at its next operation, and training goes on.
TEST(FlightRecorderMultiProcessTest, Sigusr2DumpsAndTrainingGoesOn) {
  const std::string out = testing::FreshTempDir("fr_usr2");
  const std::vector<std::string> argv = {DTRAIN_BINARY,        "train", Recipe(),         "--set",
                                         "run.out_dir=" + out, "--set", "train.steps=200"};
  bool signalled = false;
  const auto ranks = testing::RunLocalProcesses(
      argv, 2, testing::FreeTcpPort(), absl::Seconds(120), [&](const std::vector<pid_t>& pids) {
        if (signalled || pids[1] < 0) return;
        if (testing::MetricsLosses(out + "/fr/metrics.jsonl").size() >= 2) {
          kill(pids[1], SIGUSR2);
          signalled = true;
        }
      });
  ASSERT_TRUE(signalled);
  for (const auto& rank : ranks) ASSERT_EQ(rank.exit_code, 0) << rank;
  EXPECT_THAT(ranks[1].output, HasSubstr("flight recorder dumped to "));
  const FlightDump dump = LoadFlightDump(1, out + "/fr/flight_recorder/rank-1.jsonl");
  EXPECT_EQ(dump.problem, "");
  EXPECT_FALSE(dump.records.empty());
  EXPECT_FALSE(std::filesystem::exists(out + "/fr/flight_recorder/rank-0.jsonl"));
}

}  // namespace
}  // namespace dtrain
