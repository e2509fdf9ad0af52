#include "core/backend/cpu/activation.h"

#include <cmath>

#include "core/backend/cpu/parallel.h"
#include "core/backend/cpu/vector_math.h"

namespace dtrain::cpu {
namespace {

constexpr size_t kElementGrain = 1 << 14;
constexpr size_t kRowGrain = 16;
constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluCubic = 0.044715;

}  // namespace

template <typename T>
void GeluForward(T* out, const T* inp, size_t n, ThreadPool* pool) {
  ParallelFor(pool, n, kElementGrain, [&](size_t begin, size_t end, int) {
    const T* __restrict x = inp;
    T* __restrict y = out;
    for (size_t i = begin; i < end; ++i) {
      const T u = T(kSqrt2OverPi) * (x[i] + T(kGeluCubic) * x[i] * x[i] * x[i]);
      y[i] = T(0.5) * x[i] * (T(1) + Tanh(u));
    }
  });
}

template <typename T>
void GeluBackward(T* dinp, const T* inp, const T* dout, size_t n, ThreadPool* pool) {
  ParallelFor(pool, n, kElementGrain, [&](size_t begin, size_t end, int) {
    const T* __restrict x = inp;
    const T* dy = dout;  // may be dx: each element is read before it is written
    T* dx = dinp;
    for (size_t i = begin; i < end; ++i) {
      const T u = T(kSqrt2OverPi) * (x[i] + T(kGeluCubic) * x[i] * x[i] * x[i]);
      const T t = Tanh(u);
      const T du = T(kSqrt2OverPi) * (T(1) + T(3 * kGeluCubic) * x[i] * x[i]);
      dx[i] = (T(0.5) * (T(1) + t) + T(0.5) * x[i] * (T(1) - t * t) * du) * dy[i];
    }
  });
}

template <typename T>
void SwiGluForward(T* out, const T* gate_up, int n, int f, ThreadPool* pool) {
  ParallelFor(pool, n, kRowGrain, [&](size_t begin, size_t end, int) {
    for (size_t i = begin; i < end; ++i) {
      const T* __restrict gate = gate_up + i * 2 * f;
      const T* __restrict up = gate + f;
      T* __restrict y = out + i * f;
      for (int j = 0; j < f; ++j) y[j] = gate[j] / (T(1) + Exp(-gate[j])) * up[j];
    }
  });
}

template <typename T>
void SwiGluBackward(T* dgate_up, const T* gate_up, const T* dout, int n, int f, ThreadPool* pool) {
  ParallelFor(pool, n, kRowGrain, [&](size_t begin, size_t end, int) {
    for (size_t i = begin; i < end; ++i) {
      const T* __restrict gate = gate_up + i * 2 * f;
      const T* __restrict up = gate + f;
      const T* __restrict dy = dout + i * f;
      T* __restrict dgate = dgate_up + i * 2 * f;
      T* __restrict dup = dgate + f;
      for (int j = 0; j < f; ++j) {
        const T sig = T(1) / (T(1) + Exp(-gate[j]));
        dgate[j] = dy[j] * up[j] * sig * (T(1) + gate[j] * (T(1) - sig));
        dup[j] = dy[j] * gate[j] * sig;
      }
    }
  });
}

#define DTRAIN_INSTANTIATE(T)                                                 \
  template void GeluForward<T>(T*, const T*, size_t, ThreadPool*);            \
  template void GeluBackward<T>(T*, const T*, const T*, size_t, ThreadPool*); \
  template void SwiGluForward<T>(T*, const T*, int, int, ThreadPool*);        \
  template void SwiGluBackward<T>(T*, const T*, const T*, int, int, ThreadPool*);
DTRAIN_INSTANTIATE(float)
DTRAIN_INSTANTIATE(double)
#undef DTRAIN_INSTANTIATE

}  // namespace dtrain::cpu
