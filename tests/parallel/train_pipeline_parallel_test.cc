// `dtrain train` with parallel.pp > 1 as separate processes on loopback (torchrun's variables),
// against one process: pipeline parallelism alone (one model chunk per stage).
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/io/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/multi_process.h"
#include "tests/testing/run_dtrain.h"

namespace dtrain {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;

// A tiny model of 4 blocks (so 4 stages each run one), trained on byte-level text for
// `kSteps` steps of 4 micro-batches, evaluated every 6, without samples unless a test asks.
constexpr int kSteps = 12;

// SFT shards of short chats (`data pack --sft`), packed once for the tests that train on them.
std::string SftShards() {
  static const std::string shards = [] {
    std::string lines;
    for (int i = 0; i < 200; ++i) {
      absl::StrAppend(&lines, R"({"messages": [{"role": "user", "content": ")", i % 10,
                      R"( + 1?"}, {"role": "assistant", "content": ")", i % 10 + 1, R"("}]})",
                      "\n");
    }
    const std::string chat = testing::WriteTempFile("pp_chat.jsonl", lines);
    const std::string dir = testing::FreshTempDir("pp_sft_shards");
    const testing::Outcome packed = testing::RunDtrain(
        absl::StrCat("data pack --sft --chat-template chatml ", chat, " --out ", dir));
    EXPECT_EQ(packed.exit_code, 0) << packed.stderr_text;
    return dir;
  }();
  return shards;
}

// sft: the SFT shards, documents packed into the rows (positions, masked prompts), instead of
// byte-level text; rows of 96 tokens, which a chat of about 70 fills alone.
std::string Recipe(const std::string& family, bool sft = false) {
  const int seq_len = sft ? 96 : 16;
  std::string text;
  for (int i = 0; i < 300; ++i) absl::StrAppend(&text, "Pack my box with ", i % 7, " jugs.\n");
  const std::string data =
      sft ? absl::StrCat("format: sft, val_fraction: 0.2, train: [\"", SftShards(),
                         "/shard-*.tar\"]")
          : absl::StrCat("train: [", testing::WriteTempFile("pp_text.txt", text), "]");
  const std::string model = absl::StrCat(
      family == "llama"
          ? "family: llama, n_layer: 4, n_head: 4, n_kv_head: 2, d_model: 32, d_ff: 64, "
          : "n_layer: 4, n_head: 4, d_model: 32, ",
      "max_seq_len: ", std::max(seq_len, 32));
  return testing::WriteTempFile(
      absl::StrCat("pp_", family, sft ? "_sft" : "", ".yaml"),
      absl::StrCat("run: {name: pp, seed: 5, threads: 1}\nmodel: {", model, "}\ndata: {", data,
                   "}\n", R"(train: {steps: )", kSteps,
                   ", batch_size: 8, micro_batch: 2, seq_len: ", seq_len, R"(, warmup_steps: 1,
        eval_every: 6, eval_batches: 2, export_to: ""}
parallel: {timeout_s: 30}
checkpoint: {resume: never}
logging: {sample_tokens: 0}
)"));
}

using Metrics = testing::RunMetrics;

Metrics ReadMetrics(const std::string& out_dir) {
  return testing::ReadRunMetrics(out_dir + "/pp/metrics.jsonl");
}

struct PipelineCase {
  const char* family;
  int pp;
  const char* schedule;
  int virtual_stages = 1;  // model chunks per stage (interleaved)
  // The rest of the layout (pp x tp x dp ranks): one process takes none of these.
  int tp = 1;
  int dp = 1;
  const char* strategy = "ddp";
  bool sequence_parallel = false;
  // One more --set for both runs, and its name in the test's.
  std::string set = "";
  std::string label = "";
  bool sft = false;  // train on SFT documents (Recipe)
};

std::string CaseName(const PipelineCase& c) {
  return absl::StrCat(c.family, "_pp", c.pp, "_", c.schedule,
                      c.virtual_stages > 1 ? absl::StrCat("_v", c.virtual_stages) : "",
                      c.tp > 1 ? absl::StrCat("_tp", c.tp, c.sequence_parallel ? "_sp" : "") : "",
                      c.dp > 1 ? absl::StrCat("_dp", c.dp, "_", c.strategy) : "",
                      c.sft ? "_sft" : "", c.label);
}

class PipelineParallelTrainTest : public ::testing::TestWithParam<PipelineCase> {};

