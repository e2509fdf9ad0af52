#include "parallel/pipeline/sampling.h"

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/backend/cpu/cpu_backend.h"
#include "core/model/transformer.h"
#include "gtest/gtest.h"
#include "parallel/pipeline/stage_assignment.h"
#include "parallel/tensor_parallel.h"
#include "tests/testing/flat_parameters.h"
#include "tests/testing/small_model.h"
#include "tests/testing/tensor_parallel_ranks.h"

namespace dtrain {
namespace {

constexpr int kMaxTime = 9;  // shorter than the samples: the context window slides
constexpr uint64_t kSeed = 4;

// A model holding `slice` (whole, a tensor-parallel shard, a stage or both) with its own
// parameters, the same values any split of the model holds.
struct SliceModel {
  SliceModel(const ModelConfig& config, const ModelSlice& slice, Backend& backend,
             TensorParallelOps* ops, bool sequence_parallel)
      : table(config, slice),
        parameters(table, backend),
        model(config, table, parameters, backend, 1, kMaxTime, Recompute::kNone, ops,
              sequence_parallel) {
    testing::InitDistinctParameters(config, table, kSeed, parameters.params().data());
  }
  ParamTable table;
  testing::FlatParameters parameters;
  Transformer model;
};

struct Case {
  ModelFamily family;
  int stages;
  int tp;
  bool sequence_parallel = false;
  int virtual_stages = 1;  // model chunks per stage, each of one block (interleaved)
};

class GeneratePipelinedTest : public ::testing::TestWithParam<Case> {};

// Every stage returns the tokens the unsplit model samples (tp = 1: the whole model; tp > 1: the
// tensor-parallel model of all blocks on the same tp rank), bit for bit: the stages compute its
// logits with the same kernels on the same values, and draw from them with the same generator.
// Sampled (temperature and top-k, several seeds) and greedy, from prompts shorter and longer than
// the context window; prefixes of every length up to it pass between the stages (under sequence
// parallelism also lengths tp does not divide, whose last chunk is padded).
TEST_P(GeneratePipelinedTest, EveryStageSamplesTheUnsplitModelsTokens) {
  const Case c = GetParam();
  ModelConfig config = testing::SmallModelConfig(c.family);
  config.init_std = 0.5f;  // large logits: sampling has something to choose between
  if (c.virtual_stages > 1) config.n_layer = c.stages * c.virtual_stages;
  PipelineCosts costs;
  costs.blocks.assign(config.n_layer, 1.0);
  const absl::StatusOr<StageAssignment> assignment =
      AssignStages(costs, c.stages, c.virtual_stages);
  ASSERT_TRUE(assignment.ok()) << assignment.status();
  std::vector<SamplingOptions> runs(3);
  runs[0] = {.max_new_tokens = 14, .temperature = 0.8f, .top_k = 10, .seed = 1};
  runs[1] = {.max_new_tokens = 14, .temperature = 1.0f, .top_k = 0, .seed = 2};
  runs[2] = {.max_new_tokens = 14, .temperature = 0.0f, .top_k = 0, .seed = 3};
  const std::vector<std::vector<int32_t>> prompts = {{5}, {7, 1, 30, 2, 9, 11, 3, 8, 40, 12}};

  testing::RunStageGridRanks(
      c.stages, c.tp,
      [&](int stage, int tp_rank, Backend& backend, Communicator* tp, Communicator* pp) {
        std::unique_ptr<CommTensorParallel> ops;
        if (tp != nullptr) ops = std::make_unique<CommTensorParallel>(*tp, nullptr);
        const ModelSlice shard{.tp_rank = tp_rank, .tp_size = c.tp};
        SliceModel unsplit(config, shard, backend, ops.get(), c.sequence_parallel);
        ModelSlice stage_slice = shard;
        stage_slice.chunks = StageChunks(*assignment, stage);
        SliceModel split(config, stage_slice, backend, ops.get(), c.sequence_parallel);
        for (const std::vector<int32_t>& prompt : prompts) {
          for (const SamplingOptions& options : runs) {
            const std::vector<int32_t> expected =
                Generate(unsplit.model, prompt, kMaxTime, options);
            ASSERT_EQ(expected.size(), prompt.size() + options.max_new_tokens);
            const absl::StatusOr<std::vector<int32_t>> tokens =
                GeneratePipelined(split.model, *pp, prompt, kMaxTime, options);
            ASSERT_TRUE(tokens.ok()) << tokens.status();
            EXPECT_EQ(*tokens, expected)
                << "stage " << stage << ", tp rank " << tp_rank << ", seed " << options.seed;
          }
        }
        if (ops != nullptr) {
          const absl::Status settled = ops->Settle();
          EXPECT_TRUE(settled.ok()) << settled;
        }
      });
}

INSTANTIATE_TEST_SUITE_P(
    Splits, GeneratePipelinedTest,
    ::testing::Values(Case{ModelFamily::kGpt2, 2, 1}, Case{ModelFamily::kGpt2, 3, 1},
                      Case{ModelFamily::kLlama, 2, 1}, Case{ModelFamily::kLlama, 3, 1},
                      Case{ModelFamily::kGpt2, 2, 2}, Case{ModelFamily::kLlama, 2, 2, true},
                      // Each stage's chunks in turn: stage 0's output comes back to it.
                      Case{ModelFamily::kGpt2, 2, 1, false, 2},
                      Case{ModelFamily::kLlama, 2, 2, true, 2}),
    [](const auto& info) {
      return absl::StrCat(
          FamilyName(info.param.family), "_pp", info.param.stages,
          info.param.virtual_stages > 1 ? absl::StrCat("_v", info.param.virtual_stages) : "", "_tp",
          info.param.tp, info.param.sequence_parallel ? "_sp" : "");
    });

}  // namespace
}  // namespace dtrain
