// `dtrain train` as separate processes on loopback (torchrun's variables), against one process.
#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/multi_process.h"
#include "tests/testing/run_dtrain.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;

std::string Recipe(const std::string& name) {
  std::string text;
  for (int i = 0; i < 300; ++i) absl::StrAppend(&text, "Pack my box with ", i % 7, " jugs.\n");
  const std::string data = testing::WriteTempFile("mp_text.txt", text);
  return testing::WriteTempFile(name + ".yaml", absl::StrCat(R"(
run: {name: mp, seed: 5, threads: 1}
model: {n_layer: 2, n_head: 2, d_model: 32, max_seq_len: 32}
data: {train: [)",
                                                             data, R"(]}
train: {steps: 8, batch_size: 8, micro_batch: 2, seq_len: 16, warmup_steps: 1, eval_every: 4,
        eval_batches: 1, export_to: ""}
parallel: {bucket_mb: 0.01, prefetch_bucket_mb: 0.01, check_replicas: true, timeout_s: 20}
logging: {sample_tokens: 8}
)"));
}

std::vector<double> Losses(const std::string& out_dir) {
  return testing::MetricsLosses(out_dir + "/mp/metrics.jsonl");
}

std::string OutDir(const std::string& name) { return testing::FreshTempDir("mp_" + name); }

TEST(TrainMultiProcessTest, TwoRanksFollowTheSingleProcessTrajectory) {
  const std::string single = OutDir("single");
  const testing::Outcome one =
      testing::RunDtrain(absl::StrCat("train ", Recipe("one"), " --set run.out_dir=", single));
  ASSERT_EQ(one.exit_code, 0) << one.stderr_text;
  const std::vector<double> reference = Losses(single);
  ASSERT_EQ(reference.size(), 8u);

  for (const char* strategy : {"ddp", "zero2", "fsdp"}) {
    const std::string out = OutDir(strategy);
    const auto ranks = testing::RunLocalProcesses(
        {DTRAIN_BINARY, "train", Recipe(strategy), "--set", "run.out_dir=" + out, "--set",
         absl::StrCat("parallel.strategy=", strategy)},
        2, testing::FreeTcpPort(), absl::Seconds(120));
    for (const auto& rank : ranks) ASSERT_EQ(rank.exit_code, 0) << strategy << rank.output;
    EXPECT_THAT(ranks[0].output, HasSubstr("model state per rank"));
    const std::vector<double> losses = Losses(out);
    ASSERT_EQ(losses.size(), reference.size()) << strategy;
    for (size_t i = 0; i < losses.size(); ++i) {
      EXPECT_NEAR(losses[i], reference[i], 1e-5 * reference[i]) << strategy << " step " << i + 1;
    }
  }
}

// A batch that does not split over the ranks' micro-batches is refused by every rank, which
// names both fixes: a larger batch, or the largest micro-batch that splits each rank's share.
TEST(TrainMultiProcessTest, ABatchThatDoesNotSplitNamesBothFixes) {
  const auto ranks = testing::RunTrainRanks(
      Recipe("split"), 2, {"run.out_dir=" + OutDir("split"), "train.micro_batch=8"});
  for (const auto& rank : ranks) {
    EXPECT_EQ(rank.exit_code, 2) << rank;  // a usage error, before any rank connects
    EXPECT_THAT(rank.output, HasSubstr("train.batch_size 8 does not split into 2 data-parallel "
                                       "ranks x micro-batches of train.micro_batch 8; make "
                                       "batch_size a multiple of 16, or train.micro_batch 4"));
  }
}

// On CPU ranks auto takes the simplest layout that fits: plain data parallelism here, where the
// plan's GPU timings put zero3 first (measured the slowest of the layouts on this machine).
TEST(TrainMultiProcessTest, AutoOnCpuRanksTakesTheSimplestLayoutThatFits) {
  const auto ranks = testing::RunTrainRanks(
      Recipe("auto"), 2, {"run.out_dir=" + OutDir("auto"), "parallel.strategy=auto"});
  for (const auto& rank : ranks) {
    ASSERT_EQ(rank.exit_code, 0) << rank;
    EXPECT_THAT(rank.output, HasSubstr("parallel.strategy auto: ddp, tp 1, pp 1, micro_batch "));
    EXPECT_THAT(rank.output, HasSubstr("(the simplest layout that fits for 2 ranks of "));
  }
}

// So are WebDataset streams that do not split over the data-parallel ranks (each owns whole
// streams), before any shard is read (these do not exist) or any rank connects.
TEST(TrainMultiProcessTest, StreamsThatDoNotSplitAreAUsageError) {
  const auto ranks =
      testing::RunTrainRanks(Recipe("streams"), 2,
                             {"run.out_dir=" + OutDir("streams"), "data.format=webdataset",
                              "data.shards=" + OutDir("streams") + "/missing-{0..3}.tar",
                              "data.streams=3", "train.eval_every=0"});
  for (const auto& rank : ranks) {
    EXPECT_EQ(rank.exit_code, 2) << rank;
    EXPECT_THAT(rank.output, HasSubstr("data.streams = 3 is not a multiple of the 2 data-parallel "
                                       "ranks"));
  }
}

// `dtrain train` of `recipe` with `sets` as the child of RunRanksAsProcesses (it never returns).
int ExecTrain(const std::string& recipe, const std::vector<std::string>& sets) {
  std::vector<std::string> argv = {DTRAIN_BINARY, "train", recipe};
  for (const std::string& set : sets) {
    argv.push_back("--set");
    argv.push_back(set);
  }
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  execv(args[0], args.data());
  return 127;
}

// Two machines of one rank each (LOCAL_WORLD_SIZE 1, as torchrun sets it on each) and tp 2: the
// tp group spans them, which trains, and rank 0 warns that its all-reduces cross the network.
TEST(TrainMultiProcessTest, ATensorParallelGroupAcrossMachinesIsWarnedOf) {
  const std::string recipe = Recipe("tp_across");
  const std::string out = OutDir("tp_across");
  const auto ranks =
      testing::RunRanksAsProcesses(2, testing::FreeTcpPort(), absl::Seconds(120), [&](int) {
        setenv("LOCAL_WORLD_SIZE", "1", 1);
        setenv("LOCAL_RANK", "0", 1);
        setenv("DTRAIN_RDZV_TOKEN", "tp-across-test", 1);
        return ExecTrain(recipe, {"run.out_dir=" + out, "parallel.tp=2", "train.steps=2"});
      });
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_EQ(ranks[rank].exit_code, 0) << "rank " << rank << ranks[rank].output;
  }
  EXPECT_THAT(ranks[0].output,
              HasSubstr("parallel.tp 2 spans machines of 1 rank(s) each: its all-reduces, two a "
                        "block, cross the network; keep tp within a machine"));
}

// Two machines of one rank each whose checkpoint.dir is a folder of each machine's own (rank 1's
// a tmpfs over it, in a mount namespace of its own): refused at the start, exit 2 on both ranks,
// naming rank 1. The first save found it, waiting out parallel.timeout_s after the training.
TEST(TrainMultiProcessTest, ACheckpointFolderTheMachinesDoNotShareIsRefusedAtTheStart) {
  if (geteuid() != 0 || std::system("unshare -m true 2>/dev/null") != 0) {
    GTEST_SKIP() << "needs root and a mount namespace (unshare -m) to give rank 1 its own folder";
  }
  const std::string recipe = Recipe("unshared");
  const std::string out = OutDir("unshared");
  const std::string checkpoints = out + "/ckpt";
  std::filesystem::create_directories(checkpoints);
  const auto ranks =
      testing::RunRanksAsProcesses(2, testing::FreeTcpPort(), absl::Seconds(120), [&](int rank) {
        setenv("LOCAL_WORLD_SIZE", "1", 1);
        setenv("LOCAL_RANK", "0", 1);
        setenv("DTRAIN_RDZV_TOKEN", "unshared-test", 1);
        if (rank == 1 && (unshare(CLONE_NEWNS) != 0 ||
                          mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
                          mount("none", checkpoints.c_str(), "tmpfs", 0, "size=1m") != 0)) {
          return 126;
        }
        return ExecTrain(recipe, {"run.out_dir=" + out, "checkpoint.dir=" + checkpoints});
      });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(ranks[rank].exit_code, 2) << "rank " << rank << ranks[rank];
    EXPECT_THAT(ranks[rank].output, ::testing::Not(HasSubstr("step 1/"))) << "rank " << rank;
  }
  EXPECT_THAT(ranks[0].output, HasSubstr(absl::StrCat("checkpoint.dir ", checkpoints,
                                                      " is not one folder for every rank: rank 1 "
                                                      "does not see the file rank 0 wrote there")));
  EXPECT_TRUE(std::filesystem::is_empty(checkpoints));
}

