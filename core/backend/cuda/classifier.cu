// The classifier's softmax and cross-entropy: one warp per row, arithmetic in classifier_math.h.
#include "core/backend/cuda/classifier_math.h"
#include "core/backend/cuda/kernels.h"
#include "core/backend/cuda/warp.cuh"

namespace dtrain::cuda {
namespace {

template <typename T>
__global__ void ClassifierKernel(T* logits, float* losses, const int32_t* targets, int n, int v,
                                 float grad_scale, bool write_gradient) {
  const int row = WarpRow();
  if (row >= n) return;
  ClassifierRow(DeviceWarp{}, logits + static_cast<size_t>(row) * v, losses + row, targets[row], v,
                grad_scale, write_gradient);
}

}  // namespace

template <typename T>
void ClassifierSoftmaxCrossEntropy(T* logits, float* losses, const int32_t* targets, int n, int v,
                                   float grad_scale, bool write_gradient, cudaStream_t stream) {
  if (n == 0) return;
  ClassifierKernel<<<RowBlocks(n), kRowWarpsPerBlock * kWarpSize, 0, stream>>>(
      logits, losses, targets, n, v, grad_scale, write_gradient);
}

template void ClassifierSoftmaxCrossEntropy<float>(float*, float*, const int32_t*, int, int, float,
                                                   bool, cudaStream_t);
template void ClassifierSoftmaxCrossEntropy<Bf16>(Bf16*, float*, const int32_t*, int, int, float,
                                                  bool, cudaStream_t);

}  // namespace dtrain::cuda
