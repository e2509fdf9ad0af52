// Checkpoints across real processes (torchrun's variables on loopback): a run killed with SIGKILL
// and resumed continues bit-identically; checkpoints load into other world sizes and strategies;
// SIGTERM makes every rank save and exit 143; without an agent, so do SIGINT and SIGHUP.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/util/exit_codes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/multi_process.h"
#include "tests/testing/run_dtrain.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// Ranks started as processes that the test can signal while they run: the first `started` of
// the world's (all by default; fewer leave them waiting for the others).
class Ranks {
 public:
  Ranks(int world, const std::vector<std::string>& argv, int started = -1) : logs_(world) {
    const int port = testing::FreeTcpPort();
    for (int rank = 0; rank < (started < 0 ? world : started); ++rank) {
      logs_[rank] = testing::TempPath(absl::StrCat("ckpt_rank", rank, "_", port, ".log"));
      const pid_t pid = fork();
      if (pid == 0) {
        const int fd = ::open(logs_[rank].c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        setenv("RANK", std::to_string(rank).c_str(), 1);
        setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
        setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
        setenv("LOCAL_WORLD_SIZE", std::to_string(world).c_str(), 1);
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
        // As a terminal's shell starts a command (a background job's shell would leave SIGINT
        // ignored, and dtrain keeps it so).
        signal(SIGINT, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
        std::vector<char*> args;
        for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
        args.push_back(nullptr);
        execv(args[0], args.data());
        _exit(127);
      }
      pids_.push_back(pid);
    }
  }
  ~Ranks() { (void)Wait(absl::Seconds(1)); }

  void Signal(int signal) {
    for (const pid_t pid : pids_) {
      if (pid > 0) kill(pid, signal);
    }
  }
  void SignalRank(int rank, int signal) { kill(pids_[rank], signal); }
  pid_t Pid(int rank) const { return pids_[rank]; }
  // Exit codes (128 + signal when killed); stragglers past the timeout are SIGKILLed.
  std::vector<int> Wait(absl::Duration timeout) {
    std::vector<int> codes(pids_.size(), -1);
    const absl::Time deadline = absl::Now() + timeout;
    for (size_t r = 0; r < pids_.size(); ++r) {
      if (pids_[r] <= 0) continue;
      int status = 0;
      while (waitpid(pids_[r], &status, WNOHANG) == 0) {
        if (absl::Now() > deadline) kill(pids_[r], SIGKILL);
        absl::SleepFor(absl::Milliseconds(2));
      }
      codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      pids_[r] = -1;
    }
    return codes;
  }
  std::string Log(int rank) const {
    std::ifstream in(logs_[rank]);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  std::vector<pid_t> pids_;
  std::vector<std::string> logs_;
};

std::string RecipeFile(int d_model) {
  std::string text;
  for (int i = 0; i < 500; ++i)
    absl::StrAppend(&text, "How vexingly quick daft zebras jump ", i % 9, "!\n");
  const std::string data = testing::WriteTempFile("ckpt_mp_text.txt", text);
  return testing::WriteTempFile(absl::StrCat("ckpt_mp_", d_model, ".yaml"),
                                absl::StrCat(R"(
run: {name: mp, seed: 11, threads: 1}
model: {n_layer: 2, n_head: 2, d_model: )",
                                             d_model, R"(, max_seq_len: 32}
data: {train: [)",
                                             data, R"(]}
train: {steps: 12, batch_size: 12, micro_batch: 1, seq_len: 16, warmup_steps: 2, eval_every: 0,
        export_to: model.safetensors}
parallel: {bucket_mb: 0.01, prefetch_bucket_mb: 0.01, timeout_s: 30}
checkpoint: {interval: 3, keep_last: 10}
)"));
}

std::string OutDir(const std::string& name) { return testing::FreshTempDir("ckpt_mp_" + name); }

std::vector<std::string> TrainArgs(const std::string& recipe, const std::string& out,
                                   const std::vector<std::string>& sets) {
  std::vector<std::string> argv = {DTRAIN_BINARY, "train", recipe, "--set", "run.out_dir=" + out};
  for (const std::string& set : sets) {
    argv.push_back("--set");
    argv.push_back(set);
  }
  return argv;
}

// Runs to the end; every rank must exit 0.
void RunToEnd(int world, const std::vector<std::string>& argv) {
  Ranks ranks(world, argv);
  const std::vector<int> codes = ranks.Wait(absl::Seconds(120));
  for (int r = 0; r < world; ++r) ASSERT_EQ(codes[r], 0) << "rank " << r << ":\n" << ranks.Log(r);
}

std::vector<nlohmann::json> Metrics(const std::string& out) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(out + "/mp/metrics.jsonl");
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

// `dtrain data pack` of `documents` text files of 20 lines (about 900 tokens each) into 8 KB
// shards (two documents each) in `shards`.
testing::Outcome PackDocuments(int documents, const std::string& shards) {
  std::string inputs;
  for (int d = 0; d < documents; ++d) {
    std::string text;
    for (int line = 0; line < 20; ++line) {
      absl::StrAppend(&text, "Document ", d, " line ", line, ": five boxing wizards jump.\n");
    }
    absl::StrAppend(&inputs, " ", testing::WriteTempFile(absl::StrCat("wds_doc", d, ".txt"), text));
  }
  return testing::RunDtrain(
      absl::StrCat("data pack", inputs, " --out ", shards, " --shard-size 8KB"));
}

std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// 2N steps straight vs killed after a checkpoint, resumed: identical losses and parameters.
void ExpectBitIdenticalAfterSigkill(const std::string& strategy, bool async,
                                    const std::string& precision = "fp32") {
  const std::string recipe = RecipeFile(64);
  const std::vector<std::string> sets = {
      "parallel.strategy=" + strategy, absl::StrCat("checkpoint.async=", async ? "true" : "false"),
      "train.steps=40", "checkpoint.interval=4", "run.precision=" + precision};
  const std::string straight = OutDir(strategy + "_" + precision + "_straight");
  RunToEnd(2, TrainArgs(recipe, straight, sets));
  if (::testing::Test::HasFatalFailure()) return;

  const std::string killed = OutDir(strategy + "_" + precision + "_killed");
  {
    Ranks ranks(2, TrainArgs(recipe, killed, sets));
    const std::string latest = killed + "/mp/checkpoints/latest";
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (!fs::exists(latest) && absl::Now() < deadline) absl::SleepFor(absl::Microseconds(500));
    ranks.Signal(SIGKILL);
    const std::vector<int> codes = ranks.Wait(absl::Seconds(10));
    EXPECT_EQ(codes[0], 128 + SIGKILL) << ranks.Log(0);
  }
  ASSERT_FALSE(fs::exists(killed + "/mp/checkpoints/step-40")) << "the run ended before the kill";
  Ranks resumed(2, TrainArgs(recipe, killed, sets));
  const std::vector<int> codes = resumed.Wait(absl::Seconds(120));
  ASSERT_EQ(codes[0], 0) << resumed.Log(0);
  ASSERT_EQ(codes[1], 0) << resumed.Log(1);
  EXPECT_THAT(resumed.Log(0), HasSubstr("resumed from"));

  const std::vector<nlohmann::json> a = Metrics(straight), b = Metrics(killed);
  ASSERT_EQ(a.size(), 40u);
  ASSERT_EQ(b.size(), 40u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]["loss"].get<double>(), b[i]["loss"].get<double>())
        << strategy << " step " << i + 1;
    EXPECT_EQ(a[i]["grad_norm"].get<double>(), b[i]["grad_norm"].get<double>());
  }
  const std::string weights = FileBytes(straight + "/mp/model.safetensors");
  ASSERT_FALSE(weights.empty());
  EXPECT_TRUE(weights == FileBytes(killed + "/mp/model.safetensors"))
      << strategy << ": the final parameters differ";
}

TEST(CheckpointMultiProcessTest, DdpContinuesBitIdenticallyAfterSigkill) {
  ExpectBitIdenticalAfterSigkill("ddp", /*async=*/true);
}

TEST(CheckpointMultiProcessTest, Zero3ContinuesBitIdenticallyAfterSigkill) {
  ExpectBitIdenticalAfterSigkill("zero3", /*async=*/false);
}

// bf16 parameters: the checkpoint holds the float32 masters (ZeRO-2 keeps them apart from the
// rounded parameters it computes with), so the resumed run rounds the same values again. Saving
// the rounded parameters instead would change every later step.
TEST(CheckpointMultiProcessTest, Zero2AtBf16ParametersContinuesBitIdenticallyAfterSigkill) {
  ExpectBitIdenticalAfterSigkill("zero2", /*async=*/false, "bf16");
}

struct Layout {
  const char* strategy;
  int world;
};

TEST(CheckpointMultiProcessTest, CheckpointsLoadIntoOtherWorldSizesAndStrategies) {
  const std::string recipe = RecipeFile(32);
  const std::pair<Layout, Layout> pairs[] = {{{"zero3", 4}, {"ddp", 2}},
                                             {{"ddp", 2}, {"zero2", 3}},
                                             {{"fsdp", 2}, {"ddp", 1}},
                                             {{"ddp", 1}, {"zero1", 2}}};
  for (const auto& [saved, loaded] : pairs) {
    const std::string name =
        absl::StrCat(saved.strategy, saved.world, "_", loaded.strategy, loaded.world);
    SCOPED_TRACE(name);
    const std::string first = OutDir(name + "_a");
    RunToEnd(saved.world,
             TrainArgs(recipe, first, {absl::StrCat("parallel.strategy=", saved.strategy)}));
    // Every value is written once, whatever the layout: the files hold exactly the state.
    std::ifstream manifest_file(first + "/mp/checkpoints/step-6/manifest.json");
    const nlohmann::json manifest = nlohmann::json::parse(manifest_file);
    int64_t state_bytes = 0, file_bytes = 0;
    for (const auto& tensor : manifest["tensors"])
      state_bytes += 4 * tensor["numel"].get<int64_t>();
    for (const auto& file : manifest["files"]) file_bytes += file["bytes"].get<int64_t>();
    EXPECT_EQ(file_bytes, state_bytes);
    EXPECT_EQ(manifest["files"].size(), static_cast<size_t>(saved.world));
    const std::string second = OutDir(name + "_b");
    RunToEnd(loaded.world, TrainArgs(recipe, second,
                                     {absl::StrCat("parallel.strategy=", loaded.strategy),
                                      "checkpoint.resume=" + first + "/mp/checkpoints/step-6"}));
    const std::vector<nlohmann::json> reference = Metrics(first), resumed = Metrics(second);
    ASSERT_EQ(reference.size(), 12u);
    ASSERT_EQ(resumed.size(), 6u);  // steps 7..12
    for (size_t i = 0; i < resumed.size(); ++i) {
      ASSERT_EQ(resumed[i]["step"].get<int>(), static_cast<int>(i) + 7);
      const double expected = reference[i + 6]["loss"].get<double>();
      EXPECT_NEAR(resumed[i]["loss"].get<double>(), expected, 1e-5 * expected) << "step " << i + 7;
    }
  }
}

// A resume with another train.batch_size reads on from the first sequence the checkpoint did not
// consume, on any number of ranks: 6 steps of 12 (72 sequences), then steps of 20, on one rank
// and on two (72 is no multiple of 20, nor of a rank's 10), give the same losses.
TEST(CheckpointMultiProcessTest, AResumeWithAnotherBatchSizeReadsOnFromTheNextSequence) {
  const std::string recipe = RecipeFile(32);
  const std::string first = OutDir("batch12");
  RunToEnd(1, TrainArgs(recipe, first, {}));
  if (::testing::Test::HasFatalFailure()) return;
  std::vector<std::vector<nlohmann::json>> resumed;
  for (const int world : {1, 2}) {
    const std::string out = OutDir(absl::StrCat("batch20_on_", world));
    RunToEnd(world, TrainArgs(recipe, out,
                              {"train.batch_size=20",
                               "checkpoint.resume=" + first + "/mp/checkpoints/step-6"}));
    resumed.push_back(Metrics(out));
  }
  ASSERT_EQ(resumed[0].size(), 6u);
  ASSERT_EQ(resumed[1].size(), 6u);
  for (size_t i = 0; i < resumed[0].size(); ++i) {
    const double expected = resumed[0][i]["loss"].get<double>();
    EXPECT_NEAR(resumed[1][i]["loss"].get<double>(), expected, 1e-5 * expected) << "step " << i + 7;
  }
}

TEST(CheckpointMultiProcessTest, SigtermMakesEveryRankSaveAndExitCleanly) {
  const std::string recipe = RecipeFile(32);
  const std::string out = OutDir("sigterm");
  Ranks ranks(
      2, TrainArgs(recipe, out,
                   {"parallel.strategy=zero2", "train.steps=100000", "checkpoint.interval=0"}));
  const std::string metrics = out + "/mp/metrics.jsonl";
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline && (!fs::exists(metrics) || fs::file_size(metrics) < 500)) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ranks.Signal(SIGTERM);
  const std::vector<int> codes = ranks.Wait(absl::Seconds(60));
  // Stopped is not finished: 143, as a process SIGTERM ended, after the save.
  ASSERT_EQ(codes[0], kExitStopped) << ranks.Log(0);
  ASSERT_EQ(codes[1], kExitStopped) << ranks.Log(1);
  EXPECT_THAT(ranks.Log(0), HasSubstr("stopped by SIGTERM at step"));
  const std::string latest = FileBytes(out + "/mp/checkpoints/latest");
  ASSERT_THAT(latest, HasSubstr("step-"));
  const std::string step_dir = out + "/mp/checkpoints/" + latest.substr(0, latest.size() - 1);
  const testing::Outcome inspect = testing::RunDtrain("ckpt inspect " + step_dir);
  EXPECT_EQ(inspect.exit_code, 0) << inspect.stdout_text;
  EXPECT_THAT(inspect.stdout_text, HasSubstr("saved by 2 rank(s): zero2"));
}

// Two shards of PackDocuments(8) in `dir`, the second of which stalls: its command writes the
// first document (3,584 bytes) and the next one's tokens (a sample ends where the next begins),
// then nothing, as data.shards.
std::string ShardsOneOfWhichStalls(const std::string& dir) {
  const testing::Outcome pack = PackDocuments(8, dir);
  EXPECT_EQ(pack.exit_code, 0) << pack.stderr_text;
  return absl::StrCat(dir, "/shard-000000.tar::pipe:head -c 6200 ", dir,
                      "/shard-000001.tar; exec sleep 100");
}

// Waits up to 60 s for the rank's warning that it waits on its data (after 10 s of it).
void AwaitDataStallWarning(const Ranks& ranks, int rank) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline &&
         ranks.Log(rank).find("for this rank's data") == std::string::npos) {
    absl::SleepFor(absl::Milliseconds(20));
  }
}

