// Rotary position embedding, in place on the H query heads and Hkv key heads of qkv
// (B, T, qkv_width); value heads are left alone. Hugging Face Llama's rotate_half convention:
// within a head, the pair (i, i + D/2) rotates by angle (pos_offset + t) * theta^(-2i/D):
//   x_i' = x_i cos - x_{i+D/2} sin,   x_{i+D/2}' = x_{i+D/2} cos + x_i sin.
// With `positions` (B, T) (documents packed into a row: each token's position in its own
// document), the angle is (pos_offset + positions[b, t]) * theta^(-2i/D) instead.
// Backward applies the inverse rotation (angle negated) to the gradient. The cos/sin table
// (T, D/2) is computed per call in double: it costs T*D/2 sincos, nothing next to attention.
#pragma once

#include "core/backend/backend.h"
#include "core/util/thread_pool.h"

namespace dtrain::cpu {

template <typename T>
void RopeForward(T* qkv, const AttentionShape& shape, double theta, int pos_offset,
                 ThreadPool* pool, const int32_t* positions = nullptr);
template <typename T>
void RopeBackward(T* dqkv, const AttentionShape& shape, double theta, int pos_offset,
                  ThreadPool* pool, const int32_t* positions = nullptr);

}  // namespace dtrain::cpu
