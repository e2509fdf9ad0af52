#include "core/backend/cpu/rope.h"

#include <cmath>
#include <vector>

#include "core/backend/cpu/parallel.h"

namespace dtrain::cpu {
namespace {

// Rotates every query and key head of each row by +angle (direction 1) or -angle (-1).
template <typename T>
void Rotate(T* qkv, const AttentionShape& shape, double theta, int pos_offset,
            const int32_t* positions, T direction, ThreadPool* pool) {
  const int half = shape.head_dim / 2;
  const int time = shape.time;
  std::vector<T> cos_table(static_cast<size_t>(time) * half);  // (T, D/2)
  std::vector<T> sin_table(static_cast<size_t>(time) * half);  // (T, D/2)
  for (int t = 0; t < time; ++t) {
    for (int i = 0; i < half; ++i) {
      const double angle =
          (pos_offset + t) * std::pow(theta, -2.0 * i / static_cast<double>(shape.head_dim));
      cos_table[static_cast<size_t>(t) * half + i] = static_cast<T>(std::cos(angle));
      sin_table[static_cast<size_t>(t) * half + i] = direction * static_cast<T>(std::sin(angle));
    }
  }
  const int width = shape.qkv_width();
  const int rotated_heads = shape.heads + shape.kv_heads;
  const size_t rows = static_cast<size_t>(shape.batch) * time;
  ParallelFor(pool, rows, 16, [&](size_t begin, size_t end, int) {
    for (size_t row = begin; row < end; ++row) {
      // A document's positions restart at 0 and never exceed the row's time index: the table's
      // rows cover them.
      const size_t t = positions != nullptr ? positions[row] : row % time;
      const T* __restrict c = cos_table.data() + t * half;
      const T* __restrict s = sin_table.data() + t * half;
      for (int h = 0; h < rotated_heads; ++h) {
        T* __restrict x1 = qkv + row * width + static_cast<size_t>(h) * shape.head_dim;
        T* __restrict x2 = x1 + half;
        for (int i = 0; i < half; ++i) {
          const T a = x1[i];
          const T b = x2[i];
          x1[i] = a * c[i] - b * s[i];
          x2[i] = b * c[i] + a * s[i];
        }
      }
    }
  });
}

}  // namespace

template <typename T>
void RopeForward(T* qkv, const AttentionShape& shape, double theta, int pos_offset,
                 ThreadPool* pool, const int32_t* positions) {
  Rotate(qkv, shape, theta, pos_offset, positions, T(1), pool);
}

template <typename T>
void RopeBackward(T* dqkv, const AttentionShape& shape, double theta, int pos_offset,
                  ThreadPool* pool, const int32_t* positions) {
  Rotate(dqkv, shape, theta, pos_offset, positions, T(-1), pool);
}

#define DTRAIN_INSTANTIATE(T)                                                        \
  template void RopeForward<T>(T*, const AttentionShape&, double, int, ThreadPool*,  \
                               const int32_t*);                                      \
  template void RopeBackward<T>(T*, const AttentionShape&, double, int, ThreadPool*, \
                                const int32_t*);
DTRAIN_INSTANTIATE(float)
DTRAIN_INSTANTIATE(double)
#undef DTRAIN_INSTANTIATE

}  // namespace dtrain::cpu
