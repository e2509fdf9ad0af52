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
#include "core/backend/cuda/warp_math.h"

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
  // Read by the lane that owns it, which overwrites it in the gradient pass after reading it (a
  // shuffle orders no memory accesses between lanes), and summed over the warp: exact, one value
  // and zeros.
  const bool owns_target = target >= 0 && target % kWarpSize == warp.lane();
  const float target_logit = WarpSum(warp, owns_target ? ToFloat(logits[target]) : 0.0f);
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

// The vocabulary-parallel classifier's phases (Backend::ClassifierRowMax, ClassifierExpSums,
// ClassifierLossSum, ClassifierLogitsBackward): a rank's v logits of a row (its vocabulary rows
// [vocab_begin, vocab_begin + v); v may be 0), one warp per row, the CPU backend's arithmetic
// with fp32 sums instead of double. Each logit is read and written by the one lane that owns it,
// so the target's logit is read by its owner before that lane overwrites it.

struct MaxOfFloats {
  DTRAIN_HD float operator()(float a, float b) const { return a > b ? a : b; }
};

// *max = the row's largest logit (-inf when v = 0).
template <typename Warp, typename T>
DTRAIN_HD void VocabRowMax(const Warp& warp, const T* logits, float* max, int v) {
  float partial = -INFINITY;
  for (int j = warp.lane(); j < v; j += kWarpSize) {
    const float x = ToFloat(logits[j]);
    partial = x > partial ? x : partial;
  }
  partial = warp.Butterfly(partial, MaxOfFloats{});
  if (warp.lane() == 0) *max = partial;
}

// The logits become exp(logit - max); *sum = their sum; *target_logit = the target's logit where
// this rank holds it, else 0 (and for an ignored row, target < 0).
template <typename Warp, typename T>
DTRAIN_HD void VocabRowExpSum(const Warp& warp, T* logits, float* sum, float* target_logit,
                              float max, int32_t target, int v, int vocab_begin) {
  const int local = target >= 0 ? target - vocab_begin : -1;
  const bool held = local >= 0 && local < v;
  if (!held && warp.lane() == 0) *target_logit = 0.0f;
  float partial = 0.0f;
  for (int j = warp.lane(); j < v; j += kWarpSize) {
    const float x = ToFloat(logits[j]);
    if (j == local) *target_logit = x;
    const float e = cpu::Exp(x - max);
    logits[j] = FromFloat<T>(e);
    partial += e;
  }
  partial = WarpSum(warp, partial);
  if (warp.lane() == 0) *sum = partial;
}

// A row's loss from its statistics combined over the ranks: max + log(sum) - target logit, 0
// for an ignored row.
DTRAIN_HD inline float VocabRowLoss(float max, float sum, float target_logit, int32_t target) {
  return target >= 0 ? max + std::log(sum) - target_logit : 0.0f;
}

// The exponentials become dlogits = exp / sum * grad_scale - onehot(target) * grad_scale (0 for
// an ignored row), the factor grad_scale / sum in double as the CPU's.
template <typename Warp, typename T>
DTRAIN_HD void VocabRowLogitsBackward(const Warp& warp, T* logits, float sum, int32_t target, int v,
                                      int vocab_begin, float grad_scale) {
  const bool ignored = target < 0;
  const float factor =
      ignored ? 0.0f
              : static_cast<float>(static_cast<double>(grad_scale) / static_cast<double>(sum));
  const int local = ignored ? -1 : target - vocab_begin;
  for (int j = warp.lane(); j < v; j += kWarpSize) {
    float dlogit = ToFloat(logits[j]) * factor;
    if (j == local) dlogit -= grad_scale;
    logits[j] = FromFloat<T>(dlogit);
  }
}

}  // namespace dtrain::cuda
