// The training loop: builds the model, data and optimizer from a recipe and runs the steps,
// writing the step log, metrics.jsonl, evaluation samples and the exported weights.
#pragma once

#include "absl/status/status.h"
#include "core/recipe/recipe.h"
#include "parallel/world_membership.h"

namespace dtrain {

// Runs this rank's part of the job described by `recipe` (the whole job in a world of one).
// Errors name what failed and why.
absl::Status RunTraining(const Recipe& recipe, const WorldMembership& world);

// InvalidArgument naming parallel.tp, parallel.pp and the world size unless the model-parallel
// ranks (tp x pp) divide the world; callers check it before training starts.
absl::Status CheckLayoutFitsWorld(const Recipe& recipe, int world_size);

// For parallel.pp > 1, InvalidArgument naming what the trainer does not yet run with a pipeline
// (sampling, export; the recipe refuses interleaving); callers check it after
// CheckLayoutFitsWorld.
absl::Status CheckPipelineSupported(const Recipe& recipe);

}  // namespace dtrain
