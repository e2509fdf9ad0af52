#include "parallel/train_step.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "core/optim/lr_schedule.h"
#include "core/util/status.h"

namespace dtrain {

absl::StatusOr<StepResult> TrainStep(Transformer& model, DataParallelEngine& engine,
                                     const TrainSection& train, int step, int micro_batches,
                                     const MicroBatchSource& next_micro_batch,
                                     const std::function<void()>& inspect_gradients,
                                     bool documents) {
  const size_t micro_tokens = static_cast<size_t>(train.micro_batch) * train.seq_len;
  const int64_t global_tokens = static_cast<int64_t>(train.batch_size) * train.seq_len;
  // Scratch per call is cheap next to a step and keeps the function free of hidden state.
  std::vector<int32_t> inputs(micro_tokens), targets(micro_tokens);
  std::vector<int32_t> positions(documents ? micro_tokens : 0);
  int32_t* positions_or_null = documents ? positions.data() : nullptr;
  int64_t trained_tokens = 0;
  engine.BeginStep();
  // The gradient is of the global batch's mean loss, whatever the split into ranks and
  // micro-batches: summing over ranks gives it exactly. With masked targets the count of trained
  // tokens is known only after the all-reduce: FinishStep rescales.
  const float grad_scale = 1.0f / static_cast<float>(global_tokens);
  double data_wait_ms = 0;
  for (int micro = 0; micro < micro_batches; ++micro) {
    engine.BeginMicroBatch(micro + 1 == micro_batches);
    const auto start = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(next_micro_batch(inputs.data(), targets.data(), positions_or_null));
    data_wait_ms +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    model.ForwardBackward(inputs.data(), targets.data(), train.micro_batch, train.seq_len,
                          grad_scale, positions_or_null);
    if (documents) trained_tokens += TrainedTokens(targets.data(), targets.size());
  }
  if (inspect_gradients) inspect_gradients();
  ASSIGN_OR_RETURN(StepResult result,
                   FinishTrainStep(engine, train, step, model.TakeLossSum(), global_tokens,
                                   documents ? trained_tokens : -1));
  result.data_wait_ms = data_wait_ms;
  return result;
}

int64_t TrainedTokens(const int32_t* targets, size_t n) {
  return std::count_if(targets, targets + n, [](int32_t target) { return target >= 0; });
}

absl::StatusOr<StepResult> FinishTrainStep(DataParallelEngine& engine, const TrainSection& train,
                                           int step, double loss_sum, int64_t global_tokens,
                                           int64_t local_trained_tokens) {
  StepResult result;
  result.lr = LearningRate(train, step);
  ASSIGN_OR_RETURN(
      const StepTotals totals,
      engine.FinishStep(loss_sum, global_tokens, train.grad_clip, result.lr, local_trained_tokens));
  result.trained_tokens = totals.trained_tokens;
  result.loss = totals.loss;
  result.grad_norm = totals.grad_norm;
  result.exposed_comm_ms = totals.exposed_comm_ms;
  return result;
}

}  // namespace dtrain
