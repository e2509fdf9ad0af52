// The classifier's softmax and cross-entropy, fused and in the vocabulary-parallel phases: one
// warp per row, arithmetic in classifier_math.h.
#include "core/backend/cuda/classifier_math.h"
#include "core/backend/cuda/kernels.h"
#include "core/backend/cuda/warp.cuh"

namespace dtrain::cuda {
namespace {

template <typename T>
__global__ void ClassifierKernel(T* logits, int ld, float* losses, const int32_t* targets, int n,
                                 int v, float grad_scale, bool write_gradient) {
  const int row = WarpRow();
  if (row >= n) return;
  ClassifierRow(DeviceWarp{}, logits + static_cast<size_t>(row) * ld, losses + row, targets[row], v,
                grad_scale, write_gradient);
}

template <typename T>
__global__ void VocabRowMaxKernel(float* max, const T* logits, int n, int v) {
  const int row = WarpRow();
  if (row >= n) return;
  VocabRowMax(DeviceWarp{}, logits + static_cast<size_t>(row) * v, max + row, v);
}

template <typename T>
__global__ void VocabExpSumsKernel(T* logits, float* sums, float* target_logits, const float* max,
                                   const int32_t* targets, int n, int v, int vocab_begin) {
  const int row = WarpRow();
  if (row >= n) return;
  VocabRowExpSum(DeviceWarp{}, logits + static_cast<size_t>(row) * v, sums + row,
                 target_logits + row, max[row], targets[row], v, vocab_begin);
}

__global__ void VocabLossesKernel(float* losses, const float* max, const float* sums,
                                  const float* target_logits, const int32_t* targets, int n) {
  const int row = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (row >= n) return;
  losses[row] = VocabRowLoss(max[row], sums[row], target_logits[row], targets[row]);
}

template <typename T>
__global__ void VocabLogitsBackwardKernel(T* logits, const float* sums, const int32_t* targets,
                                          int n, int v, int vocab_begin, float grad_scale) {
  const int row = WarpRow();
  if (row >= n) return;
  VocabRowLogitsBackward(DeviceWarp{}, logits + static_cast<size_t>(row) * v, sums[row],
                         targets[row], v, vocab_begin, grad_scale);
}

}  // namespace

template <typename T>
void ClassifierSoftmaxCrossEntropy(T* logits, int ld, float* losses, const int32_t* targets, int n,
                                   int v, float grad_scale, bool write_gradient,
                                   cudaStream_t stream) {
  if (n == 0) return;
  ClassifierKernel<<<RowBlocks(n), kRowWarpsPerBlock * kWarpSize, 0, stream>>>(
      logits, ld, losses, targets, n, v, grad_scale, write_gradient);
}

template <typename T>
void VocabRowMax(float* max, const T* logits, int n, int v, cudaStream_t stream) {
  if (n == 0) return;
  VocabRowMaxKernel<<<RowBlocks(n), kRowWarpsPerBlock * kWarpSize, 0, stream>>>(max, logits, n, v);
}

template <typename T>
void VocabExpSums(T* logits, float* sums, float* target_logits, const float* max,
                  const int32_t* targets, int n, int v, int vocab_begin, cudaStream_t stream) {
  if (n == 0) return;
  VocabExpSumsKernel<<<RowBlocks(n), kRowWarpsPerBlock * kWarpSize, 0, stream>>>(
      logits, sums, target_logits, max, targets, n, v, vocab_begin);
}

void VocabLosses(float* losses, const float* max, const float* sums, const float* target_logits,
                 const int32_t* targets, int n, cudaStream_t stream) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  VocabLossesKernel<<<(n + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
      losses, max, sums, target_logits, targets, n);
}

template <typename T>
void VocabLogitsBackward(T* logits, const float* sums, const int32_t* targets, int n, int v,
                         int vocab_begin, float grad_scale, cudaStream_t stream) {
  if (n == 0) return;
  VocabLogitsBackwardKernel<<<RowBlocks(n), kRowWarpsPerBlock * kWarpSize, 0, stream>>>(
      logits, sums, targets, n, v, vocab_begin, grad_scale);
}

#define DTRAIN_INSTANTIATE(T)                                                                      \
  template void VocabRowMax<T>(float*, const T*, int, int, cudaStream_t);                          \
  template void VocabExpSums<T>(T*, float*, float*, const float*, const int32_t*, int, int, int,   \
                                cudaStream_t);                                                     \
  template void VocabLogitsBackward<T>(T*, const float*, const int32_t*, int, int, int, float,     \
                                       cudaStream_t);                                              \
  template void ClassifierSoftmaxCrossEntropy<T>(T*, int, float*, const int32_t*, int, int, float, \
                                                 bool, cudaStream_t);
DTRAIN_INSTANTIATE(float)
DTRAIN_INSTANTIATE(Bf16)
#undef DTRAIN_INSTANTIATE

}  // namespace dtrain::cuda
