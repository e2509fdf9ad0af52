// AdamW: one thread per 16-byte pack of the fp32 master, m and v (4 values), over every range of
// the call, arithmetic in adamw_math.h.
#include "core/backend/cuda/adamw_math.h"
#include "core/backend/cuda/kernels.h"
#include "core/backend/cuda/pack.cuh"

namespace dtrain::cuda {
namespace {

constexpr int kValues = kPackSize<float>;

__global__ void AdamWKernel(float* param, Bf16* param_copy, const float* grad, float* m, float* v,
                            size_t n, const AdamWRange* ranges, int count, AdamWCoefficients k) {
  const size_t i = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kValues;
  if (i >= n) return;
  Pack<float> p = LoadPack(param, i, n, 0.0f);
  Pack<float> mp = LoadPack(m, i, n, 0.0f);
  Pack<float> vp = LoadPack(v, i, n, 0.0f);
  const Pack<float> g = LoadPack(grad, i, n, 0.0f);
  Bf16 copy[kValues];
  bool updated[kValues];
  AdamWValues<kValues>(p.values, copy, updated, g.values, mp.values, vp.values, i, n, ranges, count,
                       k);
  // Values outside the ranges are stored back as they were loaded.
  StorePack(param, i, n, p);
  StorePack(m, i, n, mp);
  StorePack(v, i, n, vp);
  if (param_copy == nullptr) return;
  for (int j = 0; j < kValues; ++j) {
    if (updated[j]) param_copy[i + j] = copy[j];
  }
}

}  // namespace

void AdamW(float* param, Bf16* param_copy, const float* grad, float* m, float* v, size_t n,
           const AdamWRange* ranges, int count, const AdamWCoefficients& k, cudaStream_t stream) {
  if (n == 0 || count == 0) return;
  AdamWKernel<<<PackBlocks<float>(n), kElementwiseThreads, 0, stream>>>(param, param_copy, grad, m,
                                                                        v, n, ranges, count, k);
}

}  // namespace dtrain::cuda