// Rank 1's shard stalls (its command writes part of a tar, then nothing), so rank 1 waits for
// its data while rank 0 waits for rank 1. A SIGTERM then still stops the run within seconds with
// the last step's checkpoint; before, rank 1 heard it only once the shard command timed out, long
// after a launcher's grace period would have killed it with nothing saved.
TEST(CheckpointMultiProcessTest, SigtermWhileARankWaitsOnAStalledShardSaves) {
  // No shard shuffle and two streams over two shards: rank 0 reads only the first shard, rank 1
  // only the second, which stalls after about 8 steps.
  const std::string urls = ShardsOneOfWhichStalls(OutDir("stalled_shards"));
  const std::string out = OutDir("stalled");
  Ranks ranks(2, TrainArgs(RecipeFile(32), out,
                           {"data.format=webdataset", "data.shards=" + urls, "data.streams=2",
                            "data.shard_shuffle=false", "data.shuffle_buffer=1",
                            "data.pipe_timeout_s=100", "data.train=[]", "train.steps=100000",
                            "checkpoint.interval=0", "parallel.timeout_s=100"}));
  AwaitDataStallWarning(ranks, 1);
  ASSERT_THAT(ranks.Log(1), HasSubstr("a shard's read stalls (data.http_timeout_s and "
                                      "data.pipe_timeout_s end it; a SIGTERM now saves step "));
  const size_t steps = Metrics(out).size();
  ASSERT_GE(steps, 1u);
  const absl::Time signalled = absl::Now();
  ranks.Signal(SIGTERM);
  const std::vector<int> codes = ranks.Wait(absl::Seconds(60));
  EXPECT_LT(absl::Now() - signalled, absl::Seconds(20));
  ASSERT_EQ(codes[0], kExitStopped) << ranks.Log(0);
  ASSERT_EQ(codes[1], kExitStopped) << ranks.Log(1);
  // The step the ranks had trained when the data stalled is logged and saved with the stop.
  EXPECT_EQ(Metrics(out).size(), steps + 1);
  EXPECT_EQ(FileBytes(out + "/mp/checkpoints/latest"), absl::StrCat("step-", steps + 1, "\n"));
  EXPECT_THAT(ranks.Log(0), HasSubstr(absl::StrCat("stopped by SIGTERM at step ", steps + 1)));
}

