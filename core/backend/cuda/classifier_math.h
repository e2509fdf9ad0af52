// The fused classifier's per-row part, after the logits GEMM: softmax, cross-entropy and the
// logits gradient written over the logits, one warp per row (warp_math.h), so no (N, V)
// probability matrix ever exists. The CPU backend's arithmetic (core/backend/cpu/classifier.h)
// with fp32 sums instead of double:
//   max = max_j x_j,  sum = sum_j exp(x_j - max),  loss = max + log(sum) - x_target,
//   dlogit_j = exp(x_j - max) * (grad_scale / sum) - (j == target ? grad_scale : 0),
// loss and dlogits 0 for a row whose target is < 0 (ignored). One pass over the logits finds max
// and sum together (online softmax: a lane's sum is rescaled when its max grows), a second
// writes the gradient. exp is the CPU's polynomial (cpu::Exp); log is the platform's logf,
// within 1 ulp of the host's.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "core/backend/cpu/vector_math.h"
#include "core/backend/cuda/bf16.h"
#include "core/backend/cuda/host_device.h"

namespace dtrain::cuda {

// A partial softmax: the largest logit seen and the sum of exp(logit - max) over those seen.
// The empty state's max is the lowest finite float, not -inf, so that combining two empty
// states computes exp(0) * 0 rather than exp(NaN).
struct SoftmaxState {
  float max = -FLT_MAX;
  float sum = 0;
};

DTRAIN_HD inline SoftmaxState AddLogit(SoftmaxState state, float x) {
  if (x > state.max) return {x, state.sum * cpu::Exp(state.max - x) + 1.0f};
  return {state.max, state.sum + cpu::Exp(x - state.max)};
}

struct CombineSoftmax {
  DTRAIN_HD SoftmaxState operator()(SoftmaxState a, SoftmaxState b) const {
    const float max = a.max > b.max ? a.max : b.max;
    return {max, a.sum * cpu::Exp(a.max - max) + b.sum * cpu::Exp(b.max - max)};
  }
};

// One row: logits (V) become dlogits when write_gradient; *loss = the row's -log p(target).
template <typename Warp, typename T>
DTRAIN_HD void ClassifierRow(const Warp& warp, T* logits, float* loss, int32_t target, int v,
                             float grad_scale, bool write_gradient) {
  SoftmaxState state;
  for (int j = warp.lane(); j < v; j += kWarpSize) state = AddLogit(state, ToFloat(logits[j]));
  // Read before the gradient pass overwrites it; the butterfly orders the two.
  const float target_logit = target >= 0 ? ToFloat(logits[target]) : 0.0f;
  state = warp.Butterfly(state, CombineSoftmax{});
  if (warp.lane() == 0) {
    *loss = target >= 0 ? state.max + std::log(state.sum) - target_logit : 0.0f;
  }
  if (!write_gradient) return;
  const float factor = target >= 0 ? grad_scale / state.sum : 0.0f;
  for (int j = warp.lane(); j < v; j += kWarpSize) {
    float dlogit = cpu::Exp(ToFloat(logits[j]) - state.max) * factor;
    if (j == target) dlogit -= grad_scale;
    logits[j] = FromFloat<T>(dlogit);
  }
}

}  // namespace dtrain::cuda
