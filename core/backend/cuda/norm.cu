// LayerNorm and RMSNorm: one warp per row, arithmetic in norm_math.h; the parameter gradients
// with ColumnSlices(n) threads per column, then one thread per column adding their sums.
#include "core/backend/cuda/kernels.h"
#include "core/backend/cuda/norm_math.h"
#include "core/backend/cuda/warp.cuh"

namespace dtrain::cuda {
namespace {

// The slice sums' blocks: a warp's columns by kSlicesPerBlock slices, 1024 threads, which the
// kernels' launch bounds keep within the registers such a block may use.
constexpr int kSliceBlockThreads = kWarpSize * kSlicesPerBlock;

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

// Grid (column tiles of kWarpSize, slices / kSlicesPerBlock); block (kWarpSize, kSlicesPerBlock):
// thread (x, y) sums slice blockIdx.y * kSlicesPerBlock + y of column tile * kWarpSize + x (a warp
// reads kWarpSize consecutive columns of a row) into slice_sums (slices, C).
template <typename SliceSum>
__device__ void SliceSumsOfTile(ColumnGrads* slice_sums, int c, const SliceSum& slice_sum) {
  const int j = static_cast<int>(blockIdx.x) * kWarpSize + static_cast<int>(threadIdx.x);
  const int slice = static_cast<int>(blockIdx.y) * kSlicesPerBlock + static_cast<int>(threadIdx.y);
  if (j < c) slice_sums[static_cast<size_t>(slice) * c + j] = slice_sum(j, slice);
}

// One thread per column: the slices' sums added in slice order.
__global__ void AddColumnGradsKernel(float* dweight, float* dbias, const ColumnGrads* slice_sums,
                                     int slices, int c) {
  const int j = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (j < c) AddColumnGrads(dweight, dbias, slice_sums, slices, c, j);
}

template <typename T>
__global__ void __launch_bounds__(kSliceBlockThreads)
    LayerNormSliceSumsKernel(ColumnGrads* slice_sums, const T* dout, const T* inp,
                             const float* mean, const float* rstd, int n, int c, int slices) {
  SliceSumsOfTile(slice_sums, c, [&](int j, int slice) {
    return LayerNormParamGradSlice(dout, inp, mean, rstd, n, c, j, slice, slices);
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
__global__ void __launch_bounds__(kSliceBlockThreads)
    RmsNormSliceSumsKernel(ColumnGrads* slice_sums, const T* dout, const T* inp, const float* rstd,
                           int n, int c, int slices) {
  SliceSumsOfTile(slice_sums, c, [&](int j, int slice) {
    return RmsNormWeightGradSlice(dout, inp, rstd, n, c, j, slice, slices);
  });
}

constexpr int kRowThreads = kRowWarpsPerBlock * kWarpSize;
constexpr int kAddThreads = 256;

dim3 SliceGrid(int n, int c) {
  return dim3(static_cast<unsigned>((c + kWarpSize - 1) / kWarpSize),
              static_cast<unsigned>(ColumnSlices(n) / kSlicesPerBlock));
}
const dim3 kSliceThreads(kWarpSize, kSlicesPerBlock);

// dweight (and dbias) += the slices' sums of n rows, for every column.
void AddSliceSums(float* dweight, float* dbias, const ColumnGrads* slice_sums, int n, int c,
                  cudaStream_t stream) {
  AddColumnGradsKernel<<<(c + kAddThreads - 1) / kAddThreads, kAddThreads, 0, stream>>>(
      dweight, dbias, slice_sums, ColumnSlices(n), c);
}

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
void LayerNormBackward(T* dinp, float* dweight, float* dbias, ColumnGrads* slice_sums,
                       const T* dout, const T* inp, const T* weight, const float* mean,
                       const float* rstd, int n, int c, cudaStream_t stream) {
  if (n == 0 || c == 0) return;
  LayerNormBackwardKernel<<<RowBlocks(n), kRowThreads, 0, stream>>>(dinp, dout, inp, weight, mean,
                                                                    rstd, n, c);
  LayerNormSliceSumsKernel<<<SliceGrid(n, c), kSliceThreads, 0, stream>>>(
      slice_sums, dout, inp, mean, rstd, n, c, ColumnSlices(n));
  AddSliceSums(dweight, dbias, slice_sums, n, c, stream);
}

template <typename T>
void RmsNormForward(T* out, float* rstd, T* residual_out, const T* residual, const T* inp,
                    const T* weight, int n, int c, float eps, cudaStream_t stream) {
  if (n == 0) return;
  RmsNormForwardKernel<<<RowBlocks(n), kRowThreads, 0, stream>>>(out, rstd, residual_out, residual,
                                                                 inp, weight, n, c, eps);
}

template <typename T>
void RmsNormBackward(T* dinp, float* dweight, ColumnGrads* slice_sums, const T* dout, const T* inp,
                     const T* weight, const float* rstd, int n, int c, cudaStream_t stream) {
  if (n == 0 || c == 0) return;
  RmsNormBackwardKernel<<<RowBlocks(n), kRowThreads, 0, stream>>>(dinp, dout, inp, weight, rstd, n,
                                                                  c);
  RmsNormSliceSumsKernel<<<SliceGrid(n, c), kSliceThreads, 0, stream>>>(slice_sums, dout, inp, rstd,
                                                                        n, c, ColumnSlices(n));
  AddSliceSums(dweight, nullptr, slice_sums, n, c, stream);
}

#define DTRAIN_INSTANTIATE(T)                                                                    \
  template void LayerNormForward<T>(T*, float*, float*, T*, const T*, const T*, const T*,        \
                                    const T*, int, int, float, cudaStream_t);                    \
  template void LayerNormBackward<T>(T*, float*, float*, ColumnGrads*, const T*, const T*,       \
                                     const T*, const float*, const float*, int, int,             \
                                     cudaStream_t);                                              \
  template void RmsNormForward<T>(T*, float*, T*, const T*, const T*, const T*, int, int, float, \
                                  cudaStream_t);                                                 \
  template void RmsNormBackward<T>(T*, float*, ColumnGrads*, const T*, const T*, const T*,       \
                                   const float*, int, int, cudaStream_t);
DTRAIN_INSTANTIATE(float)
DTRAIN_INSTANTIATE(Bf16)
#undef DTRAIN_INSTANTIATE

}  // namespace dtrain::cuda