// A shard that stalls before the first step (the stream fills its shuffle buffer from it): a
// SIGTERM stops the run at once, with nothing trained to save; before, the rank heard it only
// once the data came, and under data.on_error: skip_shard that could be never.
TEST(CheckpointMultiProcessTest, SigtermWhileTheFirstStepWaitsOnAStalledShardStops) {
  const std::string urls = ShardsOneOfWhichStalls(OutDir("stalled_first_shards"));
  const std::string out = OutDir("stalled_first");
  Ranks ranks(1, TrainArgs(RecipeFile(32), out,
                           {"data.format=webdataset", "data.shards=" + urls, "data.streams=1",
                            "data.shard_shuffle=false", "data.pipe_timeout_s=100",
                            "data.on_error=skip_shard", "data.train=[]"}));
  AwaitDataStallWarning(ranks, 0);
  ASSERT_THAT(ranks.Log(0), HasSubstr("waited 10 s for this rank's data of step 1: a shard's read "
                                      "stalls (data.http_timeout_s and data.pipe_timeout_s end "
                                      "it; a SIGTERM now stops the run)"));
  const absl::Time signalled = absl::Now();
  ranks.Signal(SIGTERM);
  const std::vector<int> codes = ranks.Wait(absl::Seconds(60));
  EXPECT_LT(absl::Now() - signalled, absl::Seconds(20));
  ASSERT_EQ(codes[0], kExitStopped) << ranks.Log(0);
  EXPECT_THAT(ranks.Log(0), HasSubstr("stopped by SIGTERM before step 1, with nothing trained"));
  EXPECT_FALSE(fs::exists(out + "/mp/checkpoints/latest"));
}

