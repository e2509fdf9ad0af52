#include "core/backend/cuda/attention_math.h"

#include <algorithm>
#include <random>
#include <utility>
#include <vector>

#include "core/backend/cpu/attention.h"
#include "core/backend/cuda/positions_math.h"
#include "gtest/gtest.h"
#include "tests/core/backend/cuda/test_util.h"

namespace dtrain::cuda {
namespace {

using testing::ExpectFloatMatches;
using testing::ExpectMatches;
using testing::Load;
using testing::RunOnHostLanes;
using testing::Store;

// Grouped-query heads (4 query heads on 2 kv heads); D = 40 takes 4 lanes, of which lanes 0-1
// hold 16 dims, lane 2 holds 8 and lane 3 none.
constexpr AttentionShape kShape{.batch = 2, .time = 6, .heads = 4, .kv_heads = 2, .head_dim = 40};
constexpr int kLanes = AttentionLanes(kShape.head_dim);
static_assert(kLanes == 4);
using Lanes = testing::HostLanes<kLanes>;
// Rows a tile and a block, as the kernels cut the keys (and query rows) into tiles and the rows
// into blocks: T = 6 is a tile of 4 then one of 2, so a row's state carries across tiles.
constexpr int kTile = 4;
// Documents packed into the rows (SFT): batch row 0 holds [0, 2) and [2, 6), which crosses a
// tile boundary; row 1 holds [0, 3), [3, 4) and [4, 6).
const std::vector<int32_t> kPositions = {0, 1, 0, 1, 2, 3, 0, 1, 2, 0, 0, 1};

// Rows [first, first + count) of a head's block (row r at base + r * stride), in fp32, as the
// kernels copy them into shared memory.
template <typename T>
std::vector<float> Tile(const T* base, size_t stride, int first, int count, int d) {
  std::vector<float> tile(static_cast<size_t>(count) * d);
  for (int r = 0; r < count; ++r) {
    for (int c = 0; c < d; ++c) tile[r * d + c] = ToFloat(base[(first + r) * stride + c]);
  }
  return tile;
}

// Forward, then backward from the forward's own out and lse, each over the kernels' rows (every
// (b, h, t) query row; every (b, kv, s) key row), blocks and tiles, against the CPU backend given
// the same inputs; with documents (positions not null) or one document per row.
template <typename T>
void CheckAttention(const int32_t* positions) {
  SCOPED_TRACE(positions != nullptr ? "documents" : "one document per row");
  const AttentionDims dims = MakeAttentionDims(kShape);
  const int d = dims.head_dim, group = kShape.heads / kShape.kv_heads;
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
    const int32_t* positions_b = positions == nullptr ? nullptr : positions + b * kShape.time;
    // The kernels' tile loops: over the key tiles a query block streams (forward and dq), and
    // over the query tiles a key block streams (dk and dv), each clipped to what row t (or s)
    // sees; visit(tile, offset, count).
    const auto for_key_tiles = [&](int t, const auto& visit) {
      const int first = t / kTile * kTile, end = std::min(first + kTile, kShape.time);
      for (int tile = VisibleKeys(positions_b, first).begin; tile < end; tile += kTile) {
        int offset = 0;
        const int seen =
            ClipToRun(VisibleKeys(positions_b, t), tile, std::min(kTile, end - tile), &offset);
        if (seen > 0) visit(tile + offset, seen);
      }
    };
    const auto for_query_tiles = [&](int s, const auto& visit) {
      const int first = s / kTile * kTile;
      const int end =
          VisibleQueries(positions_b, kShape.time, std::min(first + kTile, kShape.time) - 1).end;
      for (int tile = first; tile < end; tile += kTile) {
        int offset = 0;
        const int seen = ClipToRun(VisibleQueries(positions_b, kShape.time, s), tile,
                                   std::min(kTile, end - tile), &offset);
        if (seen > 0) visit(tile + offset, seen);
      }
    };
    const auto key_tiles = [&](int kv, int tile, int count) {
      return std::pair(Tile(KeyAt(qkv_b, dims, kv, 0), dims.qkv_width, tile, count, d),
                       Tile(ValueAt(qkv_b, dims, kv, 0), dims.qkv_width, tile, count, d));
    };
    for (int h = 0; h < kShape.heads; ++h) {
      for (int t = 0; t < kShape.time; ++t) {
        RunOnHostLanes<kLanes>([&](const Lanes& lanes) {
          AttentionForwardState row;
          row.q = LoadSlice(lanes, QueryAt(qkv_b, dims, h, t), d);
          for_key_tiles(t, [&](int first, int count) {
            const auto [keys, values] = key_tiles(h / group, first, count);
            AttendKeys(lanes, row, keys.data(), values.data(), d, count, dims);
          });
          FinishForwardRow(lanes, row, out_b, lse_b, dims, h, t);
        });
      }
    }
    for (int h = 0; h < kShape.heads; ++h) {
      for (int t = 0; t < kShape.time; ++t) {
        RunOnHostLanes<kLanes>([&](const Lanes& lanes) {
          AttentionQueryGradState row;
          row.q = LoadSlice(lanes, QueryAt(qkv_b, dims, h, t), d);
          row.dy = LoadSlice(lanes, OutAt(dout_b, dims, h, t), d);
          row.delta = LanesDot(lanes, row.dy, OutAt(out_b, dims, h, t), d);
          row.lse = lse_b[h * kShape.time + t];
          for_key_tiles(t, [&](int first, int count) {
            const auto [keys, values] = key_tiles(h / group, first, count);
            QueryGradOverKeys(lanes, row, keys.data(), values.data(), d, count, dims);
          });
          StoreSlice(lanes, QueryAt(dqkv_b, dims, h, t), d, row.acc, dims.scale);
        });
      }
    }
    for (int kv = 0; kv < kShape.kv_heads; ++kv) {
      for (int s = 0; s < kShape.time; ++s) {
        RunOnHostLanes<kLanes>([&](const Lanes& lanes) {
          AttentionKeyGradState row;
          row.k = LoadSlice(lanes, KeyAt(qkv_b, dims, kv, s), d);
          row.v = LoadSlice(lanes, ValueAt(qkv_b, dims, kv, s), d);
          for (int h = kv * group; h < (kv + 1) * group; ++h) {
            for_query_tiles(s, [&](int first, int count) {
              const std::vector<float> queries =
                  Tile(QueryAt(qkv_b, dims, h, 0), dims.qkv_width, first, count, d);
              const std::vector<float> dys =
                  Tile(OutAt(dout_b, dims, h, 0), dims.out_width, first, count, d);
              std::vector<float> tile_lse(count), tile_delta(count);
              for (int j = 0; j < count; ++j) {
                const LaneSlice dy = LoadSlice(lanes, OutAt(dout_b, dims, h, first + j), d);
                tile_delta[j] = LanesDot(lanes, dy, OutAt(out_b, dims, h, first + j), d);
                tile_lse[j] = lse_b[h * kShape.time + first + j];
              }
              KeyGradOverQueries(lanes, row, queries.data(), dys.data(), d, tile_lse.data(),
                                 tile_delta.data(), count, dims);
            });
          }
          StoreSlice(lanes, KeyAt(dqkv_b, dims, kv, s), d, row.dk, dims.scale);
          StoreSlice(lanes, ValueAt(dqkv_b, dims, kv, s), d, row.dv, 1.0f);
        });
      }
    }
  }

