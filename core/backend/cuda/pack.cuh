// The elementwise kernels' grids over 16-byte packs (pack_math.h).
#pragma once

#include <cstddef>

#include "core/backend/cuda/pack_math.h"

namespace dtrain::cuda {

// Threads per block for the elementwise kernels, and the blocks that cover n values in packs.
inline constexpr int kElementwiseThreads = 256;
template <typename T>
inline unsigned PackBlocks(size_t n) {
  const size_t packs = (n + kPackSize<T> - 1) / kPackSize<T>;
  return static_cast<unsigned>((packs + kElementwiseThreads - 1) / kElementwiseThreads);
}

// A kernel over `rows` rows of `width` values in packs: the rows on the grid's x (up to 2^31 - 1;
// y stops at 65535, a micro-batch of 16 x 4096 tokens), each row's packs on y. In the kernel,
// RowOfGrid() and PackOfRow<T>() are the calling thread's row and first value.
template <typename T>
inline dim3 RowPackGrid(size_t rows, size_t width) {
  return dim3(static_cast<unsigned>(rows), PackBlocks<T>(width));
}
__device__ inline size_t RowOfGrid() { return blockIdx.x; }
template <typename T>
__device__ inline size_t PackOfRow() {
  return (static_cast<size_t>(blockIdx.y) * blockDim.x + threadIdx.x) * kPackSize<T>;
}

}  // namespace dtrain::cuda