// Without an agent, Ctrl-C and a closed terminal stop a run as SIGTERM does, saving its last step
// (they killed it with nothing saved).
TEST(CheckpointMultiProcessTest, SigintAndSighupSaveTheLastStepAndStop) {
  const std::string recipe = RecipeFile(32);
  for (const int signal : {SIGINT, SIGHUP}) {
    const std::string name = signal == SIGINT ? "SIGINT" : "SIGHUP";
    const std::string out = OutDir(name);
    Ranks ranks(1, TrainArgs(recipe, out, {"train.steps=100000", "checkpoint.interval=0"}));
    const std::string metrics = out + "/mp/metrics.jsonl";
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (absl::Now() < deadline && (!fs::exists(metrics) || fs::file_size(metrics) < 500)) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    ranks.SignalRank(0, signal);
    const std::vector<int> codes = ranks.Wait(absl::Seconds(60));
    ASSERT_EQ(codes[0], kExitStopped) << ranks.Log(0);
    EXPECT_THAT(ranks.Log(0), HasSubstr("stopped by " + name + " at step"));
    EXPECT_THAT(FileBytes(out + "/mp/checkpoints/latest"), HasSubstr("step-")) << name;
  }
}

// Whether process `pid` catches `signal` (its handler is installed): /proc's SigCgt mask.
bool Catches(pid_t pid, int signal) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("SigCgt:", 0) == 0) {
      return (std::stoull(line.substr(7), nullptr, 16) >> (signal - 1)) & 1;
    }
  }
  return false;
}

