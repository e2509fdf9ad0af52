// The MLP activations per element, in fp32, exactly as the CPU backend computes them
// (core/backend/cpu/activation.h has the formulas): the same operations in the same order, and
// the same exp (cpu::Exp, a polynomial that runs on the device too).
#pragma once

#include "core/backend/cpu/vector_math.h"
#include "core/backend/cuda/host_device.h"

namespace dtrain::cuda {

inline constexpr float kGeluSqrt2OverPi = 0.7978845608028654f;
inline constexpr float kGeluCubic = 0.044715f;
inline constexpr float kGeluCubicTimes3 = static_cast<float>(3 * 0.044715);  // as the CPU rounds it

DTRAIN_HD inline float GeluForward(float x) {
  const float u = kGeluSqrt2OverPi * (x + kGeluCubic * x * x * x);
  return 0.5f * x * (1.0f + cpu::Tanh(u));
}

// dinp for one value given dout.
DTRAIN_HD inline float GeluBackward(float x, float dy) {
  const float u = kGeluSqrt2OverPi * (x + kGeluCubic * x * x * x);
  const float t = cpu::Tanh(u);
  const float du = kGeluSqrt2OverPi * (1.0f + kGeluCubicTimes3 * x * x);
  return (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du) * dy;
}

// silu(gate) * up.
DTRAIN_HD inline float SwiGluForward(float gate, float up) {
  return gate / (1.0f + cpu::Exp(-gate)) * up;
}

// The gradients of gate and up for one output's dout.
DTRAIN_HD inline void SwiGluBackward(float gate, float up, float dy, float* dgate, float* dup) {
  const float sig = 1.0f / (1.0f + cpu::Exp(-gate));
  *dgate = dy * up * sig * (1.0f + gate * (1.0f - sig));
  *dup = dy * gate * sig;
}

}  // namespace dtrain::cuda
