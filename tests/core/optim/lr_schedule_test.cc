#include "core/optim/lr_schedule.h"

#include "gtest/gtest.h"

namespace dtrain {
namespace {

TrainSection Train(const std::string& schedule) {
  TrainSection train;
  train.steps = 110;
  train.warmup_steps = 10;
  train.lr = 1e-3;
  train.min_lr = 1e-4;
  train.schedule = schedule;
  return train;
}

TEST(LrScheduleTest, WarmupIsLinearFromLrOverWarmupToLr) {
  const TrainSection train = Train("cosine");
  EXPECT_DOUBLE_EQ(LearningRate(train, 0), 1e-4);
  EXPECT_DOUBLE_EQ(LearningRate(train, 4), 5e-4);
  EXPECT_DOUBLE_EQ(LearningRate(train, 9), 1e-3);
}

TEST(LrScheduleTest, CosineDecaysFromLrThroughTheMidpointToMinLr) {
  const TrainSection train = Train("cosine");
  EXPECT_DOUBLE_EQ(LearningRate(train, 10), 1e-3);
  EXPECT_NEAR(LearningRate(train, 60), 5.5e-4, 1e-15);  // halfway: (lr + min_lr) / 2
  EXPECT_NEAR(LearningRate(train, 110), 1e-4, 1e-15);
  for (int step = 11; step < 110; ++step) {
    EXPECT_LT(LearningRate(train, step), LearningRate(train, step - 1)) << step;
  }
}

TEST(LrScheduleTest, LinearAndConstant) {
  EXPECT_NEAR(LearningRate(Train("linear"), 60), 5.5e-4, 1e-15);
  EXPECT_NEAR(LearningRate(Train("linear"), 35), 1e-3 - 0.25 * 9e-4, 1e-15);
  EXPECT_DOUBLE_EQ(LearningRate(Train("constant"), 100), 1e-3);
}

}  // namespace
}  // namespace dtrain
