// Helpers for the tests of the CUDA kernels' host/device arithmetic: bf16 rounding of test
// inputs, the comparisons against the CPU backend, and a warp emulated on host threads so a row
// function written for one warp runs on the host exactly as on the device.
#pragma once

#include <algorithm>
#include <array>
#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "core/backend/cuda/bf16.h"
#include "core/backend/cuda/host_device.h"
#include "core/backend/cuda/mma_math.h"
#include "gtest/gtest.h"
#include "tests/core/backend/cpu/test_util.h"

namespace dtrain::cuda::testing {

// The kernels' fp32 arithmetic against the CPU backend's fp32 on the same inputs, relative to
// max(1, |expected|). Both sides round every operation to fp32 and differ only in the order of
// their sums (a warp's 32 strided partial sums and a 5-level tree against a running sum or a BLAS
// kernel). A sum of n terms of magnitude <= m then differs by at most n * 2^-24 of the result when
// the terms share a sign (sums of squares, softmax sums), and by about n * 2^-24 * m for random
// signs (a random walk of sqrt(n) rounding errors, each at most sqrt(n) * m * 2^-24); the tests
// keep n <= 128 and m <= 1, so both stay below 7.6e-6, and the other operations add a few ulps.
inline constexpr double kFloatTolerance = 1e-5;

// n uniform values in [lo, hi), as the CPU tests draw them, in fp32.
inline std::vector<float> RandomFloats(size_t n, unsigned seed, double lo = -1, double hi = 1) {
  return cpu::testing::ToFloat(cpu::testing::RandomVector(n, seed, lo, hi));
}

inline std::vector<float> Bf16Rounded(const std::vector<float>& values) {
  std::vector<float> rounded(values.size());
  for (size_t i = 0; i < values.size(); ++i) rounded[i] = ToFloat(FromFloat<Bf16>(values[i]));
  return rounded;
}

inline std::vector<Bf16> ToBf16(const std::vector<float>& values) {
  std::vector<Bf16> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = FromFloat<Bf16>(values[i]);
  return out;
}

// values as storage T holds them (rounded for bf16), and back to fp32.
template <typename T>
std::vector<T> Store(const std::vector<float>& values) {
  std::vector<T> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = FromFloat<T>(values[i]);
  return out;
}
template <typename T>
std::vector<float> Load(const std::vector<T>& values) {
  std::vector<float> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = ToFloat(values[i]);
  return out;
}

inline void ExpectFloatMatches(const std::vector<float>& actual, const std::vector<float>& expected,
                               const char* what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_NEAR(actual[i], expected[i], kFloatTolerance * std::max(1.0f, std::abs(expected[i])))
        << what << "[" << i << "]";
  }
}

// A bf16 output against the CPU's fp32 `expected` on the same (bf16-rounded) inputs: the
// kernel's fp32 value y is within f = kFloatTolerance * max(1, |expected|) of expected, and
// rounding y to bf16 moves it by at most half an ulp, 2^-8 |y| <= 2^-8 (|expected| + f).
inline void ExpectBf16Matches(const std::vector<Bf16>& actual, const std::vector<float>& expected,
                              const char* what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double f = kFloatTolerance * std::max(1.0, std::abs(double{expected[i]}));
    const double bound = std::ldexp(std::abs(double{expected[i]}) + f, -8) + f;
    ASSERT_NEAR(ToFloat(actual[i]), expected[i], bound) << what << "[" << i << "]";
  }
}

// ExpectFloatMatches or ExpectBf16Matches, by the storage of `actual`.
inline void ExpectMatches(const std::vector<float>& actual, const std::vector<float>& expected,
                          const char* what) {
  ExpectFloatMatches(actual, expected, what);
}
inline void ExpectMatches(const std::vector<Bf16>& actual, const std::vector<float>& expected,
                          const char* what) {
  ExpectBf16Matches(actual, expected, what);
}

// One lane of a warp (or of a group of kLanes lanes) emulated on the host: the row functions'
// Warp (see core/backend/cuda/warp.cuh for the device one). Butterfly exchanges values between
// lanes as __shfl_xor_sync does, so every lane combines the same values in the same order as on
// the GPU.
template <int kLanes>
class HostLanes {
 public:
  struct Shared {
    std::barrier<> sync{kLanes};
    std::array<std::array<std::byte, 16>, kLanes> slots;
    std::array<MmaA, kLanes> a;
    std::array<MmaB, kLanes> b;
    std::array<const Bf16*, kLanes> rows;
  };

  HostLanes(int lane, Shared* shared) : lane_(lane), shared_(shared) {}
  int lane() const { return lane_; }

  template <typename V, typename Combine>
  V Butterfly(V v, Combine combine) const {
    static_assert(sizeof(V) <= 16);
    for (int offset = kLanes / 2; offset > 0; offset /= 2) {
      std::memcpy(shared_->slots[lane_].data(), &v, sizeof(V));
      shared_->sync.arrive_and_wait();
      V other;
      std::memcpy(&other, shared_->slots[lane_ ^ offset].data(), sizeof(V));
      shared_->sync.arrive_and_wait();
      v = combine(v, other);
    }
    return v;
  }

  float ShuffleXor(float v, int offset) const {
    std::memcpy(shared_->slots[lane_].data(), &v, sizeof(v));
    shared_->sync.arrive_and_wait();
    float other;
    std::memcpy(&other, shared_->slots[lane_ ^ offset].data(), sizeof(other));
    shared_->sync.arrive_and_wait();
    return other;
  }

