// LayerNorm and RMSNorm: one warp per row, arithmetic in norm_math.h; the parameter gradients
// with kColumnSlices threads per column.
#include "core/backend/cuda/kernels.h"
#include "core/backend/cuda/norm_math.h"
#include "core/backend/cuda/warp.cuh"

namespace dtrain::cuda {
namespace {

template <typename T>
__global__ void LayerNormForwardKernel(T* out, float* mean, float* rstd, T* residual_out,
                                       const T* residual, const T* inp, const T* weight,
                                       const T* bias, int n, int c, float eps) {
  const int row = WarpRow();
  if (row >= n) return;
  const size_t at = static_cast<size_t>(row) * c;
  LayerNormForwardRow(DeviceWarp{}, out + at, mean + row, rstd + row,
                      residual == nullptr ? nullptr : residual_out + at,
                      residual == nullptr ? nullptr : residual + at, inp + at, weight, bias, c,
                      eps);
}

template <typename T>
__global__ void LayerNormBackwardKernel(T* dinp, const T* dout, const T* inp, const T* weight,
                                        const float* mean, const float* rstd, int n, int c) {
  const int row = WarpRow();
  if (row >= n) return;
  const size_t at = static_cast<size_t>(row) * c;
  LayerNormBackwardRow(DeviceWarp{}, dinp + at, dout + at, inp + at, weight, mean[row], rstd[row],
                       c);
}

// Grid: column tiles of kWarpSize; block (kWarpSize, kColumnSlices): thread (x, y) sums slice y
// of column tile * kWarpSize + x (a warp reads kWarpSize consecutive columns of a row), then the
// slices' sums are added in slice order (norm_math.h).
template <typename SliceSums>
__device__ void ColumnGradsOfTile(float* dweight, float* dbias, int c,
                                  const SliceSums& slice_sums) {
  __shared__ ColumnGrads slices[kWarpSize][kColumnSlices];
  const int j = static_cast<int>(blockIdx.x) * kWarpSize + static_cast<int>(threadIdx.x);
  if (j < c) slices[threadIdx.x][threadIdx.y] = slice_sums(j, static_cast<int>(threadIdx.y));
  __syncthreads();
  if (j < c && threadIdx.y == 0) AddColumnGrads(dweight, dbias, slices[threadIdx.x], j);
}

template <typename T>
__global__ void LayerNormParamGradKernel(float* dweight, float* dbias, const T* dout, const T* inp,
                                         const float* mean, const float* rstd, int n, int c) {
  ColumnGradsOfTile(dweight, dbias, c, [&](int j, int slice) {
    return LayerNormParamGradSlice(dout, inp, mean, rstd, n, c, j, slice);
  });
}

template <typename T>
__global__ void RmsNormForwardKernel(T* out, float* rstd, T* residual_out, const T* residual,
                                     const T* inp, const T* weight, int n, int c, float eps) {
  const int row = WarpRow();
  if (row >= n) return;
  const size_t at = static_cast<size_t>(row) * c;
  RmsNormForwardRow(DeviceWarp{}, out + at, rstd + row,
                    residual == nullptr ? nullptr : residual_out + at,
                    residual == nullptr ? nullptr : residual + at, inp + at, weight, c, eps);
}

template <typename T>
__global__ void RmsNormBackwardKernel(T* dinp, const T* dout, const T* inp, const T* weight,
                                      const float* rstd, int n, int c) {
  const int row = WarpRow();
  if (row >= n) return;
  const size_t at = static_cast<size_t>(row) * c;
  RmsNormBackwardRow(DeviceWarp{}, dinp + at, dout + at, inp + at, weight, rstd[row], c);
}

template <typename T>
__global__ void RmsNormWeightGradKernel(float* dweight, const T* dout, const T* inp,
                                        const float* rstd, int n, int c) {
  ColumnGradsOfTile(dweight, nullptr, c, [&](int j, int slice) {
    return RmsNormWeightGradSlice(dout, inp, rstd, n, c, j, slice);
  });
}

constexpr int kRowThreads = kRowWarpsPerBlock * kWarpSize;

unsigned ColumnBlocks(int c) { return static_cast<unsigned>((c + kWarpSize - 1) / kWarpSize); }
const dim3 kColumnThreads(kWarpSize, kColumnSlices);

}  // namespace

template <typename T>
void LayerNormForward(T* out, float* mean, float* rstd, T* residual_out, const T* residual,
                      const T* inp, const T* weight, const T* bias, int n, int c, float eps,
                      cudaStream_t stream) {
  if (n == 0) return;
  LayerNormForwardKernel<<<RowBlocks(n), kRowThreads, 0, stream>>>(
      out, mean, rstd, residual_out, residual, inp, weight, bias, n, c, eps);
}

template <typename T>
void LayerNormBackward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp,
                       const T* weight, const float* mean, const float* rstd, int n, int c,
                       cudaStream_t stream) {
  if (n == 0 || c == 0) return;
  LayerNormBackwardKernel<<<RowBlocks(n), kRowThreads, 0, stream>>>(dinp, dout, inp, weight, mean,
                                                                    rstd, n, c);
  LayerNormParamGradKernel<<<ColumnBlocks(c), kColumnThreads, 0, stream>>>(dweight, dbias, dout,
                                                                           inp, mean, rstd, n, c);
}

template <typename T>
void RmsNormForward(T* out, float* rstd, T* residual_out, const T* residual, const T* inp,
                    const T* weight, int n, int c, float eps, cudaStream_t stream) {
  if (n == 0) return;
  RmsNormForwardKernel<<<RowBlocks(n), kRowThreads, 0, stream>>>(out, rstd, residual_out, residual,
                                                                 inp, weight, n, c, eps);
}

template <typename T>
void RmsNormBackward(T* dinp, float* dweight, const T* dout, const T* inp, const T* weight,
                     const float* rstd, int n, int c, cudaStream_t stream) {
  if (n == 0 || c == 0) return;
  RmsNormBackwardKernel<<<RowBlocks(n), kRowThreads, 0, stream>>>(dinp, dout, inp, weight, rstd, n,
                                                                  c);
  RmsNormWeightGradKernel<<<ColumnBlocks(c), kColumnThreads, 0, stream>>>(dweight, dout, inp, rstd,
                                                                          n, c);
}

#define DTRAIN_INSTANTIATE(T)                                                                    \
  template void LayerNormForward<T>(T*, float*, float*, T*, const T*, const T*, const T*,        \
                                    const T*, int, int, float, cudaStream_t);                    \
  template void LayerNormBackward<T>(T*, float*, float*, const T*, const T*, const T*,           \
                                     const float*, const float*, int, int, cudaStream_t);        \
  template void RmsNormForward<T>(T*, float*, T*, const T*, const T*, const T*, int, int, float, \
                                  cudaStream_t);                                                 \
  template void RmsNormBackward<T>(T*, float*, const T*, const T*, const T*, const float*, int,  \
                                   int, cudaStream_t);
DTRAIN_INSTANTIATE(float)
DTRAIN_INSTANTIATE(Bf16)
#undef DTRAIN_INSTANTIATE

}  // namespace dtrain::cuda
