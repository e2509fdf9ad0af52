// Causal attention: one warp per query row forward and for dq, one warp per key row for dk and
// dv; arithmetic in attention_math.h.
#include "core/backend/cuda/attention_math.h"
#include "core/backend/cuda/kernels.h"
#include "core/backend/cuda/warp.cuh"

namespace dtrain::cuda {
namespace {

constexpr int kRowThreads = kRowWarpsPerBlock * kWarpSize;

// Warp row r = ((b * heads) + h) * T + t over `heads` heads (H for queries, Hkv for keys).
struct RowIndex {
  int batch, head, time;
};
__device__ inline RowIndex SplitRow(int row, int heads, int time) {
  return {row / (heads * time), row / time % heads, row % time};
}

template <typename T>
__global__ void AttentionForwardKernel(T* out, float* lse, const T* qkv, AttentionDims dims,
                                       int rows) {
  const int row = WarpRow();
  if (row >= rows) return;
  const RowIndex at = SplitRow(row, dims.heads, dims.time);
  const size_t b = at.batch;
  AttentionForwardRow(DeviceWarp{}, out + b * dims.time * dims.out_width,
                      lse + b * dims.heads * dims.time, qkv + b * dims.time * dims.qkv_width, dims,
                      at.head, at.time);
}

template <typename T>
__global__ void AttentionQueryGradKernel(T* dqkv, const T* dout, const T* qkv, const T* out,
                                         const float* lse, AttentionDims dims, int rows) {
  const int row = WarpRow();
  if (row >= rows) return;
  const RowIndex at = SplitRow(row, dims.heads, dims.time);
  const size_t b = at.batch;
  AttentionQueryGradRow(DeviceWarp{}, dqkv + b * dims.time * dims.qkv_width,
                        dout + b * dims.time * dims.out_width, qkv + b * dims.time * dims.qkv_width,
                        out + b * dims.time * dims.out_width, lse + b * dims.heads * dims.time,
                        dims, at.head, at.time);
}

template <typename T>
__global__ void AttentionKeyValueGradKernel(T* dqkv, const T* dout, const T* qkv, const T* out,
                                            const float* lse, AttentionDims dims, int rows) {
  const int row = WarpRow();
  if (row >= rows) return;
  const RowIndex at = SplitRow(row, dims.kv_heads, dims.time);
  const size_t b = at.batch;
  AttentionKeyValueGradRow(
      DeviceWarp{}, dqkv + b * dims.time * dims.qkv_width, dout + b * dims.time * dims.out_width,
      qkv + b * dims.time * dims.qkv_width, out + b * dims.time * dims.out_width,
      lse + b * dims.heads * dims.time, dims, at.head, at.time);
}

bool Supported(const AttentionShape& shape) {
  return shape.head_dim <= kAttentionMaxHeadDim && shape.kv_heads > 0 &&
         shape.heads % shape.kv_heads == 0;
}

}  // namespace

template <typename T>
cudaError_t AttentionForward(T* out, float* lse, const T* qkv, const AttentionShape& shape,
                             cudaStream_t stream) {
  if (!Supported(shape)) return cudaErrorInvalidValue;
  const int rows = shape.batch * shape.heads * shape.time;
  if (rows == 0) return cudaSuccess;
  AttentionForwardKernel<<<RowBlocks(rows), kRowThreads, 0, stream>>>(
      out, lse, qkv, MakeAttentionDims(shape), rows);
  return cudaSuccess;
}

template <typename T>
cudaError_t AttentionBackward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse,
                              const AttentionShape& shape, cudaStream_t stream) {
  if (!Supported(shape)) return cudaErrorInvalidValue;
  const AttentionDims dims = MakeAttentionDims(shape);
  const int query_rows = shape.batch * shape.heads * shape.time;
  const int key_rows = shape.batch * shape.kv_heads * shape.time;
  if (query_rows == 0) return cudaSuccess;
  AttentionQueryGradKernel<<<RowBlocks(query_rows), kRowThreads, 0, stream>>>(
      dqkv, dout, qkv, out, lse, dims, query_rows);
  AttentionKeyValueGradKernel<<<RowBlocks(key_rows), kRowThreads, 0, stream>>>(dqkv, dout, qkv, out,
                                                                               lse, dims, key_rows);
  return cudaSuccess;
}

#define DTRAIN_INSTANTIATE(T)                                                               \
  template cudaError_t AttentionForward<T>(T*, float*, const T*, const AttentionShape&,     \
                                           cudaStream_t);                                   \
  template cudaError_t AttentionBackward<T>(T*, const T*, const T*, const T*, const float*, \
                                            const AttentionShape&, cudaStream_t);
DTRAIN_INSTANTIATE(float)
DTRAIN_INSTANTIATE(Bf16)
#undef DTRAIN_INSTANTIATE

}  // namespace dtrain::cuda
