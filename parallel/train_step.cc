#include "parallel/train_step.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/optim/lr_schedule.h"
#include "core/util/status.h"

namespace dtrain {

absl::StatusOr<StepResult> TrainStep(Transformer& model, AdamW& optimizer, Backend& backend,
                                     const TrainSection& train, int step,
                                     const MicroBatchSource& next_micro_batch,
                                     const std::function<void()>& inspect_gradients) {
  const size_t micro_tokens = static_cast<size_t>(train.micro_batch) * train.seq_len;
  const int64_t step_tokens = static_cast<int64_t>(train.batch_size) * train.seq_len;
  // Scratch per call is cheap next to a step and keeps the function free of hidden state.
  std::vector<int32_t> inputs(micro_tokens), targets(micro_tokens);
  const std::span<float> grads = model.grads();
  backend.Zero(grads.data(), grads.size());

  // The gradient is of the whole batch's mean loss, whatever the micro-batch split.
  const float grad_scale = 1.0f / static_cast<float>(step_tokens);
  double loss_sum = 0;
  for (int micro = 0; micro < train.batch_size / train.micro_batch; ++micro) {
    RETURN_IF_ERROR(next_micro_batch(inputs.data(), targets.data()));
    loss_sum += model.ForwardBackward(inputs.data(), targets.data(), train.micro_batch,
                                      train.seq_len, grad_scale);
  }
  if (inspect_gradients) inspect_gradients();

  StepResult result;
  result.loss = loss_sum / static_cast<double>(step_tokens);
  result.grad_norm = std::sqrt(backend.SumSquares(grads.data(), grads.size()));
  if (!std::isfinite(result.grad_norm) || !std::isfinite(result.loss)) {
    return absl::InternalError(absl::StrCat("step ", step + 1, ": the loss is ", result.loss,
                                            " and the gradient norm ", result.grad_norm,
                                            "; lower train.lr or raise train.warmup_steps"));
  }
  // The rule of torch.nn.utils.clip_grad_norm_.
  if (train.grad_clip > 0) {
    const double coef = train.grad_clip / (result.grad_norm + 1e-6);
    if (coef < 1.0) backend.Scale(grads.data(), static_cast<float>(coef), grads.size());
  }
  result.lr = LearningRate(train, step);
  optimizer.Step(backend, model.params().data(), grads.data(), static_cast<float>(result.lr));
  return result;
}

}  // namespace dtrain
