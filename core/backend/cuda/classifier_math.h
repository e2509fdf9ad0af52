// The fused classifier's per-row part, after the logits GEMM: softmax, cross-entropy and the
// logits gradient written over the logits, one block per row (BlockButterfly, warp_math.h), so no
// (N, V) probability matrix ever exists. The CPU backend's arithmetic
// (core/backend/cpu/classifier.h) with fp32 sums instead of double:
//   max = max_j x_j,  sum = sum_j exp(x_j - max),  loss = max + log(sum) - x_target,
//   dlogit_j = exp(x_j - max) * (grad_scale / sum) - (j == target ? grad_scale : 0),
// loss and dlogits 0 for a row whose target is < 0 (ignored). Thread t takes the row's 16-byte
// packs (pack_math.h) t, t + kThreads, ...: one pass over the logits finds max and sum together
// (online softmax: a thread's sum is rescaled when its max grows), a second writes the gradient.
// Each logit is read and written by the one thread whose pack holds it, so the target's logit is
// read by its owner before that thread overwrites it. exp is the CPU's polynomial (cpu::Exp); log
// is the platform's logf, within 1 ulp of the host's.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "core/backend/cpu/vector_math.h"
#include "core/backend/cuda/bf16.h"
#include "core/backend/cuda/host_device.h"
#include "core/backend/cuda/pack_math.h"
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

// Threads per block of the classifier's kernels, a block per row: GPT-2's 50,257 logits are
// about 25 packs a thread in bf16, and a chunk of 640 rows (ClassifierChunkRows) is resident at
// once on an H100 (4-5 blocks on each of its 132 SMs of 2,048 threads).
inline constexpr int kClassifierThreads = 256;

// The first value of each of the calling thread's packs in a row of v values:
// for (size_t i = FirstPack<T>(block); i < v; i += kPackStride<T, kThreads>).
template <typename T, typename Block>
DTRAIN_HD size_t FirstPack(const Block& block) {
  return static_cast<size_t>(block.thread()) * kPackSize<T>;
}
template <typename T, int kThreads>
inline constexpr size_t kPackStride = static_cast<size_t>(kThreads) * kPackSize<T>;

// The thread of a block of kThreads whose pack holds value j.
template <typename T, int kThreads>
DTRAIN_HD int PackOwner(int64_t j) {
  return static_cast<int>(j / kPackSize<T> % kThreads);
}

// One row: logits (V, 16-byte aligned for whole-pack loads) become dlogits when write_gradient;
// *loss = the row's -log p(target). shared: kThreads / kWarpSize states.
template <int kThreads, typename Block, typename T>
DTRAIN_HD void ClassifierRow(const Block& block, SoftmaxState* shared, T* logits, float* loss,
                             int32_t target, int v, float grad_scale, bool write_gradient) {
  constexpr int kP = kPackSize<T>;
  const size_t n = static_cast<size_t>(v);
  SoftmaxState state;
  float target_logit = 0.0f;  // read by the target's owner
  for (size_t i = FirstPack<T>(block); i < n; i += kPackStride<T, kThreads>) {
    const Pack<T> pack = LoadPack(logits, i, n, T{});
    for (int k = 0; k < kP && i + k < n; ++k) {
      const float x = ToFloat(pack.values[k]);
      state = AddLogit(state, x);
      if (static_cast<int64_t>(i) + k == target) target_logit = x;
    }
  }
  state = BlockButterfly<kThreads>(block, shared, state, CombineSoftmax{});
  if (target >= 0 && PackOwner<T, kThreads>(target) == block.thread()) {
    *loss = state.max + std::log(state.sum) - target_logit;
  }
  if (target < 0 && block.thread() == 0) *loss = 0.0f;
  if (!write_gradient) return;
  const float factor = target >= 0 ? grad_scale / state.sum : 0.0f;
  for (size_t i = FirstPack<T>(block); i < n; i += kPackStride<T, kThreads>) {
    Pack<T> pack = LoadPack(logits, i, n, T{});
    for (int k = 0; k < kP; ++k) {
      float dlogit = cpu::Exp(ToFloat(pack.values[k]) - state.max) * factor;
      if (static_cast<int64_t>(i) + k == target) dlogit -= grad_scale;
      pack.values[k] = FromFloat<T>(dlogit);
    }
    StorePack(logits, i, n, pack);  // the values past v are not stored
  }
}

