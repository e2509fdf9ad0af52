// The training loop: builds the model, data and optimizer from a recipe and runs the steps,
// writing the step log, metrics.jsonl, evaluation samples and the exported weights.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/recipe/recipe.h"
#include "parallel/world_membership.h"

namespace dtrain {

// How a run that did not fail ended: every step trained, or stopped by SIGTERM after saving a
// checkpoint (the run is not done: a scheduler must not count it as finished).
enum class TrainingEnd { kFinished, kStopped };

// Runs this rank's part of the job described by `recipe` (the whole job in a world of one).
// Errors name what failed and why.
absl::StatusOr<TrainingEnd> RunTraining(const Recipe& recipe, const WorldMembership& world);

// InvalidArgument naming parallel.tp, parallel.pp and the world size unless the model-parallel
// ranks (tp x pp) divide the world; callers check it before training starts.
absl::Status CheckLayoutFitsWorld(const Recipe& recipe, int world_size);

// What callers check before any rank starts (exit 2): CheckLayoutFitsWorld; the run's output
// files (logging.metrics_file, train.export_to) apart from one another and from the run's own
// files, none a device; for a fresh run (no
// checkpoint to resume), InvalidArgument naming train.init_from when its weights are another
// model's (reading only config.json and the headers); then, unless parallel.strategy is auto
// (which picks its micro-batch), naming train.batch_size and train.micro_batch unless the batch
// splits into the data-parallel ranks' micro-batches, and for data.format webdataset naming
// data.streams unless they split into those ranks.
absl::Status CheckRecipeFitsWorld(const Recipe& recipe, int world_size);

// train.init_from's weights as a fresh run reads them, from config.json and the safetensors
// headers: InvalidArgument naming the key when they do not exist, are another model's or a folder
// holds none. A path that cannot be read is left to the start, as other faults of files are.
absl::Status CheckInitFromWeights(const Recipe& recipe);

}  // namespace dtrain
