// The fused classifier's per-row part, after the logits GEMM: softmax, cross-entropy and the
// logits gradient written over the logits, one block per row (BlockButterfly, warp_math.h), so no
// (N, V) probability matrix ever exists. The CPU backend's arithmetic
// (core/backend/cpu/classifier.h) with fp32 sums instead of double:
//   max = max_j x_j,  sum = sum_j exp(x_j - max),  loss = max + log(sum) - x_target,
//   dlogit_j = exp(x_j - max) * (grad_scale / sum) - (j == target ? grad_scale : 0),
// loss and dlogits 0 for a row whose target is < 0 (ignored). The block's threads take the row's
// 16-byte packs in turn (RowPacks): one pass over the logits finds max and sum together (online
// softmax: a thread's sum is rescaled when a pack raises its max), a second writes the gradient.
// The first pass walks a thread's packs from the last, so that the second starts on the packs
// read most recently, which a chunk's logits larger than the L2 cache may still hold there (as
// llm.c's classifier does). Each logit is read and written by the one thread whose pack holds it,
// so the target's logit is read by its owner before that thread overwrites it. exp is the CPU's
// polynomial (cpu::Exp); log is the platform's logf, within 1 ulp of the host's.
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

// Threads per block of the classifier's kernels, a block per row: GPT-2's 50,257 logits are
// about 25 packs a thread in bf16, and at 36 registers a thread 7 rows' blocks share an SM (924
// rows at once on an H100's 132), each of its threads with a 16-byte load in flight.
inline constexpr int kClassifierThreads = 256;

// A partial softmax: the largest logit seen and the sum of exp(logit - max) over those seen.
// The empty state's max is the lowest finite float, not -inf, so that combining two empty
// states computes exp(0) * 0 rather than exp(NaN).
struct SoftmaxState {
  float max = -FLT_MAX;
  float sum = 0;
};

// The state with the row's values of the pack at i added: the pack's largest value first, so
// the sum is rescaled at most once a pack and the lanes of a warp take the same branches.
template <typename T, int kThreads>
DTRAIN_HD SoftmaxState AddPack(SoftmaxState state, const Pack<T>& pack,
                               const RowPacks<T, kThreads>& packs, int64_t i) {
  float max = state.max;
  DTRAIN_UNROLL
  for (int k = 0; k < kPackSize<T>; ++k) {
    const float x = ToFloat(pack.values[k]);
    if (packs.Holds(i, k) && x > max) max = x;
  }
  float sum = max > state.max ? state.sum * cpu::Exp(state.max - max) : state.sum;
  DTRAIN_UNROLL
  for (int k = 0; k < kPackSize<T>; ++k) {
    if (packs.Holds(i, k)) sum += cpu::Exp(ToFloat(pack.values[k]) - max);
  }
  return {max, sum};
}

struct CombineSoftmax {
  DTRAIN_HD SoftmaxState operator()(SoftmaxState a, SoftmaxState b) const {
    const float max = a.max > b.max ? a.max : b.max;
    return {max, a.sum * cpu::Exp(a.max - max) + b.sum * cpu::Exp(b.max - max)};
  }
};

// One row: logits (V) become dlogits when write_gradient; *loss = the row's -log p(target).
// shared: kThreads / kWarpSize states.
template <int kThreads, typename Block, typename T>
DTRAIN_HD void ClassifierRow(const Block& block, SoftmaxState* shared, T* logits, float* loss,
                             int32_t target, int v, float grad_scale, bool write_gradient) {
  const RowPacks<T, kThreads> packs(logits, v);
  const int t = block.thread();
  SoftmaxState state;
  float target_logit = 0.0f;  // read by the target's owner
  for (int64_t i = packs.Last(t); i >= packs.First(t); i -= packs.kStride) {
    const Pack<T> pack = packs.Load(logits, i, T{});
    state = AddPack(state, pack, packs, i);
    DTRAIN_UNROLL
    for (int k = 0; k < kPackSize<T>; ++k) {  // constant indices keep the pack in registers
      if (target >= 0 && i + k == target) target_logit = ToFloat(pack.values[k]);
    }
  }
  state = BlockButterfly<kThreads>(block, shared, state, CombineSoftmax{});
  if (target >= 0 && packs.Owner(target) == t) {
    *loss = state.max + std::log(state.sum) - target_logit;
  }
  if (target < 0 && t == 0) *loss = 0.0f;
  if (!write_gradient) return;
  const float factor = target >= 0 ? grad_scale / state.sum : 0.0f;
  for (int64_t i = packs.First(t); i < v; i += packs.kStride) {
    Pack<T> pack = packs.Load(logits, i, T{});
    DTRAIN_UNROLL
    for (int k = 0; k < kPackSize<T>; ++k) {
      float dlogit = cpu::Exp(ToFloat(pack.values[k]) - state.max) * factor;
      if (i + k == target) dlogit -= grad_scale;
      pack.values[k] = FromFloat<T>(dlogit);
    }
    packs.Store(logits, i, pack);  // the values outside the row are not stored
  }
}

