#include "core/backend/cpu/adamw.h"

#include <algorithm>
#include <cmath>

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "core/backend/cpu/parallel.h"

namespace dtrain::cpu {
namespace {

// The update of values [begin, end), in the order the header states.
template <typename T>
void UpdateScalar(T* __restrict p, const T* __restrict g, T* __restrict m, T* __restrict v,
                  size_t begin, size_t end, const AdamWCoefficients<T>& k) {
  for (size_t i = begin; i < end; ++i) {
    const T gi = g[i] * k.grad_scale;
    p[i] = p[i] * k.decay;
    m[i] = m[i] + k.one_minus_beta1 * (gi - m[i]);
    v[i] = v[i] * k.beta2 + k.one_minus_beta2 * gi * gi;
    const T denom = std::sqrt(v[i]) / k.bias_correction2_sqrt + k.eps;
    p[i] = p[i] + k.neg_step_size * m[i] / denom;
  }
}

#if defined(__AVX__)
// The per-step scalars broadcast to 8 lanes.
struct Coefficients8 {
  explicit Coefficients8(const AdamWCoefficients<float>& k)
      : decay(_mm256_set1_ps(k.decay)),
        one_minus_beta1(_mm256_set1_ps(k.one_minus_beta1)),
        beta2(_mm256_set1_ps(k.beta2)),
        one_minus_beta2(_mm256_set1_ps(k.one_minus_beta2)),
        neg_step_size(_mm256_set1_ps(k.neg_step_size)),
        bias_correction2_sqrt(_mm256_set1_ps(k.bias_correction2_sqrt)),
        eps(_mm256_set1_ps(k.eps)),
        grad_scale(_mm256_set1_ps(k.grad_scale)) {}
  __m256 decay, one_minus_beta1, beta2, one_minus_beta2, neg_step_size, bias_correction2_sqrt, eps,
      grad_scale;
};

// UpdateScalar's operations on 8 values.
inline void Update8(float* p, const float* g, float* m, float* v, const Coefficients8& k) {
  const __m256 gi = _mm256_mul_ps(_mm256_loadu_ps(g), k.grad_scale);
  const __m256 pi = _mm256_mul_ps(_mm256_loadu_ps(p), k.decay);
  __m256 mi = _mm256_loadu_ps(m);
  mi = _mm256_add_ps(mi, _mm256_mul_ps(k.one_minus_beta1, _mm256_sub_ps(gi, mi)));
  __m256 vi = _mm256_mul_ps(_mm256_loadu_ps(v), k.beta2);
  vi = _mm256_add_ps(vi, _mm256_mul_ps(_mm256_mul_ps(k.one_minus_beta2, gi), gi));
  const __m256 denom =
      _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), k.bias_correction2_sqrt), k.eps);
  _mm256_storeu_ps(m, mi);
  _mm256_storeu_ps(v, vi);
  _mm256_storeu_ps(p, _mm256_add_ps(pi, _mm256_div_ps(_mm256_mul_ps(k.neg_step_size, mi), denom)));
}
#endif

// Float runs 8 values at a time: std::sqrt may set errno, so without -fno-math-errno the
// compiler leaves UpdateScalar scalar, and a sqrt and two divisions per value made the pass over
// 124M parameters compute-bound (4x slower than memory allows). The compiler may fuse some
// multiply-adds of Update8, so the last partial group goes through Update8 too, padded: every
// value takes the same instructions wherever the thread split falls (bit-identical runs).
void Update(float* p, const float* g, float* m, float* v, size_t begin, size_t end,
            const AdamWCoefficients<float>& k) {
#if defined(__AVX__)
  const Coefficients8 k8(k);
  size_t i = begin;
  for (; i + 8 <= end; i += 8) Update8(p + i, g + i, m + i, v + i, k8);
  if (i == end) return;
  // Zero padding is harmless: v = 0, m = 0 give a step of 0 / eps.
  float pad_p[8] = {}, pad_g[8] = {}, pad_m[8] = {}, pad_v[8] = {};
  const size_t rest = end - i;
  std::copy(p + i, p + end, pad_p);
  std::copy(g + i, g + end, pad_g);
  std::copy(m + i, m + end, pad_m);
  std::copy(v + i, v + end, pad_v);
  Update8(pad_p, pad_g, pad_m, pad_v, k8);
  std::copy(pad_p, pad_p + rest, p + i);
  std::copy(pad_m, pad_m + rest, m + i);
  std::copy(pad_v, pad_v + rest, v + i);
#else
  UpdateScalar(p, g, m, v, begin, end, k);
#endif
}

void Update(double* p, const double* g, double* m, double* v, size_t begin, size_t end,
            const AdamWCoefficients<double>& k) {
  UpdateScalar(p, g, m, v, begin, end, k);
}

}  // namespace

template <typename T>
void AdamW(T* param, const T* grad, T* m, T* v, size_t n, const AdamWCoefficients<T>& k,
           ThreadPool* pool) {
  ParallelFor(pool, n, 1 << 15,
              [&](size_t begin, size_t end, int) { Update(param, grad, m, v, begin, end, k); });
}

template void AdamW<float>(float*, const float*, float*, float*, size_t,
                           const AdamWCoefficients<float>&, ThreadPool*);
template void AdamW<double>(double*, const double*, double*, double*, size_t,
                            const AdamWCoefficients<double>&, ThreadPool*);

}  // namespace dtrain::cpu
