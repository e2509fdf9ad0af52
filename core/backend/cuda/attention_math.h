// Causal attention with grouped-query heads, the CPU backend's formulas
// (core/backend/cpu/attention.h): S = scale q k^T over keys s <= t, P = softmax(S),
// out = P v, lse = log-sum-exp of the row's scores; backward recomputes P = exp(S - lse) and,
// with delta_t = dout_t . out_t and dS = P (dout v^T - delta),
//   dq = scale dS k,   dk = scale dS^T q,   dv = P^T dout.
//
// A row (a query row forward and for dq, a key row for dk and dv) belongs to a group of
// Lanes::kLanes threads (a power of two; kAttentionDimsPerLane * kLanes >= head_dim): lane l
// holds dims [l * 16, l * 16 + 16) of the row's vectors in registers and the lanes sum their dot
// products with a butterfly (warp_math.h). The kernels (attention.cu) are tiled: a block's rows
// stream the keys (or, for dk and dv, the query rows) through shared memory a tile at a time, so
// every k, v, q and dout row is read from global memory once per block rather than once per row;
// no (T, T) matrix is ever held and backward is deterministic without atomics. The functions
// below are one row's work over a run of consecutive keys or query rows, given as pointers (into
// shared memory on the device, into the whole tensor in the host tests); a row's result is the
// same whether its run is cut into tiles or not, so the host tests run whole rows.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstddef>

#include "core/backend/backend.h"
#include "core/backend/cpu/vector_math.h"
#include "core/backend/cuda/bf16.h"
#include "core/backend/cuda/host_device.h"
#include "core/backend/cuda/warp_math.h"

