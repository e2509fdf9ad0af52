#include "core/backend/cpu/elementwise.h"

#include <algorithm>
#include <vector>

#include "core/backend/cpu/parallel.h"

namespace dtrain::cpu {
namespace {

constexpr size_t kElementGrain = 1 << 15;
constexpr size_t kSumBlock = 4096;
// Independent partial sums within a block: the compiler may not reorder one floating-point
// accumulator, but it vectorizes eight of them.
constexpr int kLanes = 8;

}  // namespace

template <typename T>
void Add(T* out, const T* a, const T* b, size_t n, ThreadPool* pool) {
  ParallelFor(pool, n, kElementGrain, [&](size_t begin, size_t end, int) {
    T* __restrict y = out;
    const T* __restrict x1 = a;
    const T* __restrict x2 = b;
    for (size_t i = begin; i < end; ++i) y[i] = x1[i] + x2[i];
  });
}

template <typename T>
double SumSquares(const T* x, size_t n, ThreadPool* pool) {
  const size_t blocks = (n + kSumBlock - 1) / kSumBlock;
  std::vector<double> block_sums(blocks);
  ParallelFor(pool, blocks, 8, [&](size_t begin, size_t end, int) {
    for (size_t block = begin; block < end; ++block) {
      const size_t first = block * kSumBlock;
      const size_t last = std::min(n, first + kSumBlock);
      double lanes[kLanes] = {};
      size_t i = first;
      for (; i + kLanes <= last; i += kLanes) {
        for (int l = 0; l < kLanes; ++l) {
          const double v = x[i + l];
          lanes[l] += v * v;
        }
      }
      for (; i < last; ++i) lanes[0] += static_cast<double>(x[i]) * x[i];
      double sum = 0;
      for (int l = 0; l < kLanes; ++l) sum += lanes[l];
      block_sums[block] = sum;
    }
  });
  double total = 0;
  for (double s : block_sums) total += s;
  return total;
}

template <typename T>
void Scale(T* x, T factor, size_t n, ThreadPool* pool) {
  ParallelFor(pool, n, kElementGrain, [&](size_t begin, size_t end, int) {
    T* __restrict y = x;
    for (size_t i = begin; i < end; ++i) y[i] *= factor;
  });
}

template <typename T>
void Zero(T* x, size_t n, ThreadPool* pool) {
  ParallelFor(pool, n, kElementGrain,
              [&](size_t begin, size_t end, int) { std::fill(x + begin, x + end, T(0)); });
}

#define DTRAIN_INSTANTIATE(T)                                        \
  template void Add<T>(T*, const T*, const T*, size_t, ThreadPool*); \
  template double SumSquares<T>(const T*, size_t, ThreadPool*);      \
  template void Scale<T>(T*, T, size_t, ThreadPool*);                \
  template void Zero<T>(T*, size_t, ThreadPool*);
DTRAIN_INSTANTIATE(float)
DTRAIN_INSTANTIATE(double)
#undef DTRAIN_INSTANTIATE

}  // namespace dtrain::cpu
