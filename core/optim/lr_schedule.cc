#include "core/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace dtrain {

double LearningRate(const TrainSection& train, int step) {
  if (step < train.warmup_steps) {
    return train.lr * static_cast<double>(step + 1) / train.warmup_steps;
  }
  const double progress = static_cast<double>(step - train.warmup_steps) /
                          std::max(1, train.steps - train.warmup_steps);
  if (train.schedule == "cosine") {
    return train.min_lr +
           0.5 * (train.lr - train.min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
  }
  if (train.schedule == "linear") return train.lr + (train.min_lr - train.lr) * progress;
  return train.lr;
}

}  // namespace dtrain