// A SIGTERM while the ranks set up past their rendezvous (each reads its data's first shard,
// which takes 3 s to come) stops them together before their first step with exit 143: the ranks
// did not handle it yet, died, and the launch exited 1 (in 1 of 15-20 preemptions of a starting
// job). The ranks are signalled once they catch SIGTERM, at the latest after 2.5 s.
TEST(CheckpointMultiProcessTest, ASigtermDuringStartUpStopsEveryRankBeforeTheFirstStep) {
  const std::string dir = OutDir("sigterm_start_up_shards");
  ASSERT_EQ(PackDocuments(8, dir).exit_code, 0);
  const std::string out = OutDir("sigterm_start_up");
  Ranks ranks(2, TrainArgs(RecipeFile(32), out,
                           {"data.format=webdataset", "data.train=[]", "data.streams=2",
                            "data.shards=pipe:sleep 3; cat " + dir + "/shard-000000.tar",
                            "train.steps=5"}));
  const absl::Time deadline = absl::Now() + absl::Milliseconds(2500);
  while (absl::Now() < deadline &&
         !(Catches(ranks.Pid(0), SIGTERM) && Catches(ranks.Pid(1), SIGTERM))) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ranks.Signal(SIGTERM);
  const std::vector<int> codes = ranks.Wait(absl::Seconds(60));
  EXPECT_EQ(codes[0], kExitStopped) << ranks.Log(0);
  EXPECT_EQ(codes[1], kExitStopped) << ranks.Log(1);
  EXPECT_THAT(ranks.Log(0), HasSubstr("stopped by SIGTERM while the first shard was read"));
}