namespace dtrain::cuda {

inline constexpr int kAttentionDimsPerLane = 16;
inline constexpr int kAttentionMaxHeadDim = kAttentionDimsPerLane * kWarpSize;

// The lanes a row of head_dim dims needs: the smallest power of two with 16 dims per lane.
DTRAIN_HD constexpr int AttentionLanes(int head_dim) {
  int lanes = 1;
  while (lanes * kAttentionDimsPerLane < head_dim) lanes *= 2;
  return lanes;
}

// AttentionShape's sizes as the device needs them, for one batch element's buffers: qkv rows
// (T, qkv_width), out and dout rows (T, H*D), lse (H, T).
struct AttentionDims {
  int time, heads, kv_heads, head_dim, qkv_width, out_width;
  float scale;  // 1 / sqrt(D), rounded as the CPU backend rounds it
};

inline AttentionDims MakeAttentionDims(const AttentionShape& shape) {
  return {shape.time,
          shape.heads,
          shape.kv_heads,
          shape.head_dim,
          shape.qkv_width(),
          shape.heads * shape.head_dim,
          1.0f / std::sqrt(static_cast<float>(shape.head_dim))};
}

// Pointers into one batch element's buffers.
template <typename T>
DTRAIN_HD T* QueryAt(T* qkv, const AttentionDims& dims, int h, int t) {
  return qkv + static_cast<size_t>(t) * dims.qkv_width + static_cast<size_t>(h) * dims.head_dim;
}
template <typename T>
DTRAIN_HD T* KeyAt(T* qkv, const AttentionDims& dims, int kv, int s) {
  return QueryAt(qkv, dims, dims.heads + kv, s);
}
template <typename T>
DTRAIN_HD T* ValueAt(T* qkv, const AttentionDims& dims, int kv, int s) {
  return QueryAt(qkv, dims, dims.heads + dims.kv_heads + kv, s);
}
template <typename T>
DTRAIN_HD T* OutAt(T* out, const AttentionDims& dims, int h, int t) {
  return out + static_cast<size_t>(t) * dims.out_width + static_cast<size_t>(h) * dims.head_dim;
}

// One lane's slice of a row vector, in registers.
struct LaneSlice {
  float values[kAttentionDimsPerLane] = {};
};

// The first dim of the calling lane's slice, and the dims it holds of d.
template <typename Lanes>
DTRAIN_HD int SliceBegin(const Lanes& lanes) {
  return lanes.lane() * kAttentionDimsPerLane;
}

template <typename Lanes, typename T>
DTRAIN_HD LaneSlice LoadSlice(const Lanes& lanes, const T* row, int d) {
  LaneSlice slice;
  const int begin = SliceBegin(lanes);
  for (int i = 0; i < kAttentionDimsPerLane && begin + i < d; ++i) {
    slice.values[i] = ToFloat(row[begin + i]);
  }
  return slice;
}

template <typename Lanes, typename T>
DTRAIN_HD void StoreSlice(const Lanes& lanes, T* row, int d, const LaneSlice& slice, float scale) {
  const int begin = SliceBegin(lanes);
  for (int i = 0; i < kAttentionDimsPerLane && begin + i < d; ++i) {
    row[begin + i] = FromFloat<T>(scale * slice.values[i]);
  }
}

// slice . row over D dims, summed over the row's lanes.
template <typename Lanes, typename T>
DTRAIN_HD float LanesDot(const Lanes& lanes, const LaneSlice& slice, const T* row, int d) {
  const int begin = SliceBegin(lanes);
  float sum = 0;
  for (int i = 0; i < kAttentionDimsPerLane && begin + i < d; ++i) {
    sum += slice.values[i] * ToFloat(row[begin + i]);
  }
  return WarpSum(lanes, sum);
}

// acc += weight * row over the lane's dims.
template <typename Lanes, typename T>
DTRAIN_HD void AddScaled(const Lanes& lanes, LaneSlice& acc, float weight, const T* row, int d) {
  const int begin = SliceBegin(lanes);
  for (int i = 0; i < kAttentionDimsPerLane && begin + i < d; ++i) {
    acc.values[i] += weight * ToFloat(row[begin + i]);
  }
}

// A query row's forward state: its q slice, its output accumulator and the online softmax's
// running max and sum of exp(score - max).
struct AttentionForwardState {
  LaneSlice q, acc;
  float max = -FLT_MAX, sum = 0;
};

// Keys j in [0, count) of a run, key j's k and v rows at keys + j * stride, values + j * stride.
template <typename Lanes, typename K>
DTRAIN_HD void AttendKeys(const Lanes& lanes, AttentionForwardState& row, const K* keys,
                          const K* values, size_t stride, int count, const AttentionDims& dims) {
  for (int j = 0; j < count; ++j) {
    const float score = LanesDot(lanes, row.q, keys + j * stride, dims.head_dim) * dims.scale;
    float weight = 1.0f;  // exp(score - max) once max covers this score
    if (score > row.max) {
      const float rescale = cpu::Exp(row.max - score);
      row.sum = row.sum * rescale + 1.0f;
      for (float& value : row.acc.values) value *= rescale;
      row.max = score;
    } else {
      weight = cpu::Exp(score - row.max);
      row.sum += weight;
    }
    AddScaled(lanes, row.acc, weight, values + j * stride, dims.head_dim);
  }
}

// The query row's out row and lse[h, t] from its final state.
template <typename Lanes, typename T>
DTRAIN_HD void FinishForwardRow(const Lanes& lanes, const AttentionForwardState& row, T* out,
                                float* lse, const AttentionDims& dims, int h, int t) {
  StoreSlice(lanes, OutAt(out, dims, h, t), dims.head_dim, row.acc, 1.0f / row.sum);
  if (lanes.lane() == 0) lse[static_cast<size_t>(h) * dims.time + t] = row.max + std::log(row.sum);
}

// A query row's dq state: q and dout slices, delta = dout . out, the row's lse, dq's accumulator.
struct AttentionQueryGradState {
  LaneSlice q, dy, acc;
  float delta = 0, lse = 0;
};

template <typename Lanes, typename K>
DTRAIN_HD void QueryGradOverKeys(const Lanes& lanes, AttentionQueryGradState& row, const K* keys,
                                 const K* values, size_t stride, int count,
                                 const AttentionDims& dims) {
  for (int j = 0; j < count; ++j) {
    const K* k = keys + j * stride;
    const float p = cpu::Exp(LanesDot(lanes, row.q, k, dims.head_dim) * dims.scale - row.lse);
    const float ds = p * (LanesDot(lanes, row.dy, values + j * stride, dims.head_dim) - row.delta);
    AddScaled(lanes, row.acc, ds, k, dims.head_dim);
  }
}

// A key row's dk and dv state: k and v slices and the two accumulators.
struct AttentionKeyGradState {
  LaneSlice k, v, dk, dv;
};

// Query rows j in [0, count) of a run: q and dout rows at queries + j * stride, dys + j *
// stride, their lse and delta at lse[j], delta[j].
template <typename Lanes, typename Q>
DTRAIN_HD void KeyGradOverQueries(const Lanes& lanes, AttentionKeyGradState& row, const Q* queries,
                                  const Q* dys, size_t stride, const float* lse, const float* delta,
                                  int count, const AttentionDims& dims) {
  for (int j = 0; j < count; ++j) {
    const Q* q = queries + j * stride;
    const Q* dy = dys + j * stride;
    const float p = cpu::Exp(LanesDot(lanes, row.k, q, dims.head_dim) * dims.scale - lse[j]);
    const float ds = p * (LanesDot(lanes, row.v, dy, dims.head_dim) - delta[j]);
    AddScaled(lanes, row.dv, p, dy, dims.head_dim);
    AddScaled(lanes, row.dk, ds, q, dims.head_dim);
  }
}

}  // namespace dtrain::cuda