// Ranks of different jobs fail before they connect, every one at once, naming the difference:
// rank 1 with another model depth, then rank 1 started for another world size. Before, the
// first crashed in Gloo's first mismatched all-reduce and the second timed out.
TEST(TrainMultiProcessTest, RanksOfDifferentJobsFailNamingTheDifference) {
  const std::string recipe = Recipe("different");
  const std::string out = OutDir("different");
  const std::vector<std::string> sets = {"run.out_dir=" + out, "parallel.timeout_s=300"};
  const auto deeper =
      testing::RunRanksAsProcesses(2, testing::FreeTcpPort(), absl::Seconds(60), [&](int rank) {
        std::vector<std::string> own = sets;
        if (rank == 1) own.push_back("model.n_layer=3");
        return ExecTrain(recipe, own);
      });
  for (const testing::RankResult& rank : deeper) {
    EXPECT_FALSE(rank.timed_out) << rank.output;
    EXPECT_EQ(rank.exit_code, 2) << rank.output;  // a usage error, which no restart mends
    EXPECT_THAT(rank.output, HasSubstr("rank 1's resolved recipe differs from rank 0's: "
                                       "`model.n_layer: 3` there, `model.n_layer: 2` on rank 0"));
  }
  const auto wider =
      testing::RunRanksAsProcesses(2, testing::FreeTcpPort(), absl::Seconds(60), [&](int rank) {
        if (rank == 1) {
          setenv("WORLD_SIZE", "4", 1);
          setenv("LOCAL_WORLD_SIZE", "4", 1);
        }
        return ExecTrain(recipe, sets);
      });
  EXPECT_EQ(wider[1].exit_code, 2) << wider[1].output;
  EXPECT_THAT(wider[1].output,
              HasSubstr("rank 1 was started for a world of 4 ranks, rank 0 for 2"));
}