// The vocabulary-parallel classifier's phases (Backend::ClassifierRowMax, ClassifierExpSums,
// ClassifierLossSum, ClassifierLogitsBackward): a rank's v logits of a row (its vocabulary rows
// [vocab_begin, vocab_begin + v); v may be 0), one block per row in RowPacks as the fused
// classifier's, the CPU backend's arithmetic with fp32 sums instead of double. shared:
// kThreads / kWarpSize floats.

struct MaxOfFloats {
  DTRAIN_HD float operator()(float a, float b) const { return a > b ? a : b; }
};

// *max = the row's largest logit (-inf when v = 0). A thread walks its packs from the last, as
// the fused classifier's first pass, for VocabRowExpSum's reads after it.
template <int kThreads, typename Block, typename T>
DTRAIN_HD void VocabRowMax(const Block& block, float* shared, const T* logits, float* max, int v) {
  const RowPacks<T, kThreads> packs(logits, v);
  const int t = block.thread();
  float partial = -INFINITY;
  for (int64_t i = packs.Last(t); i >= packs.First(t); i -= packs.kStride) {
    const Pack<T> pack = packs.Load(logits, i, T{});
    DTRAIN_UNROLL
    for (int k = 0; k < kPackSize<T>; ++k) {
      const float x = ToFloat(pack.values[k]);
      if (packs.Holds(i, k) && x > partial) partial = x;
    }
  }
  partial = BlockButterfly<kThreads>(block, shared, partial, MaxOfFloats{});
  if (t == 0) *max = partial;
}

// The logits become exp(logit - max); *sum = their sum; *target_logit = the target's logit where
// this rank holds it, else 0 (and for an ignored row, target < 0).
template <int kThreads, typename Block, typename T>
DTRAIN_HD void VocabRowExpSum(const Block& block, float* shared, T* logits, float* sum,
                              float* target_logit, float max, int32_t target, int v,
                              int vocab_begin) {
  const RowPacks<T, kThreads> packs(logits, v);
  const int t = block.thread();
  const int64_t local = target >= 0 ? int64_t{target} - vocab_begin : -1;
  const bool held = local >= 0 && local < v;
  if (!held && t == 0) *target_logit = 0.0f;
  float partial = 0.0f;
  for (int64_t i = packs.First(t); i < v; i += packs.kStride) {
    Pack<T> pack = packs.Load(logits, i, T{});
    DTRAIN_UNROLL
    for (int k = 0; k < kPackSize<T>; ++k) {
      if (!packs.Holds(i, k)) continue;
      const float x = ToFloat(pack.values[k]);
      if (i + k == local) *target_logit = x;
      const float e = cpu::Exp(x - max);
      pack.values[k] = FromFloat<T>(e);
      partial += e;
    }
    packs.Store(logits, i, pack);
  }
  partial = BlockButterfly<kThreads>(block, shared, partial, AddFloats{});
  if (t == 0) *sum = partial;
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
  const RowPacks<T, kThreads> packs(logits, v);
  const bool ignored = target < 0;
  const float factor =
      ignored ? 0.0f
              : static_cast<float>(static_cast<double>(grad_scale) / static_cast<double>(sum));
  const int64_t local = ignored ? -1 : int64_t{target} - vocab_begin;
  for (int64_t i = packs.First(block.thread()); i < v; i += packs.kStride) {
    Pack<T> pack = packs.Load(logits, i, T{});
    DTRAIN_UNROLL
    for (int k = 0; k < kPackSize<T>; ++k) {
      float dlogit = ToFloat(pack.values[k]) * factor;
      if (i + k == local) dlogit -= grad_scale;
      pack.values[k] = FromFloat<T>(dlogit);
    }
    packs.Store(logits, i, pack);
  }
}

}  // namespace dtrain::cuda
