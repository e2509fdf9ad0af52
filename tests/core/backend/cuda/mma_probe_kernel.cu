// MmaProbe on one warp of the GPU (mma_probe.h).
#include <cuda_runtime.h>

#include "core/backend/cuda/warp.cuh"
#include "tests/core/backend/cuda/mma_probe.h"

namespace dtrain::cuda::testing {
namespace {

// One warp: the inputs into shared memory (ldmatrix reads nothing else), then the probe.
__global__ void MmaProbeKernel(const Bf16* a, const Bf16* b, const Bf16* b_transposed, float* out) {
  constexpr int kValues = 16 * kProbeStride;
  __shared__ alignas(16) Bf16 shared[3][kValues];
  for (int i = static_cast<int>(threadIdx.x); i < kValues; i += kWarpSize) {
    shared[0][i] = a[i];
    shared[1][i] = b[i];
    shared[2][i] = b_transposed[i];
  }
  __syncwarp();
  MmaProbe(DeviceWarp{}, shared[0], shared[1], shared[2], out);
}

template <typename T>
T* ToDevice(const std::vector<T>& host) {
  T* device = nullptr;
  if (cudaMalloc(&device, host.size() * sizeof(T)) != cudaSuccess) return nullptr;
  cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  return device;
}

}  // namespace

cudaError_t MmaProbeOnDevice(const ProbeCase& probe, std::vector<float>* out) {
  out->assign(kProbeOutputs, 0.0f);
  Bf16* a = ToDevice(probe.a);
  Bf16* b = ToDevice(probe.b);
  Bf16* b_transposed = ToDevice(probe.b_transposed);
  float* device_out = ToDevice(*out);
  MmaProbeKernel<<<1, kWarpSize>>>(a, b, b_transposed, device_out);
  cudaError_t error = cudaGetLastError();
  if (error == cudaSuccess) {
    error =
        cudaMemcpy(out->data(), device_out, out->size() * sizeof(float), cudaMemcpyDeviceToHost);
  }
  for (void* buffer : {static_cast<void*>(a), static_cast<void*>(b),
                       static_cast<void*>(b_transposed), static_cast<void*>(device_out)}) {
    cudaFree(buffer);
  }
  return error;
}

}  // namespace dtrain::cuda::testing
