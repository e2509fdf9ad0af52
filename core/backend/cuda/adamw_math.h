// One AdamW step for one value on the fp32 master weights and moments, in the CPU backend's order
// of operations with its per-step scalars (core/backend/cpu/adamw.h), writing the bf16 copy of
// the parameter that the bf16 forward and backward read. The gradient G is fp32 or bf16
// (widened before use).
#pragma once

#include <cmath>
#include <cstddef>

#include "core/backend/cpu/adamw.h"
#include "core/backend/cuda/bf16.h"
#include "core/backend/cuda/host_device.h"

namespace dtrain::cuda {

using AdamWCoefficients = cpu::AdamWCoefficients<float>;

// param, m, v (fp32) and grad at index i updated; param_copy[i] = bf16(param[i]) when not null.
template <typename G>
DTRAIN_HD void AdamWValue(float* param, Bf16* param_copy, const G* grad, float* m, float* v,
                          size_t i, const AdamWCoefficients& k) {
  const float g = ToFloat(grad[i]);
  float p = param[i] * k.decay;
  const float mi = m[i] + k.one_minus_beta1 * (g - m[i]);
  const float vi = v[i] * k.beta2 + k.one_minus_beta2 * g * g;
  const float denom = std::sqrt(vi) / k.bias_correction2_sqrt + k.eps;
  p = p + k.neg_step_size * mi / denom;
  param[i] = p;
  m[i] = mi;
  v[i] = vi;
  if (param_copy != nullptr) param_copy[i] = FromFloat<Bf16>(p);
}

}  // namespace dtrain::cuda
