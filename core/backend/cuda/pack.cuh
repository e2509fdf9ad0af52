// 16-byte packs: an elementwise kernel thread loads and stores kPackSize<T> contiguous values (4
// floats or 8 bf16) with one vector instruction each, where the address is 16-byte aligned and
// the pack lies inside the buffer; elsewhere (a misaligned view, the tail) value by value.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dtrain::cuda {

template <typename T>
inline constexpr int kPackSize = 16 / sizeof(T);

template <typename T>
struct alignas(16) Pack {
  T values[kPackSize<T>];
};

template <typename T>
__device__ inline bool IsWholePack(const T* p, size_t i, size_t n) {
  return i + kPackSize<T> <= n && reinterpret_cast<uintptr_t>(p + i) % 16 == 0;
}

// p[i, i + kPackSize) with values past n left as `fill`.
template <typename T>
__device__ inline Pack<T> LoadPack(const T* p, size_t i, size_t n, T fill) {
  if (IsWholePack(p, i, n)) return *reinterpret_cast<const Pack<T>*>(p + i);
  Pack<T> pack;
  for (int k = 0; k < kPackSize<T>; ++k) pack.values[k] = i + k < n ? p[i + k] : fill;
  return pack;
}

// Stores the values of `pack` that fall inside [0, n).
template <typename T>
__device__ inline void StorePack(T* p, size_t i, size_t n, const Pack<T>& pack) {
  if (IsWholePack(p, i, n)) {
    *reinterpret_cast<Pack<T>*>(p + i) = pack;
    return;
  }
  for (int k = 0; k < kPackSize<T> && i + k < n; ++k) p[i + k] = pack.values[k];
}

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
