// Linear layer: out (N, OC) = inp (N, IC) @ weight (OC, IC)^T + bias (OC). One GEMM each way;
// the bias column sums run over columns split across threads so every column sums its rows in
// the same order whatever the thread count (bit-identical runs).
#pragma once

#include "core/util/thread_pool.h"

namespace dtrain::cpu {

// bias may be null.
template <typename T>
void LinearForward(T* out, const T* inp, const T* weight, const T* bias, int n, int in_features,
                   int out_features, ThreadPool* pool);

// dinp (N, IC) = dout @ weight, written (skipped when null); dweight (OC, IC) += dout^T @ inp;
// dbias (OC) += column sums of dout (skipped when null).
template <typename T>
void LinearBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                    int n, int in_features, int out_features, ThreadPool* pool);

// sums (C) += column sums of x (N, C), each column in row order.
// out (N, C) += bias (C) on every row.
template <typename T>
void AddBias(T* out, const T* bias, int n, int c, ThreadPool* pool);
template <typename T>
void AddColumnSums(T* sums, const T* x, int n, int c, ThreadPool* pool);

}  // namespace dtrain::cpu
