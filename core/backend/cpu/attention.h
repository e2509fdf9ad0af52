// Causal self-attention with grouped-query heads, scale 1/sqrt(D), computed one (batch, head)
// pair at a time in blocks of query rows, so no (T, T) probability matrix outlives one block:
// the scratch is (block rows, T) per thread, and the rows above the diagonal are never
// multiplied (block i0 only sees keys [0, i0 + rows)).
//
// qkv (B, T, qkv_width) holds per row H query heads, Hkv key heads, Hkv value heads, each D
// wide; query head h reads kv head h / (H / Hkv). The GEMMs address the heads in place with
// leading dimension qkv_width.
//
// Forward: S = scale Q K^T, P = softmax(S) over keys j <= i, O = P V; lse (B, H, T) keeps each
// row's log-sum-exp. Backward recomputes P = exp(S - lse), then with D_i = rowsum(dO * O):
//   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - D),  dQ = scale dS K,  dK = scale dS^T Q.
// Document-aware (packed samples): with `positions` (B, T), each token's position in its own
// document (0 at the document's first token), row i attends only to keys [i - positions[i], i],
// its own document; a block's GEMMs then start at its first row's document. Null: plain causal
// attention over the whole row, the same arithmetic as before documents existed.
//
// Backward runs one task per (batch, kv head) that walks all query heads of the group, so the
// dK and dV sums never race and their order does not depend on the thread count. Masked
// entries have P = 0 exactly and contribute exactly 0.
#pragma once

#include <cstddef>

#include "core/backend/backend.h"
#include "core/util/thread_pool.h"

namespace dtrain::cpu {

// Values of scratch each thread needs; the kernels take NumThreads(pool) times this.
size_t AttentionScratchSize(const AttentionShape& shape);

// out (B, T, H*D), lse (B, H, T); qkv (B, T, qkv_width).
template <typename T>
void AttentionForward(T* out, T* lse, const T* qkv, const AttentionShape& shape, T* scratch,
                      ThreadPool* pool, const int32_t* positions = nullptr);
// dqkv (B, T, qkv_width) written; dout (B, T, H*D).
template <typename T>
void AttentionBackward(T* dqkv, const T* dout, const T* qkv, const T* out, const T* lse,
                       const AttentionShape& shape, T* scratch, ThreadPool* pool,
                       const int32_t* positions = nullptr);

}  // namespace dtrain::cpu
