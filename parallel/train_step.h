// One optimizer step, shared by the training loop and the PyTorch parity probe: the step's
// micro-batches forward and backward through the data-parallel engine (which reduces the
// gradients as they appear), then the engine's end of step: global-norm clipping, the learning
// rate of the schedule, AdamW, parameter gather.
#pragma once

#include <functional>

#include "absl/status/statusor.h"
#include "core/model/transformer.h"
#include "core/recipe/recipe.h"
#include "parallel/data_parallel.h"

namespace dtrain {

struct StepResult {
  double loss = 0;       // mean token loss over the global batch
  double grad_norm = 0;  // before clipping
  double lr = 0;
  double exposed_comm_ms = 0;  // time the step waited on communication
  double data_wait_ms = 0;     // time the step waited for its micro-batches
};

// Fills one micro-batch of inputs and targets, each (micro_batch, seq_len).
using MicroBatchSource = std::function<absl::Status(int32_t* inputs, int32_t* targets)>;

// `step` is 0-based; `micro_batches` of train.micro_batch sequences each run on this rank (the
// ranks together make train.batch_size). `inspect_gradients`, when set, sees the gradients once
// backward is done, before clipping (the parity probe).
absl::StatusOr<StepResult> TrainStep(Transformer& model, DataParallelEngine& engine,
                                     const TrainSection& train, int step, int micro_batches,
                                     const MicroBatchSource& next_micro_batch,
                                     const std::function<void()>& inspect_gradients = nullptr);

// The engine's end of a step whose gradients are in (`loss_sum` over this rank's tokens of the
// global batch's `global_tokens`): clipping, the schedule's learning rate, AdamW; the result
// without data_wait_ms. Shared by TrainStep and the pipelined step.
absl::StatusOr<StepResult> FinishTrainStep(DataParallelEngine& engine, const TrainSection& train,
                                           int step, double loss_sum, int64_t global_tokens);

}  // namespace dtrain
