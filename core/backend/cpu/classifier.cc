#include "core/backend/cpu/classifier.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/backend/cpu/gemm.h"
#include "core/backend/cpu/parallel.h"
#include "core/backend/cpu/vector_math.h"

namespace dtrain::cpu {

size_t ClassifierScratchSize(int v) { return static_cast<size_t>(kClassifierChunkRows) * v; }

template <typename T>
double ClassifierForwardBackward(T* dx, T* dweight, const T* x, const T* weight,
                                 const int32_t* targets, int n, int c, int v, T grad_scale,
                                 T* scratch, ThreadPool* pool) {
  std::vector<double> row_loss(kClassifierChunkRows);
  double loss = 0;
  for (int r0 = 0; r0 < n; r0 += kClassifierChunkRows) {
    const int rows = std::min(kClassifierChunkRows, n - r0);
    const T* x_chunk = x + static_cast<size_t>(r0) * c;
    T* logits = scratch;  // (rows, V)
    Gemm(false, true, rows, v, c, T(1), x_chunk, c, weight, c, T(0), logits, v);
    ParallelFor(pool, rows, 1, [&](size_t begin, size_t end, int) {
      for (size_t r = begin; r < end; ++r) {
        T* __restrict row = logits + r * v;
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

template double ClassifierForwardBackward<float>(float*, float*, const float*, const float*,
                                                 const int32_t*, int, int, int, float, float*,
                                                 ThreadPool*);
template double ClassifierForwardBackward<double>(double*, double*, const double*, const double*,
                                                  const int32_t*, int, int, int, double, double*,
                                                  ThreadPool*);

}  // namespace dtrain::cpu
