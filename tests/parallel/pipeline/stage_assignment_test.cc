#include "parallel/pipeline/stage_assignment.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<int> BlocksPerChunk(const StageAssignment& assignment) {
  std::vector<int> counts;
  for (int k = 0; k < assignment.model_chunks(); ++k) {
    counts.push_back(assignment.first_block[k + 1] - assignment.first_block[k]);
  }
  return counts;
}

double MaxChunkCost(const StageAssignment& assignment) {
  return *std::max_element(assignment.chunk_costs.begin(), assignment.chunk_costs.end());
}

// The smallest largest-chunk cost over every cut of the blocks into `chunks` non-empty
// contiguous chunks, by enumeration.
double BruteForceBound(const PipelineCosts& costs, int chunks) {
  const int n = static_cast<int>(costs.blocks.size());
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> starts = {0};
  std::function<void(int)> cut = [&](int chunk) {
    if (chunk == chunks - 1) {
      starts.push_back(n);
      double worst = 0;
      for (int k = 0; k < chunks; ++k) {
        double cost = k == 0 ? costs.embedding : 0;
        if (k == chunks - 1) cost += costs.head;
        for (int b = starts[k]; b < starts[k + 1]; ++b) cost += costs.blocks[b];
        worst = std::max(worst, cost);
      }
      best = std::min(best, worst);
      starts.pop_back();
      return;
    }
    for (int start = starts.back() + 1; start <= n - (chunks - 1 - chunk); ++start) {
      starts.push_back(start);
      cut(chunk + 1);
      starts.pop_back();
    }
  };
  cut(0);
  return best;
}

TEST(StageAssignmentTest, UniformBlocksWithAHeavyHeadPutFewerBlocksOnTheLastStage) {
  // 24 equal blocks of 1, a head worth 3 blocks (a large vocabulary): the last stage takes 4
  // blocks + head = 7, the others 6 or 7. An even split would give the last stage 9.
  PipelineCosts costs{.embedding = 0, .blocks = std::vector<double>(24, 1.0), .head = 3};
  const StageAssignment assignment = *AssignStages(costs, 4, 1);
  EXPECT_EQ(MaxChunkCost(assignment), 7);
  EXPECT_LT(BlocksPerChunk(assignment).back(), 24 / 4);
  EXPECT_EQ(assignment.first_block.front(), 0);
  EXPECT_EQ(assignment.first_block.back(), 24);
}

TEST(StageAssignmentTest, AHeavyEmbeddingPutsFewerBlocksOnTheFirstStage) {
  // 12 equal blocks and an embedding worth 4: no cut stays under 6 (5 + 5 leave 2 blocks + 4
  // for the first); at 6 the first stage runs the embedding and one block.
  PipelineCosts costs{.embedding = 4, .blocks = std::vector<double>(12, 1.0), .head = 0};
  const StageAssignment assignment = *AssignStages(costs, 3, 1);
  EXPECT_EQ(MaxChunkCost(assignment), 6);
  EXPECT_THAT(BlocksPerChunk(assignment), ElementsAre(1, 5, 6));
}

TEST(StageAssignmentTest, TiesGiveLaterStagesTheMoreBlocks) {
  // 7 equal blocks on 3 stages: the bound is 3 either way; the first stage, which holds the
  // most micro-batches under 1F1B, gets the remainder.
  PipelineCosts costs{.embedding = 0, .blocks = std::vector<double>(7, 1.0), .head = 0};
  EXPECT_THAT(BlocksPerChunk(*AssignStages(costs, 3, 1)), ElementsAre(1, 3, 3));
  costs.blocks.assign(8, 1.0);
  EXPECT_THAT(BlocksPerChunk(*AssignStages(costs, 4, 1)), ElementsAre(2, 2, 2, 2));
}

TEST(StageAssignmentTest, MatchesBruteForceOnSmallCases) {
  // Deterministic pseudo-random costs: block costs 1..9, embedding and head 0..12.
  uint32_t state = 12345;
  const auto next = [&](int modulo) {
    state = state * 1103515245u + 12345u;
    return static_cast<int>((state >> 16) % modulo);
  };
  int cases = 0;
  for (int n = 1; n <= 9; ++n) {
    for (int chunks = 1; chunks <= n; ++chunks) {
      for (int trial = 0; trial < 6; ++trial) {
        PipelineCosts costs;
        for (int b = 0; b < n; ++b) costs.blocks.push_back(1 + next(9) + 0.25 * next(4));
        costs.embedding = trial % 2 == 0 ? 0 : next(13);
        costs.head = trial % 3 == 0 ? 0 : next(13) + 0.5;
        // As pp x virtual stages: every divisor split gives the same chunk count.
        const StageAssignment assignment = *AssignStages(costs, chunks, 1);
        ASSERT_EQ(static_cast<int>(assignment.first_block.size()), chunks + 1);
        for (int count : BlocksPerChunk(assignment)) ASSERT_GE(count, 1);
        // The bisection stops within 1e-12 of the bound; the chunk costs are exact sums of
        // small multiples of 0.25 and 0.5, so the optimum is hit exactly.
        ASSERT_EQ(MaxChunkCost(assignment), BruteForceBound(costs, chunks))
            << "n " << n << " chunks " << chunks << " trial " << trial;
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, 45 * 6);
}

TEST(StageAssignmentTest, VirtualStagesLoopOverTheStages) {
  PipelineCosts costs{.embedding = 0, .blocks = std::vector<double>(8, 1.0), .head = 0};
  const StageAssignment assignment = *AssignStages(costs, 2, 2);
  EXPECT_THAT(BlocksPerChunk(assignment), ElementsAre(2, 2, 2, 2));
  EXPECT_EQ(assignment.StageCost(0), 4);
  EXPECT_EQ(FormatStageAssignment(assignment),
            "stage 0: embedding + blocks 0-1, blocks 4-5; stage 1: blocks 2-3, blocks 6-7 + head");
}

TEST(StageAssignmentTest, FormatNamesTheEmbeddingAndTheHead) {
  PipelineCosts costs{.embedding = 0, .blocks = std::vector<double>(3, 1.0), .head = 0};
  EXPECT_EQ(FormatStageAssignment(*AssignStages(costs, 3, 1)),
            "stage 0: embedding + block 0; stage 1: block 1; stage 2: block 2 + head");
}

TEST(StageAssignmentTest, TooFewBlocksNameTheKeys) {
  PipelineCosts costs{.embedding = 0, .blocks = std::vector<double>(4, 1.0), .head = 0};
  const absl::Status status = AssignStages(costs, 3, 2).status();
  EXPECT_THAT(status.message(), HasSubstr("model.n_layer = 4"));
  EXPECT_THAT(status.message(), HasSubstr("parallel.pp x parallel.pp_virtual_stages = 3 x 2"));
  costs.head = -1;
  EXPECT_FALSE(AssignStages(costs, 2, 1).ok());
  costs.head = std::nan("");
  EXPECT_FALSE(AssignStages(costs, 2, 1).ok());
}

}  // namespace
}  // namespace dtrain
