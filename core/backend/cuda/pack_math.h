// 16-byte packs: a kernel thread loads and stores kPackSize<T> contiguous values (4 floats or 8
// bf16) with one vector instruction each, where the address is 16-byte aligned and the pack lies
// inside the buffer; elsewhere (a misaligned view, the tail) value by value. The host, which
// runs the same row functions in the tests, copies a whole pack with memcpy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/backend/cuda/host_device.h"

namespace dtrain::cuda {

template <typename T>
inline constexpr int kPackSize = 16 / sizeof(T);

template <typename T>
struct alignas(16) Pack {
  T values[kPackSize<T>];
};

template <typename T>
DTRAIN_HD inline bool IsWholePack(const T* p, size_t i, size_t n) {
  return i + kPackSize<T> <= n && reinterpret_cast<uintptr_t>(p + i) % 16 == 0;
}

// p[i, i + kPackSize) with values past n left as `fill`.
template <typename T>
DTRAIN_HD inline Pack<T> LoadPack(const T* p, size_t i, size_t n, T fill) {
  Pack<T> pack;
  if (IsWholePack(p, i, n)) {
#if defined(__CUDA_ARCH__)
    pack = *reinterpret_cast<const Pack<T>*>(p + i);
#else
    std::memcpy(&pack, p + i, sizeof(pack));
#endif
    return pack;
  }
  for (int k = 0; k < kPackSize<T>; ++k) pack.values[k] = i + k < n ? p[i + k] : fill;
  return pack;
}

// Stores the values of `pack` that fall inside [0, n).
template <typename T>
DTRAIN_HD inline void StorePack(T* p, size_t i, size_t n, const Pack<T>& pack) {
  if (IsWholePack(p, i, n)) {
#if defined(__CUDA_ARCH__)
    *reinterpret_cast<Pack<T>*>(p + i) = pack;
#else
    std::memcpy(p + i, &pack, sizeof(pack));
#endif
    return;
  }
  for (int k = 0; k < kPackSize<T> && i + k < n; ++k) p[i + k] = pack.values[k];
}

}  // namespace dtrain::cuda
