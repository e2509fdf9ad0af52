#include "core/backend/cpu/activation.h"

#include <cmath>
#include <vector>

#include "core/backend/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/core/backend/cpu/test_util.h"

namespace dtrain::cpu {
namespace {

using testing::Dot;
using testing::ExpectFloatMatches;
using testing::ExpectGradientMatches;
using testing::RandomVector;
using testing::RoundToFloat;
using testing::ToFloat;

TEST(GeluTest, ForwardMatchesFormula) {
  const std::vector<double> inp = {-3.0, -0.5, 0.0, 0.7, 2.5};
  std::vector<double> out(inp.size());
  GeluForward(out.data(), inp.data(), inp.size(), nullptr);
  for (size_t i = 0; i < inp.size(); ++i) {
    const double x = inp[i];
    const double expected =
        0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    EXPECT_NEAR(out[i], expected, 1e-15);
  }
}

TEST(GeluTest, BackwardMatchesFiniteDifferences) {
  auto inp = RandomVector(23, 1, -4, 4);
  const auto r = RandomVector(inp.size(), 2);
  auto loss = [&] {
    std::vector<double> out(inp.size());
    GeluForward(out.data(), inp.data(), inp.size(), nullptr);
    return Dot(out, r);
  };
  std::vector<double> dinp(inp.size());
  GeluBackward(dinp.data(), inp.data(), r.data(), inp.size(), nullptr);
  ExpectGradientMatches(inp, loss, dinp, "dinp");
}

TEST(SwiGluTest, BackwardMatchesFiniteDifferences) {
  const int n = 3, f = 5;
  auto gate_up = RandomVector(n * 2 * f, 1, -3, 3);
  const auto r = RandomVector(n * f, 2);
  auto loss = [&] {
    std::vector<double> out(n * f);
    SwiGluForward(out.data(), gate_up.data(), n, f, nullptr);
    return Dot(out, r);
  };
  std::vector<double> dgate_up(gate_up.size());
  SwiGluBackward(dgate_up.data(), gate_up.data(), r.data(), n, f, nullptr);
  ExpectGradientMatches(gate_up, loss, dgate_up, "dgate_up");
}

TEST(ActivationTest, FloatBackendMatchesDouble) {
  const int n = 61, f = 300;  // enough values for the pool to split them
  const auto inp = RoundToFloat(RandomVector(n * 2 * f, 1, -5, 5));
  const auto dout = RoundToFloat(RandomVector(n * 2 * f, 2));
  std::vector<double> gelu(inp.size()), dgelu(inp.size()), swiglu(n * f), dswiglu(inp.size());
  GeluForward(gelu.data(), inp.data(), inp.size(), nullptr);
  GeluBackward(dgelu.data(), inp.data(), dout.data(), inp.size(), nullptr);
  SwiGluForward(swiglu.data(), inp.data(), n, f, nullptr);
  SwiGluBackward(dswiglu.data(), inp.data(), dout.data(), n, f, nullptr);

  CpuBackend backend(2);
  const auto inp_f = ToFloat(inp), dout_f = ToFloat(dout);
  std::vector<float> gelu_f(inp.size()), dgelu_f(inp.size()), swiglu_f(n * f),
      dswiglu_f(inp.size());
  backend.GeluForward(gelu_f.data(), inp_f.data(), inp.size());
  backend.GeluBackward(dgelu_f.data(), inp_f.data(), dout_f.data(), inp.size());
  backend.SwiGluForward(swiglu_f.data(), inp_f.data(), n, f);
  backend.SwiGluBackward(dswiglu_f.data(), inp_f.data(), dout_f.data(), n, f);
  ExpectFloatMatches(gelu_f, gelu, "gelu");
  ExpectFloatMatches(dgelu_f, dgelu, "dgelu");
  ExpectFloatMatches(swiglu_f, swiglu, "swiglu");
  ExpectFloatMatches(dswiglu_f, dswiglu, "dswiglu");
}

}  // namespace
}  // namespace dtrain::cpu