// The first shard's first sample (its tokenizer record), read at start-up, stalls: a SIGTERM
// stops the run within a second with exit 143; it was heard only when the command timed out, and
// the run then failed with exit 1.
TEST(CheckpointMultiProcessTest, SigtermWhileTheFirstShardsRecordIsReadStops) {
  const std::string dir = OutDir("stalled_record_shards");
  ASSERT_EQ(PackDocuments(8, dir).exit_code, 0);
  const std::string out = OutDir("stalled_record");
  Ranks ranks(1, TrainArgs(RecipeFile(32), out,
                           {"data.format=webdataset", "data.train=[]",
                            "data.shards=pipe:sleep 100; cat " + dir + "/shard-000000.tar",
                            "data.pipe_timeout_s=100"}));
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline && !Catches(ranks.Pid(0), SIGTERM)) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  absl::SleepFor(absl::Milliseconds(500));  // into the read
  const absl::Time signalled = absl::Now();
  ranks.SignalRank(0, SIGTERM);
  const std::vector<int> codes = ranks.Wait(absl::Seconds(60));
  EXPECT_LT(absl::Now() - signalled, absl::Seconds(10));
  EXPECT_EQ(codes[0], kExitStopped) << ranks.Log(0);
  EXPECT_THAT(ranks.Log(0), HasSubstr("stopped by SIGTERM while the first shard was read"));
}

