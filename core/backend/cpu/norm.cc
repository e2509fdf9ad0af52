#include "core/backend/cpu/norm.h"

#include <cmath>

#include "core/backend/cpu/parallel.h"

namespace dtrain::cpu {
namespace {

// Rows per task: a row of a few thousand channels is too little work to hand out alone.
constexpr size_t kRowGrain = 16;
constexpr size_t kColumnGrain = 64;

}  // namespace

template <typename T>
void LayerNormForward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int n,
                      int c, T eps, ThreadPool* pool) {
  ParallelFor(pool, n, kRowGrain, [&](size_t begin, size_t end, int) {
    for (size_t i = begin; i < end; ++i) {
      const T* __restrict x = inp + i * c;
      T* __restrict y = out + i * c;
      T sum = 0;
      for (int j = 0; j < c; ++j) sum += x[j];
      const T m = sum / c;
      // Two passes: the variance of the centred values does not cancel catastrophically.
      T sum_sq = 0;
      for (int j = 0; j < c; ++j) sum_sq += (x[j] - m) * (x[j] - m);
      const T s = T(1) / std::sqrt(sum_sq / c + eps);
      for (int j = 0; j < c; ++j) y[j] = (x[j] - m) * s * weight[j] + bias[j];
      mean[i] = m;
      rstd[i] = s;
    }
  });
}

template <typename T>
void LayerNormBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                       const T* mean, const T* rstd, int n, int c, ThreadPool* pool) {
  ParallelFor(pool, n, kRowGrain, [&](size_t begin, size_t end, int) {
    for (size_t i = begin; i < end; ++i) {
      const T* __restrict x = inp + i * c;
      const T* __restrict dy = dout + i * c;
      T* __restrict dx = dinp + i * c;
      const T m = mean[i];
      const T s = rstd[i];
      T dnorm_sum = 0;
      T dnorm_norm_sum = 0;
      for (int j = 0; j < c; ++j) {
        const T dnorm = weight[j] * dy[j];
        dnorm_sum += dnorm;
        dnorm_norm_sum += dnorm * (x[j] - m) * s;
      }
      const T dnorm_mean = dnorm_sum / c;
      const T dnorm_norm_mean = dnorm_norm_sum / c;
      for (int j = 0; j < c; ++j) {
        const T norm = (x[j] - m) * s;
        dx[j] += (weight[j] * dy[j] - dnorm_mean - norm * dnorm_norm_mean) * s;
      }
    }
  });
  ParallelFor(pool, c, kColumnGrain, [&](size_t begin, size_t end, int) {
    const size_t width = end - begin;
    T* __restrict dw = dweight + begin;
    T* __restrict db = dbias + begin;
    for (int i = 0; i < n; ++i) {
      const T* __restrict x = inp + static_cast<size_t>(i) * c + begin;
      const T* __restrict dy = dout + static_cast<size_t>(i) * c + begin;
      const T m = mean[i];
      const T s = rstd[i];
      for (size_t j = 0; j < width; ++j) {
        dw[j] += (x[j] - m) * s * dy[j];
        db[j] += dy[j];
      }
    }
  });
}

template <typename T>
void RmsNormForward(T* out, T* rstd, const T* inp, const T* weight, int n, int c, T eps,
                    ThreadPool* pool) {
  ParallelFor(pool, n, kRowGrain, [&](size_t begin, size_t end, int) {
    for (size_t i = begin; i < end; ++i) {
      const T* __restrict x = inp + i * c;
      T* __restrict y = out + i * c;
      T sum_sq = 0;
      for (int j = 0; j < c; ++j) sum_sq += x[j] * x[j];
      const T s = T(1) / std::sqrt(sum_sq / c + eps);
      for (int j = 0; j < c; ++j) y[j] = x[j] * s * weight[j];
      rstd[i] = s;
    }
  });
}

template <typename T>
void RmsNormBackward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                     const T* rstd, int n, int c, ThreadPool* pool) {
  ParallelFor(pool, n, kRowGrain, [&](size_t begin, size_t end, int) {
    for (size_t i = begin; i < end; ++i) {
      const T* __restrict x = inp + i * c;
      const T* __restrict dy = dout + i * c;
      T* __restrict dx = dinp + i * c;
      const T s = rstd[i];
      T dnorm_norm_sum = 0;
      for (int j = 0; j < c; ++j) dnorm_norm_sum += weight[j] * dy[j] * x[j] * s;
      const T dnorm_norm_mean = dnorm_norm_sum / c;
      for (int j = 0; j < c; ++j) dx[j] += (weight[j] * dy[j] - x[j] * s * dnorm_norm_mean) * s;
    }
  });
  ParallelFor(pool, c, kColumnGrain, [&](size_t begin, size_t end, int) {
    const size_t width = end - begin;
    T* __restrict dw = dweight + begin;
    for (int i = 0; i < n; ++i) {
      const T* __restrict x = inp + static_cast<size_t>(i) * c + begin;
      const T* __restrict dy = dout + static_cast<size_t>(i) * c + begin;
      const T s = rstd[i];
      for (size_t j = 0; j < width; ++j) dw[j] += x[j] * s * dy[j];
    }
  });
}

#define DTRAIN_INSTANTIATE(T)                                                                      \
  template void LayerNormForward<T>(T*, T*, T*, const T*, const T*, const T*, int, int, T,         \
                                    ThreadPool*);                                                  \
  template void LayerNormBackward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, \
                                     int, int, ThreadPool*);                                       \
  template void RmsNormForward<T>(T*, T*, const T*, const T*, int, int, T, ThreadPool*);           \
  template void RmsNormBackward<T>(T*, T*, const T*, const T*, const T*, const T*, int, int,       \
                                   ThreadPool*);
DTRAIN_INSTANTIATE(float)
DTRAIN_INSTANTIATE(double)
#undef DTRAIN_INSTANTIATE

}  // namespace dtrain::cpu
