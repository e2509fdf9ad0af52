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

TEST(StragglersTest, APersistentStragglerIsTheOneOfMoreThanHalfTheSteps) {
  StragglerTracker tracker(10);
  for (const double lag : {50, 30, 40, 20, 60}) {
    EXPECT_EQ(tracker.Add({100, 100, 100 + lag})->rank, 2);
    EXPECT_EQ(tracker.Add({140, 100, 100})->rank, 0);
  }
  // Rank 2 and rank 0 each in 5 of 10 steps: neither is persistent (each of 2 ranks whose times
  // just vary is the straggler in about half of the steps).
  EXPECT_EQ(tracker.PersistentSummary(), "");
  EXPECT_EQ(tracker.Add({100, 100, 125})->rank, 2);
  // Rank 2 in 6 of 11 (lags 50, 30, 40, 20, 60, 25%: median 35%).
  EXPECT_EQ(tracker.PersistentSummary(),
            "rank 2 was the straggler in 6 of 11 steps (median lag +35.0%)");
  // A few steps say too little: 4 of 4 is not persistent, 5 of 5 is.
  StragglerTracker short_run(10);
  for (int step = 0; step < 4; ++step) short_run.Add({100, 100, 150});
  EXPECT_EQ(short_run.PersistentSummary(), "");
  short_run.Add({100, 100, 150});
  EXPECT_EQ(short_run.PersistentSummary(),
            "rank 2 was the straggler in 5 of 5 steps (median lag +50.0%)");
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
