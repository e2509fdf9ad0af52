#include "core/backend/cpu/classifier.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/backend/cpu/gemm.h"
#include "core/backend/cpu/parallel.h"
#include "core/backend/cpu/vector_math.h"

namespace dtrain::cpu {

size_t ClassifierScratchSize(int chunk_rows, int v) { return static_cast<size_t>(chunk_rows) * v; }

template <typename T>
double ClassifierForwardBackward(T* dx, T* dweight, const T* x, const T* weight,
                                 const int32_t* targets, int n, int c, int v, T grad_scale,
                                 int chunk_rows, T* scratch, ThreadPool* pool,
                                 MatmulPrecision precision, bool bf16_logits) {
  // The precision the logits' gradient is rounded to for the backward GEMMs.
  const MatmulPrecision dlogits_precision = bf16_logits ? MatmulPrecision::kMedium : precision;
  chunk_rows = std::min(chunk_rows, n);
  std::vector<double> row_loss(chunk_rows);
  double loss = 0;
  for (int r0 = 0; r0 < n; r0 += chunk_rows) {
    const int rows = std::min(chunk_rows, n - r0);
    const T* x_chunk = x + static_cast<size_t>(r0) * c;
    T* logits = scratch;  // (rows, V)
    Gemm(false, true, rows, v, c, T(1), x_chunk, c, weight, c, T(0), logits, v);
    ParallelFor(pool, rows, 1, [&](size_t begin, size_t end, int) {
      for (size_t r = begin; r < end; ++r) {
        T* __restrict row = logits + r * v;
        if constexpr (std::is_same_v<T, float>) {
          if (bf16_logits) {
            for (int j = 0; j < v; ++j) row[j] = RoundForMatmul(row[j], MatmulPrecision::kMedium);
          }
        }
        const int32_t target = targets[r0 + r];
        const T max = MaxOf(row, v);
        const double target_logit = target >= 0 ? row[target] : 0.0;
        // Exponentials replace the logits so the gradient below needs no second exp.
        ExpShifted(row, v, max);
        const double sum = SumOf(row, v);
        row_loss[r] = target >= 0 ? max + std::log(sum) - target_logit : 0.0;
        if (dx == nullptr) continue;
        const T factor = target >= 0 ? static_cast<T>(grad_scale / sum) : T(0);
        for (int j = 0; j < v; ++j) row[j] *= factor;
        if (target >= 0) row[target] -= grad_scale;
        if constexpr (std::is_same_v<T, float>) {
          if (dlogits_precision != MatmulPrecision::kHighest) {
            for (int j = 0; j < v; ++j) row[j] = RoundForMatmul(row[j], dlogits_precision);
          }
        }
      }
    });
    for (int r = 0; r < rows; ++r) loss += row_loss[r];
    if (dx == nullptr) continue;
    Gemm(false, false, rows, c, v, T(1), logits, v, weight, c, T(0),
         dx + static_cast<size_t>(r0) * c, c);
    Gemm(true, false, v, c, rows, T(1), logits, v, x_chunk, c, T(1), dweight, c);
  }
  return loss;
}

template <typename T>
void ClassifierRowMax(T* max, const T* logits, int n, int v, ThreadPool* pool) {
  ParallelFor(pool, n, 16, [&](size_t begin, size_t end, int) {
    for (size_t r = begin; r < end; ++r) {
      max[r] = v > 0 ? MaxOf(logits + r * v, v) : -std::numeric_limits<T>::infinity();
    }
  });
}

template <typename T>
void ClassifierExpSums(T* logits, T* sums, T* target_logits, const T* max, const int32_t* targets,
                       int n, int v, int vocab_begin, ThreadPool* pool) {
  ParallelFor(pool, n, 1, [&](size_t begin, size_t end, int) {
    for (size_t r = begin; r < end; ++r) {
      T* __restrict row = logits + r * v;
      const int32_t target = targets[r] - vocab_begin;
      target_logits[r] = targets[r] >= 0 && target >= 0 && target < v ? row[target] : T(0);
      ExpShifted(row, v, max[r]);
      sums[r] = static_cast<T>(SumOf(row, v));
    }
  });
}

template <typename T>
double ClassifierLossSum(const T* max, const T* sums, const T* target_logits,
                         const int32_t* targets, int n) {
  double loss = 0;
  for (int r = 0; r < n; ++r) {
    if (targets[r] < 0) continue;
    loss += max[r] + std::log(static_cast<double>(sums[r])) - target_logits[r];
  }
  return loss;
}

template <typename T>
void ClassifierLogitsBackward(T* logits, const T* sums, const int32_t* targets, int n, int v,
                              int vocab_begin, T grad_scale, ThreadPool* pool) {
  ParallelFor(pool, n, 1, [&](size_t begin, size_t end, int) {
    for (size_t r = begin; r < end; ++r) {
      T* __restrict row = logits + r * v;
      const bool ignored = targets[r] < 0;
      const T factor = ignored ? T(0) : static_cast<T>(grad_scale / static_cast<double>(sums[r]));
      for (int j = 0; j < v; ++j) row[j] *= factor;
      const int32_t target = targets[r] - vocab_begin;
      if (!ignored && target >= 0 && target < v) row[target] -= grad_scale;
    }
  });
}

#define DTRAIN_INSTANTIATE(T)                                                               \
  template void ClassifierRowMax<T>(T*, const T*, int, int, ThreadPool*);                   \
  template void ClassifierExpSums<T>(T*, T*, T*, const T*, const int32_t*, int, int, int,   \
                                     ThreadPool*);                                          \
  template double ClassifierLossSum<T>(const T*, const T*, const T*, const int32_t*, int);  \
  template void ClassifierLogitsBackward<T>(T*, const T*, const int32_t*, int, int, int, T, \
                                            ThreadPool*);
DTRAIN_INSTANTIATE(float)
DTRAIN_INSTANTIATE(double)
#undef DTRAIN_INSTANTIATE

template double ClassifierForwardBackward<float>(float*, float*, const float*, const float*,
                                                 const int32_t*, int, int, int, float, int, float*,
                                                 ThreadPool*, MatmulPrecision, bool);
template double ClassifierForwardBackward<double>(double*, double*, const double*, const double*,
                                                  const int32_t*, int, int, int, double, int,
                                                  double*, ThreadPool*, MatmulPrecision, bool);

}  // namespace dtrain::cpu
