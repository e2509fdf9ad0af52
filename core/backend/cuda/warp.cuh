// The device's Warp for the row functions (warp_math.h): the warp of the calling thread, every
// lane of which must make the same Butterfly calls, or a group of its lanes.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/backend/cuda/host_device.h"

namespace dtrain::cuda {

// A group of kLanes consecutive lanes of the calling thread's warp (a power of two dividing the
// warp), every lane of which must make the same Butterfly calls; the other groups of the warp may
// have diverged.
template <int kLanes>
struct DeviceLanes {
  static_assert(kLanes > 0 && kLanes <= kWarpSize && kWarpSize % kLanes == 0);
  __device__ int lane() const { return threadIdx.x % kLanes; }

  template <typename V, typename Combine>
  __device__ V Butterfly(V v, Combine combine) const {
    static_assert(sizeof(V) % sizeof(uint32_t) == 0);
    constexpr int kWords = sizeof(V) / sizeof(uint32_t);
    constexpr uint32_t kGroupBits = kLanes == kWarpSize ? 0xffffffffu : (1u << kLanes) - 1;
    const uint32_t mask = kGroupBits << (threadIdx.x % kWarpSize / kLanes * kLanes);
    for (int offset = kLanes / 2; offset > 0; offset /= 2) {
      uint32_t words[kWords];
      std::memcpy(words, &v, sizeof(V));
      for (int w = 0; w < kWords; ++w) words[w] = __shfl_xor_sync(mask, words[w], offset, kLanes);
      V other;
      std::memcpy(&other, words, sizeof(V));
      v = combine(v, other);
    }
    return v;
  }
};

using DeviceWarp = DeviceLanes<kWarpSize>;

// Warps per block of the row kernels, and the blocks that give each of `rows` rows a warp.
inline constexpr int kRowWarpsPerBlock = 8;
inline unsigned RowBlocks(int rows) {
  return static_cast<unsigned>((rows + kRowWarpsPerBlock - 1) / kRowWarpsPerBlock);
}
// The row of the calling thread's warp; rows past the end are the whole warp's, so it returns
// as one and no lane is missing from a butterfly.
__device__ inline int WarpRow() {
  return static_cast<int>(blockIdx.x) * kRowWarpsPerBlock +
         static_cast<int>(threadIdx.x) / kWarpSize;
}

}  // namespace dtrain::cuda