// Every stage count and schedule follows the single process's trajectory: the same loss and
// gradient norm at every step. Tolerance: the stages run the same kernels on the same rows, but
// the loss and the squared norm are summed over the stages in another order, and GPT-2's tied
// embedding adds its two gradients once at the end instead of accumulating the head's into the
// embedding's; AdamW carries that float32 rounding forward: 1e-5 relative, the bar of the data-
// and tensor-parallel runs (train_tensor_parallel_test.cc).
TEST_P(PipelineParallelTrainTest, FollowsOneProcess) {
  const PipelineCase& c = GetParam();
  const std::string recipe = Recipe(c.family, c.sft);
  const std::string name = CaseName(c);
  const std::string single = testing::FreshTempDir("pp_single_" + name);
  const testing::Outcome one = testing::RunDtrain(absl::StrCat(
      "train ", recipe, " --set run.out_dir=", single, c.set.empty() ? "" : " --set ", c.set));
  ASSERT_EQ(one.exit_code, 0) << one.stderr_text;
  const Metrics reference = ReadMetrics(single);
  ASSERT_EQ(reference.loss.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(reference.val_loss.size(), 2u);

  const std::string out = testing::FreshTempDir("pp_" + name);
  std::vector<std::string> sets = {
      "run.out_dir=" + out, absl::StrCat("parallel.pp=", c.pp),
      absl::StrCat("parallel.pp_schedule=", c.schedule),
      absl::StrCat("parallel.pp_virtual_stages=", c.virtual_stages),
      absl::StrCat("parallel.tp=", c.tp), absl::StrCat("parallel.strategy=", c.strategy),
      absl::StrCat("parallel.sequence_parallel=", c.sequence_parallel ? "true" : "false"),
      // GPT-2's tied embedding copies, on the first and the last stage, stay bit-identical.
      "parallel.check_replicas=true"};
  if (!c.set.empty()) sets.push_back(c.set);
  const auto ranks = testing::RunTrainRanks(recipe, c.pp * c.tp * c.dp, sets);
  for (const auto& rank : ranks) ASSERT_EQ(rank.exit_code, 0) << rank;
  EXPECT_THAT(ranks[0].output,
              HasSubstr(absl::StrCat("pipeline parallel: ", c.pp, " stages, schedule ", c.schedule,
                                     "; stage 0: embedding + block")));
  EXPECT_THAT(ranks[0].output, HasSubstr("+ head"));
  // The first stage's bytes in its pipeline group are the planner's to the byte: the micro-
  // batches' activations, GPT-2's tied embedding gradient, and the loss and norm sums.
  std::smatch sent;
  ASSERT_TRUE(std::regex_search(ranks[0].output, sent,
                                std::regex(R"(pp group (\d+) bytes \(the plan: (\d+)\))")))
      << ranks[0].output;
  EXPECT_EQ(sent[1].str(), sent[2].str());
  const Metrics metrics = ReadMetrics(out);
  ASSERT_EQ(metrics.loss.size(), reference.loss.size());
  for (size_t i = 0; i < metrics.loss.size(); ++i) {
    EXPECT_NEAR(metrics.loss[i], reference.loss[i], 1e-5 * reference.loss[i]) << "step " << i;
    EXPECT_NEAR(metrics.grad_norm[i], reference.grad_norm[i], 1e-5 * reference.grad_norm[i])
        << "step " << i;
  }
  // Evaluation runs the micro-batches through the stages in turn: the same validation loss,
  // data-parallel replicas reading their shares of the same sequences.
  ASSERT_EQ(metrics.val_loss.size(), reference.val_loss.size());
  for (size_t i = 0; i < metrics.val_loss.size(); ++i) {
    EXPECT_NEAR(metrics.val_loss[i], reference.val_loss[i], 1e-5 * reference.val_loss[i])
        << "evaluation " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, PipelineParallelTrainTest,
    ::testing::Values(
        PipelineCase{"llama", 2, "1f1b"}, PipelineCase{"llama", 4, "gpipe"},
        PipelineCase{"gpt2", 2, "gpipe"}, PipelineCase{"gpt2", 4, "1f1b"},
        // Recomputation keeps each slot's block inputs only.
        PipelineCase{.family = "llama",
                     .pp = 2,
                     .schedule = "1f1b",
                     .set = "parallel.recompute=full",
                     .label = "_recompute"},
        PipelineCase{.family = "gpt2",
                     .pp = 4,
                     .schedule = "gpipe",
                     .set = "parallel.recompute=selective",
                     .label = "_selective"},
        // 2 micro-batches on 4 stages: the bubble, and fewer slots than stages.
        PipelineCase{.family = "gpt2",
                     .pp = 4,
                     .schedule = "1f1b",
                     .set = "train.batch_size=4",
                     .label = "_2_micro_batches"},
        // Interleaved: two model chunks per stage (blocks 0 and 2 on stage 0, 1 and 3 on 1).
        PipelineCase{.family = "llama", .pp = 2, .schedule = "interleaved", .virtual_stages = 2},
        PipelineCase{.family = "gpt2", .pp = 2, .schedule = "interleaved", .virtual_stages = 2},
        // Each chunk's units gathered once per step and reduced after the chunk's last backward.
        PipelineCase{.family = "gpt2",
                     .pp = 2,
                     .schedule = "interleaved",
                     .virtual_stages = 2,
                     .dp = 2,
                     .strategy = "zero3"},
        PipelineCase{.family = "llama",
                     .pp = 2,
                     .schedule = "interleaved",
                     .virtual_stages = 2,
                     .tp = 2,
                     .sequence_parallel = true},
        // 3D: the stages' tp groups and data-parallel replicas.
        PipelineCase{.family = "llama", .pp = 2, .schedule = "1f1b", .tp = 2},
        PipelineCase{.family = "gpt2", .pp = 2, .schedule = "1f1b", .tp = 2},
        PipelineCase{
            .family = "gpt2", .pp = 2, .schedule = "gpipe", .tp = 2, .sequence_parallel = true},
        PipelineCase{.family = "llama", .pp = 2, .schedule = "1f1b", .dp = 2, .strategy = "zero1"},
        PipelineCase{.family = "gpt2", .pp = 2, .schedule = "1f1b", .dp = 2, .strategy = "zero1"},
        PipelineCase{.family = "gpt2", .pp = 2, .schedule = "1f1b", .dp = 2, .strategy = "zero2"},
        // Four replicas sum the tied copies' gradients in the same order on both stages
        // (check_replicas).
        PipelineCase{.family = "gpt2",
                     .pp = 2,
                     .schedule = "1f1b",
                     .dp = 4,
                     .strategy = "zero1",
                     .set = "train.batch_size=16",
                     .label = "_batch_16"},
        // Parameters gathered once per step, kept across the micro-batches.
        PipelineCase{.family = "llama", .pp = 2, .schedule = "1f1b", .dp = 2, .strategy = "zero3"},
        PipelineCase{.family = "gpt2", .pp = 2, .schedule = "gpipe", .dp = 2, .strategy = "fsdp"},
        PipelineCase{
            .family = "llama", .pp = 2, .schedule = "1f1b", .tp = 2, .dp = 2, .strategy = "zero1"},
        PipelineCase{.family = "gpt2",
                     .pp = 2,
                     .schedule = "1f1b",
                     .tp = 2,
                     .dp = 2,
                     .strategy = "ddp",
                     .sequence_parallel = true},
        // SFT: every chunk takes the documents' positions, the loss is over the trained tokens
        // (counted by every stage, summed over the replicas).
        PipelineCase{.family = "gpt2", .pp = 2, .schedule = "1f1b", .sft = true},
        PipelineCase{.family = "llama",
                     .pp = 2,
                     .schedule = "interleaved",
                     .virtual_stages = 2,
                     .sft = true},
        PipelineCase{.family = "gpt2",
                     .pp = 2,
                     .schedule = "1f1b",
                     .dp = 2,
                     .strategy = "zero1",
                     .sft = true}),
    [](const ::testing::TestParamInfo<PipelineCase>& info) { return CaseName(info.param); });

struct ReshardCase {
  const char* family;
  int save_pp;
  int load_pp;
  // Model chunks per stage (interleaved above 1) of the saving and the loading run.
  int save_v = 1;
  int load_v = 1;
};

// The --set values of a pipeline of `pp` stages of `v` chunks each.
std::vector<std::string> PipelineSets(int pp, int v) {
  return {absl::StrCat("parallel.pp=", pp),
          absl::StrCat("parallel.pp_schedule=", v > 1 ? "interleaved" : "1f1b"),
          absl::StrCat("parallel.pp_virtual_stages=", v)};
}

std::string ReshardName(const ReshardCase& c) {
  const auto layout = [](int pp, int v) {
    return absl::StrCat("pp", pp, v > 1 ? absl::StrCat("v", v) : "");
  };
  return absl::StrCat(c.family, "_", layout(c.save_pp, c.save_v), "_to_",
                      layout(c.load_pp, c.load_v));
}

class PipelineCheckpointTest : public ::testing::TestWithParam<ReshardCase> {};

// A checkpoint saved at one stage count (or chunks per stage) loads at another: the run saved at
// step 6 and resumed there in the other layout follows the single process's trajectory to the
// end (steps 7-12), within the tolerance of FollowsOneProcess. GPT-2's last stage holds a copy of
// the tied embedding, which the checkpoint stores once.
TEST_P(PipelineCheckpointTest, LoadsAtAnotherStageCount) {
  const ReshardCase& c = GetParam();
  const std::string recipe = Recipe(c.family);
  const std::string single = testing::FreshTempDir(absl::StrCat("pp_ckpt_single_", c.family));
  const testing::Outcome one =
      testing::RunDtrain(absl::StrCat("train ", recipe, " --set run.out_dir=", single));
  ASSERT_EQ(one.exit_code, 0) << one.stderr_text;
  const Metrics reference = ReadMetrics(single);
  ASSERT_EQ(reference.loss.size(), static_cast<size_t>(kSteps));

  const std::string tag = ReshardName(c);
  const std::string saved = testing::FreshTempDir("pp_ckpt_save_" + tag);
  std::vector<std::string> save_sets = PipelineSets(c.save_pp, c.save_v);
  save_sets.insert(save_sets.end(), {"run.out_dir=" + saved, "checkpoint.interval=6",
                                     "checkpoint.keep_last=5", "checkpoint.async=false"});
  for (const auto& rank : testing::RunTrainRanks(recipe, c.save_pp, save_sets)) {
    ASSERT_EQ(rank.exit_code, 0) << rank;
  }
  std::string step6;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(saved)) {
    if (entry.path().filename() == "step-6") step6 = entry.path().string();
  }
  ASSERT_FALSE(step6.empty()) << "no step-6 checkpoint under " << saved;

  const std::string loaded = testing::FreshTempDir("pp_ckpt_load_" + tag);
  std::vector<std::string> load_sets = PipelineSets(c.load_pp, c.load_v);
  load_sets.insert(load_sets.end(), {"run.out_dir=" + loaded, "checkpoint.resume=" + step6});
  const auto ranks = testing::RunTrainRanks(recipe, c.load_pp, load_sets);
  for (const auto& rank : ranks) ASSERT_EQ(rank.exit_code, 0) << rank;
  EXPECT_THAT(ranks[0].output, HasSubstr("resumed from " + step6 + " at step 6"));
  EXPECT_THAT(ranks[0].output, HasSubstr(absl::StrCat("pp ", c.load_pp, ")")));
  // A fresh start (the checkpoint not loaded) would write 12 lines: the resumed run writes
  // steps 7-12 only.
  const Metrics metrics = ReadMetrics(loaded);
  ASSERT_EQ(metrics.loss.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    const size_t step = 6 + i;
    EXPECT_NEAR(metrics.loss[i], reference.loss[step], 1e-5 * reference.loss[step])
        << "step " << step + 1;
    EXPECT_NEAR(metrics.grad_norm[i], reference.grad_norm[step], 1e-5 * reference.grad_norm[step])
        << "step " << step + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, PipelineCheckpointTest,
                         ::testing::Values(ReshardCase{"gpt2", 2, 1}, ReshardCase{"gpt2", 1, 2},
                                           ReshardCase{"llama", 2, 1}, ReshardCase{"llama", 1, 2},
                                           // Stage 0's blocks 0-1 become blocks 0 and 2.
                                           ReshardCase{"gpt2", 2, 2, 1, 2},
                                           ReshardCase{"llama", 2, 1, 2, 1}),
                         [](const ::testing::TestParamInfo<ReshardCase>& info) {
                           return ReshardName(info.param);
                         });

class PipelineCheckpointChainTest : public ::testing::TestWithParam<const char*> {};

// A checkpoint moves between pipeline, tensor and data-parallel layouts: pp 2 x tp 2 x dp 2
// (zero1) saves at step 3, pp 1 x dp 4 (zero2) resumes it and saves at 6, pp 4 resumes that and
// saves at 9, pp 2 x tp 2 x dp 2 (fsdp) resumes that and runs to 12. Every run continues the
// single process's trajectory (a constant schedule, so that train.steps only says where each run
// stops; the global batch stays 8 sequences, re-partitioned over the replicas), within the
// tolerance of FollowsOneProcess: each layout sums the same values in its own order, and AdamW
// carries that rounding forward from one run into the next.
TEST_P(PipelineCheckpointChainTest, MovesBetweenPipelineTensorAndDataParallelLayouts) {
  const std::string family = GetParam();
  const std::string recipe = Recipe(family);
  const std::vector<std::string> common = {"train.schedule=constant", "train.eval_every=0",
                                           "checkpoint.interval=3", "checkpoint.async=false"};
  const std::string single = testing::FreshTempDir("pp_chain_single_" + family);
  std::string command = absl::StrCat("train ", recipe, " --set run.out_dir=", single);
  for (const std::string& set : common) absl::StrAppend(&command, " --set ", set);
  const testing::Outcome one = testing::RunDtrain(command);
  ASSERT_EQ(one.exit_code, 0) << one.stderr_text;
  const Metrics reference = ReadMetrics(single);
  ASSERT_EQ(reference.loss.size(), static_cast<size_t>(kSteps));

  struct Leg {
    int pp, tp, dp, steps;
    const char* strategy;
  };
  int resumed_step = 0;
  std::string previous;
  for (const Leg& leg : {Leg{2, 2, 2, 3, "zero1"}, Leg{1, 1, 4, 6, "zero2"}, Leg{4, 1, 1, 9, "ddp"},
                         Leg{2, 2, 2, 12, "fsdp"}}) {
    SCOPED_TRACE(absl::StrCat("pp ", leg.pp, " x tp ", leg.tp, " x dp ", leg.dp, " (", leg.strategy,
                              ") to step ", leg.steps));
    const std::string out =
        testing::FreshTempDir(absl::StrCat("pp_chain_", family, "_", leg.steps));
    std::vector<std::string> sets = common;
    sets.insert(
        sets.end(),
        {"run.out_dir=" + out, absl::StrCat("parallel.pp=", leg.pp),
         absl::StrCat("parallel.tp=", leg.tp), absl::StrCat("parallel.strategy=", leg.strategy),
         absl::StrCat("train.steps=", leg.steps), "parallel.check_replicas=true",
         "checkpoint.resume=" + (previous.empty() ? "never" : previous)});
    const auto ranks = testing::RunTrainRanks(recipe, leg.pp * leg.tp * leg.dp, sets);
    for (const auto& rank : ranks) ASSERT_EQ(rank.exit_code, 0) << rank;
    // A fresh start would write every step from 1: the run must have resumed.
    if (!previous.empty()) {
      EXPECT_THAT(ranks[0].output,
                  HasSubstr(absl::StrCat("resumed from ", previous, " at step ", resumed_step)));
    }
    const Metrics metrics = ReadMetrics(out);
    ASSERT_EQ(metrics.loss.size(), static_cast<size_t>(leg.steps - resumed_step));
    for (size_t i = 0; i < metrics.loss.size(); ++i) {
      const size_t step = resumed_step + i;
      EXPECT_NEAR(metrics.loss[i], reference.loss[step], 1e-5 * reference.loss[step])
          << "step " << step + 1;
      EXPECT_NEAR(metrics.grad_norm[i], reference.grad_norm[step], 1e-5 * reference.grad_norm[step])
          << "step " << step + 1;
    }
    previous = absl::StrCat(out, "/pp/checkpoints/step-", leg.steps);
    resumed_step = leg.steps;
  }
}

// GPT-2: the tied embedding, a copy on the first and the last stage, stored once; Llama: kv heads
// split over tp.
INSTANTIATE_TEST_SUITE_P(Families, PipelineCheckpointChainTest, ::testing::Values("gpt2", "llama"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

// Every stage reports its own pipeline figures once training ends (rank 0's metrics and step
// lines carry stage 0's wait per step): its idle share over the steps after the first, and the
// micro-batches it held against the slots the start-up estimate sized. 1F1B on 2 stages with 4
// micro-batches: stage 0 holds 2, stage 1 one.
TEST(PipelineParallelReportTest, EveryStageLogsItsIdleShareAndActivations) {
  const std::string out = testing::FreshTempDir("pp_report");
  const auto ranks = testing::RunTrainRanks(
      Recipe("gpt2"), 2, {"run.out_dir=" + out, "parallel.pp=2", "train.steps=3"});
  for (int s = 0; s < 2; ++s) {
    ASSERT_EQ(ranks[s].exit_code, 0) << ranks[s];
    EXPECT_THAT(
        ranks[s].output,
        ContainsRegex(absl::StrCat(
            "pipeline stage ", s,
            " of 2: waited [0-9.]+ ms of [0-9.]+ ms \\([0-9.]+%\\) in 2 steps, "
            "computing [0-9.]+ ms; activations: at most ",
            2 - s, " micro-batches in flight in ", 2 - s,
            " slots, [0-9.]+ MiB \\(the estimate: [0-9.]+ MiB\\), plus [0-9.]+ MiB of send and "
            "receive buffers")));
  }
  EXPECT_THAT(ranks[0].output, HasSubstr(" | pp wait "));
  std::ifstream metrics(out + "/pp/metrics.jsonl");
  int steps = 0;
  for (std::string line; std::getline(metrics, line); ++steps) {
    const nlohmann::json step = nlohmann::json::parse(line);
    ASSERT_TRUE(step.contains("pp_wait_ms")) << line;
    EXPECT_GT(step["pp_wait_ms"].get<double>(), 0) << line;
    EXPECT_LE(step["pp_wait_ms"].get<double>(), step["step_ms"].get<double>()) << line;
  }
  EXPECT_EQ(steps, 3);
}

// train.export_to under pp 2 (alone, and with tp 2 and two ZeRO-3 replicas) writes the whole model,
// every tensor under its name and shape, with the single process's values: the last stage's blocks
// and head gathered to the first, GPT-2's tied embedding once (the first stage's, not the last
// stage's head copy). `dtrain ckpt export` of the pipeline run's last checkpoint writes the same
// values.
//
// Tolerance: two AdamW steps move every parameter by at most about 2 lr = 2e-3 (the update is
// normalised), and the layouts' updates differ only by the rounding of the gradients behind them
// (train_tensor_parallel_test.cc's ExportGathersTheWholeModel), so the parameters agree to far
// below 1e-6; a stage's tensor missing or placed at another's offset is off by the initial
// values' spread, 0.02. The checkpoint holds the very values the run exported: bit for bit.
TEST(PipelineParallelExportTest, ExportGathersTheStages) {
  for (const std::string family : {"gpt2", "llama"}) {
    SCOPED_TRACE(family);
    const std::string recipe = Recipe(family);
    const std::vector<std::string> sets = {"train.steps=2", "train.lr=1e-3", "train.eval_every=0",
                                           "train.export_to=model.safetensors"};
    const std::string single = testing::FreshTempDir("pp_export_single_" + family);
    std::string command = absl::StrCat("train ", recipe, " --set run.out_dir=", single);
    for (const std::string& set : sets) absl::StrAppend(&command, " --set ", set);
    const testing::Outcome one = testing::RunDtrain(command);
    ASSERT_EQ(one.exit_code, 0) << one.stderr_text;
    const SafetensorsContents expected = testing::ReadWeights(single + "/pp/model.safetensors");

    // The stages alone, and with their tp groups and ZeRO-3 replicas (8 ranks). tp and the
    // replicas sum the gradients in another order: an element whose gradient cancels to near
    // AdamW's eps (1e-8) moves by lr x (its absolute rounding) / eps, up to about 1e-2 lr a step,
    // so that layout is held to 1e-4, still far below a misplaced tensor's 0.02.
    struct ExportLayout {
      std::string name;
      std::vector<std::string> sets;
      int ranks;
      double tolerance;
    };
    const std::vector<ExportLayout> layouts = {
        {"pp2", {"parallel.pp=2"}, 2, 1e-6},
        {"pp2_interleaved_v2",
         {"parallel.pp=2", "parallel.pp_schedule=interleaved", "parallel.pp_virtual_stages=2"},
         2,
         1e-6},
        {"pp2_tp2_dp2_zero3",
         {"parallel.pp=2", "parallel.tp=2", "parallel.strategy=zero3"},
         8,
         1e-4}};
    for (const auto& [name, layout, ranks, tolerance] : layouts) {
      SCOPED_TRACE(name);
      const std::string out = testing::FreshTempDir("pp_export_" + name + "_" + family);
      std::vector<std::string> pp_sets = sets;
      pp_sets.push_back("run.out_dir=" + out);
      pp_sets.insert(pp_sets.end(), layout.begin(), layout.end());
      for (const auto& rank : testing::RunTrainRanks(recipe, ranks, pp_sets)) {
        ASSERT_EQ(rank.exit_code, 0) << rank;
      }
      const SafetensorsContents exported = testing::ReadWeights(out + "/pp/model.safetensors");
      testing::ExpectWeightsNear(exported, expected, tolerance);

      const std::string from_checkpoint = out + "/from_checkpoint.safetensors";
      const testing::Outcome result = testing::RunDtrain(
          absl::StrCat("ckpt export ", out, "/pp/checkpoints --out ", from_checkpoint));
      ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
      EXPECT_EQ(testing::ReadWeights(from_checkpoint).floats, exported.floats);
    }
  }
}

// train.init_from under pp 2 x tp 2: each rank reads the whole model's weights a tensor at a time
// and keeps its stage's tensors' tp shards (GPT-2's last stage its copy of the tied embedding
// too), so the first step's loss and gradient norm, computed before any update, are the single
// process's from the same weights. Tolerance: the same sums in another order, 1e-5 relative as in
// the layouts' trajectories; a shard taken from the wrong rows or columns changes the loss at the
// first digit.
TEST(PipelineParallelInitTest, InitFromGivesEachRankItsSlice) {
  for (const std::string family : {"gpt2", "llama"}) {
    SCOPED_TRACE(family);
    const std::string recipe = Recipe(family);
    const std::string trained = testing::FreshTempDir("pp_init_trained_" + family);
    const testing::Outcome trained_run = testing::RunDtrain(
        absl::StrCat("train ", recipe, " --set run.out_dir=", trained,
                     " --set train.steps=2 --set train.lr=1e-2 --set train.eval_every=0",
                     " --set train.export_to=model.safetensors"));
    ASSERT_EQ(trained_run.exit_code, 0) << trained_run.stderr_text;
    const std::string init = "train.init_from=" + trained + "/pp/model.safetensors";
    const std::string single = testing::FreshTempDir("pp_init_single_" + family);
    const testing::Outcome one = testing::RunDtrain(absl::StrCat(
        "train ", recipe, " --set run.out_dir=", single, " --set train.steps=1 --set ", init));
    ASSERT_EQ(one.exit_code, 0) << one.stderr_text;
    const Metrics reference = ReadMetrics(single);

    const std::string out = testing::FreshTempDir("pp_init_pp2_tp2_" + family);
    for (const auto& rank : testing::RunTrainRanks(
             recipe, 4,
             {"run.out_dir=" + out, "train.steps=1", init, "parallel.pp=2", "parallel.tp=2"})) {
      ASSERT_EQ(rank.exit_code, 0) << rank;
    }
    const Metrics sliced = ReadMetrics(out);
    ASSERT_EQ(reference.loss.size(), 1u);
    ASSERT_EQ(sliced.loss.size(), 1u);
    EXPECT_NEAR(sliced.loss[0], reference.loss[0], 1e-5 * reference.loss[0]);
    EXPECT_NEAR(sliced.grad_norm[0], reference.grad_norm[0], 1e-5 * reference.grad_norm[0]);
  }
}

// pp 2 x tp 2 x dp 2 (world ranks 0-3 stage 0, 4-7 stage 1; tp innermost, then dp) with a 10 s
// parallel.timeout_s: rank 5 (stage 1, tp rank 1 of its first replica) gets `signal` once two
// steps are logged. Returns every rank's result.
std::vector<testing::RankResult> SignalStageRankMidRun(const std::string& name, int signal) {
  const std::string out = testing::FreshTempDir("pp_signal_" + name);
  const std::vector<std::string> argv = {
      DTRAIN_BINARY,        "train", Recipe("gpt2"),         "--set", "run.out_dir=" + out, "--set",
      "train.steps=100000", "--set", "train.eval_every=0",   "--set", "parallel.pp=2",      "--set",
      "parallel.tp=2",      "--set", "parallel.timeout_s=10"};
  return testing::SignalRankMidRun(argv, 8, 5, signal, absl::Seconds(180), [&] {
    return testing::MetricsLosses(out + "/pp/metrics.jsonl").size() >= 2;
  });
}

// The ranks that outlive a dead or hung rank 5 fail on their own within the timeout (not the
// test's 180 s cap, which would SIGKILL them), each naming rank 5: in the first failure, which
// every rank reports (its stage-0 peer's receive "from stage 1 ... from rank 5 on group 'pp'", in
// the schedule or in the tied embedding's gradient swap, or a collective "never started by rank 5"
// first among the ranks it lists, the furthest behind; which of them fails first is a race), in
// the error that blames it, or as the root cause. Exit 1, never a hang. Each also says where rank
// 5 sits: a tp or dp peer's collective alone names no stage, and among 7 survivors some fail on
// one.
void ExpectSurvivorsNameRank5(const std::vector<testing::RankResult>& ranks) {
  ASSERT_EQ(ranks.size(), 8u);
  for (const int rank : {0, 1, 2, 3, 4, 6, 7}) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    EXPECT_FALSE(ranks[rank].timed_out) << ranks[rank].output;
    EXPECT_EQ(ranks[rank].exit_code, 1) << ranks[rank].output;
    EXPECT_THAT(ranks[rank].output,
                ContainsRegex("(from stage 1 failed: recv of [0-9]+ bytes from rank 5 on group "
                              "'pp'|never started by rank 5 |blames rank\\(s\\) 5:|root cause: "
                              "rank 5 )"))
        << ranks[rank].output;
    EXPECT_THAT(ranks[rank].output,
                ContainsRegex("rank 5:? \\(?pipeline stage 1 of 2, tp rank 1, dp rank 0"))
        << ranks[rank].output;
  }
}

TEST(PipelineParallelFaultTest, AKilledStageRankFailsEveryRankNamingIt) {
  const auto ranks = SignalStageRankMidRun("kill", SIGKILL);
  EXPECT_EQ(ranks[5].exit_code, 128 + SIGKILL);
  ExpectSurvivorsNameRank5(ranks);
}

TEST(PipelineParallelFaultTest, AHungStageRankFailsEveryRankNamingItWithinTheTimeout) {
  const auto ranks = SignalStageRankMidRun("stop", SIGSTOP);
  ExpectSurvivorsNameRank5(ranks);
  // Only a timeout ends a wait on a stopped rank, so the survivor that failed first timed out
  // (which one is a race; the others may then fail on its closed connections first).
  EXPECT_TRUE(testing::SomeRankPrinted(ranks, "(timeout 10s)")) << ranks[0];
}

// parallel.strategy: auto pipelines what nothing else splits: one sequence per step leaves no
// rows for a second replica and one attention head nothing for a second tp rank, so the plan for
// 2 ranks is 2 stages, which the trainer logs and runs.
TEST(PipelineAutoTest, AutoPipelinesWhatReplicasAndTensorParallelismCannotSplit) {
  const std::string out = testing::FreshTempDir("pp_auto");
  const auto ranks =
      testing::RunTrainRanks(Recipe("gpt2"), 2,
                             {"run.out_dir=" + out, "parallel.strategy=auto", "model.n_head=1",
                              "train.batch_size=1", "train.micro_batch=1"});
  for (const auto& rank : ranks) ASSERT_EQ(rank.exit_code, 0) << rank;
  EXPECT_THAT(ranks[0].output, HasSubstr(", pp 2 1f1b, micro_batch 1"));
  EXPECT_THAT(ranks[0].output, HasSubstr("pipeline parallel: 2 stages, schedule 1f1b"));
  EXPECT_EQ(ReadMetrics(out).loss.size(), static_cast<size_t>(kSteps));
}

class PipelineSamplingTest : public ::testing::TestWithParam<std::string> {};

// The text logged as "sample at step <step>:" in a run's output: the lines after it up to the
// next log line ("I 2026-12-06 12:34:56 ..."); empty when there is none.
std::string LoggedSample(const std::string& output, int step) {
  const std::string marker = absl::StrCat("sample at step ", step, ":\n");
  const size_t at = output.find(marker);
  if (at == std::string::npos) return "";
  const std::regex log_line(R"(^[A-Z?] \d{4}-\d\d-\d\d \d\d:\d\d:\d\d )");
  std::istringstream lines(output.substr(at + marker.size()));
  std::string sample;
  for (std::string line; std::getline(lines, line) && !std::regex_search(line, log_line);) {
    sample += line + "\n";
  }
  return sample;
}

// Samples at evaluation run through the stages: the pp 2 run logs the single process's text at
// every evaluation, at the default temperature and top-k. The learning rate is 1e-30 (the recipe
// wants it positive) so that both runs keep their initial parameters: AdamW's normalised update
// moves a parameter by about lr, below half a float32 ulp of any nonzero initial value (norm
// weights 1, weights from N(0, 0.02) above 1e-22 but for a vanishing few), and GPT-2's zero
// biases become about 1e-30, which vanishes when added to any activation above 1e-22. So the
// stages compute the single process's logits bit for bit (the same kernels on the same values)
// and draw the same tokens from them.
TEST_P(PipelineSamplingTest, SamplesTheSingleProcesssText) {
  const std::string family = GetParam();
  const std::string recipe = Recipe(family);
  const std::vector<std::string> sets = {"train.steps=2", "train.eval_every=1", "train.lr=1e-30",
                                         "train.min_lr=0", "logging.sample_tokens=24"};
  const std::string single = testing::FreshTempDir("pp_sample_single_" + family);
  std::string command = absl::StrCat("train ", recipe, " --set run.out_dir=", single);
  for (const std::string& set : sets) absl::StrAppend(&command, " --set ", set);
  const testing::Outcome one = testing::RunDtrain(command);
  ASSERT_EQ(one.exit_code, 0) << one.stderr_text;

  const std::string out = testing::FreshTempDir("pp_sample_pp2_" + family);
  std::vector<std::string> pp_sets = sets;
  pp_sets.insert(pp_sets.end(), {"run.out_dir=" + out, "parallel.pp=2"});
  const auto ranks = testing::RunTrainRanks(recipe, 2, pp_sets);
  for (const auto& rank : ranks) ASSERT_EQ(rank.exit_code, 0) << rank;
  for (const int step : {1, 2}) {
    const std::string expected = LoggedSample(one.stderr_text, step);
    EXPECT_GT(expected.size(), 24u) << one.stderr_text;  // the prompt and 24 tokens
    EXPECT_EQ(LoggedSample(ranks[0].output, step), expected) << "step " << step;
  }
  // Each evaluation samples with its own seed: the two texts differ.
  EXPECT_NE(LoggedSample(one.stderr_text, 1), LoggedSample(one.stderr_text, 2));
  // Only rank 0 logs the sample.
  EXPECT_EQ(LoggedSample(ranks[1].output, 1), "");
}

INSTANTIATE_TEST_SUITE_P(Families, PipelineSamplingTest, ::testing::Values("gpt2", "llama"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace dtrain