  std::vector<float> scratch(cpu::AttentionScratchSize(kShape));
  const std::vector<float> qkv_cpu = Load(qkv);
  std::vector<float> out_cpu(out.size()), lse_cpu(lse.size()), dqkv_cpu(dqkv.size());
  cpu::AttentionForward(out_cpu.data(), lse_cpu.data(), qkv_cpu.data(), kShape, scratch.data(),
                        nullptr, positions);
  ExpectMatches(out, out_cpu, "out");
  ExpectFloatMatches(lse, lse_cpu, "lse");
  cpu::AttentionBackward(dqkv_cpu.data(), Load(dout).data(), qkv_cpu.data(), Load(out).data(),
                         lse.data(), kShape, scratch.data(), nullptr, positions);
  ExpectMatches(dqkv, dqkv_cpu, "dqkv");
}

TEST(CudaAttentionTest, Fp32MatchesCpuBackend) {
  CheckAttention<float>(nullptr);
  CheckAttention<float>(kPositions.data());
}

TEST(CudaAttentionTest, Bf16MatchesCpuBackendOnRoundedInputs) {
  CheckAttention<Bf16>(nullptr);
  CheckAttention<Bf16>(kPositions.data());
}

// Over random packings (documents of 1 to 12 rows, rows of 1 to 40): a query row's keys start at
// its document's first row, and a key row's queries end at the first later row whose position
// is 0, the document's end by a linear scan.
TEST(CudaAttentionTest, VisibleRowsOfRandomPackings) {
  std::mt19937 random(7);
  for (int trial = 0; trial < 500; ++trial) {
    const int time = std::uniform_int_distribution<int>(1, 40)(random);
    std::vector<int32_t> positions;
    while (static_cast<int>(positions.size()) < time) {
      const int length = std::uniform_int_distribution<int>(1, 12)(random);
      for (int i = 0; i < length && static_cast<int>(positions.size()) < time; ++i) {
        positions.push_back(i);
      }
    }
    for (int s = 0; s < time; ++s) {
      int end = s + 1;
      while (end < time && positions[end] != 0) ++end;
      ASSERT_EQ(VisibleQueries(positions.data(), time, s).end, end) << "trial " << trial;
      ASSERT_EQ(VisibleKeys(positions.data(), s).begin, s - positions[s]) << "trial " << trial;
    }
  }
}

// The rows a row sees, and their clipping to a tile, from the positions alone.
TEST(CudaAttentionTest, DocumentsBoundWhatARowSees) {
  const int32_t* row1 = kPositions.data() + kShape.time;  // documents [0, 3), [3, 4), [4, 6)
  EXPECT_EQ(VisibleKeys(row1, 2).begin, 0);
  EXPECT_EQ(VisibleKeys(row1, 3).begin, 3);
  EXPECT_EQ(VisibleKeys(row1, 5).begin, 4);
  EXPECT_EQ(VisibleKeys(nullptr, 5).begin, 0);
  EXPECT_EQ(VisibleKeys(row1, 5).end, 6);
  EXPECT_EQ(VisibleQueries(row1, kShape.time, 1).end, 3);
  EXPECT_EQ(VisibleQueries(row1, kShape.time, 3).end, 4);
  EXPECT_EQ(VisibleQueries(row1, kShape.time, 4).end, 6);
  EXPECT_EQ(VisibleQueries(nullptr, kShape.time, 1).end, 6);
  int offset = -1;
  EXPECT_EQ(ClipToRun({.begin = 2, .end = 5}, 4, 4, &offset), 1);  // row 4 of the run [4, 8)
  EXPECT_EQ(offset, 0);
  EXPECT_EQ(ClipToRun({.begin = 5, .end = 7}, 4, 4, &offset), 2);
  EXPECT_EQ(offset, 1);
  EXPECT_LE(ClipToRun({.begin = 0, .end = 3}, 4, 4, &offset), 0);
}

}  // namespace
}  // namespace dtrain::cuda
