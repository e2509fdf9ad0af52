// Token plus learned position embedding: out (B*T, C) = token_embedding[tokens] +
// position_embedding[t]. Backward ACCUMULATES into both tables. Vocabulary-parallel: the token
// table holds only rows [vocab_begin, vocab_end) (row 0 is token vocab_begin); a token outside
// them looks up a zero row and adds no gradient. A token may repeat, so backward
// splits the channels, not the tokens, across threads: no two threads touch one element, and
// every element sums its tokens in order whatever the thread count.
#pragma once

#include <cstdint>

#include "core/util/thread_pool.h"

namespace dtrain::cpu {

// tokens (B, T); token_embedding (vocab_end - vocab_begin, C); position_embedding (maxT, C), may
// be null. `positions` (B, T): each token's position in its document, the position table's row
// for it (null: its time index t).
template <typename T>
void EmbeddingForward(T* out, const int32_t* tokens, const T* token_embedding,
                      const T* position_embedding, int b, int t, int c, int vocab_begin,
                      int vocab_end, ThreadPool* pool, const int32_t* positions = nullptr);
// dtoken_embedding (vocab_end - vocab_begin, C) +=; dposition_embedding (maxT, C) += (skipped
// when null).
template <typename T>
void EmbeddingBackward(T* dtoken_embedding, T* dposition_embedding, const T* dout,
                       const int32_t* tokens, int b, int t, int c, int vocab_begin, int vocab_end,
                       ThreadPool* pool, const int32_t* positions = nullptr);

}  // namespace dtrain::cpu
