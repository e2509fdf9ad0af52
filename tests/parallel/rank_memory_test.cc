#include "parallel/rank_memory.h"

#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "core/backend/cpu/cpu_backend.h"
#include "core/model/param_table.h"
#include "core/model/transformer.h"
#include "core/util/exit_codes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/data_parallel.h"

namespace dtrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A small model's recipe with `sets` ("parallel.strategy=ddp", ...) applied.
absl::StatusOr<Recipe> SmallRecipeWith(const std::vector<std::string>& sets) {
  return ParseRecipe(
      "data:\n  train: [x.txt]\nmodel: {n_layer: 2, n_head: 2, d_model: 32, max_seq_len: 16}\n"
      "train: {batch_size: 4, micro_batch: 2, seq_len: 16}\n",
      "t.yaml", sets);
}

Recipe SmallRecipe(const std::string& strategy) {
  absl::StatusOr<Recipe> recipe = SmallRecipeWith({"parallel.strategy=" + strategy});
  EXPECT_TRUE(recipe.ok()) << recipe.status();
  return *recipe;
}

// SmallRecipe("ddp") on `dp_size` ranks: its strategy and one rank's estimate.
struct SmallDdp {
  explicit SmallDdp(int dp_size)
      : recipe(SmallRecipe("ddp")),
        strategy(*ShardingStrategyFromRecipe(recipe.parallel)),
        memory(EstimateRankMemory(recipe, ModelConfigFromRecipe(recipe.model, recipe.d_ff()),
                                  strategy, Recompute::kNone, dp_size)) {}
  Recipe recipe;
  ShardingStrategy strategy;
  RankMemory memory;
};

// One process holds everything: the estimate is what the engine allocates.
TEST(RankMemoryTest, EstimateIsWhatOneProcessAllocates) {
  const Recipe recipe = SmallRecipe("ddp");
  const ModelConfig config = ModelConfigFromRecipe(recipe.model, recipe.d_ff());
  const ParamTable table(config, ModelSlice{});
  const ShardingStrategy strategy = *ShardingStrategyFromRecipe(recipe.parallel);
  CpuBackend backend(1);
  const DataParallelEngine engine(table, strategy, recipe.train, backend, nullptr);
  const RankMemory estimate = EstimateRankMemory(recipe, config, strategy, Recompute::kNone, 1);
  EXPECT_EQ(estimate.parameter_bytes, static_cast<double>(engine.memory().parameter_bytes));
  EXPECT_EQ(estimate.gradient_bytes, static_cast<double>(engine.memory().gradient_bytes));
  EXPECT_EQ(estimate.optimizer_bytes, static_cast<double>(engine.memory().optimizer_bytes));
  // The model's arena, and the fused classifier's float32 logits of the micro-batch's 2 x 16
  // tokens (fewer than a chunk's rows), which the backend keeps.
  EXPECT_EQ(estimate.activation_bytes,
            Transformer::ActivationBytes(config, 2, 16, Recompute::kNone) +
                2.0 * 16 * config.vocab_size * sizeof(float));
}

// The classifier's chunk is the device's: at GPT-2's vocabulary and 16 x 1024 tokens a
// micro-batch, 640 rows of float32 logits on the CPU and 10,624 of bf16 on a GPU (1 GiB, each row
// padded to 50,264 values).
TEST(RankMemoryTest, TheClassifiersChunkIsTheDevices) {
  const auto logits_bytes = [](const std::string& device) {
    const absl::StatusOr<Recipe> recipe =
        SmallRecipeWith({"run.device=" + device, "model.vocab_size=50257", "model.max_seq_len=1024",
                         "train.seq_len=1024", "train.batch_size=16", "train.micro_batch=16"});
    EXPECT_TRUE(recipe.ok()) << recipe.status();
    const ModelConfig config = ModelConfigFromRecipe(recipe->model, recipe->d_ff());
    const ShardingStrategy strategy =
        *ShardingStrategyFromRecipe(recipe->parallel, recipe->bf16_params());
    return EstimateRankMemory(*recipe, config, strategy, Recompute::kNone, 1).activation_bytes -
           Transformer::ActivationBytes(config, 16, 1024, Recompute::kNone, {}, false, 1,
                                        strategy.param_type);
  };
  EXPECT_EQ(logits_bytes("cpu"), 640.0 * 50257 * 4);
  EXPECT_EQ(logits_bytes("cuda"), 10624.0 * 50264 * 2);
}

