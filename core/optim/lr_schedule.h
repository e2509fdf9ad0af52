// Learning rate at a step: linear warmup, then cosine, linear or constant decay to min_lr.
#pragma once

#include "core/recipe/recipe.h"

namespace dtrain {

// `step` is 0-based. Warmup: lr * (step + 1) / warmup_steps. After it, with progress
// p = (step - warmup) / max(1, steps - warmup): cosine min + (lr - min) (1 + cos(pi p)) / 2,
// linear lr + (min - lr) p, constant lr.
double LearningRate(const TrainSection& train, int step);

}  // namespace dtrain
