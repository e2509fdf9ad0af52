#include "core/backend/cuda/flash_attention_math.h"

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/backend/cpu/attention.h"
#include "gtest/gtest.h"
#include "tests/core/backend/cuda/attention_bounds.h"
#include "tests/core/backend/cuda/test_util.h"

namespace dtrain::cuda {
namespace {

using testing::HostBlock;
using testing::Load;
using testing::RandomFloats;
using testing::RunOnHostBlock;
using testing::ToBf16;

using Block = HostBlock<kFlashThreads>;

// Runs body(block, shared) on every block of a (blocks_x, blocks_y) grid, each with `bytes` of
// zeroed shared memory.
template <typename Body>
void RunGrid(int blocks_x, int blocks_y, size_t bytes, const Body& body) {
  for (int x = 0; x < blocks_x; ++x) {
    for (int y = 0; y < blocks_y; ++y) {
      std::vector<std::byte> shared(bytes);
      RunOnHostBlock<kFlashThreads>(
          [&](const Block& block) { body(block, reinterpret_cast<Bf16*>(shared.data()), x, y); });
    }
  }
}

// The three kernels' blocks over the whole grid on emulated blocks, against the CPU backend given
// the same bf16 inputs, within the rounding of P and dS (attention_bounds.h).
template <int kD>
void CheckFlashAttention(const AttentionShape& shape, const std::vector<int32_t>& documents) {
  SCOPED_TRACE(::testing::Message()
               << "T " << shape.time << " D " << kD << (documents.empty() ? "" : ", documents"));
  const int32_t* positions = documents.empty() ? nullptr : documents.data();
  const AttentionDims dims = MakeAttentionDims(shape);
  const size_t rows = static_cast<size_t>(shape.batch) * shape.time;
  const std::vector<Bf16> qkv = ToBf16(RandomFloats(rows * dims.qkv_width, 1));
  const std::vector<Bf16> dout = ToBf16(RandomFloats(rows * dims.out_width, 2));
  std::vector<Bf16> out(rows * dims.out_width), dqkv(qkv.size());
  std::vector<float> lse(rows * shape.heads), deltas(lse.size());
  const int tiles = (shape.time + kFlashBlockRows<kD> - 1) / kFlashBlockRows<kD>;
  RunGrid(shape.batch * shape.heads, tiles, kFlashForwardShared<kD>,
          [&](const Block& block, Bf16* shared, int x, int y) {
            FlashForwardBlock<kD>(block, shared, out.data(), lse.data(), qkv.data(), positions,
                                  dims, x / shape.heads, x % shape.heads, y);
          });
  RunGrid(shape.batch * shape.heads, tiles, kFlashQueryGradShared<kD>,
          [&](const Block& block, Bf16* shared, int x, int y) {
            FlashQueryGradBlock<kD>(block, shared, dqkv.data(), deltas.data(), dout.data(),
                                    qkv.data(), out.data(), lse.data(), positions, dims,
                                    x / shape.heads, x % shape.heads, y);
          });
  RunGrid(shape.batch * shape.kv_heads, tiles, kFlashKeyValueGradShared<kD>,
          [&](const Block& block, Bf16* shared, int x, int y) {
            FlashKeyValueGradBlock<kD>(block, shared, dqkv.data(), dout.data(), qkv.data(),
                                       lse.data(), deltas.data(), positions, dims,
                                       x / shape.kv_heads, x % shape.kv_heads, y);
          });

  const std::vector<float> qkv_cpu = Load(qkv), dout_cpu = Load(dout), out_kernel = Load(out);
  std::vector<float> scratch(cpu::AttentionScratchSize(shape));
  std::vector<float> out_cpu(out.size()), lse_cpu(lse.size()), dqkv_cpu(qkv.size());
  cpu::AttentionForward(out_cpu.data(), lse_cpu.data(), qkv_cpu.data(), shape, scratch.data(),
                        nullptr, positions);
  cpu::AttentionBackward(dqkv_cpu.data(), dout_cpu.data(), qkv_cpu.data(), out_kernel.data(),
                         lse.data(), shape, scratch.data(), nullptr, positions);
  const testing::AttentionSums sums =
      testing::AttentionAbsoluteSums(shape, qkv_cpu, dout_cpu, out_kernel, positions);
  testing::ExpectWithinRounding(out, out_cpu, sums.out, "out");
  testing::ExpectFloatMatches(lse, lse_cpu, "lse");
  testing::ExpectWithinRounding(dqkv, dqkv_cpu, sums.dqkv, "dqkv");
}

// D = 64 with T = 152: two tiles of 128 query (and key) rows, the second partial: its first
// warp's second 16-row tile half past T, the other warps' wholly; three forward key tiles, five dq
// key tiles and dk/dv query tiles, grouped-query heads; documents cross the tiles' boundaries,
// so rows of one block see keys from before it and rows past a document's end see none of a tile.
TEST(FlashAttentionTest, HeadDim64MatchesCpuBackend) {
  const AttentionShape shape{.batch = 2, .time = 152, .heads = 4, .kv_heads = 2, .head_dim = 64};
  CheckFlashAttention<64>(shape, {});
  CheckFlashAttention<64>(shape,
                          testing::PackedPositions(shape.batch, shape.time, {3, 1, 50, 17, 70}));
}

// D = 128 with T = 70: two query and key tiles of 64 rows, one 16-row tile a warp.
TEST(FlashAttentionTest, HeadDim128MatchesCpuBackend) {
  const AttentionShape shape{.batch = 1, .time = 70, .heads = 2, .kv_heads = 1, .head_dim = 128};
  CheckFlashAttention<128>(shape, {});
  CheckFlashAttention<128>(shape, testing::PackedPositions(shape.batch, shape.time, {5, 40}));
}

}  // namespace
}  // namespace dtrain::cuda
