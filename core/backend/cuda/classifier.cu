// The classifier's softmax and cross-entropy, fused and in the vocabulary-parallel phases: one
// block per row, arithmetic in classifier_math.h.
#include "core/backend/cuda/classifier_math.h"
#include "core/backend/cuda/kernels.h"
#include "core/backend/cuda/warp.cuh"

namespace dtrain::cuda {
namespace {

constexpr int kThreads = kClassifierThreads;

// A block's shared values for BlockButterfly, one per warp; raw storage, as a __shared__
// variable may not have a constructor (SoftmaxState's members have initial values).
template <typename V>
struct alignas(V) WarpValues {
  unsigned char bytes[kThreads / kWarpSize * sizeof(V)];
  __device__ V* get() { return reinterpret_cast<V*>(bytes); }
};

// The row of the calling block.
__device__ inline size_t BlockRow() { return blockIdx.x; }

template <typename T>
__global__ void __launch_bounds__(kThreads)
    ClassifierKernel(T* logits, int ld, float* losses, const int32_t* targets, int v,
                     float grad_scale, bool write_gradient) {
  __shared__ WarpValues<SoftmaxState> shared;
  const size_t row = BlockRow();
  ClassifierRow<kThreads>(DeviceBlock{}, shared.get(), logits + row * ld, losses + row,
                          targets[row], v, grad_scale, write_gradient);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) VocabRowMaxKernel(float* max, const T* logits, int v) {
  __shared__ WarpValues<float> shared;
  const size_t row = BlockRow();
  VocabRowMax<kThreads>(DeviceBlock{}, shared.get(), logits + row * v, max + row, v);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    VocabExpSumsKernel(T* logits, float* sums, float* target_logits, const float* max,
                       const int32_t* targets, int v, int vocab_begin) {
  __shared__ WarpValues<float> shared;
  const size_t row = BlockRow();
  VocabRowExpSum<kThreads>(DeviceBlock{}, shared.get(), logits + row * v, sums + row,
                           target_logits + row, max[row], targets[row], v, vocab_begin);
}

__global__ void VocabLossesKernel(float* losses, const float* max, const float* sums,
                                  const float* target_logits, const int32_t* targets, int n) {
  const int row = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (row >= n) return;
  losses[row] = VocabRowLoss(max[row], sums[row], target_logits[row], targets[row]);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    VocabLogitsBackwardKernel(T* logits, const float* sums, const int32_t* targets, int v,
                              int vocab_begin, float grad_scale) {
  const size_t row = BlockRow();
  VocabRowLogitsBackward<kThreads>(DeviceBlock{}, logits + row * v, sums[row], targets[row], v,
                                   vocab_begin, grad_scale);
}

}  // namespace

template <typename T>
void ClassifierSoftmaxCrossEntropy(T* logits, int ld, float* losses, const int32_t* targets, int n,
                                   int v, float grad_scale, bool write_gradient,
                                   cudaStream_t stream) {
  if (n == 0) return;
  ClassifierKernel<<<n, kThreads, 0, stream>>>(logits, ld, losses, targets, v, grad_scale,
                                               write_gradient);
}

template <typename T>
void VocabRowMax(float* max, const T* logits, int n, int v, cudaStream_t stream) {
  if (n == 0) return;
  VocabRowMaxKernel<<<n, kThreads, 0, stream>>>(max, logits, v);
}

template <typename T>
void VocabExpSums(T* logits, float* sums, float* target_logits, const float* max,
                  const int32_t* targets, int n, int v, int vocab_begin, cudaStream_t stream) {
  if (n == 0) return;
  VocabExpSumsKernel<<<n, kThreads, 0, stream>>>(logits, sums, target_logits, max, targets, v,
                                                 vocab_begin);
}

void VocabLosses(float* losses, const float* max, const float* sums, const float* target_logits,
                 const int32_t* targets, int n, cudaStream_t stream) {
  if (n == 0) return;
  constexpr int kLossThreads = 256;
  VocabLossesKernel<<<(n + kLossThreads - 1) / kLossThreads, kLossThreads, 0, stream>>>(
      losses, max, sums, target_logits, targets, n);
}

template <typename T>
void VocabLogitsBackward(T* logits, const float* sums, const int32_t* targets, int n, int v,
                         int vocab_begin, float grad_scale, cudaStream_t stream) {
  if (n == 0) return;
  VocabLogitsBackwardKernel<<<n, kThreads, 0, stream>>>(logits, sums, targets, v, vocab_begin,
                                                        grad_scale);
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
