// One AdamW step on the fp32 master weights and moments, in the CPU backend's order of operations
// with its per-step scalars (core/backend/cpu/adamw.h), over the ranges of one call
// (AdamWRange: every tensor of a unit, with or without weight decay, in one kernel), writing the
// bf16 copy of the parameters that the bf16 forward and backward read.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "core/backend/cpu/adamw.h"
#include "core/backend/cuda/bf16.h"
#include "core/backend/cuda/host_device.h"

namespace dtrain::cuda {

using AdamWCoefficients = cpu::AdamWCoefficients<float>;

// Values [begin, end) of the ones an AdamW call updates (counted from its first), with weight
// decay (decay 1) or without (0: a no_decay tensor). A call's ranges ascend without overlapping;
// the values between them are left as they are.
struct AdamWRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t decay = 0;
};

// The first of the `count` ascending ranges that ends after value i (count when none does).
DTRAIN_HD inline int FirstRangeEndingAfter(const AdamWRange* ranges, int count, int64_t i) {
  int lo = 0, hi = count;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (ranges[mid].end <= i) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// param, m, v (fp32) updated at index i from grad[i] * k.grad_scale, the parameter decayed when
// `decay` (else multiplied by nothing: the CPU's multiplication by 1 - lr * 0 = 1 is exact);
// param_copy[i] = bf16(param[i]) when not null.
DTRAIN_HD inline void AdamWValue(float* param, Bf16* param_copy, const float* grad, float* m,
                                 float* v, size_t i, const AdamWCoefficients& k, bool decay) {
  const float g = grad[i] * k.grad_scale;
  float p = decay ? param[i] * k.decay : param[i];
  const float mi = m[i] + k.one_minus_beta1 * (g - m[i]);
  const float vi = v[i] * k.beta2 + k.one_minus_beta2 * g * g;
  const float denom = std::sqrt(vi) / k.bias_correction2_sqrt + k.eps;
  p = p + k.neg_step_size * mi / denom;
  param[i] = p;
  m[i] = mi;
  v[i] = vi;
  if (param_copy != nullptr) param_copy[i] = FromFloat<Bf16>(p);
}

// The kValues values of one kernel thread, from `first` on (the call's n values end `first` +
// kValues or earlier): param, grad, m and v hold them (loaded from [first, first + kValues));
// those in a range are updated, and updated[j] says which. copy[j] gets the bf16 parameter of each.
template <int kValues>
DTRAIN_HD void AdamWValues(float* param, Bf16* copy, bool* updated, const float* grad, float* m,
                           float* v, size_t first, size_t n, const AdamWRange* ranges, int count,
                           const AdamWCoefficients& k) {
  int r = FirstRangeEndingAfter(ranges, count, static_cast<int64_t>(first));
  for (int j = 0; j < kValues; ++j) {
    const int64_t i = static_cast<int64_t>(first) + j;
    while (r < count && ranges[r].end <= i) ++r;
    updated[j] = static_cast<size_t>(i) < n && r < count && ranges[r].begin <= i;
    if (updated[j]) AdamWValue(param, copy, grad, m, v, j, k, ranges[r].decay != 0);
  }
}

}  // namespace dtrain::cuda
