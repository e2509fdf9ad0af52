// Rotary position embedding per pair, the CPU backend's arithmetic (core/backend/cpu/rope.h): the
// pair (i, i + D/2) of a query or key head at position p rotates by angle
// p * theta^(-2i/D), computed in double and its cos and sin rounded to fp32; backward rotates
// by the negated angle. The device's double cos and sin are within 2 ulp of the host's, far
// below the fp32 rounding that follows.
#pragma once

#include <cmath>

#include "core/backend/cuda/bf16.h"
#include "core/backend/cuda/host_device.h"

namespace dtrain::cuda {

// cos and direction * sin of pair i's angle at `position` (direction +1 forward, -1 backward).
DTRAIN_HD inline void RopeCosSin(int position, int i, int head_dim, double theta, float direction,
                                 float* cos_angle, float* sin_angle) {
  const double angle = position * std::pow(theta, -2.0 * i / static_cast<double>(head_dim));
  *cos_angle = static_cast<float>(std::cos(angle));
  *sin_angle = direction * static_cast<float>(std::sin(angle));
}

// x1 = a cos - b sin, x2 = b cos + a sin for (a, b) = (x1, x2), in place.
template <typename T>
DTRAIN_HD void RotatePair(T* x1, T* x2, float cos_angle, float sin_angle) {
  const float a = ToFloat(*x1);
  const float b = ToFloat(*x2);
  *x1 = FromFloat<T>(a * cos_angle - b * sin_angle);
  *x2 = FromFloat<T>(b * cos_angle + a * sin_angle);
}

}  // namespace dtrain::cuda
