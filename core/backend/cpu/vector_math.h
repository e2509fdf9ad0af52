// Row reductions and exp written so the compiler vectorizes them: the softmax loops of the
// classifier (rows of V = 50257) and attention. Plain loops would stay scalar: without
// -ffast-math the compiler may not reorder one max or sum accumulator, and std::exp is a libm
// call per value. So reductions keep kLanes independent accumulators, and float exp is a
// branch-free Cephes-style polynomial (about 2 ulp over the softmax range). Double keeps
// std::exp: it is the finite-difference reference and must be exact to ~1e-16. The float exp and
// tanh are DTRAIN_HD: the CUDA kernels call them too (core/backend/cuda/*_math.h).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "core/backend/cuda/host_device.h"

namespace dtrain::cpu {

inline constexpr int kLanes = 16;

// max of x[0, n), n >= 1.
template <typename T>
T MaxOf(const T* __restrict x, size_t n) {
  T lanes[kLanes];
  std::fill(lanes, lanes + kLanes, x[0]);
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] = lanes[l] > x[i + l] ? lanes[l] : x[i + l];
  }
  T max = x[0];
  for (; i < n; ++i) max = std::max(max, x[i]);
  for (int l = 0; l < kLanes; ++l) max = std::max(max, lanes[l]);
  return max;
}

// Sum of x[0, n) in double.
template <typename T>
double SumOf(const T* __restrict x, size_t n) {
  double lanes[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] += static_cast<double>(x[i + l]);
  }
  double sum = 0;
  for (; i < n; ++i) sum += x[i];
  for (int l = 0; l < kLanes; ++l) sum += lanes[l];
  return sum;
}

// exp(a) for float without a libm call, so loops over it vectorize. exp(a) = 2^k exp(r),
// k = round(a / ln 2), |r| <= ln 2 / 2. The clamp keeps 2^k a normal float; below -87 the
// result (~1e-38) is zero next to any sum it enters.
DTRAIN_HD inline float FastExp(float a) {
  a = std::clamp(a, -87.0f, 88.0f);
  // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer without a libm call.
  const float k = (a * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (a - k * 0.693359375f) + k * 2.12194440e-4f;  // ln 2 split in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // A NaN `a` is NaN in p already; converting NaN to an integer would be undefined.
  const float exponent = k == k ? k : 0.0f;
  return p * std::bit_cast<float>((static_cast<int32_t>(exponent) + 127) << 23);
}

// The exp the kernels use: the polynomial for float, exact std::exp for double (the
// finite-difference reference).
DTRAIN_HD inline float Exp(float a) { return FastExp(a); }
inline double Exp(double a) { return std::exp(a); }

// tanh through exp: 1 - 2 / (exp(2a) + 1), absolute error about 1e-7 in float.
template <typename T>
DTRAIN_HD T Tanh(T a) {
  return T(1) - T(2) / (Exp(T(2) * a) + T(1));
}

// x[i] = exp(x[i] - shift) for i in [0, n).
template <typename T>
void ExpShifted(T* __restrict x, size_t n, T shift) {
  for (size_t i = 0; i < n; ++i) x[i] = Exp(x[i] - shift);
}

}  // namespace dtrain::cpu
