// Tensor-core tiles (sm_80 and later): the warp-wide mma.sync.m16n8k16 of bf16 inputs with fp32
// accumulators, C (16 x 8) += A (16 x 16) B (16 x 8), each matrix spread over the warp's 32
// lanes as PTX lays out its fragments ("Matrix Fragments for mma.m16n8k16 with floating point
// type"). With g = lane / 4 and c = lane % 4, a register of two bf16 holding its first element in
// the low half:
//   A: a[0] = A[g][2c, 2c+1]   a[1] = A[g+8][2c, 2c+1]   a[2] = A[g][2c+8, 2c+9]
//      a[3] = A[g+8][2c+8, 2c+9]
//   B: b[0] = B[2c, 2c+1][g]   b[1] = B[2c+8, 2c+9][g]
//   C: c[0], c[1] = C[g][2c, 2c+1]   c[2], c[3] = C[g+8][2c, 2c+1]
// A lane thus holds rows g and g + 8 of C, the four lanes of a quad (same g) share those rows,
// and the C tiles of two neighbouring blocks of 8 columns are, rounded to bf16, exactly the A
// fragment of the 16 columns they span (ToA): attention's P feeds its next product from
// registers. The warp type (warp_math.h) adds
//   void Mma(MmaC& c, const MmaA& a, const MmaB& b) const;   // c += a b, every lane
//   float ShuffleXor(float v, int offset) const;              // the value of lane ^ offset
//   void LoadMatricesTransposed(const Bf16* row, uint32_t (&reg)[4]) const;
// the last ldmatrix.sync.m8n8.x4.trans (shared memory): lane l gives the address of row l % 8
// of 8 x 8 matrix l / 8 (8 contiguous values, 16-byte aligned), and receives in reg[i] matrix
// i's elements [2c][g] (low half) and [2c+1][g]: a B fragment's register, read from B's rows.
// DeviceLanes (warp.cuh) runs the instructions; tests/core/backend/cuda/test_util.h emulates them
// on host threads from the layouts above, so the host tests run the kernels' fragment code as
// written.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/backend/cuda/bf16.h"
#include "core/backend/cuda/host_device.h"

namespace dtrain::cuda {

struct MmaA {
  uint32_t reg[4];
};
struct MmaB {
  uint32_t reg[2];
};
struct MmaC {
  float value[4] = {};
};

// Row and column of element e (0-7 for A, 0-3 for B and C, in the order above) that `lane`
// holds.
struct MatrixIndex {
  int row, col;
};
DTRAIN_HD inline MatrixIndex MmaAIndex(int lane, int e) {
  return {lane / 4 + (e / 2 % 2) * 8, 2 * (lane % 4) + e % 2 + (e / 4) * 8};
}
DTRAIN_HD inline MatrixIndex MmaBIndex(int lane, int e) {
  return {2 * (lane % 4) + e % 2 + (e / 2) * 8, lane / 4};
}
DTRAIN_HD inline MatrixIndex MmaCIndex(int lane, int e) {
  return {lane / 4 + (e / 2) * 8, 2 * (lane % 4) + e % 2};
}

DTRAIN_HD inline uint32_t PackBf16(float low, float high) {
  return static_cast<uint32_t>(FloatToBf16Bits(low)) |
         (static_cast<uint32_t>(FloatToBf16Bits(high)) << 16);
}
// Element `half` (0 low, 1 high) of a register.
DTRAIN_HD inline float UnpackBf16(uint32_t reg, int half) {
  return Bf16BitsToFloat(static_cast<uint16_t>(reg >> (16 * half)));
}

// p[0], p[1] as one register (p 4-byte aligned: shared memory tiles).
DTRAIN_HD inline uint32_t LoadBf16Pair(const Bf16* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint32_t*>(p);
#else
  uint32_t reg;
  std::memcpy(&reg, p, sizeof(reg));
  return reg;
#endif
}
// The A fragment of the 16 x 16 block at `tile` of a row-major matrix (row r at tile + r *
// stride).
DTRAIN_HD inline MmaA LoadA(int lane, const Bf16* tile, int stride) {
  const Bf16* p = tile + (lane / 4) * stride + 2 * (lane % 4);
  return {{LoadBf16Pair(p), LoadBf16Pair(p + 8 * stride), LoadBf16Pair(p + 8),
           LoadBf16Pair(p + 8 * stride + 8)}};
}
// The B fragment of the 16 x 8 block B = M^T, M (8 x 16) row-major at `tile`: keys stored as
// rows multiplying queries (S = Q K^T).
DTRAIN_HD inline MmaB LoadBTransposed(int lane, const Bf16* tile, int stride) {
  const Bf16* p = tile + (lane / 4) * stride + 2 * (lane % 4);
  return {{LoadBf16Pair(p), LoadBf16Pair(p + 8)}};
}
// The B fragments of the two 16 x 8 blocks, columns [0, 8) and [8, 16), of the 16 x 16 block at
// `tile` of a row-major matrix (P V, V's rows the keys), in one ldmatrix: matrices 0-3 are rows
// [0, 8) and [8, 16) of columns [0, 8), then of columns [8, 16). `tile` and `stride` keep every
// row 16-byte aligned.
template <typename Warp>
DTRAIN_HD void LoadBPair(const Warp& warp, const Bf16* tile, int stride, MmaB& left, MmaB& right) {
  const int matrix = warp.lane() / 8;
  uint32_t reg[4];
  warp.LoadMatricesTransposed(tile + (matrix % 2 * 8 + warp.lane() % 8) * stride + matrix / 2 * 8,
                              reg);
  left = {{reg[0], reg[1]}};
  right = {{reg[2], reg[3]}};
}

// The A fragment (rounded to bf16) of the 16 x 16 product whose columns 0-7 are `left`'s and
// 8-15 are `right`'s.
DTRAIN_HD inline MmaA ToA(const MmaC& left, const MmaC& right) {
  return {{PackBf16(left.value[0], left.value[1]), PackBf16(left.value[2], left.value[3]),
           PackBf16(right.value[0], right.value[1]), PackBf16(right.value[2], right.value[3])}};
}

// The sum (max) over the quad of the calling lane, the lanes that share its rows of C.
template <typename Warp>
DTRAIN_HD float QuadSum(const Warp& warp, float v) {
  v += warp.ShuffleXor(v, 1);
  return v + warp.ShuffleXor(v, 2);
}
template <typename Warp>
DTRAIN_HD float QuadMax(const Warp& warp, float v) {
  const float a = warp.ShuffleXor(v, 1);
  v = v > a ? v : a;
  const float b = warp.ShuffleXor(v, 2);
  return v > b ? v : b;
}

}  // namespace dtrain::cuda
