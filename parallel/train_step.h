// One optimizer step, shared by the training loop and the PyTorch parity probe: zero the
// gradients, forward and backward over the step's micro-batches, global-norm clipping, the
// learning rate of the schedule, AdamW.
#pragma once

#include <functional>

#include "absl/status/statusor.h"
#include "core/backend/backend.h"
#include "core/model/transformer.h"
#include "core/optim/adamw.h"
#include "core/recipe/recipe.h"

namespace dtrain {

struct StepResult {
  double loss = 0;       // mean token loss over the step's batch
  double grad_norm = 0;  // before clipping
  double lr = 0;
};

// Fills one micro-batch of inputs and targets, each (micro_batch, seq_len).
using MicroBatchSource = std::function<absl::Status(int32_t* inputs, int32_t* targets)>;

// `step` is 0-based. `inspect_gradients`, when set, sees the full gradient before clipping.
absl::StatusOr<StepResult> TrainStep(Transformer& model, AdamW& optimizer, Backend& backend,
                                     const TrainSection& train, int step,
                                     const MicroBatchSource& next_micro_batch,
                                     const std::function<void()>& inspect_gradients = nullptr);

}  // namespace dtrain