// The first Ctrl-C says at once what happens and how to quit; a second quits at once, unsaved.
TEST(CheckpointMultiProcessTest, ASecondSigintQuitsAtOnceUnsaved) {
  const std::string out = OutDir("sigint_twice");
  setenv("DTRAIN_TEST_SLOW_RANK", "0:5000", 1);  // each step sleeps 5 s first
  Ranks ranks(1, TrainArgs(RecipeFile(32), out, {"train.steps=100", "checkpoint.interval=0"}));
  unsetenv("DTRAIN_TEST_SLOW_RANK");
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline && ranks.Log(0).find("step 1/100") == std::string::npos) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ranks.SignalRank(0, SIGINT);  // during step 2's 5 s
  while (absl::Now() < deadline && ranks.Log(0).find("Ctrl-C again") == std::string::npos) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_THAT(ranks.Log(0),
              HasSubstr("SIGINT: the run saves a checkpoint at the end of this step"));
  ranks.SignalRank(0, SIGINT);
  const absl::Time signalled = absl::Now();
  const std::vector<int> codes = ranks.Wait(absl::Seconds(60));
  EXPECT_LT(absl::Now() - signalled, absl::Seconds(3));
  EXPECT_EQ(codes[0], 128 + SIGINT) << ranks.Log(0);
  EXPECT_FALSE(fs::exists(out + "/mp/checkpoints/latest"));
}

// A reader of the output that goes away (`| head`) costs the output, not the run: it trains to
// the end and saves (SIGPIPE killed it at its next log line).
TEST(CheckpointMultiProcessTest, AClosedOutputPipeCostsTheOutputNotTheRun) {
  const std::string out = OutDir("closed_pipe");
  const std::string exit_file = out + ".exit";
  const std::string command =
      absl::StrCat("{ ", DTRAIN_BINARY, " train ", RecipeFile(32), " --set run.out_dir=", out,
                   " --set train.steps=6 --set logging.every=1 2>&1; echo $? > ", exit_file,
                   "; } | head -c 1 > /dev/null");
  ASSERT_EQ(std::system(command.c_str()), 0);
  EXPECT_EQ(FileBytes(exit_file), "0\n");
  EXPECT_EQ(FileBytes(out + "/mp/checkpoints/latest"), "step-6\n");
}

// SIGUSR2 asks for the flight recorder's dump (`pkill -USR2 dtrain` on a job that hangs): it is
// never fatal, in a world of one (which records nothing; it ended the run unsaved) nor in a rank
// waiting for the others at the rendezvous. Both train on, or wait on, until SIGTERM stops them.
TEST(CheckpointMultiProcessTest, Sigusr2IsNeverFatal) {
  const std::string out = OutDir("sigusr2_alone");
  Ranks alone(1, TrainArgs(RecipeFile(32), out, {"train.steps=100000", "checkpoint.interval=0"}));
  Ranks waiting(2, TrainArgs(RecipeFile(32), OutDir("sigusr2_waiting"), {}), /*started=*/1);
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (!Catches(alone.Pid(0), SIGUSR2) || !Catches(waiting.Pid(0), SIGUSR2)) {
    ASSERT_LT(absl::Now(), deadline) << "SIGUSR2 is not caught:\n" << alone.Log(0);
    absl::SleepFor(absl::Milliseconds(5));
  }
  alone.SignalRank(0, SIGUSR2);
  waiting.SignalRank(0, SIGUSR2);
  const size_t lines_at_signal = Metrics(out).size();
  while (Metrics(out).size() < lines_at_signal + 3) {
    ASSERT_LT(absl::Now(), deadline) << "no steps after SIGUSR2:\n" << alone.Log(0);
    absl::SleepFor(absl::Milliseconds(5));
  }
  alone.Signal(SIGTERM);
  waiting.Signal(SIGTERM);
  EXPECT_EQ(alone.Wait(absl::Seconds(60))[0], kExitStopped) << alone.Log(0);
  EXPECT_NE(waiting.Wait(absl::Seconds(30))[0], 128 + SIGUSR2) << waiting.Log(0);
}

