#include "core/backend/cpu/adamw.h"

#include <cmath>

#include "core/backend/cpu/parallel.h"

namespace dtrain::cpu {

template <typename T>
void AdamW(T* param, const T* grad, T* m, T* v, size_t n, double lr, double beta1, double beta2,
           double eps, double weight_decay, int64_t step, ThreadPool* pool) {
  const T decay = static_cast<T>(1.0 - lr * weight_decay);
  const T one_minus_beta1 = static_cast<T>(1.0 - beta1);
  const T beta2_t = static_cast<T>(beta2);
  const T one_minus_beta2 = static_cast<T>(1.0 - beta2);
  const double t = static_cast<double>(step);
  const T neg_step_size = static_cast<T>(-lr / (1.0 - std::pow(beta1, t)));
  const T bias_correction2_sqrt = static_cast<T>(std::sqrt(1.0 - std::pow(beta2, t)));
  const T eps_t = static_cast<T>(eps);
  ParallelFor(pool, n, 1 << 15, [&](size_t begin, size_t end, int) {
    T* __restrict p = param;
    const T* __restrict g = grad;
    T* __restrict m1 = m;
    T* __restrict m2 = v;
    for (size_t i = begin; i < end; ++i) {
      p[i] = p[i] * decay;
      m1[i] = m1[i] + one_minus_beta1 * (g[i] - m1[i]);
      m2[i] = m2[i] * beta2_t + one_minus_beta2 * g[i] * g[i];
      const T denom = std::sqrt(m2[i]) / bias_correction2_sqrt + eps_t;
      p[i] = p[i] + neg_step_size * m1[i] / denom;
    }
  });
}

template void AdamW<float>(float*, const float*, float*, float*, size_t, double, double, double,
                           double, double, int64_t, ThreadPool*);
template void AdamW<double>(double*, const double*, double*, double*, size_t, double, double,
                            double, double, double, int64_t, ThreadPool*);

}  // namespace dtrain::cpu
