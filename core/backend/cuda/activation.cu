// GELU and SwiGLU: one thread per 16-byte pack of outputs, arithmetic in activation_math.h.
#include "core/backend/cuda/activation_math.h"
#include "core/backend/cuda/kernels.h"
#include "core/backend/cuda/pack.cuh"

namespace dtrain::cuda {
namespace {

template <typename T>
__global__ void GeluForwardKernel(T* out, const T* inp, size_t n) {
  const size_t i = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kPackSize<T>;
  if (i >= n) return;
  const Pack<T> x = LoadPack(inp, i, n, T{});
  Pack<T> y;
  for (int k = 0; k < kPackSize<T>; ++k)
    y.values[k] = FromFloat<T>(GeluForward(ToFloat(x.values[k])));
  StorePack(out, i, n, y);
}

template <typename T>
__global__ void GeluBackwardKernel(T* dinp, const T* inp, const T* dout, size_t n) {
  const size_t i = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kPackSize<T>;
  if (i >= n) return;
  const Pack<T> x = LoadPack(inp, i, n, T{});
  const Pack<T> dy = LoadPack(dout, i, n, T{});
  Pack<T> dx;
  for (int k = 0; k < kPackSize<T>; ++k) {
    dx.values[k] = FromFloat<T>(GeluBackward(ToFloat(x.values[k]), ToFloat(dy.values[k])));
  }
  StorePack(dinp, i, n, dx);
}

// Grid: RowPackGrid; row r's gate is gate_up[r, :F] and its up gate_up[r, F:].
template <typename T>
__global__ void SwiGluForwardKernel(T* out, const T* gate_up, int f) {
  const size_t row = RowOfGrid();
  const size_t j = PackOfRow<T>();
  if (j >= static_cast<size_t>(f)) return;
  const T* gate = gate_up + row * 2 * f;
  const Pack<T> g = LoadPack(gate, j, f, T{});
  const Pack<T> u = LoadPack(gate + f, j, f, T{});
  Pack<T> y;
  for (int k = 0; k < kPackSize<T>; ++k) {
    y.values[k] = FromFloat<T>(SwiGluForward(ToFloat(g.values[k]), ToFloat(u.values[k])));
  }
  StorePack(out + row * f, j, f, y);
}

template <typename T>
__global__ void SwiGluBackwardKernel(T* dgate_up, const T* gate_up, const T* dout, int f) {
  const size_t row = RowOfGrid();
  const size_t j = PackOfRow<T>();
  if (j >= static_cast<size_t>(f)) return;
  const T* gate = gate_up + row * 2 * f;
  const Pack<T> g = LoadPack(gate, j, f, T{});
  const Pack<T> u = LoadPack(gate + f, j, f, T{});
  const Pack<T> dy = LoadPack(dout + row * f, j, f, T{});
  Pack<T> dg, du;
  for (int k = 0; k < kPackSize<T>; ++k) {
    float dgate, dup;
    SwiGluBackward(ToFloat(g.values[k]), ToFloat(u.values[k]), ToFloat(dy.values[k]), &dgate, &dup);
    dg.values[k] = FromFloat<T>(dgate);
    du.values[k] = FromFloat<T>(dup);
  }
  T* dgate_row = dgate_up + row * 2 * f;
  StorePack(dgate_row, j, f, dg);
  StorePack(dgate_row + f, j, f, du);
}

}  // namespace

template <typename T>
void GeluForward(T* out, const T* inp, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  GeluForwardKernel<<<PackBlocks<T>(n), kElementwiseThreads, 0, stream>>>(out, inp, n);
}

template <typename T>
void GeluBackward(T* dinp, const T* inp, const T* dout, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  GeluBackwardKernel<<<PackBlocks<T>(n), kElementwiseThreads, 0, stream>>>(dinp, inp, dout, n);
}

template <typename T>
void SwiGluForward(T* out, const T* gate_up, int n, int f, cudaStream_t stream) {
  if (n == 0 || f == 0) return;
  const dim3 grid = RowPackGrid<T>(n, f);
  SwiGluForwardKernel<<<grid, kElementwiseThreads, 0, stream>>>(out, gate_up, f);
}

template <typename T>
void SwiGluBackward(T* dgate_up, const T* gate_up, const T* dout, int n, int f,
                    cudaStream_t stream) {
  if (n == 0 || f == 0) return;
  const dim3 grid = RowPackGrid<T>(n, f);
  SwiGluBackwardKernel<<<grid, kElementwiseThreads, 0, stream>>>(dgate_up, gate_up, dout, f);
}

#define DTRAIN_INSTANTIATE(T)                                                  \
  template void GeluForward<T>(T*, const T*, size_t, cudaStream_t);            \
  template void GeluBackward<T>(T*, const T*, const T*, size_t, cudaStream_t); \
  template void SwiGluForward<T>(T*, const T*, int, int, cudaStream_t);        \
  template void SwiGluBackward<T>(T*, const T*, const T*, int, int, cudaStream_t);
DTRAIN_INSTANTIATE(float)
DTRAIN_INSTANTIATE(Bf16)
#undef DTRAIN_INSTANTIATE

}  // namespace dtrain::cuda
