#include "core/backend/cpu/attention.h"

#include <algorithm>
#include <cmath>

#include "core/backend/cpu/gemm.h"
#include "core/backend/cpu/parallel.h"
#include "core/backend/cpu/vector_math.h"

namespace dtrain::cpu {
namespace {

// Query rows per block: large enough for efficient GEMMs, small enough that the skipped upper
// triangle saves most of the causal half.
constexpr int kQueryBlock = 64;

int BlockRows(const AttentionShape& shape) { return std::min(kQueryBlock, shape.time); }

// The first key row i may attend to: its document's first row i - positions[i] (within batch
// row `b`), or 0 without documents.
int FirstKey(const int32_t* positions, const AttentionShape& shape, int b, int i) {
  return positions == nullptr ? 0 : i - positions[static_cast<size_t>(b) * shape.time + i];
}

// Pointers to one head's (T, D) slice of a (B, T, qkv_width) buffer; rows are qkv_width apart.
template <typename T>
T* QueryHead(T* qkv, const AttentionShape& shape, int b, int h) {
  return qkv + static_cast<size_t>(b) * shape.time * shape.qkv_width() +
         static_cast<size_t>(h) * shape.head_dim;
}
template <typename T>
T* KeyHead(T* qkv, const AttentionShape& shape, int b, int kv) {
  return QueryHead(qkv, shape, b, shape.heads + kv);
}
template <typename T>
T* ValueHead(T* qkv, const AttentionShape& shape, int b, int kv) {
  return QueryHead(qkv, shape, b, shape.heads + shape.kv_heads + kv);
}
// One head's (T, D) slice of a (B, T, H*D) buffer.
template <typename T>
T* OutHead(T* out, const AttentionShape& shape, int b, int h) {
  return out + static_cast<size_t>(b) * shape.time * shape.heads * shape.head_dim +
         static_cast<size_t>(h) * shape.head_dim;
}

}  // namespace

size_t AttentionScratchSize(const AttentionShape& shape) {
  // Forward: the block's scores/probabilities; backward adds the block's dP/dS.
  return 2 * static_cast<size_t>(BlockRows(shape)) * shape.time;
}

template <typename T>
void AttentionForward(T* out, T* lse, const T* qkv, const AttentionShape& shape, T* scratch,
                      ThreadPool* pool, const int32_t* positions) {
  const int time = shape.time;
  const int d = shape.head_dim;
  const int width = shape.qkv_width();
  const int out_width = shape.heads * d;
  const int group = shape.heads / shape.kv_heads;
  const T scale = T(1) / std::sqrt(static_cast<T>(d));
  const size_t scratch_size = AttentionScratchSize(shape);
  const SerialBlasScope serial_blas;
  ParallelFor(pool, static_cast<size_t>(shape.batch) * shape.heads, 1,
              [&](size_t begin, size_t end, int thread) {
                T* probs = scratch + thread * scratch_size;  // (rows, cols) of one block
                for (size_t task = begin; task < end; ++task) {
                  const int b = static_cast<int>(task / shape.heads);
                  const int h = static_cast<int>(task % shape.heads);
                  const T* q = QueryHead(qkv, shape, b, h);
                  const T* k = KeyHead(qkv, shape, b, h / group);
                  const T* v = ValueHead(qkv, shape, b, h / group);
                  T* o = OutHead(out, shape, b, h);
                  T* row_lse = lse + (static_cast<size_t>(b) * shape.heads + h) * time;
                  for (int i0 = 0; i0 < time; i0 += kQueryBlock) {
                    const int rows = std::min(kQueryBlock, time - i0);
                    // The block's keys [col0, i0 + rows): its first row's document start is the
                    // earliest of its rows' (0 without documents).
                    const int col0 = FirstKey(positions, shape, b, i0);
                    const int cols = i0 + rows - col0;
                    const size_t key_offset = static_cast<size_t>(col0) * width;
                    Gemm(false, true, rows, cols, d, scale, q + static_cast<size_t>(i0) * width,
                         width, k + key_offset, width, T(0), probs, cols);
                    for (int r = 0; r < rows; ++r) {
                      T* __restrict p = probs + static_cast<size_t>(r) * cols;
                      // Keys j in [first, i] of the block's columns.
                      const int first = FirstKey(positions, shape, b, i0 + r) - col0;
                      const int valid = i0 + r + 1 - col0;
                      const int count = valid - first;
                      const T max = MaxOf(p + first, count);
                      ExpShifted(p + first, count, max);
                      const double sum = SumOf(p + first, count);
                      const T inv_sum = static_cast<T>(1.0 / sum);
                      for (int j = first; j < valid; ++j) p[j] *= inv_sum;
                      std::fill(p, p + first, T(0));
                      std::fill(p + valid, p + cols, T(0));
                      row_lse[i0 + r] = static_cast<T>(max + std::log(sum));
                    }
                    Gemm(false, false, rows, d, cols, T(1), probs, cols, v + key_offset, width,
                         T(0), o + static_cast<size_t>(i0) * out_width, out_width);
                  }
                }
              });
}

template <typename T>
void AttentionBackward(T* dqkv, const T* dout, const T* qkv, const T* out, const T* lse,
                       const AttentionShape& shape, T* scratch, ThreadPool* pool,
                       const int32_t* positions) {
  const int time = shape.time;
  const int d = shape.head_dim;
  const int width = shape.qkv_width();
  const int out_width = shape.heads * d;
  const int group = shape.heads / shape.kv_heads;
  const T scale = T(1) / std::sqrt(static_cast<T>(d));
  const size_t scratch_size = AttentionScratchSize(shape);
  const size_t block_size = scratch_size / 2;
  const SerialBlasScope serial_blas;
  ParallelFor(pool, static_cast<size_t>(shape.batch) * shape.kv_heads, 1,
              [&](size_t begin, size_t end, int thread) {
                T* probs = scratch + thread * scratch_size;  // (rows, cols): P of one block
                T* dprobs = probs + block_size;              // (rows, cols): dP, then dS in place
                for (size_t task = begin; task < end; ++task) {
                  const int b = static_cast<int>(task / shape.kv_heads);
                  const int kv = static_cast<int>(task % shape.kv_heads);
                  const T* k = KeyHead(qkv, shape, b, kv);
                  const T* v = ValueHead(qkv, shape, b, kv);
                  T* dk = KeyHead(dqkv, shape, b, kv);
                  T* dv = ValueHead(dqkv, shape, b, kv);
                  for (int t = 0; t < time; ++t) {
                    std::fill(dk + static_cast<size_t>(t) * width,
                              dk + static_cast<size_t>(t) * width + d, T(0));
                    std::fill(dv + static_cast<size_t>(t) * width,
                              dv + static_cast<size_t>(t) * width + d, T(0));
                  }
                  for (int h = kv * group; h < (kv + 1) * group; ++h) {
                    const T* q = QueryHead(qkv, shape, b, h);
                    const T* o = OutHead(out, shape, b, h);
                    const T* dout_head = OutHead(dout, shape, b, h);
                    T* dq = QueryHead(dqkv, shape, b, h);
                    const T* row_lse = lse + (static_cast<size_t>(b) * shape.heads + h) * time;
                    for (int i0 = 0; i0 < time; i0 += kQueryBlock) {
                      const int rows = std::min(kQueryBlock, time - i0);
                      const int col0 = FirstKey(positions, shape, b, i0);  // as in forward
                      const int cols = i0 + rows - col0;
                      const size_t key_offset = static_cast<size_t>(col0) * width;
                      const T* q_block = q + static_cast<size_t>(i0) * width;
                      const T* o_block = o + static_cast<size_t>(i0) * out_width;
                      const T* dout_block = dout_head + static_cast<size_t>(i0) * out_width;
                      Gemm(false, true, rows, cols, d, scale, q_block, width, k + key_offset, width,
                           T(0), probs, cols);
                      for (int r = 0; r < rows; ++r) {
                        T* __restrict p = probs + static_cast<size_t>(r) * cols;
                        const int first = FirstKey(positions, shape, b, i0 + r) - col0;
                        const int valid = i0 + r + 1 - col0;
                        ExpShifted(p + first, valid - first, row_lse[i0 + r]);
                        std::fill(p, p + first, T(0));
                        std::fill(p + valid, p + cols, T(0));
                      }
                      Gemm(true, false, cols, d, rows, T(1), probs, cols, dout_block, out_width,
                           T(1), dv + key_offset, width);
                      Gemm(false, true, rows, cols, d, T(1), dout_block, out_width, v + key_offset,
                           width, T(0), dprobs, cols);
                      for (int r = 0; r < rows; ++r) {
                        const T* __restrict dy = dout_block + static_cast<size_t>(r) * out_width;
                        const T* __restrict y = o_block + static_cast<size_t>(r) * out_width;
                        T delta = 0;
                        for (int j = 0; j < d; ++j) delta += dy[j] * y[j];
                        const T* __restrict p = probs + static_cast<size_t>(r) * cols;
                        T* __restrict ds = dprobs + static_cast<size_t>(r) * cols;
                        for (int j = 0; j < cols; ++j) ds[j] = p[j] * (ds[j] - delta);
                      }
                      Gemm(false, false, rows, d, cols, scale, dprobs, cols, k + key_offset, width,
                           T(0), dq + static_cast<size_t>(i0) * width, width);
                      Gemm(true, false, cols, d, rows, scale, dprobs, cols, q_block, width, T(1),
                           dk + key_offset, width);
                    }
                  }
                }
              });
}

#define DTRAIN_INSTANTIATE(T)                                                                 \
  template void AttentionForward<T>(T*, T*, const T*, const AttentionShape&, T*, ThreadPool*, \
                                    const int32_t*);                                          \
  template void AttentionBackward<T>(T*, const T*, const T*, const T*, const T*,              \
                                     const AttentionShape&, T*, ThreadPool*, const int32_t*);
DTRAIN_INSTANTIATE(float)
DTRAIN_INSTANTIATE(double)
#undef DTRAIN_INSTANTIATE

}  // namespace dtrain::cpu
