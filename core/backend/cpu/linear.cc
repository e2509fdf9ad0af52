#include "core/backend/cpu/linear.h"

#include <algorithm>

#include "core/backend/cpu/gemm.h"
#include "core/backend/cpu/parallel.h"

namespace dtrain::cpu {

template <typename T>
void LinearForward(T* out, const T* inp, const T* weight, const T* bias, int n, int in_features,
                   int out_features, ThreadPool* pool) {
  // Broadcasting the bias into out first lets the GEMM add onto it (beta 1).
  if (bias != nullptr) {
    ParallelFor(pool, n, 64, [&](size_t begin, size_t end, int) {
      for (size_t i = begin; i < end; ++i) {
        std::copy(bias, bias + out_features, out + i * out_features);
      }
    });
  }
  Gemm(false, true, n, out_features, in_features, T(1), inp, in_features, weight, in_features,
       bias != nullptr ? T(1) : T(0), out, out_features);
}

template <typename T>
void LinearBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                    int n, int in_features, int out_features, ThreadPool* pool) {
  if (dinp != nullptr) {
    Gemm(false, false, n, in_features, out_features, T(1), dout, out_features, weight, in_features,
         T(0), dinp, in_features);
  }
  Gemm(true, false, out_features, in_features, n, T(1), dout, out_features, inp, in_features, T(1),
       dweight, in_features);
  if (dbias != nullptr) AddColumnSums(dbias, dout, n, out_features, pool);
}

template <typename T>
void AddBias(T* out, const T* bias, int n, int c, ThreadPool* pool) {
  ParallelFor(pool, n, 64, [&](size_t begin, size_t end, int) {
    for (size_t i = begin; i < end; ++i) {
      T* __restrict row = out + i * c;
      for (int j = 0; j < c; ++j) row[j] += bias[j];
    }
  });
}

template <typename T>
void AddColumnSums(T* sums, const T* x, int n, int c, ThreadPool* pool) {
  ParallelFor(pool, c, 64, [&](size_t begin, size_t end, int) {
    T* __restrict s = sums + begin;
    const size_t width = end - begin;
    for (int i = 0; i < n; ++i) {
      const T* __restrict row = x + static_cast<size_t>(i) * c + begin;
      for (size_t j = 0; j < width; ++j) s[j] += row[j];
    }
  });
}

#define DTRAIN_INSTANTIATE(T)                                                                   \
  template void LinearForward<T>(T*, const T*, const T*, const T*, int, int, int, ThreadPool*); \
  template void LinearBackward<T>(T*, T*, T*, const T*, const T*, const T*, int, int, int,      \
                                  ThreadPool*);                                                 \
  template void AddBias<T>(T*, const T*, int, int, ThreadPool*);                                \
  template void AddColumnSums<T>(T*, const T*, int, int, ThreadPool*);
DTRAIN_INSTANTIATE(float)
DTRAIN_INSTANTIATE(double)
#undef DTRAIN_INSTANTIATE

}  // namespace dtrain::cpu
