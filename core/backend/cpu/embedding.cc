#include "core/backend/cpu/embedding.h"

#include <algorithm>

#include "core/backend/cpu/parallel.h"

namespace dtrain::cpu {

template <typename T>
void EmbeddingForward(T* out, const int32_t* tokens, const T* token_embedding,
                      const T* position_embedding, int b, int t, int c, int vocab_begin,
                      int vocab_end, ThreadPool* pool, const int32_t* positions) {
  // The position table's row for token row `row`: its position in its document, or in the row.
  auto position = [&](size_t row) -> size_t {
    return positions != nullptr ? positions[row] : row % t;
  };
  ParallelFor(pool, static_cast<size_t>(b) * t, 16, [&](size_t begin, size_t end, int) {
    for (size_t row = begin; row < end; ++row) {
      T* __restrict y = out + row * c;
      const int32_t token = tokens[row];
      if (token < vocab_begin || token >= vocab_end) {
        if (position_embedding == nullptr) {
          std::fill(y, y + c, T(0));
        } else {
          const T* __restrict wpe = position_embedding + position(row) * c;
          std::copy(wpe, wpe + c, y);
        }
        continue;
      }
      const T* __restrict wte = token_embedding + static_cast<size_t>(token - vocab_begin) * c;
      if (position_embedding == nullptr) {
        std::copy(wte, wte + c, y);
        continue;
      }
      const T* __restrict wpe = position_embedding + position(row) * c;
      for (int j = 0; j < c; ++j) y[j] = wte[j] + wpe[j];
    }
  });
}

template <typename T>
void EmbeddingBackward(T* dtoken_embedding, T* dposition_embedding, const T* dout,
                       const int32_t* tokens, int b, int t, int c, int vocab_begin, int vocab_end,
                       ThreadPool* pool, const int32_t* positions) {
  auto position = [&](size_t row) -> size_t {
    return positions != nullptr ? positions[row] : row % t;
  };
  const size_t rows = static_cast<size_t>(b) * t;
  ParallelFor(pool, c, 64, [&](size_t begin, size_t end, int) {
    const size_t width = end - begin;
    for (size_t row = 0; row < rows; ++row) {
      const T* __restrict dy = dout + row * c + begin;
      const int32_t token = tokens[row];
      if (token >= vocab_begin && token < vocab_end) {
        T* __restrict dwte =
            dtoken_embedding + static_cast<size_t>(token - vocab_begin) * c + begin;
        for (size_t j = 0; j < width; ++j) dwte[j] += dy[j];
      }
      if (dposition_embedding == nullptr) continue;
      T* __restrict dwpe = dposition_embedding + position(row) * c + begin;
      for (size_t j = 0; j < width; ++j) dwpe[j] += dy[j];
    }
  });
}

#define DTRAIN_INSTANTIATE(T)                                                                   \
  template void EmbeddingForward<T>(T*, const int32_t*, const T*, const T*, int, int, int, int, \
                                    int, ThreadPool*, const int32_t*);                          \
  template void EmbeddingBackward<T>(T*, T*, const T*, const int32_t*, int, int, int, int, int, \
                                     ThreadPool*, const int32_t*);
DTRAIN_INSTANTIATE(float)
DTRAIN_INSTANTIATE(double)
#undef DTRAIN_INSTANTIATE

}  // namespace dtrain::cpu
