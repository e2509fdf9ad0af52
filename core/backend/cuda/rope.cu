// RoPE: one thread per rotated pair (row, head, i), arithmetic in rope_math.h. Each thread
// computes its own cos and sin in double instead of reading a table: no scratch buffer, and
// next to attention the cost is nothing.
#include "core/backend/cuda/kernels.h"
#include "core/backend/cuda/pack.cuh"
#include "core/backend/cuda/positions_math.h"
#include "core/backend/cuda/rope_math.h"

namespace dtrain::cuda {
namespace {

// rows = B * T rows of `width` values whose first rotated_heads heads (of head_dim) rotate.
template <typename T>
__global__ void RopeKernel(T* qkv, const int32_t* positions, size_t rows, int time,
                           int rotated_heads, int head_dim, int width, double theta, int pos_offset,
                           float direction) {
  const int half = head_dim / 2;
  const size_t pair = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t pairs_per_row = static_cast<size_t>(rotated_heads) * half;
  const size_t row = pair / pairs_per_row;
  if (row >= rows) return;
  const int head = static_cast<int>(pair % pairs_per_row) / half;
  const int i = static_cast<int>(pair % half);
  float cos_angle, sin_angle;
  RopeCosSin(pos_offset + TokenPosition(positions, row, time), i, head_dim, theta, direction,
             &cos_angle, &sin_angle);
  T* x1 = qkv + row * width + static_cast<size_t>(head) * head_dim + i;
  RotatePair(x1, x1 + half, cos_angle, sin_angle);
}

template <typename T>
void Rotate(T* qkv, const AttentionShape& shape, double theta, int pos_offset,
            const int32_t* positions, float direction, cudaStream_t stream) {
  const size_t rows = static_cast<size_t>(shape.batch) * shape.time;
  const int rotated_heads = shape.heads + shape.kv_heads;
  const size_t pairs = rows * rotated_heads * (shape.head_dim / 2);
  if (pairs == 0) return;
  const unsigned blocks =
      static_cast<unsigned>((pairs + kElementwiseThreads - 1) / kElementwiseThreads);
  RopeKernel<<<blocks, kElementwiseThreads, 0, stream>>>(
      qkv, positions, rows, shape.time, rotated_heads, shape.head_dim, shape.qkv_width(), theta,
      pos_offset, direction);
}

}  // namespace

template <typename T>
void RopeForward(T* qkv, const AttentionShape& shape, double theta, int pos_offset,
                 const int32_t* positions, cudaStream_t stream) {
  Rotate(qkv, shape, theta, pos_offset, positions, 1.0f, stream);
}

template <typename T>
void RopeBackward(T* dqkv, const AttentionShape& shape, double theta, int pos_offset,
                  const int32_t* positions, cudaStream_t stream) {
  Rotate(dqkv, shape, theta, pos_offset, positions, -1.0f, stream);
}

#define DTRAIN_INSTANTIATE(T)                                                           \
  template void RopeForward<T>(T*, const AttentionShape&, double, int, const int32_t*,  \
                               cudaStream_t);                                           \
  template void RopeBackward<T>(T*, const AttentionShape&, double, int, const int32_t*, \
                                cudaStream_t);
DTRAIN_INSTANTIATE(float)
DTRAIN_INSTANTIATE(Bf16)
#undef DTRAIN_INSTANTIATE

}  // namespace dtrain::cuda
