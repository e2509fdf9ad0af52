// LayerNorm and RMSNorm per row, the CPU backend's arithmetic (core/backend/cpu/norm.h has the
// formulas) with the row's sums split over one warp (warp_math.h) and in fp32 whatever the
// storage T: mean and rstd are fp32, and bf16 inputs widen, outputs round once.
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
#include "core/backend/cuda/warp_math.h"

namespace dtrain::cuda {

// x = residual + inp into residual_out when fusing; returns the row to normalise.
template <typename Warp, typename T>
DTRAIN_HD const T* ResidualAddRow(const Warp& warp, T* residual_out, const T* residual,
                                  const T* inp, int c) {
  if (residual == nullptr) return inp;
  for (int j = warp.lane(); j < c; j += kWarpSize) {
    residual_out[j] = FromFloat<T>(ToFloat(residual[j]) + ToFloat(inp[j]));
  }
  return residual_out;
}

// One row: out, residual_out, residual, inp (C); weight, bias (C); mean, rstd: the row's.
template <typename Warp, typename T>
DTRAIN_HD void LayerNormForwardRow(const Warp& warp, T* out, float* mean, float* rstd,
                                   T* residual_out, const T* residual, const T* inp,
                                   const T* weight, const T* bias, int c, float eps) {
  const T* x = ResidualAddRow(warp, residual_out, residual, inp, c);
  float sum = 0;
  for (int j = warp.lane(); j < c; j += kWarpSize) sum += ToFloat(x[j]);
  const float m = WarpSum(warp, sum) / c;
  // Two passes: the variance of the centred values does not cancel catastrophically.
  float sum_sq = 0;
  for (int j = warp.lane(); j < c; j += kWarpSize) {
    const float d = ToFloat(x[j]) - m;
    sum_sq += d * d;
  }
  const float s = 1.0f / std::sqrt(WarpSum(warp, sum_sq) / c + eps);
  for (int j = warp.lane(); j < c; j += kWarpSize) {
    out[j] = FromFloat<T>((ToFloat(x[j]) - m) * s * ToFloat(weight[j]) + ToFloat(bias[j]));
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
  float dnorm_sum = 0;
  float dnorm_norm_sum = 0;
  for (int j = warp.lane(); j < c; j += kWarpSize) {
    const float dnorm = ToFloat(weight[j]) * ToFloat(dout[j]);
    dnorm_sum += dnorm;
    dnorm_norm_sum += dnorm * (ToFloat(inp[j]) - mean) * rstd;
  }
  const float dnorm_mean = WarpSum(warp, dnorm_sum) / c;
  const float dnorm_norm_mean = WarpSum(warp, dnorm_norm_sum) / c;
  for (int j = warp.lane(); j < c; j += kWarpSize) {
    const float norm = (ToFloat(inp[j]) - mean) * rstd;
    const float dx =
        (ToFloat(weight[j]) * ToFloat(dout[j]) - dnorm_mean - norm * dnorm_norm_mean) * rstd;
    dinp[j] = FromFloat<T>(ToFloat(dinp[j]) + dx);
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
  const T* x = ResidualAddRow(warp, residual_out, residual, inp, c);
  float sum_sq = 0;
  for (int j = warp.lane(); j < c; j += kWarpSize) sum_sq += ToFloat(x[j]) * ToFloat(x[j]);
  const float s = 1.0f / std::sqrt(WarpSum(warp, sum_sq) / c + eps);
  for (int j = warp.lane(); j < c; j += kWarpSize) {
    out[j] = FromFloat<T>(ToFloat(x[j]) * s * ToFloat(weight[j]));
  }
  if (warp.lane() == 0) *rstd = s;
}

template <typename Warp, typename T>
DTRAIN_HD void RmsNormBackwardRow(const Warp& warp, T* dinp, const T* dout, const T* inp,
                                  const T* weight, float rstd, int c) {
  float dnorm_norm_sum = 0;
  for (int j = warp.lane(); j < c; j += kWarpSize) {
    dnorm_norm_sum += ToFloat(weight[j]) * ToFloat(dout[j]) * ToFloat(inp[j]) * rstd;
  }
  const float dnorm_norm_mean = WarpSum(warp, dnorm_norm_sum) / c;
  for (int j = warp.lane(); j < c; j += kWarpSize) {
    const float x = ToFloat(inp[j]);
    const float dx = (ToFloat(weight[j]) * ToFloat(dout[j]) - x * rstd * dnorm_norm_mean) * rstd;
    dinp[j] = FromFloat<T>(ToFloat(dinp[j]) + dx);
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
