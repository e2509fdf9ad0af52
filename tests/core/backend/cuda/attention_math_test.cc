#include "core/backend/cuda/attention_math.h"

#include <vector>

#include "core/backend/cpu/attention.h"
#include "gtest/gtest.h"
#include "tests/core/backend/cuda/test_util.h"

namespace dtrain::cuda {
namespace {

using testing::ExpectFloatMatches;
using testing::ExpectMatches;
using testing::HostWarp;
using testing::Load;
using testing::RunOnHostWarp;
using testing::Store;

// Grouped-query heads (4 query heads on 2 kv heads); D = 40, so lanes 0-7 hold two dims and the
// others one.
constexpr AttentionShape kShape{.batch = 2, .time = 6, .heads = 4, .kv_heads = 2, .head_dim = 40};

// Forward, then backward from the forward's own out and lse, each over the kernels' rows (every
// (b, h, t) query row; every (b, kv, s) key row), against the CPU backend given the same inputs.
template <typename T>
void CheckAttention() {
  const AttentionDims dims = MakeAttentionDims(kShape);
  const size_t rows = static_cast<size_t>(kShape.batch) * kShape.time;
  const std::vector<T> qkv = Store<T>(testing::RandomFloats(rows * dims.qkv_width, 1));
  const std::vector<T> dout = Store<T>(testing::RandomFloats(rows * dims.out_width, 2));
  std::vector<T> out(rows * dims.out_width), dqkv(qkv.size());
  std::vector<float> lse(static_cast<size_t>(kShape.batch) * kShape.heads * kShape.time);
  for (int b = 0; b < kShape.batch; ++b) {
    const T* qkv_b = qkv.data() + b * kShape.time * dims.qkv_width;
    T* out_b = out.data() + b * kShape.time * dims.out_width;
    const T* dout_b = dout.data() + b * kShape.time * dims.out_width;
    T* dqkv_b = dqkv.data() + b * kShape.time * dims.qkv_width;
    float* lse_b = lse.data() + b * kShape.heads * kShape.time;
    for (int h = 0; h < kShape.heads; ++h) {
      for (int t = 0; t < kShape.time; ++t) {
        RunOnHostWarp([&](const HostWarp& warp) {
          AttentionForwardRow(warp, out_b, lse_b, qkv_b, dims, h, t);
        });
      }
    }
    for (int h = 0; h < kShape.heads; ++h) {
      for (int t = 0; t < kShape.time; ++t) {
        RunOnHostWarp([&](const HostWarp& warp) {
          AttentionQueryGradRow(warp, dqkv_b, dout_b, qkv_b, out_b, lse_b, dims, h, t);
        });
      }
    }
    for (int kv = 0; kv < kShape.kv_heads; ++kv) {
      for (int s = 0; s < kShape.time; ++s) {
        RunOnHostWarp([&](const HostWarp& warp) {
          AttentionKeyValueGradRow(warp, dqkv_b, dout_b, qkv_b, out_b, lse_b, dims, kv, s);
        });
      }
    }
  }

  std::vector<float> scratch(cpu::AttentionScratchSize(kShape));
  const std::vector<float> qkv_cpu = Load(qkv);
  std::vector<float> out_cpu(out.size()), lse_cpu(lse.size()), dqkv_cpu(dqkv.size());
  cpu::AttentionForward(out_cpu.data(), lse_cpu.data(), qkv_cpu.data(), kShape, scratch.data(),
                        nullptr);
  ExpectMatches(out, out_cpu, "out");
  ExpectFloatMatches(lse, lse_cpu, "lse");
  cpu::AttentionBackward(dqkv_cpu.data(), Load(dout).data(), qkv_cpu.data(), Load(out).data(),
                         lse.data(), kShape, scratch.data(), nullptr);
  ExpectMatches(dqkv, dqkv_cpu, "dqkv");
}

TEST(CudaAttentionTest, Fp32MatchesCpuBackend) { CheckAttention<float>(); }

TEST(CudaAttentionTest, Bf16MatchesCpuBackendOnRoundedInputs) { CheckAttention<Bf16>(); }

}  // namespace
}  // namespace dtrain::cuda
