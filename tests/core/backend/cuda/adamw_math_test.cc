#include "core/backend/cuda/adamw_math.h"

#include <vector>

#include "core/backend/cpu/adamw.h"
#include "gtest/gtest.h"
#include "tests/core/backend/cuda/test_util.h"

namespace dtrain::cuda {
namespace {

using testing::ExpectBf16Matches;
using testing::ExpectFloatMatches;
using testing::Load;
using testing::Store;

constexpr size_t kValues = 37;
constexpr double kLr = 3e-2, kBeta1 = 0.9, kBeta2 = 0.95, kEps = 1e-8, kWeightDecay = 0.1;

// Three steps with gradients stored as G: AdamWValue over every index, as the kernel runs it,
// against the CPU backend's AdamW on the same (widened) gradients; the bf16 copy of the
// parameters against the CPU's fp32 parameters.
template <typename G>
void CheckAdamW() {
  std::vector<float> param = testing::RandomFloats(kValues, 1), m(kValues), v(kValues);
  std::vector<float> param_cpu = param, m_cpu = m, v_cpu = v;
  std::vector<Bf16> copy(kValues);
  for (int step = 1; step <= 3; ++step) {
    const std::vector<G> grad = Store<G>(testing::RandomFloats(kValues, 10 + step));
    const AdamWCoefficients k =
        cpu::MakeAdamWCoefficients<float>(kLr, kBeta1, kBeta2, kEps, kWeightDecay, step);
    for (size_t i = 0; i < kValues; ++i) {
      AdamWValue(param.data(), copy.data(), grad.data(), m.data(), v.data(), i, k);
    }
    cpu::AdamW(param_cpu.data(), Load(grad).data(), m_cpu.data(), v_cpu.data(), kValues, kLr,
               kBeta1, kBeta2, kEps, kWeightDecay, step, nullptr);
    ExpectFloatMatches(param, param_cpu, "param");
    ExpectFloatMatches(m, m_cpu, "m");
    ExpectFloatMatches(v, v_cpu, "v");
    ExpectBf16Matches(copy, param_cpu, "bf16 copy");
  }
}

TEST(CudaAdamWTest, Fp32GradientsMatchCpuBackend) { CheckAdamW<float>(); }

TEST(CudaAdamWTest, Bf16GradientsMatchCpuBackendOnRoundedGradients) { CheckAdamW<Bf16>(); }

TEST(CudaAdamWTest, NoCopyWhenNotAsked) {
  float param = 0.5f, m = 0, v = 0;
  const float grad = 1;
  const AdamWCoefficients k =
      cpu::MakeAdamWCoefficients<float>(kLr, kBeta1, kBeta2, kEps, kWeightDecay, 1);
  AdamWValue(&param, nullptr, &grad, &m, &v, 0, k);
  EXPECT_LT(param, 0.5f);
}

}  // namespace
}  // namespace dtrain::cuda
