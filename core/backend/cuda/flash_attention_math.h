// Causal attention on tensor cores for bf16 with head_dim 64 or 128 (FlashAttention-2's
// scheme): the formulas of attention_math.h, with every product of two (rows x head_dim) blocks
// an mma.sync of mma_math.h. A block is kFlashWarps warps, each of kFlashWarpTiles<kD> tiles of
// 16 rows (the mma's M), kFlashBlockRows<kD> rows in all.
//   Forward, grid (B * H, query tiles): the block's query rows stream their keys through shared
//     memory kFlashForwardKeys at a time; a warp computes S = Q K^T for its rows, masks it,
//     updates its online softmax in registers, rounds P to bf16 and adds P V.
//   dq, grid (B * H, query tiles): keys kFlashGradTile at a time; S and dP = dO V^T give
//     dS = P (dP - delta), and dq += dS K. It writes each row's delta = dO . O for dk and dv.
//   dk and dv, grid (B * Hkv, key tiles): the query and dout rows of every head of the group that
//     see the block's keys stream kFlashGradTile at a time; a warp computes S^T and dP^T for its
//     keys, dv += P^T dO and dk += dS^T Q.
// Backward is thus deterministic without atomics (dq and dk, dv each have one writer), at the
// price of computing S and dP twice. P and dS are rounded to bf16 before they are multiplied,
// as FlashAttention does; every sum is fp32. Softmax runs in base 2 (scores scaled by
// scale * log2(e)); lse is stored in natural units, as the other kernels and the CPU backend
// keep it.
// Every fragment a warp reads from shared memory for its B operand serves each of its tiles: at
// one tile a warp, the SM's four sub-partitions share 128 bytes a cycle of shared memory, and four
// warps' fragments (256 bytes each) take 8 cycles, twice the ~4 of the mma they feed on sm_90. A
// warp skips the tiles of keys (forward, dq) wholly after its rows and of queries (dk/dv) wholly
// before them.
//
// The functions below are whole blocks' work, written against a Block (warp.cuh's DeviceBlock,
// the tests' HostBlock) and called by attention.cu's kernels with the block's coordinates; the
// host tests run them on emulated blocks. Shared memory tiles are row-major bf16 with rows
// padded by kFlashPad values, so the fragment loads of a warp's 32 lanes fall in distinct banks.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "core/backend/cuda/attention_math.h"
#include "core/backend/cuda/bf16.h"
#include "core/backend/cuda/host_device.h"
#include "core/backend/cuda/mma_math.h"
#include "core/backend/cuda/positions_math.h"
#include "core/backend/cuda/warp_math.h"

