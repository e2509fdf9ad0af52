// One AdamW step over n values, in PyTorch's order of operations (torch.optim.AdamW,
// single-tensor path) so trajectories match it, from the gradient g = grad * grad_scale (the
// mean over the step's tokens and the clipping, torch.nn.utils.clip_grad_norm_'s scaling):
//   p = p * (1 - lr * weight_decay)
//   m = m + (1 - beta1) * (g - m)                 (torch.lerp with weight 1 - beta1)
//   v = v * beta2 + (1 - beta2) * g * g
//   p = p + (-lr / (1 - beta1^step)) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// which is p -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * p); step is 1-based. The
// per-step scalars are computed in double, as Python computes them, then rounded to T. Float
// runs 8 values per instruction where the target has AVX; any split of the range across
// threads gives bit-identical values.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "core/util/thread_pool.h"

namespace dtrain::cpu {

// The per-step scalars of the update, computed in double and rounded to T; the CUDA kernel
// (core/backend/cuda/adamw_math.h) takes them too.
template <typename T>
struct AdamWCoefficients {
  T decay, one_minus_beta1, beta2, one_minus_beta2, neg_step_size, bias_correction2_sqrt, eps,
      grad_scale;
};

template <typename T>
AdamWCoefficients<T> MakeAdamWCoefficients(double lr, double beta1, double beta2, double eps,
                                           double weight_decay, int64_t step, double grad_scale) {
  const double t = static_cast<double>(step);
  return {
      .decay = static_cast<T>(1.0 - lr * weight_decay),
      .one_minus_beta1 = static_cast<T>(1.0 - beta1),
      .beta2 = static_cast<T>(beta2),
      .one_minus_beta2 = static_cast<T>(1.0 - beta2),
      .neg_step_size = static_cast<T>(-lr / (1.0 - std::pow(beta1, t))),
      .bias_correction2_sqrt = static_cast<T>(std::sqrt(1.0 - std::pow(beta2, t))),
      .eps = static_cast<T>(eps),
      .grad_scale = static_cast<T>(grad_scale),
  };
}

template <typename T>
void AdamW(T* param, const T* grad, T* m, T* v, size_t n, const AdamWCoefficients<T>& k,
           ThreadPool* pool);

}  // namespace dtrain::cpu
