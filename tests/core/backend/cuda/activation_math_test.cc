#include "core/backend/cuda/activation_math.h"

#include <vector>

#include "core/backend/cpu/activation.h"
#include "gtest/gtest.h"
#include "tests/core/backend/cuda/test_util.h"

namespace dtrain::cuda {
namespace {

using testing::Bf16Rounded;
using testing::ExpectBf16Matches;
using testing::ExpectFloatMatches;
using testing::RandomFloats;

constexpr int kRows = 7, kFeatures = 45;  // 45: rows are not a whole number of 16-byte packs

// What the kernels of activation.cu compute for storage T, over the CPU kernels' index spaces:
// value i for GELU, (row, j) of the (N, F) output for SwiGLU. Inputs widen with ToFloat and
// outputs round with FromFloat<T>, as in the kernels.
template <typename T>
struct Outputs {
  std::vector<T> gelu, dgelu, swiglu, dswiglu;
};

template <typename T>
Outputs<T> RunKernelMath(const std::vector<T>& inp, const std::vector<T>& dout, int n, int f) {
  Outputs<T> y{std::vector<T>(inp.size()), std::vector<T>(inp.size()),
               std::vector<T>(static_cast<size_t>(n) * f), std::vector<T>(inp.size())};
  for (size_t i = 0; i < inp.size(); ++i) {
    y.gelu[i] = FromFloat<T>(GeluForward(ToFloat(inp[i])));
    y.dgelu[i] = FromFloat<T>(GeluBackward(ToFloat(inp[i]), ToFloat(dout[i])));
  }
  for (int row = 0; row < n; ++row) {
    for (int j = 0; j < f; ++j) {
      const size_t gate = static_cast<size_t>(row) * 2 * f + j, up = gate + f;
      const size_t out = static_cast<size_t>(row) * f + j;
      y.swiglu[out] = FromFloat<T>(SwiGluForward(ToFloat(inp[gate]), ToFloat(inp[up])));
      float dgate, dup;
      SwiGluBackward(ToFloat(inp[gate]), ToFloat(inp[up]), ToFloat(dout[out]), &dgate, &dup);
      y.dswiglu[gate] = FromFloat<T>(dgate);
      y.dswiglu[up] = FromFloat<T>(dup);
    }
  }
  return y;
}

// The CPU backend's float kernels on `inp` (N, 2F) and `dout` (N, 2F; SwiGLU reads (N, F)).
Outputs<float> RunCpu(const std::vector<float>& inp, const std::vector<float>& dout, int n, int f) {
  Outputs<float> y{std::vector<float>(inp.size()), std::vector<float>(inp.size()),
                   std::vector<float>(static_cast<size_t>(n) * f), std::vector<float>(inp.size())};
  cpu::GeluForward(y.gelu.data(), inp.data(), inp.size(), nullptr);
  cpu::GeluBackward(y.dgelu.data(), inp.data(), dout.data(), inp.size(), nullptr);
  cpu::SwiGluForward(y.swiglu.data(), inp.data(), n, f, nullptr);
  cpu::SwiGluBackward(y.dswiglu.data(), inp.data(), dout.data(), n, f, nullptr);
  return y;
}

TEST(CudaActivationTest, Fp32MatchesCpuBackend) {
  const auto inp = RandomFloats(kRows * 2 * kFeatures, 1, -6, 6);
  const auto dout = RandomFloats(kRows * 2 * kFeatures, 2);
  const Outputs<float> actual = RunKernelMath(inp, dout, kRows, kFeatures);
  const Outputs<float> expected = RunCpu(inp, dout, kRows, kFeatures);
  ExpectFloatMatches(actual.gelu, expected.gelu, "gelu");
  ExpectFloatMatches(actual.dgelu, expected.dgelu, "dgelu");
  ExpectFloatMatches(actual.swiglu, expected.swiglu, "swiglu");
  ExpectFloatMatches(actual.dswiglu, expected.dswiglu, "dswiglu");
}

// bf16 storage: the CPU backend on the bf16-rounded inputs, then the output's rounding.
TEST(CudaActivationTest, Bf16MatchesCpuBackendOnRoundedInputs) {
  const auto inp = Bf16Rounded(RandomFloats(kRows * 2 * kFeatures, 3, -6, 6));
  const auto dout = Bf16Rounded(RandomFloats(kRows * 2 * kFeatures, 4));
  const Outputs<Bf16> actual =
      RunKernelMath(testing::ToBf16(inp), testing::ToBf16(dout), kRows, kFeatures);
  const Outputs<float> expected = RunCpu(inp, dout, kRows, kFeatures);
  ExpectBf16Matches(actual.gelu, expected.gelu, "gelu");
  ExpectBf16Matches(actual.dgelu, expected.dgelu, "dgelu");
  ExpectBf16Matches(actual.swiglu, expected.swiglu, "swiglu");
  ExpectBf16Matches(actual.dswiglu, expected.dswiglu, "dswiglu");
}

}  // namespace
}  // namespace dtrain::cuda
