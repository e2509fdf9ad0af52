// The gradient's global norm and its clipping (core/backend/cpu/elementwise.h has the CPU's), and
// the sum of the classifier's row losses.
// The sum of squares runs in two deterministic steps (warp_math.h): every block of
// kSumSquaresBlock values gets its fp32 sum from one warp (a lane adds 128 squares, the lanes
// combine), then one block of kSumThreads adds the block sums in double. All terms are positive, so
// the fp32 step's relative error stays below (128 + 5) * 2^-24 ~ 8e-6 whatever the values; the
// double step keeps the sum over a model's hundreds of millions of values from losing more.
#pragma once

#include <cstddef>

#include "core/backend/cuda/bf16.h"
#include "core/backend/cuda/host_device.h"
#include "core/backend/cuda/warp_math.h"

namespace dtrain::cuda {

inline constexpr size_t kSumSquaresBlock = 4096;

inline size_t SumSquaresBlocks(size_t n) { return (n + kSumSquaresBlock - 1) / kSumSquaresBlock; }

struct AddDoubles {
  DTRAIN_HD double operator()(double a, double b) const { return a + b; }
};

// The sum of squares of x's values [block * kSumSquaresBlock, +kSumSquaresBlock) ∩ [0, n).
template <typename Warp, typename T>
DTRAIN_HD float SumSquaresOfBlock(const Warp& warp, const T* x, size_t n, size_t block) {
  const size_t first = block * kSumSquaresBlock;
  const size_t last = first + kSumSquaresBlock < n ? first + kSumSquaresBlock : n;
  float sum = 0;
  for (size_t i = first + warp.lane(); i < last; i += kWarpSize)
    sum += ToFloat(x[i]) * ToFloat(x[i]);
  return WarpSum(warp, sum);
}

// Threads of the block that adds values in double (SumInDouble): the classifier's 16,384 row
// losses of a 16 x 1024 micro-batch are 16 loads a thread, where one warp made 512 in turn.
inline constexpr int kSumThreads = 1024;

// The sum of n values in double: the blocks' sums, or the classifier's row losses. Thread t adds
// values t, t + kThreads, ..., and the block combines them in warp order (BlockButterfly);
// shared: kThreads / kWarpSize doubles.
template <int kThreads, typename Block>
DTRAIN_HD double SumInDouble(const Block& block, double* shared, const float* values, size_t n) {
  double sum = 0;
  for (size_t i = static_cast<size_t>(block.thread()); i < n; i += kThreads) sum += values[i];
  return BlockButterfly<kThreads>(block, shared, sum, AddDoubles{});
}

// One value of a + b (the residual stream's add where it is not fused into a norm).
template <typename T>
DTRAIN_HD T AddValues(T a, T b) {
  return FromFloat<T>(ToFloat(a) + ToFloat(b));
}

// One value scaled by the clipping factor.
template <typename T>
DTRAIN_HD T ScaleValue(T x, float factor) {
  return FromFloat<T>(ToFloat(x) * factor);
}

}  // namespace dtrain::cuda
