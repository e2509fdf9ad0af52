// The output layer fused with softmax and cross-entropy, in chunks of rows so only (chunk, V)
// logits exist at once (the full (N, V) would be 205 MB at N = 1024, V = 50257). Per chunk:
//   logits = x_chunk @ weight^T                         (one GEMM, threaded by OpenBLAS)
//   loss  += lse - logit[target]  per row, in double    (rows split across the pool)
//   dlogits = (softmax - onehot(target)) * grad_scale   (in place; 0 for ignored rows)
//   dx_chunk = dlogits @ weight (written),  dweight += dlogits^T @ x_chunk.
// Chunks run one after another, so the dweight GEMMs never race and sum in chunk order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/backend/matmul_precision.h"
#include "core/util/thread_pool.h"

namespace dtrain::cpu {

// Values of scratch a call with chunks of chunk_rows needs (shared by all threads).
size_t ClassifierScratchSize(int chunk_rows, int v);

// x (N, C), weight (V, C), targets (N; < 0 ignored). Returns the sum over rows of
// -log p(target). When dx is not null, writes dx (N, C) and accumulates dweight (V, C) for that
// sum scaled by grad_scale. Below `precision` highest (float only), the logits' gradient is
// rounded for the backward GEMMs as x and weight are by the caller (matmul_precision.h). With
// `bf16_logits` (float only), the logits and their gradient are rounded to bf16 as they are
// computed, as the CUDA backend stores them for bf16 inputs.
template <typename T>
double ClassifierForwardBackward(T* dx, T* dweight, const T* x, const T* weight,
                                 const int32_t* targets, int n, int c, int v, T grad_scale,
                                 int chunk_rows, T* scratch, ThreadPool* pool,
                                 MatmulPrecision precision = MatmulPrecision::kHighest,
                                 bool bf16_logits = false);

// The vocabulary-parallel phases (Backend::ClassifierRowMax and the rest): the same arithmetic
// per row as the fused kernel, on the logits (N, v) of the vocabulary rows [vocab_begin,
// vocab_begin + v), so that a rank holding the whole vocabulary computes what it does.
template <typename T>
void ClassifierRowMax(T* max, const T* logits, int n, int v, ThreadPool* pool);
template <typename T>
void ClassifierExpSums(T* logits, T* sums, T* target_logits, const T* max, const int32_t* targets,
                       int n, int v, int vocab_begin, ThreadPool* pool);
template <typename T>
double ClassifierLossSum(const T* max, const T* sums, const T* target_logits,
                         const int32_t* targets, int n);
template <typename T>
void ClassifierLogitsBackward(T* logits, const T* sums, const int32_t* targets, int n, int v,
                              int vocab_begin, T grad_scale, ThreadPool* pool);

}  // namespace dtrain::cpu
