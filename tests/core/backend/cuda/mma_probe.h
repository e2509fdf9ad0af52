// One warp's tour of mma_math.h, written once for the host's emulated warp (mma_math_test.cc)
// and the GPU's (mma_probe_kernel.cu, run by kernels_device_test.cc), so that the GPU test
// compares the hardware with the emulation the host tests trust: the fragment layouts are the
// one thing only a GPU can check.
#pragma once

#include <vector>

#if defined(DTRAIN_HAVE_CUDA_KERNELS)
#include <cuda_runtime.h>
#endif

#include "core/backend/cuda/bf16.h"
#include "core/backend/cuda/host_device.h"
#include "core/backend/cuda/mma_math.h"
#include "tests/core/backend/cuda/test_util.h"

namespace dtrain::cuda::testing {

// Rows of kProbeStride values (padded, as the kernels' shared tiles).
inline constexpr int kProbeStride = 24;
// Four 16 x 8 products, then each lane's quad max and quad sum.
inline constexpr int kProbeProducts = 4;
inline constexpr int kProbeOutputs = kProbeProducts * 16 * 8 + 2 * kWarpSize;

// a: A (16 x 16) row-major; b: B (16 x 16) row-major; b_transposed: B^T row-major; all 16-byte
// aligned, as shared memory. Writes, as row-major 16 x 8 tiles: A B[:, 0:8] and A B[:, 8:16]
// (LoadBPair's ldmatrix), A B[:, 0:8] again from B^T (LoadBTransposed), and (A B rounded to bf16,
// fed back through ToA) B[:, 0:8]; then lane l's QuadMax and QuadSum of l.
template <typename Warp>
DTRAIN_HD void MmaProbe(const Warp& warp, const Bf16* a, const Bf16* b, const Bf16* b_transposed,
                        float* out) {
  const int lane = warp.lane();
  const MmaA fragment = LoadA(lane, a, kProbeStride);
  MmaC products[kProbeProducts];
  MmaB left, right;
  LoadBPair(warp, b, kProbeStride, left, right);
  warp.Mma(products[0], fragment, left);
  warp.Mma(products[1], fragment, right);
  warp.Mma(products[2], fragment, LoadBTransposed(lane, b_transposed, kProbeStride));
  warp.Mma(products[3], ToA(products[0], products[1]), left);
  for (int p = 0; p < kProbeProducts; ++p) {
    for (int e = 0; e < 4; ++e) {
      const MatrixIndex at = MmaCIndex(lane, e);
      out[p * 128 + at.row * 8 + at.col] = products[p].value[e];
    }
  }
  out[kProbeProducts * 128 + lane] = QuadMax(warp, static_cast<float>(lane));
  out[kProbeProducts * 128 + kWarpSize + lane] = QuadSum(warp, static_cast<float>(lane));
}

// The probe's random inputs, and its products computed in double (the fourth from the first two
// rounded to bf16).
struct ProbeCase {
  std::vector<Bf16> a, b, b_transposed;
  std::vector<double> products;  // kProbeProducts tiles of 16 x 8
};

inline ProbeCase MakeProbeCase() {
  ProbeCase probe{ToBf16(RandomFloats(16 * kProbeStride, 1)),
                  ToBf16(RandomFloats(16 * kProbeStride, 2)), std::vector<Bf16>(16 * kProbeStride),
                  std::vector<double>(kProbeProducts * 128)};
  double ab[16][16] = {};
  for (int k = 0; k < 16; ++k) {
    for (int n = 0; n < 16; ++n)
      probe.b_transposed[n * kProbeStride + k] = probe.b[k * kProbeStride + n];
  }
  for (int m = 0; m < 16; ++m) {
    for (int n = 0; n < 16; ++n) {
      for (int k = 0; k < 16; ++k) {
        ab[m][n] +=
            double{ToFloat(probe.a[m * kProbeStride + k])} * ToFloat(probe.b[k * kProbeStride + n]);
      }
    }
  }
  for (int m = 0; m < 16; ++m) {
    for (int n = 0; n < 8; ++n) {
      probe.products[m * 8 + n] = probe.products[256 + m * 8 + n] = ab[m][n];
      probe.products[128 + m * 8 + n] = ab[m][n + 8];
      for (int k = 0; k < 16; ++k) {
        const float rounded = ToFloat(FromFloat<Bf16>(static_cast<float>(ab[m][k])));
        probe.products[384 + m * 8 + n] += double{rounded} * ToFloat(probe.b[k * kProbeStride + n]);
      }
    }
  }
  return probe;
}

#if defined(DTRAIN_HAVE_CUDA_KERNELS)
// MmaProbe's outputs on one warp of the current GPU (mma_probe_kernel.cu).
cudaError_t MmaProbeOnDevice(const ProbeCase& probe, std::vector<float>* out);
#endif

}  // namespace dtrain::cuda::testing
