// LayerNorm and RMSNorm per row, the CPU backend's arithmetic (core/backend/cpu/norm.h has the
// formulas) with the row's sums split over one warp (warp_math.h) and in fp32 whatever the
// storage T: mean and rstd are fp32, and bf16 inputs widen, outputs round once. A lane takes the
// row's 16-byte packs (RowPacks, pack_math.h) l, l + 32, ...: 3 of GPT-2 124M's 768 bf16 values a
// pass, each one vector load where the row is aligned.
//
// The forward functions fuse the transformer block's residual add: with `residual` not null the
// row normalised is x = residual + inp, rounded to T and stored to residual_out, and the norm
// reads it back so that it normalises exactly the stored value its backward will see. With
// `residual` null, x = inp and residual_out is unused.
//
// dinp ACCUMULATES (the residual stream's gradient). The parameter gradients are column sums
// over the rows: one thread per column adds the rows in order, so they are deterministic (no
// atomics) and sum as the CPU backend does.
#pragma once

#include <cmath>

#include "core/backend/cuda/bf16.h"
#include "core/backend/cuda/host_device.h"
#include "core/backend/cuda/pack_math.h"
#include "core/backend/cuda/warp_math.h"

namespace dtrain::cuda {

// A warp's packs of a row of c values.
template <typename T>
using WarpPacks = RowPacks<T, kWarpSize>;

// x = residual + inp into residual_out when fusing; returns the row to normalise. `packs` are
// those of the returned row.
template <typename Warp, typename T>
DTRAIN_HD const T* ResidualAddRow(const Warp& warp, const WarpPacks<T>& packs, T* residual_out,
                                  const T* residual, const T* inp, int c) {
  if (residual == nullptr) return inp;
  for (int64_t i = packs.First(warp.lane()); i < c; i += packs.kStride) {
    const Pack<T> a = packs.Load(residual, i, T{}), b = packs.Load(inp, i, T{});
    Pack<T> sum;
    DTRAIN_UNROLL
    for (int k = 0; k < kPackSize<T>; ++k) {
      sum.values[k] = FromFloat<T>(ToFloat(a.values[k]) + ToFloat(b.values[k]));
    }
    packs.Store(residual_out, i, sum);
  }
  return residual_out;
}

// The row a forward normalises and its packs: residual_out when fusing, else inp.
template <typename T>
DTRAIN_HD WarpPacks<T> NormRowPacks(const T* residual_out, const T* residual, const T* inp, int c) {
  return WarpPacks<T>(residual == nullptr ? inp : residual_out, c);
}

// One row: out, residual_out, residual, inp (C); weight, bias (C); mean, rstd: the row's.
template <typename Warp, typename T>
DTRAIN_HD void LayerNormForwardRow(const Warp& warp, T* out, float* mean, float* rstd,
                                   T* residual_out, const T* residual, const T* inp,
                                   const T* weight, const T* bias, int c, float eps) {
  const WarpPacks<T> packs = NormRowPacks(residual_out, residual, inp, c);
  const T* x = ResidualAddRow(warp, packs, residual_out, residual, inp, c);
  const int64_t first = packs.First(warp.lane());
  float sum = 0;
  for (int64_t i = first; i < c; i += packs.kStride) {
    const Pack<T> xp = packs.Load(x, i, T{});
    DTRAIN_UNROLL
    for (int k = 0; k < kPackSize<T>; ++k) {
      if (packs.Holds(i, k)) sum += ToFloat(xp.values[k]);
    }
  }
  const float m = WarpSum(warp, sum) / c;
  // Two passes: the variance of the centred values does not cancel catastrophically.
  float sum_sq = 0;
  for (int64_t i = first; i < c; i += packs.kStride) {
    const Pack<T> xp = packs.Load(x, i, T{});
    DTRAIN_UNROLL
    for (int k = 0; k < kPackSize<T>; ++k) {
      const float d = ToFloat(xp.values[k]) - m;
      if (packs.Holds(i, k)) sum_sq += d * d;
    }
  }
  const float s = 1.0f / std::sqrt(WarpSum(warp, sum_sq) / c + eps);
  for (int64_t i = first; i < c; i += packs.kStride) {
    const Pack<T> xp = packs.Load(x, i, T{}), w = packs.Load(weight, i, T{}),
                  b = packs.Load(bias, i, T{});
    Pack<T> y;
    DTRAIN_UNROLL
    for (int k = 0; k < kPackSize<T>; ++k) {
      y.values[k] = FromFloat<T>((ToFloat(xp.values[k]) - m) * s * ToFloat(w.values[k]) +
                                 ToFloat(b.values[k]));
    }
    packs.Store(out, i, y);
  }
  if (warp.lane() == 0) {
    *mean = m;
    *rstd = s;
  }
}

// One row: dinp (C) +=; dout, inp (C) where inp is the x the forward normalised.
template <typename Warp, typename T>
DTRAIN_HD void LayerNormBackwardRow(const Warp& warp, T* dinp, const T* dout, const T* inp,
                                    const T* weight, float mean, float rstd, int c) {
  const WarpPacks<T> packs(dinp, c);
  const int64_t first = packs.First(warp.lane());
  float dnorm_sum = 0;
  float dnorm_norm_sum = 0;
  for (int64_t i = first; i < c; i += packs.kStride) {
    const Pack<T> w = packs.Load(weight, i, T{}), dy = packs.Load(dout, i, T{}),
                  x = packs.Load(inp, i, T{});
    DTRAIN_UNROLL
    for (int k = 0; k < kPackSize<T>; ++k) {
      if (!packs.Holds(i, k)) continue;
      const float dnorm = ToFloat(w.values[k]) * ToFloat(dy.values[k]);
      dnorm_sum += dnorm;
      dnorm_norm_sum += dnorm * (ToFloat(x.values[k]) - mean) * rstd;
    }
  }
  const float dnorm_mean = WarpSum(warp, dnorm_sum) / c;
  const float dnorm_norm_mean = WarpSum(warp, dnorm_norm_sum) / c;
  for (int64_t i = first; i < c; i += packs.kStride) {
    const Pack<T> w = packs.Load(weight, i, T{}), dy = packs.Load(dout, i, T{}),
                  x = packs.Load(inp, i, T{});
    Pack<T> dx = packs.Load(dinp, i, T{});
    DTRAIN_UNROLL
    for (int k = 0; k < kPackSize<T>; ++k) {
      const float norm = (ToFloat(x.values[k]) - mean) * rstd;
      const float d =
          (ToFloat(w.values[k]) * ToFloat(dy.values[k]) - dnorm_mean - norm * dnorm_norm_mean) *
          rstd;
      dx.values[k] = FromFloat<T>(ToFloat(dx.values[k]) + d);
    }
    packs.Store(dinp, i, dx);
  }
}

// The parameters' gradients are column sums over the N rows. The column kernels split column j's
// rows into ColumnSlices(n) interleaved slices (rows slice, slice + slices, ...), sum each slice on
// its own thread (kSlicesPerBlock slices of kWarpSize columns a block, a column's blocks side by
// side on the grid, so that a GPU's SMs all take part), and a second kernel adds the slices' sums
// in slice order: deterministic without atomics.
inline constexpr int kSlicesPerBlock = 32;
inline constexpr int kRowsPerSlice = 64;
inline constexpr int kMaxColumnSlices = 1024;

// The slices of a column of n rows: about n / kRowsPerSlice, a multiple of kSlicesPerBlock
// between kSlicesPerBlock and kMaxColumnSlices (GPT-2 at 16 x 1024 tokens: 256).
DTRAIN_HD inline int ColumnSlices(int n) {
  const int wanted = (n / kRowsPerSlice + kSlicesPerBlock - 1) / kSlicesPerBlock * kSlicesPerBlock;
  return wanted < kSlicesPerBlock    ? kSlicesPerBlock
         : wanted > kMaxColumnSlices ? kMaxColumnSlices
                                     : wanted;
}

struct ColumnGrads {
  float dweight = 0, dbias = 0;
};

// LayerNorm's sums over one of the `slices` slices of column j of dout, inp (N, C).
template <typename T>
DTRAIN_HD ColumnGrads LayerNormParamGradSlice(const T* dout, const T* inp, const float* mean,
                                              const float* rstd, int n, int c, int j, int slice,
                                              int slices) {
  ColumnGrads sums;
  for (int i = slice; i < n; i += slices) {
    const size_t at = static_cast<size_t>(i) * c + j;
    const float dy = ToFloat(dout[at]);
    sums.dweight += (ToFloat(inp[at]) - mean[i]) * rstd[i] * dy;
    sums.dbias += dy;
  }
  return sums;
}

// dweight[j] (and dbias[j], unless dbias is null) += column j's sums of its `slices` slices, in
// order: slice s's at slice_sums[s * c + j]. Parameter gradients are float32 whatever the values'
// type (backend.h).
DTRAIN_HD inline void AddColumnGrads(float* dweight, float* dbias, const ColumnGrads* slice_sums,
                                     int slices, int c, int j) {
  float dw = dweight[j];
  float db = dbias == nullptr ? 0 : dbias[j];
  for (int slice = 0; slice < slices; ++slice) {
    const ColumnGrads& sums = slice_sums[static_cast<size_t>(slice) * c + j];
    dw += sums.dweight;
    db += sums.dbias;
  }
  dweight[j] = dw;
  if (dbias != nullptr) dbias[j] = db;
}

// RMSNorm: out = x * rstd * weight; the same row layout as LayerNormForwardRow.
template <typename Warp, typename T>
DTRAIN_HD void RmsNormForwardRow(const Warp& warp, T* out, float* rstd, T* residual_out,
                                 const T* residual, const T* inp, const T* weight, int c,
                                 float eps) {
  const WarpPacks<T> packs = NormRowPacks(residual_out, residual, inp, c);
  const T* x = ResidualAddRow(warp, packs, residual_out, residual, inp, c);
  const int64_t first = packs.First(warp.lane());
  float sum_sq = 0;
  for (int64_t i = first; i < c; i += packs.kStride) {
    const Pack<T> xp = packs.Load(x, i, T{});
    DTRAIN_UNROLL
    for (int k = 0; k < kPackSize<T>; ++k) {
      const float value = ToFloat(xp.values[k]);
      if (packs.Holds(i, k)) sum_sq += value * value;
    }
  }
  const float s = 1.0f / std::sqrt(WarpSum(warp, sum_sq) / c + eps);
  for (int64_t i = first; i < c; i += packs.kStride) {
    const Pack<T> xp = packs.Load(x, i, T{}), w = packs.Load(weight, i, T{});
    Pack<T> y;
    DTRAIN_UNROLL
    for (int k = 0; k < kPackSize<T>; ++k) {
      y.values[k] = FromFloat<T>(ToFloat(xp.values[k]) * s * ToFloat(w.values[k]));
    }
    packs.Store(out, i, y);
  }
  if (warp.lane() == 0) *rstd = s;
}

template <typename Warp, typename T>
DTRAIN_HD void RmsNormBackwardRow(const Warp& warp, T* dinp, const T* dout, const T* inp,
                                  const T* weight, float rstd, int c) {
  const WarpPacks<T> packs(dinp, c);
  const int64_t first = packs.First(warp.lane());
  float dnorm_norm_sum = 0;
  for (int64_t i = first; i < c; i += packs.kStride) {
    const Pack<T> w = packs.Load(weight, i, T{}), dy = packs.Load(dout, i, T{}),
                  x = packs.Load(inp, i, T{});
    DTRAIN_UNROLL
    for (int k = 0; k < kPackSize<T>; ++k) {
      if (!packs.Holds(i, k)) continue;
      dnorm_norm_sum += ToFloat(w.values[k]) * ToFloat(dy.values[k]) * ToFloat(x.values[k]) * rstd;
    }
  }
  const float dnorm_norm_mean = WarpSum(warp, dnorm_norm_sum) / c;
  for (int64_t i = first; i < c; i += packs.kStride) {
    const Pack<T> w = packs.Load(weight, i, T{}), dy = packs.Load(dout, i, T{}),
                  x = packs.Load(inp, i, T{});
    Pack<T> dx = packs.Load(dinp, i, T{});
    DTRAIN_UNROLL
    for (int k = 0; k < kPackSize<T>; ++k) {
      const float value = ToFloat(x.values[k]);
      const float d =
          (ToFloat(w.values[k]) * ToFloat(dy.values[k]) - value * rstd * dnorm_norm_mean) * rstd;
      dx.values[k] = FromFloat<T>(ToFloat(dx.values[k]) + d);
    }
    packs.Store(dinp, i, dx);
  }
}

// RMSNorm's weight sums over one of the `slices` slices of column j (dbias stays 0).
template <typename T>
DTRAIN_HD ColumnGrads RmsNormWeightGradSlice(const T* dout, const T* inp, const float* rstd, int n,
                                             int c, int j, int slice, int slices) {
  ColumnGrads sums;
  for (int i = slice; i < n; i += slices) {
    const size_t at = static_cast<size_t>(i) * c + j;
    sums.dweight += ToFloat(inp[at]) * rstd[i] * ToFloat(dout[at]);
  }
  return sums;
}

}  // namespace dtrain::cuda