// The vocabulary-parallel classifier's phases (Backend::ClassifierRowMax, ClassifierExpSums,
// ClassifierLossSum, ClassifierLogitsBackward): a rank's v logits of a row (its vocabulary rows
// [vocab_begin, vocab_begin + v); v may be 0), one block per row as the fused classifier's, the
// CPU backend's arithmetic with fp32 sums instead of double. A row starts where the one before it
// ends, so its packs are whole-pack loads only where v keeps them 16-byte aligned. shared:
// kThreads / kWarpSize floats.

struct MaxOfFloats {
  DTRAIN_HD float operator()(float a, float b) const { return a > b ? a : b; }
};

// *max = the row's largest logit (-inf when v = 0).
template <int kThreads, typename Block, typename T>
DTRAIN_HD void VocabRowMax(const Block& block, float* shared, const T* logits, float* max, int v) {
  const size_t n = static_cast<size_t>(v);
  float partial = -INFINITY;
  for (size_t i = FirstPack<T>(block); i < n; i += kPackStride<T, kThreads>) {
    const Pack<T> pack = LoadPack(logits, i, n, T{});
    for (int k = 0; k < kPackSize<T> && i + k < n; ++k) {
      const float x = ToFloat(pack.values[k]);
      partial = x > partial ? x : partial;
    }
  }
  partial = BlockButterfly<kThreads>(block, shared, partial, MaxOfFloats{});
  if (block.thread() == 0) *max = partial;
}

// The logits become exp(logit - max); *sum = their sum; *target_logit = the target's logit where
// this rank holds it, else 0 (and for an ignored row, target < 0).
template <int kThreads, typename Block, typename T>
DTRAIN_HD void VocabRowExpSum(const Block& block, float* shared, T* logits, float* sum,
                              float* target_logit, float max, int32_t target, int v,
                              int vocab_begin) {
  const size_t n = static_cast<size_t>(v);
  const int64_t local = target >= 0 ? static_cast<int64_t>(target) - vocab_begin : -1;
  const bool held = local >= 0 && local < v;
  if (!held && block.thread() == 0) *target_logit = 0.0f;
  float partial = 0.0f;
  for (size_t i = FirstPack<T>(block); i < n; i += kPackStride<T, kThreads>) {
    Pack<T> pack = LoadPack(logits, i, n, T{});
    for (int k = 0; k < kPackSize<T> && i + k < n; ++k) {
      const float x = ToFloat(pack.values[k]);
      if (static_cast<int64_t>(i) + k == local) *target_logit = x;
      const float e = cpu::Exp(x - max);
      pack.values[k] = FromFloat<T>(e);
      partial += e;
    }
    StorePack(logits, i, n, pack);
  }
  partial = BlockButterfly<kThreads>(block, shared, partial, AddFloats{});
  if (block.thread() == 0) *sum = partial;
}

// A row's loss from its statistics combined over the ranks: max + log(sum) - target logit, 0
// for an ignored row.
DTRAIN_HD inline float VocabRowLoss(float max, float sum, float target_logit, int32_t target) {
  return target >= 0 ? max + std::log(sum) - target_logit : 0.0f;
}

// The exponentials become dlogits = exp / sum * grad_scale - onehot(target) * grad_scale (0 for
// an ignored row), the factor grad_scale / sum in double as the CPU's.
template <int kThreads, typename Block, typename T>
DTRAIN_HD void VocabRowLogitsBackward(const Block& block, T* logits, float sum, int32_t target,
                                      int v, int vocab_begin, float grad_scale) {
  const size_t n = static_cast<size_t>(v);
  const bool ignored = target < 0;
  const float factor =
      ignored ? 0.0f
              : static_cast<float>(static_cast<double>(grad_scale) / static_cast<double>(sum));
  const int64_t local = ignored ? -1 : static_cast<int64_t>(target) - vocab_begin;
  for (size_t i = FirstPack<T>(block); i < n; i += kPackStride<T, kThreads>) {
    Pack<T> pack = LoadPack(logits, i, n, T{});
    for (int k = 0; k < kPackSize<T>; ++k) {
      float dlogit = ToFloat(pack.values[k]) * factor;
      if (static_cast<int64_t>(i) + k == local) dlogit -= grad_scale;
      pack.values[k] = FromFloat<T>(dlogit);
    }
    StorePack(logits, i, n, pack);
  }
}

}  // namespace dtrain::cuda
