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
  double loss = 0;             // mean token loss over the global batch's trained tokens
  double grad_norm = 0;        // before clipping
  int64_t trained_tokens = 0;  // the global batch's targets that count (all but masked ones)
  double lr = 0;
  double exposed_comm_ms = 0;  // time the step waited on communication
  double data_wait_ms = 0;     // time the step waited for its micro-batches
};

// Fills one micro-batch of inputs and targets, each (micro_batch, seq_len), and for document
// data the tokens' positions in their documents (same shape; null otherwise: plain data leaves
// it alone).
using MicroBatchSource =
    std::function<absl::Status(int32_t* inputs, int32_t* targets, int32_t* positions)>;

// `step` is 0-based; `micro_batches` of train.micro_batch sequences each run on this rank (the
// ranks together make train.batch_size). `inspect_gradients`, when set, sees the gradients once
// backward is done, before clipping (the parity probe). `documents`: the data packs documents
// (SFT samples) with positions and masked targets (< 0); the loss is then the mean over the
// global batch's trained tokens (DataParallelEngine::FinishStep).
absl::StatusOr<StepResult> TrainStep(Transformer& model, DataParallelEngine& engine,
                                     const TrainSection& train, int step, int micro_batches,
                                     const MicroBatchSource& next_micro_batch,
                                     const std::function<void()>& inspect_gradients = nullptr,
                                     bool documents = false);

// The targets among targets[0, n) that count (>= 0; masked ones are < 0).
int64_t TrainedTokens(const int32_t* targets, size_t n);

// The engine's end of a step whose gradients are in (`loss_sum` over this rank's tokens of the
// global batch's `global_tokens`): clipping, the schedule's learning rate, AdamW; the result
// without data_wait_ms. Shared by TrainStep and the pipelined step.
// `local_trained_tokens`: as DataParallelEngine::FinishStep's.
absl::StatusOr<StepResult> FinishTrainStep(DataParallelEngine& engine, const TrainSection& train,
                                           int step, double loss_sum, int64_t global_tokens,
                                           int64_t local_trained_tokens = -1);

}  // namespace dtrain