// A tensor-parallel rank's estimate is what its engine allocates for its shard of the model.
TEST(RankMemoryTest, EstimateOfATensorParallelRankIsWhatItsEngineAllocates) {
  const Recipe recipe = SmallRecipe("ddp");
  const ModelConfig config = ModelConfigFromRecipe(recipe.model, recipe.d_ff());
  const ModelSlice slice{.tp_rank = 1, .tp_size = 2};
  const ParamTable table(config, slice);
  const ShardingStrategy strategy = *ShardingStrategyFromRecipe(recipe.parallel);
  CpuBackend backend(1);
  const DataParallelEngine engine(table, strategy, recipe.train, backend, nullptr);
  const RankMemory estimate =
      EstimateRankMemory(recipe, config, strategy, Recompute::kNone, 1, slice);
  EXPECT_EQ(estimate.parameter_bytes, static_cast<double>(engine.memory().parameter_bytes));
  EXPECT_EQ(estimate.optimizer_bytes, static_cast<double>(engine.memory().optimizer_bytes));
  EXPECT_LT(estimate.parameter_bytes,
            EstimateRankMemory(recipe, config, strategy, Recompute::kNone, 1).parameter_bytes);
  EXPECT_EQ(estimate.activation_bytes,
            Transformer::ActivationBytes(config, recipe.train.micro_batch, recipe.train.seq_len,
                                         Recompute::kNone, slice));
}

// Under sequence parallelism the estimate is what the model allocates when it holds half of the
// residual stream's rows: less than plain tensor parallelism keeps.
TEST(RankMemoryTest, SequenceParallelEstimateSeesTheSmallerActivations) {
  Recipe recipe = SmallRecipe("ddp");
  recipe.parallel.tp = 2;
  const ModelConfig config = ModelConfigFromRecipe(recipe.model, recipe.d_ff());
  const ModelSlice slice{.tp_rank = 1, .tp_size = 2};
  const ShardingStrategy strategy = *ShardingStrategyFromRecipe(recipe.parallel);
  const double plain =
      EstimateRankMemory(recipe, config, strategy, Recompute::kNone, 1, slice).activation_bytes;
  recipe.parallel.sequence_parallel = true;
  const double split =
      EstimateRankMemory(recipe, config, strategy, Recompute::kNone, 1, slice).activation_bytes;
  EXPECT_EQ(split, Transformer::ActivationBytes(config, recipe.train.micro_batch,
                                                recipe.train.seq_len, Recompute::kNone, slice,
                                                /*sequence_parallel=*/true));
  EXPECT_LT(split, plain);
}

// A pipeline stage keeps the activations of every micro-batch in flight: what the model
// allocates with that many slots.
TEST(RankMemoryTest, PipelineStageEstimateCountsEveryActivationSlot) {
  const Recipe recipe = SmallRecipe("ddp");
  const ModelConfig config = ModelConfigFromRecipe(recipe.model, recipe.d_ff());
  const ModelSlice slice{.chunks = {{0, 1}}};
  const ShardingStrategy strategy = *ShardingStrategyFromRecipe(recipe.parallel);
  const double one =
      EstimateRankMemory(recipe, config, strategy, Recompute::kNone, 1, slice).activation_bytes;
  const double four =
      EstimateRankMemory(recipe, config, strategy, Recompute::kNone, 1, slice, 4).activation_bytes;
  EXPECT_EQ(four, Transformer::ActivationBytes(config, recipe.train.micro_batch,
                                               recipe.train.seq_len, Recompute::kNone, slice,
                                               /*sequence_parallel=*/false, 4));
  EXPECT_GT(four, one);
}

// Sharding divides the state over the ranks (ZeRO), activations stay whole on every rank.
TEST(RankMemoryTest, ShardedStateDividesOverRanks) {
  const Recipe ddp = SmallRecipe("ddp"), zero3 = SmallRecipe("zero3");
  const ModelConfig config = ModelConfigFromRecipe(ddp.model, ddp.d_ff());
  const RankMemory whole = EstimateRankMemory(
      ddp, config, *ShardingStrategyFromRecipe(ddp.parallel), Recompute::kNone, 4);
  const RankMemory quarter = EstimateRankMemory(
      zero3, config, *ShardingStrategyFromRecipe(zero3.parallel), Recompute::kNone, 4);
  EXPECT_DOUBLE_EQ(quarter.model_state_bytes(), whole.model_state_bytes() / 4);
  EXPECT_EQ(quarter.activation_bytes, whole.activation_bytes);
}