  // mma.sync.m16n8k16 from the fragment layout of mma_math.h: the lanes post their fragments,
  // and each sums its four elements of C in fp32 over k in order (the products of bf16 values
  // are exact in fp32; the tensor cores' order of the sum is unspecified).
  void Mma(MmaC& c, const MmaA& a, const MmaB& b) const {
    static_assert(kLanes == kWarpSize);
    shared_->a[lane_] = a;
    shared_->b[lane_] = b;
    shared_->sync.arrive_and_wait();
    float a_matrix[16][16], b_matrix[16][8];
    for (int lane = 0; lane < kLanes; ++lane) {
      for (int e = 0; e < 8; ++e) {
        const MatrixIndex at = MmaAIndex(lane, e);
        a_matrix[at.row][at.col] = UnpackBf16(shared_->a[lane].reg[e / 2], e % 2);
      }
      for (int e = 0; e < 4; ++e) {
        const MatrixIndex at = MmaBIndex(lane, e);
        b_matrix[at.row][at.col] = UnpackBf16(shared_->b[lane].reg[e / 2], e % 2);
      }
    }
    shared_->sync.arrive_and_wait();
    for (int e = 0; e < 4; ++e) {
      const MatrixIndex at = MmaCIndex(lane_, e);
      for (int k = 0; k < 16; ++k) c.value[e] += a_matrix[at.row][k] * b_matrix[k][at.col];
    }
  }

  // ldmatrix.sync.m8n8.x4.trans as mma_math.h states it: matrix i's row r is at the address lane
  // 8i + r gave; this lane takes elements [2c][g] and [2c+1][g] of each.
  void LoadMatricesTransposed(const Bf16* row, uint32_t (&reg)[4]) const {
    static_assert(kLanes == kWarpSize);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(row) % 16, 0u)
        << "an ldmatrix row is not 16-byte aligned";
    shared_->rows[lane_] = row;
    shared_->sync.arrive_and_wait();
    const int g = lane_ / 4, c = lane_ % 4;
    for (int i = 0; i < 4; ++i) {
      reg[i] = static_cast<uint32_t>(shared_->rows[8 * i + 2 * c][g].bits) |
               (static_cast<uint32_t>(shared_->rows[8 * i + 2 * c + 1][g].bits) << 16);
    }
    shared_->sync.arrive_and_wait();
  }

 private:
  int lane_;
  Shared* shared_;
};

using HostWarp = HostLanes<kWarpSize>;

// Runs body(lanes) on each of the kLanes lanes of one emulated group, one thread per lane.
template <int kLanes = kWarpSize>
void RunOnHostLanes(const std::function<void(const HostLanes<kLanes>&)>& body) {
  typename HostLanes<kLanes>::Shared shared;
  std::vector<std::thread> lanes;
  for (int lane = 0; lane < kLanes; ++lane) {
    lanes.emplace_back([&, lane] { body(HostLanes<kLanes>(lane, &shared)); });
  }
  for (std::thread& lane : lanes) lane.join();
}

inline void RunOnHostWarp(const std::function<void(const HostWarp&)>& body) {
  RunOnHostLanes<kWarpSize>(body);
}

// A thread of a block of kThreads threads (whole warps) emulated on host threads: the Block of
// kernels written against one (warp.cuh's DeviceBlock on the GPU).
// Its async copies land only when WaitAsync lets them, group by group, and poison (0xff bytes:
// bf16 NaN) their destination when they begin, as on the GPU they may land any time in between: a
// read before the wait for its group, or by another thread before the barrier after that wait,
// reads the poison (or, racing, either).
template <int kThreads>
class HostBlock {
 public:
  static_assert(kThreads % kWarpSize == 0);
  // A copy begun and not yet landed.
  struct Copy {
    void* to;
    const void* from;
    bool valid;
  };
  struct Shared {
    std::barrier<> sync{kThreads};
    std::array<HostWarp::Shared, kThreads / kWarpSize> warps;
    // Each thread's copies: its committed groups, oldest first, and the group it is filling.
    std::array<std::vector<std::vector<Copy>>, kThreads> groups;
    std::array<std::vector<Copy>, kThreads> open;
  };

  HostBlock(int thread, Shared* shared) : thread_(thread), shared_(shared) {}
  int thread() const { return thread_; }
  int warp_index() const { return thread_ / kWarpSize; }
  HostWarp warp() const { return HostWarp(thread_ % kWarpSize, &shared_->warps[warp_index()]); }
  void Sync() const { shared_->sync.arrive_and_wait(); }

  void CopyAsync(void* to, const void* from, bool valid) const {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(to) % 16, 0u) << "cp.async's shared address";
    std::memset(to, 0xff, 16);
    shared_->open[thread_].push_back({to, from, valid});
  }
  void CommitAsync() const {
    shared_->groups[thread_].push_back(std::move(shared_->open[thread_]));
    shared_->open[thread_].clear();
  }
  template <int kPending>
  void WaitAsync() const {
    std::vector<std::vector<Copy>>& groups = shared_->groups[thread_];
    while (groups.size() > static_cast<size_t>(kPending)) {
      for (const Copy& copy : groups.front()) {
        if (copy.valid) {
          std::memcpy(copy.to, copy.from, 16);
        } else {
          std::memset(copy.to, 0, 16);
        }
      }
      groups.erase(groups.begin());
    }
  }

 private:
  int thread_;
  Shared* shared_;
};

// Runs body(block) on each of the kThreads threads of one emulated block.
template <int kThreads>
void RunOnHostBlock(const std::function<void(const HostBlock<kThreads>&)>& body) {
  typename HostBlock<kThreads>::Shared shared;
  std::vector<std::thread> threads;
  for (int thread = 0; thread < kThreads; ++thread) {
    threads.emplace_back([&, thread] { body(HostBlock<kThreads>(thread, &shared)); });
  }
  for (std::thread& thread : threads) thread.join();
}

}  // namespace dtrain::cuda::testing
