#include "core/backend/cpu/linear.h"

#include <vector>

#include "core/backend/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/core/backend/cpu/test_util.h"

namespace dtrain::cpu {
namespace {

using testing::Difference;
using testing::Dot;
using testing::ExpectFloatMatches;
using testing::ExpectGradientMatches;
using testing::RandomVector;
using testing::RoundToFloat;
using testing::ToFloat;

constexpr int kRows = 5, kIn = 4, kOut = 3;

// A row-parallel layer adds its bias after the reduction: the forward without a bias, then
// AddBias, gives the forward with it (to rounding: the bias joins the sum at another point).
TEST(LinearTest, AddBiasCompletesALinearWithoutBias) {
  const auto inp = RandomVector(kRows * kIn, 1);
  const auto weight = RandomVector(kOut * kIn, 2);
  const auto bias = RandomVector(kOut, 3);
  std::vector<double> with_bias(kRows * kOut), added(kRows * kOut);
  LinearForward(with_bias.data(), inp.data(), weight.data(), bias.data(), kRows, kIn, kOut,
                nullptr);
  LinearForward(added.data(), inp.data(), weight.data(), static_cast<const double*>(nullptr), kRows,
                kIn, kOut, nullptr);
  AddBias(added.data(), bias.data(), kRows, kOut, nullptr);
  for (size_t i = 0; i < added.size(); ++i) EXPECT_DOUBLE_EQ(added[i], with_bias[i]) << i;
}

TEST(LinearTest, BackwardMatchesFiniteDifferences) {
  auto inp = RandomVector(kRows * kIn, 1);
  auto weight = RandomVector(kOut * kIn, 2);
  auto bias = RandomVector(kOut, 3);
  const auto r = RandomVector(kRows * kOut, 4);
  auto loss = [&] {
    std::vector<double> out(kRows * kOut);
    LinearForward(out.data(), inp.data(), weight.data(), bias.data(), kRows, kIn, kOut, nullptr);
    return Dot(out, r);
  };
  // dweight and dbias accumulate: start them at random values and check what was added.
  const auto dweight0 = RandomVector(kOut * kIn, 5);
  const auto dbias0 = RandomVector(kOut, 6);
  std::vector<double> dinp(kRows * kIn), dweight = dweight0, dbias = dbias0;
  LinearBackward(dinp.data(), dweight.data(), dbias.data(), r.data(), inp.data(), weight.data(),
                 kRows, kIn, kOut, nullptr);
  ExpectGradientMatches(inp, loss, dinp, "dinp");
  ExpectGradientMatches(weight, loss, Difference(dweight, dweight0), "dweight");
  ExpectGradientMatches(bias, loss, Difference(dbias, dbias0), "dbias");
}

TEST(LinearTest, FloatBackendMatchesDouble) {
  const auto inp = RoundToFloat(RandomVector(kRows * kIn, 1));
  const auto weight = RoundToFloat(RandomVector(kOut * kIn, 2));
  const auto bias = RoundToFloat(RandomVector(kOut, 3));
  const auto dout = RoundToFloat(RandomVector(kRows * kOut, 4));
  std::vector<double> out(kRows * kOut), dinp(kRows * kIn), dweight(kOut * kIn), dbias(kOut);
  LinearForward(out.data(), inp.data(), weight.data(), bias.data(), kRows, kIn, kOut, nullptr);
  LinearBackward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(),
                 kRows, kIn, kOut, nullptr);

  CpuBackend backend(2);
  const auto inp_f = ToFloat(inp), weight_f = ToFloat(weight), bias_f = ToFloat(bias);
  const auto dout_f = ToFloat(dout);
  std::vector<float> out_f(kRows * kOut), dinp_f(kRows * kIn), dweight_f(kOut * kIn), dbias_f(kOut);
  backend.LinearForward(out_f.data(), inp_f.data(), weight_f.data(), bias_f.data(), kRows, kIn,
                        kOut);
  backend.LinearBackward(dinp_f.data(), dweight_f.data(), dbias_f.data(), dout_f.data(),
                         inp_f.data(), weight_f.data(), kRows, kIn, kOut);
  ExpectFloatMatches(out_f, out, "out");
  ExpectFloatMatches(dinp_f, dinp, "dinp");
  ExpectFloatMatches(dweight_f, dweight, "dweight");
  ExpectFloatMatches(dbias_f, dbias, "dbias");

  // Without bias the output is the bare product; a null dinp is skipped.
  backend.LinearForward(out_f.data(), inp_f.data(), weight_f.data(), nullptr, kRows, kIn, kOut);
  for (int i = 0; i < kRows; ++i) {
    for (int o = 0; o < kOut; ++o) out[i * kOut + o] -= bias[o];
  }
  ExpectFloatMatches(out_f, out, "out without bias");
  backend.LinearBackward(nullptr, dweight_f.data(), nullptr, dout_f.data(), inp_f.data(),
                         weight_f.data(), kRows, kIn, kOut);
  for (double& g : dweight) g *= 2;
  ExpectFloatMatches(dweight_f, dweight, "dweight twice");
}

}  // namespace
}  // namespace dtrain::cpu