TEST(RankMemoryTest, TooLargeForTheMachineNamesEachPartAndTheFix) {
  const SmallDdp ddp(1);
  const ShardingStrategy& strategy = ddp.strategy;
  const RankMemory& memory = ddp.memory;
  const Backend::Memory machine = CpuBackend(1).AvailableMemory();
  EXPECT_EQ(machine.name, "this machine");
  EXPECT_GT(machine.bytes, 0);
  EXPECT_TRUE(machine.shared_by_local_ranks);
  const Backend::Memory fits{"this machine", memory.total_bytes(), true};
  EXPECT_TRUE(CheckRankMemory(ddp.recipe, memory, fits, strategy, 1, 1, 1).ok());
  EXPECT_EQ(machine.capacity, machine.bytes);
  const absl::Status status =
      CheckRankMemory(ddp.recipe, memory, {"this machine", 1024, true, 1024}, strategy, 1, 1, 1);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ExitCodeOf(status), kExitUsage);  // no restart gives the machine more memory
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr("one rank needs "), HasSubstr("with ddp over 1 rank"),
                    HasSubstr("this machine has 1.0 KiB; the planner finds no layout for 1 rank "
                              "of 1.0 KiB: add machines (the ranks of one share its memory) and "
                              "shard the state over them (parallel.strategy: zero3)")));
  // A GPU's own memory grows with the ranks (GPUs).
  EXPECT_THAT(std::string(CheckRankMemory(ddp.recipe, memory, {"GPU 0", 1024, false, 1024},
                                          strategy, 1, 1, 1)
                              .message()),
              HasSubstr("the planner finds no layout for 1 rank of 1.0 KiB: add ranks and shard"));
}

// train.export_to's gather holds the whole model about twice in float32 on rank 0: refused at
// start on rank 0's machine, asking for exit 2, where it cannot hold that (a GPU run's host
// memory, which the check above does not see); OK on the other machines and without export_to.
TEST(RankMemoryTest, AnExportTheMachineCannotHoldIsRefusedAtStart) {
  absl::StatusOr<Recipe> recipe = SmallRecipeWith({"train.export_to=model.safetensors"});
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  const ModelConfig config = ModelConfigFromRecipe(recipe->model, recipe->d_ff());
  const double twice = 2.0 * sizeof(float) * ParamTable(config, {}).total_numel();
  EXPECT_TRUE(CheckExportFitsMachine(*recipe, config, true, twice).ok());
  EXPECT_TRUE(CheckExportFitsMachine(*recipe, config, false, 0).ok());
  const absl::Status status = CheckExportFitsMachine(*recipe, config, true, twice - 1);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ExitCodeOf(status), kExitUsage);
  EXPECT_THAT(
      std::string(status.message()),
      AllOf(HasSubstr("train.export_to model.safetensors gathers the whole model on rank 0"),
            HasSubstr("more than this machine's"), HasSubstr("`dtrain ckpt export`")));
  recipe->train.export_to = "";
  EXPECT_TRUE(CheckExportFitsMachine(*recipe, config, true, 0).ok());
}

// A GPU's memory is its rank's own (one worker per GPU): ranks on one machine do not add up, and
// the message names the GPU and its free memory.
TEST(RankMemoryTest, EachRankChecksItsOwnGpu) {
  const SmallDdp ddp(8);
  const ShardingStrategy& strategy = ddp.strategy;
  const RankMemory& memory = ddp.memory;
  const Backend::Memory gpu{"GPU 3", memory.total_bytes() * 1.5, false};
  EXPECT_TRUE(CheckRankMemory(ddp.recipe, memory, gpu, strategy, 8, 8, 8).ok());
  const absl::Status status = CheckRankMemory(
      ddp.recipe, memory, {"GPU 3", 2048, false, memory.total_bytes() * 2}, strategy, 8, 8, 8);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(status.message()),
              AllOf(::testing::StartsWith("one rank needs "), HasSubstr("; step buffers "),
                    HasSubstr("GPU 3 has 2.0 KiB free;")));
  // Free memory another process holds may be free at the restart: exit 1. Beyond the GPU's
  // whole memory, exit 2.
  EXPECT_EQ(ExitCodeOf(status), std::nullopt);
  EXPECT_EQ(ExitCodeOf(CheckRankMemory(ddp.recipe, memory, {"GPU 3", 2048, false, 4096}, strategy,
                                       8, 8, 8)),
            kExitUsage);
}

