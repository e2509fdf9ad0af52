// The output layer fused with softmax and cross-entropy, in chunks of kClassifierChunkRows rows
// so only (chunk, V) logits exist at once (the full (N, V) would be 205 MB at N = 1024,
// V = 50257). Per chunk:
//   logits = x_chunk @ weight^T                         (one GEMM, threaded by OpenBLAS)
//   loss  += lse - logit[target]  per row, in double    (rows split across the pool)
//   dlogits = (softmax - onehot(target)) * grad_scale   (in place; 0 for ignored rows)
//   dx_chunk = dlogits @ weight (written),  dweight += dlogits^T @ x_chunk.
// Chunks run one after another, so the dweight GEMMs never race and sum in chunk order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/util/thread_pool.h"

namespace dtrain::cpu {

inline constexpr int kClassifierChunkRows = 128;

// Values of scratch a call needs (shared by all threads, not per thread).
size_t ClassifierScratchSize(int v);

// x (N, C), weight (V, C), targets (N; < 0 ignored). Returns the sum over rows of
// -log p(target). When dx is not null, writes dx (N, C) and accumulates dweight (V, C) for that
// sum scaled by grad_scale.
template <typename T>
double ClassifierForwardBackward(T* dx, T* dweight, const T* x, const T* weight,
                                 const int32_t* targets, int n, int c, int v, T grad_scale,
                                 T* scratch, ThreadPool* pool);

}  // namespace dtrain::cpu
