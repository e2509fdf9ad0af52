// LayerNorm and RMSNorm over the last dimension C of x (N, C).
//
// LayerNorm: out = (x - mean) * rstd * weight + bias, rstd = 1 / sqrt(var + eps) (biased var).
// RMSNorm:   out = x * rstd * weight,                rstd = 1 / sqrt(mean(x^2) + eps).
// Forward saves mean and rstd (N) so backward needs no second reduction over x. Backward follows
// llm.c: dinp += rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = weight * dout
// (RMSNorm drops the mean(dnorm) term). dinp ACCUMULATES because it is the residual stream's
// gradient. Rows run in parallel; dweight and dbias are column sums computed in a second pass
// split by columns, so each column sums its rows in order whatever the thread count.
#pragma once

#include "core/util/thread_pool.h"

namespace dtrain::cpu {

// out (N, C), mean (N), rstd (N); inp (N, C), weight (C), bias (C).
template <typename T>
void LayerNormForward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int n,
                      int c, T eps, ThreadPool* pool);
// dinp (N, C) +=, dweight (C) +=, dbias (C) +=.
template <typename T>
void LayerNormBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                       const T* mean, const T* rstd, int n, int c, ThreadPool* pool);

// out (N, C), rstd (N); inp (N, C), weight (C).
template <typename T>
void RmsNormForward(T* out, T* rstd, const T* inp, const T* weight, int n, int c, T eps,
                    ThreadPool* pool);
// dinp (N, C) +=, dweight (C) +=.
template <typename T>
void RmsNormBackward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                     const T* rstd, int n, int c, ThreadPool* pool);

}  // namespace dtrain::cpu