TEST(CheckpointMultiProcessTest, Sigusr1ToOneRankMakesAllSaveAndContinue) {
  const std::string recipe = RecipeFile(32);
  const std::string out = OutDir("sigusr1");
  Ranks ranks(
      2, TrainArgs(recipe, out,
                   {"parallel.strategy=zero3", "train.steps=100000", "checkpoint.interval=0"}));
  const std::string metrics = out + "/mp/metrics.jsonl";
  const std::string latest = out + "/mp/checkpoints/latest";
  absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline && (!fs::exists(metrics) || fs::file_size(metrics) < 500)) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ranks.SignalRank(1, SIGUSR1);  // only rank 1: both must save the same step
  while (absl::Now() < deadline && !fs::exists(latest)) absl::SleepFor(absl::Milliseconds(5));
  const std::string first = FileBytes(latest);
  ASSERT_THAT(first, HasSubstr("step-"));
  const size_t lines_at_save = Metrics(out).size();
  // Training goes on after the save.
  while (absl::Now() < deadline && Metrics(out).size() < lines_at_save + 5) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ranks.Signal(SIGTERM);
  const std::vector<int> codes = ranks.Wait(absl::Seconds(60));
  ASSERT_EQ(codes[0], kExitStopped) << ranks.Log(0);
  ASSERT_EQ(codes[1], kExitStopped) << ranks.Log(1);
  const std::string second = FileBytes(latest);
  EXPECT_NE(first, second);
  // Rank 0 logs the save (only the step line's ckpt field showed it).
  EXPECT_THAT(ranks.Log(0),
              HasSubstr("SIGUSR1: saving step " + first.substr(5, first.size() - 6) + " to " + out +
                        "/mp/checkpoints/" + first.substr(0, first.size() - 1)));
  const std::string first_dir = out + "/mp/checkpoints/" + first.substr(0, first.size() - 1);
  const testing::Outcome inspect = testing::RunDtrain("ckpt inspect " + first_dir);
  EXPECT_EQ(inspect.exit_code, 0) << inspect.stdout_text;
  EXPECT_THAT(inspect.stdout_text, HasSubstr("rank-1.bin"));
}

TEST(CheckpointMultiProcessTest, WebDatasetCursorContinuesInAnotherWorldSize) {
  const std::string shards = OutDir("wds_shards");
  const testing::Outcome pack = PackDocuments(24, shards);
  ASSERT_EQ(pack.exit_code, 0) << pack.stderr_text;
  // "... in N shards: DIR/shard-{000000..00000K}.tar"
  const size_t pattern_at = pack.stdout_text.find(shards + "/shard-{");
  ASSERT_NE(pattern_at, std::string::npos) << pack.stdout_text;
  const std::string pattern = pack.stdout_text.substr(
      pattern_at, pack.stdout_text.find(".tar", pattern_at) + 4 - pattern_at);
  const std::vector<std::string> sets = {"data.format=webdataset", "data.shards=" + pattern,
                                         "data.streams=4", "data.shuffle_buffer=64",
                                         "data.train=[]"};
  const std::string recipe = RecipeFile(32);
  const std::string first = OutDir("wds_a");
  std::vector<std::string> a = sets;
  a.push_back("parallel.strategy=ddp");
  RunToEnd(2, TrainArgs(recipe, first, a));
  if (::testing::Test::HasFatalFailure()) return;
  const std::string second = OutDir("wds_b");
  std::vector<std::string> b = sets;
  b.push_back("parallel.strategy=zero3");
  b.push_back("checkpoint.resume=" + first + "/mp/checkpoints/step-6");
  RunToEnd(4, TrainArgs(recipe, second, b));
  if (::testing::Test::HasFatalFailure()) return;
  const std::vector<nlohmann::json> reference = Metrics(first), resumed = Metrics(second);
  ASSERT_EQ(reference.size(), 12u);
  ASSERT_EQ(resumed.size(), 6u);
  for (size_t i = 0; i < resumed.size(); ++i) {
    const double expected = reference[i + 6]["loss"].get<double>();
    EXPECT_NEAR(resumed[i]["loss"].get<double>(), expected, 1e-5 * expected) << "step " << i + 7;
  }
}

}  // namespace
}  // namespace dtrain
