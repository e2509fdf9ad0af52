// One AdamW step over n values, in PyTorch's order of operations (torch.optim.AdamW,
// single-tensor path) so trajectories match it:
//   p = p * (1 - lr * weight_decay)
//   m = m + (1 - beta1) * (g - m)                 (torch.lerp with weight 1 - beta1)
//   v = v * beta2 + (1 - beta2) * g * g
//   p = p + (-lr / (1 - beta1^step)) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// which is p -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * p); step is 1-based. The
// per-step scalars are computed in double, as Python computes them, then rounded to T. Float
// runs 8 values per instruction where the target has AVX; any split of the range across
// threads gives bit-identical values.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/util/thread_pool.h"

namespace dtrain::cpu {

template <typename T>
void AdamW(T* param, const T* grad, T* m, T* v, size_t n, double lr, double beta1, double beta2,
           double eps, double weight_decay, int64_t step, ThreadPool* pool);

}  // namespace dtrain::cpu