namespace dtrain::cuda {

inline constexpr int kFlashWarps = 4;
inline constexpr int kFlashThreads = kFlashWarps * kWarpSize;
// A warp's 16-row tiles: two at head size 64 (ptxas: 223, 245 and 248 registers a thread for the
// forward, dq and dk/dv on sm_90, 227, 235 and 252 on sm_80, no spills), one at 128, where two
// tiles' accumulators and fragments would not fit in 255 registers.
template <int kD>
inline constexpr int kFlashWarpTiles = kD == 64 ? 2 : 1;
// A block's rows: query rows in the forward and dq kernels, key rows in dk/dv.
template <int kD>
inline constexpr int kFlashBlockRows = kFlashWarpTiles<kD> * 16 * kFlashWarps;
inline constexpr int kFlashForwardKeys = 64;
// The keys a forward warp scores at once, a part of the staged tile: its scores take
// kFlashWarpTiles<kD> * kFlashScoreKeys<kD> / 8 blocks of registers, 8 at either head size (at 64
// keys and two tiles, sm_80's ptxas spills).
template <int kD>
inline constexpr int kFlashScoreKeys = kFlashForwardKeys / kFlashWarpTiles<kD>;
inline constexpr int kFlashGradTile = 32;
inline constexpr int kFlashPad = 8;
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// dq stages its two key tiles where its query rows (16 a warp or more) were; a tile's rows are
// whole k-steps.
static_assert(2 * kFlashGradTile <= 16 * kFlashWarps);
static_assert(kFlashScoreKeys<64> % 16 == 0 && kFlashGradTile % 16 == 0);

DTRAIN_HD constexpr bool FlashHeadDim(int head_dim) { return head_dim == 64 || head_dim == 128; }

template <int kD>
inline constexpr int kFlashStride = kD + kFlashPad;

// Shared memory of each kernel, in bytes: the forward's query rows (then two key tiles) and two
// value tiles; dq's query rows (then out's, then two key tiles) and dout's (then two value tiles);
// dk/dv's key and value rows, a query and a dout tile, and three numbers a query row of the tile.
// The forward and dq kernels stream their keys and values two tiles at a time, the next one's
// copies landing while the warps use the other.
template <int kD>
inline constexpr int kFlashForwardKeysRows =
    kFlashBlockRows<kD> > 2 * kFlashForwardKeys ? kFlashBlockRows<kD> : 2 * kFlashForwardKeys;
template <int kD>
inline constexpr size_t kFlashForwardShared = kFlashStride<kD> * sizeof(Bf16) *
                                              (kFlashForwardKeysRows<kD> + 2 * kFlashForwardKeys);
template <int kD>
inline constexpr size_t kFlashQueryGradShared = kFlashStride<kD> * sizeof(Bf16) *
                                                2 * kFlashBlockRows<kD>;
template <int kD>
inline constexpr size_t kFlashKeyValueGradShared = kFlashStride<kD> * sizeof(Bf16) * 2 *
                                                       (kFlashBlockRows<kD> + kFlashGradTile) +
                                                   sizeof(float) * 3 * kFlashGradTile;

DTRAIN_HD inline float FlashExp2(float x) {
#if defined(__CUDA_ARCH__)
  return exp2f(x);
#else
  return std::exp2(x);
#endif
}

// Begins copying rows [first, first + count) of a (T, ...) matrix (row r at base + r * stride)
// into `tile` (rows, kD), zeros in the tile's rows from count on (count >= 1): every thread of the
// block, 16 bytes each, as async copies (warp.cuh) that the caller commits and waits for.
template <int kD, typename Block>
DTRAIN_HD void StageRows(const Block& block, Bf16* tile, int rows, const Bf16* base, size_t stride,
                         int first, int count) {
  constexpr int kChunks = kD / 8;
  for (int i = block.thread(); i < rows * kChunks; i += kFlashThreads) {
    const int r = i / kChunks, c = (i % kChunks) * 8;
    // A row past count reads nothing; its address is the first row's, which exists.
    block.CopyAsync(tile + r * kFlashStride<kD> + c,
                    base + (first + (r < count ? r : 0)) * stride + c, r < count);
  }
}

// Commits the copies the thread began, waits for all of them and for the block.
template <typename Block>
DTRAIN_HD void LandStaged(const Block& block) {
  block.CommitAsync();
  block.template WaitAsync<0>();
  block.Sync();
}

// Begins staging the query and dout rows [query0, query0 + kFlashGradTile) of head h, up to end,
// into the tiles `queries` and `dys`.
template <int kD, typename Block>
DTRAIN_HD void StageQueriesDouts(const Block& block, Bf16* queries, Bf16* dys, const Bf16* qkv,
                                 const Bf16* dout, const AttentionDims& dims, int h, int query0,
                                 int end) {
  const int count = end - query0 < kFlashGradTile ? end - query0 : kFlashGradTile;
  StageRows<kD>(block, queries, kFlashGradTile, QueryAt(qkv, dims, h, 0), dims.qkv_width, query0,
                count);
  StageRows<kD>(block, dys, kFlashGradTile, OutAt(dout, dims, h, 0), dims.out_width, query0, count);
}

// Begins staging the key and value rows [key0, key0 + rows) of kv head kv, up to end, into the
// tiles `keys` and `values`, one group of copies.
template <int kD, typename Block>
DTRAIN_HD void StageKeysValues(const Block& block, Bf16* keys, Bf16* values, int rows,
                               const Bf16* qkv, const AttentionDims& dims, int kv, int key0,
                               int end) {
  const int count = end - key0 < rows ? end - key0 : rows;
  StageRows<kD>(block, keys, rows, KeyAt(qkv, dims, kv, 0), dims.qkv_width, key0, count);
  StageRows<kD>(block, values, rows, ValueAt(qkv, dims, kv, 0), dims.qkv_width, key0, count);
  block.CommitAsync();
}

// Streams the key and value rows [key_begin, end) of kv head kv through shared memory kRows at a
// time, in two tiles each at `keys` and `values`: the next tile's copies are in flight while
// body(key0, tile_keys, tile_values) runs on this one, on every thread of the block, between
// barriers.
template <int kD, int kRows, typename Block, typename Body>
DTRAIN_HD void StreamKeysValues(const Block& block, Bf16* keys, Bf16* values, const Bf16* qkv,
                                const AttentionDims& dims, int kv, int key_begin, int end,
                                const Body& body) {
  constexpr int kBuffer = kRows * kFlashStride<kD>;
  StageKeysValues<kD>(block, keys, values, kRows, qkv, dims, kv, key_begin, end);
  for (int key0 = key_begin, buffer = 0; key0 < end; key0 += kRows, buffer ^= 1) {
    if (key0 + kRows < end) {
      StageKeysValues<kD>(block, keys + (buffer ^ 1) * kBuffer, values + (buffer ^ 1) * kBuffer,
                          kRows, qkv, dims, kv, key0 + kRows, end);
      block.template WaitAsync<1>();
    } else {
      block.template WaitAsync<0>();
    }
    block.Sync();
    body(key0, keys + buffer * kBuffer, values + buffer * kBuffer);
    block.Sync();
  }
}

// Batch element b's part of a (B, rows, width) buffer; null stays null.
template <typename T>
DTRAIN_HD T* BatchPart(T* base, int b, int rows, int width) {
  return base == nullptr ? nullptr : base + static_cast<size_t>(b) * rows * width;
}

// Tile `tile` of kRows rows of a block: rows [first, end) of its batch element's T, and the
// calling thread's lane and its warp's first row in the tile (kRows / kFlashWarps rows a warp).
struct FlashTile {
  int first, end, lane, warp_first;
};
template <int kRows, typename Block>
DTRAIN_HD FlashTile MakeFlashTile(const Block& block, int tile, int time) {
  const int first = tile * kRows;
  return {first, first + kRows < time ? first + kRows : time, block.warp().lane(),
          kRows / kFlashWarps * block.warp_index()};
}

// What one lane of a 16-row warp tile holds of its C blocks: rows g and g + 8 of the warp's
// rows; element e of a C block is row e / 2's.
struct LaneRows {
  int row[2];           // in the batch element's T rows (may be >= T)
  RowRange visible[2];  // each row's keys ({0, 0} past T)
};

DTRAIN_HD inline LaneRows MakeLaneRows(int lane, int first_row, const int32_t* positions,
                                       int time) {
  LaneRows rows;
  DTRAIN_UNROLL
  for (int r = 0; r < 2; ++r) {
    rows.row[r] = first_row + lane / 4 + 8 * r;
    rows.visible[r] = rows.row[r] < time ? VisibleKeys(positions, rows.row[r]) : RowRange{0, 0};
  }
  return rows;
}

// Whether key `key` is in `range`.
DTRAIN_HD inline bool Sees(const RowRange& range, int key) {
  return key >= range.begin && key < range.end;
}

// The per-row dot products of the elements two A fragments of the same rows hold: partial[r] +=
// row r's (the lane's share; QuadSum completes it).
DTRAIN_HD inline void AddRowDots(const MmaA& x, const MmaA& y, float (&partial)[2]) {
  DTRAIN_UNROLL
  for (int e = 0; e < 8; ++e) {
    partial[e / 2 % 2] += UnpackBf16(x.reg[e / 2], e % 2) * UnpackBf16(y.reg[e / 2], e % 2);
  }
}

// acc[i] += X_i R for each of a warp's tiles i: X_i (16 x 8 kBlocks) is the C blocks x[i]
// rounded to bf16 as A fragments, R (8 kBlocks x kD) the rows at `rows` in shared memory.
template <int kD, int kTiles, int kBlocks, typename Warp>
DTRAIN_HD void AddRowProducts(const Warp& warp, const MmaC (&x)[kTiles][kBlocks], const Bf16* rows,
                              MmaC (&acc)[kTiles][kD / 8]) {
  static_assert(kBlocks % 2 == 0);
  DTRAIN_UNROLL
  for (int k = 0; k < kBlocks / 2; ++k) {
    MmaA a[kTiles];
    DTRAIN_UNROLL
    for (int i = 0; i < kTiles; ++i) a[i] = ToA(x[i][2 * k], x[i][2 * k + 1]);
    DTRAIN_UNROLL
    for (int n = 0; n < kD / 8; n += 2) {
      MmaB left, right;
      LoadBPair(warp, rows + 16 * k * kFlashStride<kD> + 8 * n, kFlashStride<kD>, left, right);
      DTRAIN_UNROLL
      for (int i = 0; i < kTiles; ++i) {
        warp.Mma(acc[i][n], a[i], left);
        warp.Mma(acc[i][n + 1], a[i], right);
      }
    }
  }
}

// Stores a warp's 16 x kD fp32 result (C blocks acc[kD / 8]) times `scale` into rows `rows` of
// the matrix at `base` (row t at base + t * stride), rows < time.
template <int kD>
DTRAIN_HD void StoreRows(int lane, const MmaC (&acc)[kD / 8], const LaneRows& rows,
                         const float (&scale)[2], Bf16* base, size_t stride, int time) {
  DTRAIN_UNROLL
  for (int n = 0; n < kD / 8; ++n) {
    DTRAIN_UNROLL
    for (int e = 0; e < 4; ++e) {
      const int r = e / 2;
      if (rows.row[r] >= time) continue;
      base[rows.row[r] * stride + MmaCIndex(lane, e).col + 8 * n] =
          FromFloat<Bf16>(acc[n].value[e] * scale[r]);
    }
  }
}

// One 16-row tile's step of the online softmax over kFlashScoreKeys<kD> keys from key0: masks
// the scores s (scaled to base 2), rescales acc and the lane's share of the rows' sums to the
// rows' new maxima, and turns s into P (unrounded).
template <int kD, typename Warp>
DTRAIN_HD void SoftmaxStep(const Warp& warp, int lane, const LaneRows& rows, int key0, float scale,
                           MmaC (&s)[kFlashScoreKeys<kD> / 8], MmaC (&acc)[kD / 8], float (&max)[2],
                           float (&sum)[2]) {
  float tile_max[2] = {-INFINITY, -INFINITY};
  DTRAIN_UNROLL
  for (int n = 0; n < kFlashScoreKeys<kD> / 8; ++n) {
    DTRAIN_UNROLL
    for (int e = 0; e < 4; ++e) {
      const int r = e / 2, key = key0 + 8 * n + MmaCIndex(lane, e).col;
      float& score = s[n].value[e];
      score = Sees(rows.visible[r], key) ? score * scale : -INFINITY;
      tile_max[r] = score > tile_max[r] ? score : tile_max[r];
    }
  }
  float base[2];  // the rows' new max, or 0 while a row has seen no key
  DTRAIN_UNROLL
  for (int r = 0; r < 2; ++r) {
    const float tile_row_max = QuadMax(warp, tile_max[r]);
    const float new_max = tile_row_max > max[r] ? tile_row_max : max[r];
    base[r] = new_max == -INFINITY ? 0.0f : new_max;
    const float rescale = FlashExp2(max[r] - base[r]);
    sum[r] *= rescale;
    DTRAIN_UNROLL
    for (MmaC& block_acc : acc) {
      block_acc.value[2 * r] *= rescale;
      block_acc.value[2 * r + 1] *= rescale;
    }
    max[r] = new_max;
  }
  DTRAIN_UNROLL
  for (MmaC& block_s : s) {
    DTRAIN_UNROLL
    for (int e = 0; e < 4; ++e) {
      block_s.value[e] = FlashExp2(block_s.value[e] - base[e / 2]);
      sum[e / 2] += block_s.value[e];
    }
  }
}

// The forward of query rows [tile * kFlashBlockRows<kD>, +kFlashBlockRows<kD>) of head h of
// batch element b. shared: kFlashForwardShared<kD> bytes.
template <int kD, typename Block>
DTRAIN_HD void FlashForwardBlock(const Block& block, Bf16* shared, Bf16* out, float* lse,
                                 const Bf16* qkv, const int32_t* positions,
                                 const AttentionDims& dims, int b, int h, int tile) {
  constexpr int kStride = kFlashStride<kD>, kTiles = kFlashWarpTiles<kD>;
  constexpr int kRows = kFlashBlockRows<kD>, kScoreKeys = kFlashScoreKeys<kD>;
  Bf16* keys = shared;  // the query rows, then two key tiles
  Bf16* values = shared + kFlashForwardKeysRows<kD> * kStride;
  const int time = dims.time, kv = h / (dims.heads / dims.kv_heads);
  qkv = BatchPart(qkv, b, time, dims.qkv_width);
  out = BatchPart(out, b, time, dims.out_width);
  lse = BatchPart(lse, b, dims.heads, time) + static_cast<size_t>(h) * time;
  positions = BatchPart(positions, b, time, 1);
  const auto [first, end, lane, warp_first] = MakeFlashTile<kRows>(block, tile, time);
  const auto warp = block.warp();

  StageRows<kD>(block, keys, kRows, QueryAt(qkv, dims, h, 0), dims.qkv_width, first, end - first);
  LandStaged(block);
  MmaA q[kTiles][kD / 16];
  LaneRows rows[kTiles];
  DTRAIN_UNROLL
  for (int i = 0; i < kTiles; ++i) {
    DTRAIN_UNROLL
    for (int k = 0; k < kD / 16; ++k)
      q[i][k] = LoadA(lane, keys + (warp_first + 16 * i) * kStride + 16 * k, kStride);
    rows[i] = MakeLaneRows(lane, first + warp_first + 16 * i, positions, time);
  }
  block.Sync();

  const float scale = dims.scale * kLog2e;
  const int warp_last = first + warp_first + 16 * kTiles - 1;
  float max[kTiles][2], sum[kTiles][2];  // sum: the lane's share
  DTRAIN_UNROLL
  for (int i = 0; i < kTiles; ++i) {
    max[i][0] = max[i][1] = -INFINITY;
    sum[i][0] = sum[i][1] = 0;
  }
  MmaC acc[kTiles][kD / 8];
  StreamKeysValues<kD, kFlashForwardKeys>(
      block, keys, values, qkv, dims, kv, VisibleKeys(positions, first).begin, end,
      [&](int key0, const Bf16* tile_keys, const Bf16* tile_values) {
        // The staged keys kScoreKeys at a time; keys wholly after the warp's rows (in the diagonal
        // block) add nothing to them.
        for (int part = 0; part < kFlashForwardKeys && key0 + part <= warp_last;
             part += kScoreKeys) {
          MmaC s[kTiles][kScoreKeys / 8];
          DTRAIN_UNROLL
          for (int k = 0; k < kD / 16; ++k) {
            DTRAIN_UNROLL
            for (int n = 0; n < kScoreKeys / 8; ++n) {
              const MmaB key_columns =
                  LoadBTransposed(lane, tile_keys + (part + 8 * n) * kStride + 16 * k, kStride);
              DTRAIN_UNROLL
              for (int i = 0; i < kTiles; ++i) warp.Mma(s[i][n], q[i][k], key_columns);
            }
          }
          DTRAIN_UNROLL
          for (int i = 0; i < kTiles; ++i)
            SoftmaxStep<kD>(warp, lane, rows[i], key0 + part, scale, s[i], acc[i], max[i], sum[i]);
          AddRowProducts<kD>(warp, s, tile_values + part * kStride, acc);  // P V
        }
      });
  DTRAIN_UNROLL
  for (int i = 0; i < kTiles; ++i) {
    float inverse[2];
    DTRAIN_UNROLL
    for (int r = 0; r < 2; ++r) {
      const float total = QuadSum(warp, sum[i][r]);
      inverse[r] = 1.0f / total;
      if (lane % 4 == 0 && rows[i].row[r] < time)
        lse[rows[i].row[r]] = (max[i][r] + std::log2(total)) * kLn2;
    }
    StoreRows<kD>(lane, acc[i], rows[i], inverse, OutAt(out, dims, h, 0), dims.out_width, time);
  }
}

// dq of query rows [tile * kFlashBlockRows<kD>, +kFlashBlockRows<kD>) of head h of batch
// element b, and their deltas = dout . out (B, H, T), which FlashKeyValueGradBlock reads.
// shared: kFlashQueryGradShared<kD> bytes.
template <int kD, typename Block>
DTRAIN_HD void FlashQueryGradBlock(const Block& block, Bf16* shared, Bf16* dqkv, float* deltas,
                                   const Bf16* dout, const Bf16* qkv, const Bf16* out,
                                   const float* lse, const int32_t* positions,
                                   const AttentionDims& dims, int b, int h, int tile) {
  constexpr int kStride = kFlashStride<kD>, kTiles = kFlashWarpTiles<kD>;
  constexpr int kRows = kFlashBlockRows<kD>;
  Bf16* keys = shared;
  Bf16* values = shared + kRows * kStride;
  const int time = dims.time, kv = h / (dims.heads / dims.kv_heads);
  qkv = BatchPart(qkv, b, time, dims.qkv_width);
  dqkv = BatchPart(dqkv, b, time, dims.qkv_width);
  out = BatchPart(out, b, time, dims.out_width);
  dout = BatchPart(dout, b, time, dims.out_width);
  lse = BatchPart(lse, b, dims.heads, time) + static_cast<size_t>(h) * time;
  deltas = BatchPart(deltas, b, dims.heads, time) + static_cast<size_t>(h) * time;
  positions = BatchPart(positions, b, time, 1);
  const auto [first, end, lane, warp_first] = MakeFlashTile<kRows>(block, tile, time);
  const auto warp = block.warp();

  // q and dout in registers, then delta = dout . out from out staged where q was.
  StageRows<kD>(block, keys, kRows, QueryAt(qkv, dims, h, 0), dims.qkv_width, first, end - first);
  StageRows<kD>(block, values, kRows, OutAt(dout, dims, h, 0), dims.out_width, first, end - first);
  LandStaged(block);
  MmaA q[kTiles][kD / 16], dy[kTiles][kD / 16];
  DTRAIN_UNROLL
  for (int i = 0; i < kTiles; ++i) {
    DTRAIN_UNROLL
    for (int k = 0; k < kD / 16; ++k) {
      const int at = (warp_first + 16 * i) * kStride + 16 * k;
      q[i][k] = LoadA(lane, keys + at, kStride);
      dy[i][k] = LoadA(lane, values + at, kStride);
    }
  }
  block.Sync();
  StageRows<kD>(block, keys, kRows, OutAt(out, dims, h, 0), dims.out_width, first, end - first);
  LandStaged(block);
  LaneRows rows[kTiles];
  float delta[kTiles][2], row_lse[kTiles][2];
  DTRAIN_UNROLL
  for (int i = 0; i < kTiles; ++i) {
    delta[i][0] = delta[i][1] = 0;
    DTRAIN_UNROLL
    for (int k = 0; k < kD / 16; ++k) {
      AddRowDots(dy[i][k], LoadA(lane, keys + (warp_first + 16 * i) * kStride + 16 * k, kStride),
                 delta[i]);
    }
    rows[i] = MakeLaneRows(lane, first + warp_first + 16 * i, positions, time);
    DTRAIN_UNROLL
    for (int r = 0; r < 2; ++r) {
      delta[i][r] = QuadSum(warp, delta[i][r]);
      row_lse[i][r] = rows[i].row[r] < time ? lse[rows[i].row[r]] * kLog2e : 0.0f;
      if (lane % 4 == 0 && rows[i].row[r] < time) deltas[rows[i].row[r]] = delta[i][r];
    }
  }
  block.Sync();

  const float scale = dims.scale * kLog2e;
  const int warp_last = first + warp_first + 16 * kTiles - 1;
  MmaC acc[kTiles][kD / 8];
  // Key and value tiles where q and dout were, as in the forward.
  StreamKeysValues<kD, kFlashGradTile>(
      block, keys, values, qkv, dims, kv, VisibleKeys(positions, first).begin, end,
      [&](int key0, const Bf16* tile_keys, const Bf16* tile_values) {
        if (key0 <= warp_last) {  // as in the forward
          MmaC s[kTiles][kFlashGradTile / 8], dp[kTiles][kFlashGradTile / 8];
          DTRAIN_UNROLL
          for (int k = 0; k < kD / 16; ++k) {
            DTRAIN_UNROLL
            for (int n = 0; n < kFlashGradTile / 8; ++n) {
              const int at = 8 * n * kStride + 16 * k;
              const MmaB key_columns = LoadBTransposed(lane, tile_keys + at, kStride);
              const MmaB value_columns = LoadBTransposed(lane, tile_values + at, kStride);
              DTRAIN_UNROLL
              for (int i = 0; i < kTiles; ++i) {
                warp.Mma(s[i][n], q[i][k], key_columns);
                warp.Mma(dp[i][n], dy[i][k], value_columns);
              }
            }
          }
          DTRAIN_UNROLL
          for (int i = 0; i < kTiles; ++i) {
            DTRAIN_UNROLL
            for (int n = 0; n < kFlashGradTile / 8; ++n) {
              DTRAIN_UNROLL
              for (int e = 0; e < 4; ++e) {
                const int r = e / 2, key = key0 + 8 * n + MmaCIndex(lane, e).col;
                const float p = Sees(rows[i].visible[r], key)
                                    ? FlashExp2(s[i][n].value[e] * scale - row_lse[i][r])
                                    : 0.0f;
                s[i][n].value[e] = p * (dp[i][n].value[e] - delta[i][r]);  // dS
              }
            }
          }
          AddRowProducts<kD>(warp, s, tile_keys, acc);  // dS K
        }
      });
  const float scales[2] = {dims.scale, dims.scale};
  DTRAIN_UNROLL
  for (int i = 0; i < kTiles; ++i) {
    StoreRows<kD>(lane, acc[i], rows[i], scales, QueryAt(dqkv, dims, h, 0), dims.qkv_width, time);
  }
}

// dk and dv of key rows [tile * kFlashBlockRows<kD>, +kFlashBlockRows<kD>) of kv head kv of
// batch element b. shared: kFlashKeyValueGradShared<kD> bytes.
template <int kD, typename Block>
DTRAIN_HD void FlashKeyValueGradBlock(const Block& block, Bf16* shared, Bf16* dqkv,
                                      const Bf16* dout, const Bf16* qkv, const float* lse,
                                      const float* deltas, const int32_t* positions,
                                      const AttentionDims& dims, int b, int kv, int tile) {
  constexpr int kStride = kFlashStride<kD>, kTiles = kFlashWarpTiles<kD>;
  constexpr int kRows = kFlashBlockRows<kD>;
  Bf16* keys = shared;
  Bf16* values = keys + kRows * kStride;
  Bf16* queries = values + kRows * kStride;
  Bf16* dys = queries + kFlashGradTile * kStride;
  float* tile_lse = reinterpret_cast<float*>(dys + kFlashGradTile * kStride);
  float* tile_delta = tile_lse + kFlashGradTile;
  int* tile_first_key = reinterpret_cast<int*>(tile_delta + kFlashGradTile);
  const int time = dims.time, group = dims.heads / dims.kv_heads;
  qkv = BatchPart(qkv, b, time, dims.qkv_width);
  dqkv = BatchPart(dqkv, b, time, dims.qkv_width);
  dout = BatchPart(dout, b, time, dims.out_width);
  lse = BatchPart(lse, b, dims.heads, time);
  deltas = BatchPart(deltas, b, dims.heads, time);
  positions = BatchPart(positions, b, time, 1);
  const auto [first, end, lane, warp_first] = MakeFlashTile<kRows>(block, tile, time);
  // The query rows that see the block's keys end where its last key's document does.
  const int queries_end = VisibleQueries(positions, time, end - 1).end;
  const auto warp = block.warp();
  int key[kTiles][2];  // the lane's key rows of C
  DTRAIN_UNROLL
  for (int i = 0; i < kTiles; ++i) {
    DTRAIN_UNROLL
    for (int r = 0; r < 2; ++r) key[i][r] = first + warp_first + 16 * i + lane / 4 + 8 * r;
  }

  StageRows<kD>(block, keys, kRows, KeyAt(qkv, dims, kv, 0), dims.qkv_width, first, end - first);
  StageRows<kD>(block, values, kRows, ValueAt(qkv, dims, kv, 0), dims.qkv_width, first,
                end - first);
  // The keys and values land with the first query tile.
  const float scale = dims.scale * kLog2e;
  MmaC dk[kTiles][kD / 8], dv[kTiles][kD / 8];
  for (int h = kv * group; h < (kv + 1) * group; ++h) {
    for (int query0 = first; query0 < queries_end; query0 += kFlashGradTile) {
      const int count =
          queries_end - query0 < kFlashGradTile ? queries_end - query0 : kFlashGradTile;
      // Landed before use (a second tile in flight would spill the accumulators' registers), with
      // the tile's rows' lse, delta (from FlashQueryGradBlock) and first visible key.
      StageQueriesDouts<kD>(block, queries, dys, qkv, dout, dims, h, query0, queries_end);
      for (int j = block.thread(); j < kFlashGradTile; j += kFlashThreads) {
        const size_t at = static_cast<size_t>(h) * time + query0 + j;
        tile_lse[j] = j < count ? lse[at] * kLog2e : 0.0f;
        tile_delta[j] = j < count ? deltas[at] : 0.0f;
        tile_first_key[j] = j < count ? VisibleKeys(positions, query0 + j).begin : time;
      }
      LandStaged(block);
      // A query tile wholly before the warp's keys (in the diagonal block) sees none of them.
      if (query0 + kFlashGradTile > first + warp_first) {
        MmaC s[kTiles][kFlashGradTile / 8], dp[kTiles][kFlashGradTile / 8];
        DTRAIN_UNROLL
        for (int k = 0; k < kD / 16; ++k) {
          MmaA k_rows[kTiles], v_rows[kTiles];
          DTRAIN_UNROLL
          for (int i = 0; i < kTiles; ++i) {
            const int at = (warp_first + 16 * i) * kStride + 16 * k;
            k_rows[i] = LoadA(lane, keys + at, kStride);
            v_rows[i] = LoadA(lane, values + at, kStride);
          }
          DTRAIN_UNROLL
          for (int n = 0; n < kFlashGradTile / 8; ++n) {
            const int at = 8 * n * kStride + 16 * k;
            const MmaB query_columns = LoadBTransposed(lane, queries + at, kStride);
            const MmaB dy_columns = LoadBTransposed(lane, dys + at, kStride);
            DTRAIN_UNROLL
            for (int i = 0; i < kTiles; ++i) {
              warp.Mma(s[i][n], k_rows[i], query_columns);
              warp.Mma(dp[i][n], v_rows[i], dy_columns);
            }
          }
        }
        DTRAIN_UNROLL
        for (int i = 0; i < kTiles; ++i) {
          DTRAIN_UNROLL
          for (int n = 0; n < kFlashGradTile / 8; ++n) {
            DTRAIN_UNROLL
            for (int e = 0; e < 4; ++e) {
              const int j = 8 * n + MmaCIndex(lane, e).col, k_row = key[i][e / 2];
              const bool sees = k_row < time && k_row >= tile_first_key[j] && k_row <= query0 + j;
              const float p = sees ? FlashExp2(s[i][n].value[e] * scale - tile_lse[j]) : 0.0f;
              s[i][n].value[e] = p;                                         // P^T
              dp[i][n].value[e] = p * (dp[i][n].value[e] - tile_delta[j]);  // dS^T
            }
          }
        }
        AddRowProducts<kD>(warp, s, dys, dv);       // P^T dO
        AddRowProducts<kD>(warp, dp, queries, dk);  // dS^T Q
      }
      block.Sync();
    }
  }
  const float dk_scale[2] = {dims.scale, dims.scale}, dv_scale[2] = {1.0f, 1.0f};
  DTRAIN_UNROLL
  for (int i = 0; i < kTiles; ++i) {
    const LaneRows rows = {{key[i][0], key[i][1]}, {}};
    StoreRows<kD>(lane, dk[i], rows, dk_scale, KeyAt(dqkv, dims, kv, 0), dims.qkv_width, time);
    StoreRows<kD>(lane, dv[i], rows, dv_scale, ValueAt(dqkv, dims, kv, 0), dims.qkv_width, time);
  }
}

}  // namespace dtrain::cuda
