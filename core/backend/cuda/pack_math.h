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

// A row of n values split among kThreads threads (a warp's lanes, or a block's threads) in packs
// that start on 16-byte boundaries wherever the row starts: the first pack begins `skew` values
// before the row (0 when the row is aligned, as the fused classifier's padded rows are; an arena
// view or a rank's vocabulary-parallel rows may not be), so that every pack but the first and last
// is one vector load. Thread t takes packs t, t + kThreads, ...; a pack's first index i may be
// negative, and only its values in [0, n) belong to the row. Other rows read at the same indices
// (a norm's weight beside its input) load whole packs where their own alignment allows.
template <typename T, int kThreads>
struct RowPacks {
  static constexpr int64_t kStride = int64_t{kThreads} * kPackSize<T>;

  DTRAIN_HD RowPacks(const T* row, int64_t n)
      : n(n), skew(static_cast<int64_t>(reinterpret_cast<uintptr_t>(row) % 16 / sizeof(T))) {}
  // The first index of thread t's first pack, and of its last (First - kStride when it has none).
  DTRAIN_HD int64_t First(int t) const { return int64_t{t} * kPackSize<T> - skew; }
  DTRAIN_HD int64_t Last(int t) const {
    return First(t) < n ? First(t) + (n - 1 - First(t)) / kStride * kStride : First(t) - kStride;
  }
  // The thread whose pack holds value j of the row.
  DTRAIN_HD int Owner(int64_t j) const {
    return static_cast<int>((j + skew) / kPackSize<T> % kThreads);
  }
  DTRAIN_HD bool Holds(int64_t i, int k) const { return i + k >= 0 && i + k < n; }

  // The pack at i, values outside the row left as `fill`, and the values of `pack` in the row
  // stored back.
  DTRAIN_HD Pack<T> Load(const T* row, int64_t i, T fill) const {
    if (i >= 0) return LoadPack(row, static_cast<size_t>(i), static_cast<size_t>(n), fill);
    Pack<T> pack;
    for (int k = 0; k < kPackSize<T>; ++k) pack.values[k] = Holds(i, k) ? row[i + k] : fill;
    return pack;
  }
  DTRAIN_HD void Store(T* row, int64_t i, const Pack<T>& pack) const {
    if (i >= 0) {
      StorePack(row, static_cast<size_t>(i), static_cast<size_t>(n), pack);
      return;
    }
    for (int k = 0; k < kPackSize<T>; ++k) {
      if (Holds(i, k)) row[i + k] = pack.values[k];
    }
  }

  int64_t n;
  int64_t skew;
};

}  // namespace dtrain::cuda
