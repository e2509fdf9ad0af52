// Causal attention with grouped-query heads per row, the CPU backend's formulas
// (core/backend/cpu/attention.h): S = scale q k^T over keys s <= t, P = softmax(S),
// out = P v, lse = log-sum-exp of the row's scores; backward recomputes P = exp(S - lse) and,
// with delta_t = dout_t . out_t and dS = P (dout v^T - delta),
//   dq = scale dS k,   dk = scale dS^T q,   dv = P^T dout.
// One warp per row, lane l holding dims l, l + 32, ... of a head (head_dim <= 256) in
// registers (the loops over a lane's dims have a constant bound, so they unroll), the dot
// products summed over the warp. Forward streams the keys once with an online softmax: no
// (T, T) scores, no scratch. Backward is deterministic without atomics: a warp per query row
// writes dq, and a warp per key row walks the query rows of every head of its group to write
// dk and dv, recomputing P (three dot products per pair instead of a stored matrix).
//
// This is the arithmetic a tiled flash-attention kernel must reproduce, not that kernel: it
// reads k and v once per query row from L2 and uses no tensor cores.
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

inline constexpr int kAttentionMaxHeadDim = 256;
inline constexpr int kAttentionDimsPerLane = kAttentionMaxHeadDim / kWarpSize;

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

// a . b over D dims, summed over the warp.
template <typename Warp, typename T>
DTRAIN_HD float WarpDot(const Warp& warp, const T* a, const T* b, int d) {
  float sum = 0;
  for (int dim = warp.lane(); dim < d; dim += kWarpSize) sum += ToFloat(a[dim]) * ToFloat(b[dim]);
  return WarpSum(warp, sum);
}

// Query row (h, t): out row and lse[h, t].
template <typename Warp, typename T>
DTRAIN_HD void AttentionForwardRow(const Warp& warp, T* out, float* lse, const T* qkv,
                                   const AttentionDims& dims, int h, int t) {
  const int kv = h / (dims.heads / dims.kv_heads);
  const T* q = QueryAt(qkv, dims, h, t);
  float acc[kAttentionDimsPerLane] = {};
  float max = -FLT_MAX, sum = 0;
  for (int s = 0; s <= t; ++s) {
    const float score = WarpDot(warp, q, KeyAt(qkv, dims, kv, s), dims.head_dim) * dims.scale;
    float weight = 1.0f;  // exp(score - max) once max covers this score
    if (score > max) {
      const float rescale = cpu::Exp(max - score);
      sum = sum * rescale + 1.0f;
      for (int i = 0; i < kAttentionDimsPerLane; ++i) acc[i] *= rescale;
      max = score;
    } else {
      weight = cpu::Exp(score - max);
      sum += weight;
    }
    const T* v = ValueAt(qkv, dims, kv, s);
    for (int i = 0; i < kAttentionDimsPerLane; ++i) {
      const int dim = warp.lane() + i * kWarpSize;
      if (dim >= dims.head_dim) break;
      acc[i] += weight * ToFloat(v[dim]);
    }
  }
  T* o = OutAt(out, dims, h, t);
  for (int i = 0; i < kAttentionDimsPerLane; ++i) {
    const int dim = warp.lane() + i * kWarpSize;
    if (dim >= dims.head_dim) break;
    o[dim] = FromFloat<T>(acc[i] / sum);
  }
  if (warp.lane() == 0) lse[static_cast<size_t>(h) * dims.time + t] = max + std::log(sum);
}

// Query row (h, t): its dq in dqkv.
template <typename Warp, typename T>
DTRAIN_HD void AttentionQueryGradRow(const Warp& warp, T* dqkv, const T* dout, const T* qkv,
                                     const T* out, const float* lse, const AttentionDims& dims,
                                     int h, int t) {
  const int kv = h / (dims.heads / dims.kv_heads);
  const T* q = QueryAt(qkv, dims, h, t);
  const T* dy = OutAt(dout, dims, h, t);
  const float delta = WarpDot(warp, dy, OutAt(out, dims, h, t), dims.head_dim);
  const float row_lse = lse[static_cast<size_t>(h) * dims.time + t];
  float acc[kAttentionDimsPerLane] = {};
  for (int s = 0; s <= t; ++s) {
    const T* k = KeyAt(qkv, dims, kv, s);
    const float p = cpu::Exp(WarpDot(warp, q, k, dims.head_dim) * dims.scale - row_lse);
    const float ds = p * (WarpDot(warp, dy, ValueAt(qkv, dims, kv, s), dims.head_dim) - delta);
    for (int i = 0; i < kAttentionDimsPerLane; ++i) {
      const int dim = warp.lane() + i * kWarpSize;
      if (dim >= dims.head_dim) break;
      acc[i] += ds * ToFloat(k[dim]);
    }
  }
  T* dq = QueryAt(dqkv, dims, h, t);
  for (int i = 0; i < kAttentionDimsPerLane; ++i) {
    const int dim = warp.lane() + i * kWarpSize;
    if (dim >= dims.head_dim) break;
    dq[dim] = FromFloat<T>(dims.scale * acc[i]);
  }
}

// Key row (kv, s): its dk and dv in dqkv, over the query rows t >= s of the group's heads.
template <typename Warp, typename T>
DTRAIN_HD void AttentionKeyValueGradRow(const Warp& warp, T* dqkv, const T* dout, const T* qkv,
                                        const T* out, const float* lse, const AttentionDims& dims,
                                        int kv, int s) {
  const int group = dims.heads / dims.kv_heads;
  const T* k = KeyAt(qkv, dims, kv, s);
  const T* v = ValueAt(qkv, dims, kv, s);
  float dk_acc[kAttentionDimsPerLane] = {};
  float dv_acc[kAttentionDimsPerLane] = {};
  for (int h = kv * group; h < (kv + 1) * group; ++h) {
    for (int t = s; t < dims.time; ++t) {
      const T* q = QueryAt(qkv, dims, h, t);
      const T* dy = OutAt(dout, dims, h, t);
      const float p = cpu::Exp(WarpDot(warp, q, k, dims.head_dim) * dims.scale -
                               lse[static_cast<size_t>(h) * dims.time + t]);
      const float delta = WarpDot(warp, dy, OutAt(out, dims, h, t), dims.head_dim);
      const float ds = p * (WarpDot(warp, dy, v, dims.head_dim) - delta);
      for (int i = 0; i < kAttentionDimsPerLane; ++i) {
        const int dim = warp.lane() + i * kWarpSize;
        if (dim >= dims.head_dim) break;
        dv_acc[i] += p * ToFloat(dy[dim]);
        dk_acc[i] += ds * ToFloat(q[dim]);
      }
    }
  }
  T* dk = KeyAt(dqkv, dims, kv, s);
  T* dv = ValueAt(dqkv, dims, kv, s);
  for (int i = 0; i < kAttentionDimsPerLane; ++i) {
    const int dim = warp.lane() + i * kWarpSize;
    if (dim >= dims.head_dim) break;
    dk[dim] = FromFloat<T>(dims.scale * dk_acc[i]);
    dv[dim] = FromFloat<T>(dv_acc[i]);
  }
}

}  // namespace dtrain::cuda
