#include "core/metrics/stragglers.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;

// The slowest rank against the median of all ranks (an odd and an even count), named only beyond
// the threshold.
TEST(StragglersTest, TheSlowestRankBeyondTheThresholdAboveTheMedian) {
  const std::optional<Straggler> found = FindStraggler({100, 130, 98, 102}, 10);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->rank, 1);
  EXPECT_DOUBLE_EQ(found->lag_pct, 100.0 * (130 - 101) / 101);   // median (100 + 102) / 2
  EXPECT_FALSE(FindStraggler({100, 109, 100}, 10).has_value());  // 9% above the median
  EXPECT_EQ(FindStraggler({100, 100, 111}, 10)->rank, 2);
  EXPECT_FALSE(FindStraggler({100}, 10).has_value());      // one rank has no peers
  EXPECT_FALSE(FindStraggler({0, 0, 5}, 10).has_value());  // no median to compare with
}

// Ranks doing other work (pipeline stages of other blocks) are not compared: the last stage,
// with the head, is slower than the first by design, not a straggler; within a stage it can be.
TEST(StragglersTest, RanksAreComparedWithThePeersOfTheirGroupOnly) {
  const std::vector<int> stages = {0, 0, 1, 1};
  EXPECT_FALSE(FindStraggler({100, 100, 180, 180}, 10, stages).has_value());
  EXPECT_EQ(FindStraggler({100, 100, 180, 180}, 10)->rank, 2);  // all ranks as one group
  const std::optional<Straggler> found = FindStraggler({100, 104, 180, 240}, 10, stages);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->rank, 3);
  EXPECT_DOUBLE_EQ(found->lag_pct, 100.0 * (240 - 210) / 210);
  // The larger lag of two groups' stragglers.
  EXPECT_EQ(FindStraggler({100, 150, 180, 260}, 10, stages)->rank, 1);  // +20% and +18%
  EXPECT_FALSE(FindStraggler({100, 300}, 10, {0, 1}).has_value());      // one rank a group
}

TEST(StragglersTest, PersistentStragglersAreThoseOfHalfTheSteps) {
  StragglerTracker tracker(10);
  EXPECT_EQ(tracker.Add({100, 100, 150})->rank, 2);
  EXPECT_EQ(tracker.Add({100, 100, 130})->rank, 2);
  EXPECT_EQ(tracker.Add({140, 100, 100})->rank, 0);
  EXPECT_FALSE(tracker.Add({100, 100, 100}).has_value());
  // Rank 2 in 2 of 4 steps (lags 50% and 30%: median 40%); rank 0 in 1 of 4 is not persistent.
  EXPECT_EQ(tracker.PersistentSummary(),
            "rank 2 was the straggler in 2 of 4 steps (median lag +40.0%)");
  EXPECT_FALSE(tracker.Add({100, 100, 100}).has_value());
  EXPECT_EQ(tracker.PersistentSummary(), "");  // 2 of 5 steps
}

// A long run's median lag is its lags' (kept as bounded bins, not one number a straggler step).
TEST(StragglersTest, ALongRunsMedianLagIsItsLagsMedian) {
  StragglerTracker tracker(10);
  for (int step = 0; step < 200000; ++step) {
    const double lag_pct = 11 + (step * 7919 % 2001) / 100.0;  // 11.00% .. 31.00%, spread evenly
    ASSERT_EQ(tracker.Add({100, 100, 100 + lag_pct})->rank, 2);
  }
  EXPECT_EQ(tracker.PersistentSummary(),
            "rank 2 was the straggler in 200000 of 200000 steps (median lag +21.0%)");
}

}  // namespace
}  // namespace dtrain
