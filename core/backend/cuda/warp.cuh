// The device's Warp for the row functions (warp_math.h): the warp of the calling thread, every
// lane of which must make the same Butterfly calls, or a group of its lanes.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/backend/cuda/host_device.h"
#include "core/backend/cuda/mma_math.h"

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

  // The tensor-core operations of mma_math.h, for whole warps (kLanes 32) of converged lanes.
  __device__ float ShuffleXor(float v, int offset) const {
    static_assert(kLanes == kWarpSize);
    return __shfl_xor_sync(0xffffffffu, v, offset);
  }
  __device__ void Mma(MmaC& c, const MmaA& a, const MmaB& b) const {
    static_assert(kLanes == kWarpSize);
#if __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c.value[0]), "+f"(c.value[1]), "+f"(c.value[2]), "+f"(c.value[3])
        : "r"(a.reg[0]), "r"(a.reg[1]), "r"(a.reg[2]), "r"(a.reg[3]), "r"(b.reg[0]), "r"(b.reg[1]));
#else
    __trap();  // the launchers use tensor-core kernels only on sm_80 and later
#endif
  }
  __device__ void LoadMatricesTransposed(const Bf16* row, uint32_t (&reg)[4]) const {
    static_assert(kLanes == kWarpSize);
#if __CUDA_ARCH__ >= 800
    const auto address = static_cast<uint32_t>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(reg[0]), "=r"(reg[1]), "=r"(reg[2]), "=r"(reg[3])
                 : "r"(address)
                 : "memory");  // it reads shared memory the compiler does not see
#else
    __trap();
#endif
  }
};

using DeviceWarp = DeviceLanes<kWarpSize>;

// The block of the calling thread, for kernels written against a Block type (thread(),
// warp_index(), warp(), Sync(), the async copies) that the host tests emulate (test_util.h's
// HostBlock). Async copies (sm_80 and later): CopyAsync starts a 16-byte copy from global to
// shared memory (16 zero bytes where `valid` is false, reading nothing) that the thread's next
// CommitAsync closes into a group; WaitAsync<kPending>() returns once all but the kPending newest
// groups have landed, and a Sync after it shows them to the block.
struct DeviceBlock {
  __device__ int thread() const { return static_cast<int>(threadIdx.x); }
  __device__ int warp_index() const { return static_cast<int>(threadIdx.x) / kWarpSize; }
  __device__ DeviceWarp warp() const { return {}; }
  __device__ void Sync() const { __syncthreads(); }

  __device__ void CopyAsync(void* to, const void* from, bool valid) const {
#if __CUDA_ARCH__ >= 800
    // A view into the arena may be 2-byte aligned only (bf16 rows), which cp.async may fault on
    // even when it reads nothing: copied here, 2 bytes at a time.
    if (reinterpret_cast<uintptr_t>(from) % 16 != 0) {
      uint16_t halves[8] = {};
      for (int k = 0; valid && k < 8; ++k) halves[k] = static_cast<const uint16_t*>(from)[k];
      std::memcpy(to, halves, sizeof(halves));
      return;
    }
    const auto address = static_cast<uint32_t>(__cvta_generic_to_shared(to));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :
                 : "r"(address), "l"(from), "r"(valid ? 16 : 0)
                 : "memory");
#else
    __trap();  // the launchers use the kernels that copy so only on sm_80 and later
#endif
  }
  __device__ void CommitAsync() const {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
  }
  template <int kPending>
  __device__ void WaitAsync() const {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
  }
};

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