// Two processes started as rank 1: the second to arrive fails at once naming the duplicate, and
// the job trains with the first.
TEST(TrainMultiProcessTest, ADuplicateRankIsRefused) {
  const std::string recipe = Recipe("duplicate");
  const std::string out = OutDir("duplicate");
  const auto ranks =
      testing::RunRanksAsProcesses(3, testing::FreeTcpPort(), absl::Seconds(120), [&](int rank) {
        setenv("WORLD_SIZE", "2", 1);
        setenv("LOCAL_WORLD_SIZE", "2", 1);
        if (rank == 2) {
          setenv("RANK", "1", 1);
          setenv("LOCAL_RANK", "1", 1);
        }
        return ExecTrain(recipe, {"run.out_dir=" + out});
      });
  EXPECT_EQ(ranks[0].exit_code, 0) << ranks[0].output;
  const bool second_refused = ranks[2].exit_code != 0;
  const testing::RankResult& refused = ranks[second_refused ? 2 : 1];
  const testing::RankResult& trained = ranks[second_refused ? 1 : 2];
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_THAT(refused.output, HasSubstr("rank 1 has joined the rendezvous at 127.0.0.1:"));
  EXPECT_THAT(refused.output, HasSubstr("a duplicate RANK"));
  EXPECT_EQ(trained.exit_code, 0) << trained.output;
}

TEST(TrainMultiProcessTest, ARankThatNeverArrivesIsNamedWithinTheTimeout) {
  const std::string recipe = Recipe("missing");
  const std::string out = OutDir("missing");
  const auto ranks =
      testing::RunRanksAsProcesses(2, testing::FreeTcpPort(), absl::Seconds(120), [&](int rank) {
        if (rank == 1) return 0;  // never shows up
        const std::vector<std::string> argv = {
            DTRAIN_BINARY,         "train", recipe, "--set", "run.out_dir=" + out, "--set",
            "parallel.timeout_s=3"};
        std::vector<char*> args;
        for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
        args.push_back(nullptr);
        execv(args[0], args.data());
        return 127;
      });
  EXPECT_FALSE(ranks[0].timed_out);  // ended by the 3 s rendezvous timeout, not the 120 s cap
  EXPECT_EQ(ranks[0].exit_code, 1) << ranks[0].output;
  EXPECT_THAT(ranks[0].output, HasSubstr("within 3s"));
  EXPECT_THAT(ranks[0].output, HasSubstr("rank(s) 1 never joined"));
}

