// The training loop: builds the model, data and optimizer from a recipe and runs the steps,
// writing the step log, metrics.jsonl, evaluation samples and the exported weights.
#pragma once

#include "absl/status/status.h"
#include "core/recipe/recipe.h"

namespace dtrain {

// Runs the whole job described by `recipe` in this process. Errors name what failed and why.
absl::Status RunTraining(const Recipe& recipe);

}  // namespace dtrain