// Where another layout fits, the message names the planner's as the options that select it, and
// that layout does fit by the trainer's own estimate. One rank (so that the estimate needs no
// pipeline stage or tensor-parallel shard) whose activations, micro-batches of 64, dominate
// (with gradient buckets of 1 MB).
TEST(RankMemoryTest, TooLargeNamesThePlannersLayoutThatFits) {
  for (const char* precision : {"run.precision=fp32", "run.precision=bf16"}) {
    SCOPED_TRACE(precision);
    const std::vector<std::string> big_batches = {"model.d_model=64", "train.batch_size=64",
                                                  "train.micro_batch=64", "parallel.bucket_mb=1",
                                                  precision};
    const absl::StatusOr<Recipe> recipe = SmallRecipeWith(big_batches);
    ASSERT_TRUE(recipe.ok()) << recipe.status();
    const ShardingStrategy ddp =
        *ShardingStrategyFromRecipe(recipe->parallel, recipe->bf16_params());
    const RankMemory needed = EstimateRankMemory(
        *recipe, ModelConfigFromRecipe(recipe->model, recipe->d_ff()), ddp, Recompute::kNone, 1);
    const Backend::Memory gpu{"GPU 0", needed.total_bytes() / 2, false};
    const absl::Status status = CheckRankMemory(*recipe, needed, gpu, ddp, 1, 1, 1);
    ASSERT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
    const std::string message(status.message());
    const std::string intro = "the planner's layout for 1 rank of ";
    ASSERT_THAT(message, HasSubstr(intro)) << message;
    // "(--set parallel.strategy=zero3 --set parallel.tp=1 ... --set train.micro_batch=2)"
    const size_t open = message.find("(--set ", message.find(intro));
    const std::vector<std::string> words =
        absl::StrSplit(message.substr(open + 1, message.find(')', open) - open - 1), ' ');
    std::vector<std::string> sets;
    for (size_t i = 0; i + 1 < words.size(); i += 2) {
      ASSERT_EQ(words[i], "--set") << message;
      sets.push_back(words[i + 1]);
    }
    sets.insert(sets.begin(), big_batches.begin(), big_batches.end());
    absl::StatusOr<Recipe> fitting = SmallRecipeWith(sets);
    ASSERT_TRUE(fitting.ok()) << fitting.status();
    const ShardingStrategy strategy =
        *ShardingStrategyFromRecipe(fitting->parallel, fitting->bf16_params());
    const RankMemory memory =
        EstimateRankMemory(*fitting, ModelConfigFromRecipe(fitting->model, fitting->d_ff()),
                           strategy, *ParseRecompute(fitting->parallel.recompute), 1);
    EXPECT_LT(memory.total_bytes(), needed.total_bytes()) << message;
    EXPECT_TRUE(CheckRankMemory(*fitting, memory, gpu, strategy, 1, 1, 1).ok()) << message;
  }
}

// The ranks of one machine share its memory: two that each fit alone do not fit together.
TEST(RankMemoryTest, RanksOnOneMachineShareItsMemory) {
  const SmallDdp ddp(2);
  const ShardingStrategy& strategy = ddp.strategy;
  const RankMemory& memory = ddp.memory;
  const Backend::Memory machine{"this machine", memory.total_bytes() * 1.5, true};
  EXPECT_TRUE(CheckRankMemory(ddp.recipe, memory, machine, strategy, 2, 2, 1).ok());
  const absl::Status status = CheckRankMemory(ddp.recipe, memory, machine, strategy, 2, 2, 2);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(status.message()), HasSubstr("2 ranks on this machine need"));
}

}  // namespace
}  // namespace dtrain