// Rank 1's data file is missing (rank 0's is there: the same relative path from another
// folder): rank 1 fails after rendezvous and must not wait for rank 0, and rank 0, in its first
// collective, fails at once naming rank 1 and its error, long before the 300 s timeout.
TEST(TrainMultiProcessTest, ARankThatFailsEndsTheOthersAtOnceNamingIt) {
  const std::string recipe = Recipe("fails");
  const std::string out = OutDir("fails");
  const std::string missing = "mp_relative_text.txt";
  const std::string with_data = testing::FreshTempDir("mp_with_data");
  const std::string without = testing::FreshTempDir("mp_without_data");
  std::filesystem::create_directories(with_data);
  std::filesystem::create_directories(without);
  std::ofstream(with_data + "/" + missing) << std::string(4000, 'a');
  const auto ranks =
      testing::RunRanksAsProcesses(2, testing::FreeTcpPort(), absl::Seconds(60), [&](int rank) {
        if (chdir((rank == 0 ? with_data : without).c_str()) != 0) return 126;
        return ExecTrain(recipe, {"run.out_dir=" + out, "parallel.timeout_s=300",
                                  "data.train=[" + missing + "]"});
      });
  // Rank 1's missing file is a usage error (exit 2, which an agent does not restart); rank 0
  // fails because rank 1 did.
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_FALSE(ranks[rank].timed_out) << "rank " << rank << ranks[rank].output;
    EXPECT_EQ(ranks[rank].exit_code, rank == 1 ? 2 : 1) << "rank " << rank << ranks[rank].output;
    EXPECT_THAT(ranks[rank].output, HasSubstr(missing)) << "rank " << rank;
  }
  EXPECT_THAT(ranks[0].output, HasSubstr("rank 1 failed: data.train: file pattern '" + missing))
      << ranks[0].output;
}

TEST(TrainMultiProcessTest, UnresolvableMasterFailsAtOnceNamingIt) {
  const testing::Outcome outcome = testing::RunDtrain(
      absl::StrCat("train ", Recipe("unresolvable")),
      "env RANK=1 WORLD_SIZE=2 MASTER_ADDR=no-such-host.invalid MASTER_PORT=29555");
  EXPECT_EQ(outcome.exit_code, 2);  // a usage error, which the agent does not restart
  EXPECT_THAT(outcome.stderr_text,
              HasSubstr("master address 'no-such-host.invalid' (MASTER_ADDR=no-such-host.invalid) "
                        "does not resolve"));
}

// A rank slowed by 80 ms a step (DTRAIN_TEST_SLOW_RANK, test only) among three is the straggler
// of every step: named in the step log and metrics.jsonl, and at the end as persistently slow.
// The others' steps take a few ms of compute, so its lag is far beyond the 10% threshold.
TEST(TrainMultiProcessTest, ASlowRankIsNamedAsTheStraggler) {
  const std::string out = OutDir("straggler");
  setenv("DTRAIN_TEST_SLOW_RANK", "1:80", 1);
  const auto ranks = testing::RunLocalProcesses(
      {DTRAIN_BINARY, "train", Recipe("straggler"), "--set", "run.out_dir=" + out, "--set",
       "train.eval_every=0", "--set", "logging.sample_tokens=0", "--set", "train.batch_size=6"},
      3, testing::FreeTcpPort(), absl::Seconds(120));
  unsetenv("DTRAIN_TEST_SLOW_RANK");
  for (const auto& rank : ranks) ASSERT_EQ(rank.exit_code, 0) << rank;
  EXPECT_THAT(ranks[0].output, HasSubstr("| straggler rank 1 +"));
  EXPECT_THAT(ranks[0].output,
              HasSubstr("persistently slow: rank 1 was the straggler in 8 of 8 steps"));
  std::ifstream metrics(out + "/mp/metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(metrics, line); ++lines) {
    EXPECT_THAT(line, HasSubstr("\"straggler_rank\":1")) << line;
  }
  EXPECT_EQ(lines, 8);
}

}  // namespace
}  // namespace dtrain
