#include "parallel/whole_model.h"

#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/model/param_table.h"
#include "gtest/gtest.h"
#include "parallel/pipeline/stage_assignment.h"
#include "tests/testing/small_model.h"
#include "tests/testing/tensor_parallel_ranks.h"

namespace dtrain {
namespace {

constexpr uint64_t kSeed = 13;

struct Case {
  ModelFamily family;
  int stages;
  int tp;
  int virtual_stages = 1;  // model chunks per stage (interleaved), one block each
};

class GatherWholeModelTest : public ::testing::TestWithParam<Case> {};

// Rank 0 of a pp x tp grid (stage 0, tp rank 0) gets the whole model's parameters bit for bit
// (the gather only copies), each element taken from the one rank that counts it: every element a
// rank does not count (a replicated tensor on tp rank > 0, a replicated kv head's later holders,
// GPT-2's tied head copy on the last stage) holds NaN there, so reading one would show. The
// other ranks get nothing.
TEST_P(GatherWholeModelTest, RankZeroGetsTheWholeModel) {
  const Case c = GetParam();
  ModelConfig config = testing::SmallModelConfig(c.family);
  if (c.virtual_stages > 1) config.n_layer = c.stages * c.virtual_stages;
  const ParamTable whole(config, ModelSlice{});
  std::vector<float> expected(whole.total_numel());
  testing::InitDistinctParameters(config, whole, kSeed, expected.data());
  PipelineCosts costs;
  costs.blocks.assign(config.n_layer, 1.0);
  const absl::StatusOr<StageAssignment> assignment =
      AssignStages(costs, c.stages, c.virtual_stages);
  ASSERT_TRUE(assignment.ok()) << assignment.status();

  testing::RunStageGridRanks(
      c.stages, c.tp,
      [&](int stage, int tp_rank, Backend& backend, Communicator* tp, Communicator* pp) {
        const ParamTable table(
            config,
            {.chunks = StageChunks(*assignment, stage), .tp_rank = tp_rank, .tp_size = c.tp});
        std::vector<float> own(table.total_numel());
        testing::InitDistinctParameters(config, table, kSeed, own.data());
        std::vector<float> uncounted(own.size(), std::numeric_limits<float>::quiet_NaN());
        for (const auto& [begin, end] : table.CountedRanges()) {
          std::copy(own.begin() + begin, own.begin() + end, uncounted.begin() + begin);
        }
        const absl::StatusOr<std::vector<float>> gathered =
            GatherWholeModel(table, uncounted, backend, tp, pp);
        ASSERT_TRUE(gathered.ok()) << gathered.status();
        if (stage != 0 || tp_rank != 0) {
          EXPECT_TRUE(gathered->empty()) << "stage " << stage << ", tp rank " << tp_rank;
          return;
        }
        ASSERT_EQ(gathered->size(), expected.size());
        for (const TensorEntry& entry : whole.entries()) {
          for (size_t i = 0; i < entry.numel; ++i) {
            ASSERT_EQ((*gathered)[entry.offset + i], expected[entry.offset + i])
                << entry.name << " element " << i << " on stage " << stage << ", tp rank "
                << tp_rank;
          }
        }
      });
}

INSTANTIATE_TEST_SUITE_P(
    Grids, GatherWholeModelTest,
    ::testing::Values(Case{ModelFamily::kGpt2, 1, 1}, Case{ModelFamily::kGpt2, 1, 2},
                      Case{ModelFamily::kGpt2, 2, 1}, Case{ModelFamily::kGpt2, 3, 1},
                      Case{ModelFamily::kGpt2, 2, 2}, Case{ModelFamily::kLlama, 2, 1},
                      // tp 4 replicates each of the 2 kv heads on 2 ranks.
                      Case{ModelFamily::kLlama, 1, 4}, Case{ModelFamily::kLlama, 3, 2},
                      Case{ModelFamily::kLlama, 2, 4},
                      // Stage 0 holds blocks 0 and 2, stage 1 blocks 1 and 3.
                      Case{ModelFamily::kGpt2, 2, 1, 2}, Case{ModelFamily::kLlama, 2, 2, 2}),
    [](const auto& info) {
      return absl::StrCat(
          FamilyName(info.param.family), "_pp", info.param.stages,
          info.param.virtual_stages > 1 ? absl::StrCat("_v", info.param.virtual_stages) : "", "_tp",
          info.param.tp);
    });

}  // namespace
}  // namespace dtrain
