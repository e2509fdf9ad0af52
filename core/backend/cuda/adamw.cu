// AdamW: one thread per 16-byte pack of the fp32 master, m and v (4 values), arithmetic in
// adamw_math.h.
#include "core/backend/cuda/adamw_math.h"
#include "core/backend/cuda/kernels.h"
#include "core/backend/cuda/pack.cuh"

namespace dtrain::cuda {
namespace {

constexpr int kValues = kPackSize<float>;

template <typename G>
__global__ void AdamWKernel(float* param, Bf16* param_copy, const G* grad, float* m, float* v,
                            size_t n, AdamWCoefficients k) {
  const size_t i = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kValues;
  if (i >= n) return;
  Pack<float> p = LoadPack(param, i, n, 0.0f);
  Pack<float> mp = LoadPack(m, i, n, 0.0f);
  Pack<float> vp = LoadPack(v, i, n, 0.0f);
  // Values past n stay zero: a zero gradient and moments give a finite step of 0 / eps.
  G g[kValues] = {};
  for (int j = 0; j < kValues && i + j < n; ++j) g[j] = grad[i + j];
  Bf16 copy[kValues];
  for (int j = 0; j < kValues; ++j) AdamWValue(p.values, copy, g, mp.values, vp.values, j, k);
  StorePack(param, i, n, p);
  StorePack(m, i, n, mp);
  StorePack(v, i, n, vp);
  if (param_copy == nullptr) return;
  for (int j = 0; j < kValues && i + j < n; ++j) param_copy[i + j] = copy[j];
}

}  // namespace

template <typename G>
void AdamW(float* param, Bf16* param_copy, const G* grad, float* m, float* v, size_t n,
           const AdamWCoefficients& k, cudaStream_t stream) {
  if (n == 0) return;
  AdamWKernel<<<PackBlocks<float>(n), kElementwiseThreads, 0, stream>>>(param, param_copy, grad, m,
                                                                        v, n, k);
}

template void AdamW<float>(float*, Bf16*, const float*, float*, float*, size_t,
                           const AdamWCoefficients&, cudaStream_t);
template void AdamW<Bf16>(float*, Bf16*, const Bf16*, float*, float*, size_t,
                          const AdamWCoefficients&, cudaStream_t);

}  // namespace dtrain::cuda
