// bfloat16 storage (1 sign, 8 exponent, 7 mantissa bits: the top half of a float) and its
// conversions, for the bf16 parameters and activations of `run.precision: bf16`. Arithmetic is
// always fp32: a kernel widens its bf16 inputs with ToFloat and rounds its outputs with
// FromFloat<T>. The rounding is __float2bfloat16_rn's: to nearest, ties to even, overflow to
// infinity, subnormals kept, every NaN to the canonical 0x7FFF. One integer routine on host and
// device (not the cvt.rn.bf16.f32 instruction) so the host tests check exactly what the kernels
// compute; the kernels it serves are memory-bound.
#pragma once

#include <bit>
#include <cstdint>

#include "core/backend/cuda/host_device.h"

namespace dtrain::cuda {

// A bfloat16 value as its bits; layout-compatible with CUDA's __nv_bfloat16.
struct Bf16 {
  uint16_t bits;
};

DTRAIN_HD inline uint16_t FloatToBf16Bits(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  // Adding 0x7fff, plus the kept part's lowest bit, carries into the kept part exactly when the
  // dropped 16 bits exceed half, or equal half and the kept part is odd. A carry out of the
  // mantissa steps the exponent, and from the largest finite value reaches infinity.
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

DTRAIN_HD inline float Bf16BitsToFloat(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

DTRAIN_HD inline float ToFloat(float x) { return x; }
DTRAIN_HD inline float ToFloat(Bf16 x) { return Bf16BitsToFloat(x.bits); }

// A kernel's fp32 result stored as T: unchanged for float, rounded for bf16.
template <typename T>
DTRAIN_HD T FromFloat(float x);
template <>
DTRAIN_HD inline float FromFloat<float>(float x) {
  return x;
}
template <>
DTRAIN_HD inline Bf16 FromFloat<Bf16>(float x) {
  return Bf16{FloatToBf16Bits(x)};
}

}  // namespace dtrain::cuda
