#include "core/backend/cpu/norm.h"

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

constexpr int kRows = 4, kChannels = 7;
constexpr double kEps = 1e-5;

TEST(LayerNormTest, BackwardMatchesFiniteDifferences) {
  auto inp = RandomVector(kRows * kChannels, 1);
  auto weight = RandomVector(kChannels, 2, 0.5, 1.5);
  auto bias = RandomVector(kChannels, 3);
  const auto r = RandomVector(kRows * kChannels, 4);
  std::vector<double> out(kRows * kChannels), mean(kRows), rstd(kRows);
  auto loss = [&] {
    LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(),
                     kRows, kChannels, kEps, nullptr);
    return Dot(out, r);
  };
  loss();
  // All three gradients accumulate (dinp into the residual stream).
  const auto dinp0 = RandomVector(kRows * kChannels, 5);
  const auto dweight0 = RandomVector(kChannels, 6);
  const auto dbias0 = RandomVector(kChannels, 7);
  auto dinp = dinp0, dweight = dweight0, dbias = dbias0;
  LayerNormBackward(dinp.data(), dweight.data(), dbias.data(), r.data(), inp.data(), weight.data(),
                    mean.data(), rstd.data(), kRows, kChannels, nullptr);
  ExpectGradientMatches(inp, loss, Difference(dinp, dinp0), "dinp");
  ExpectGradientMatches(weight, loss, Difference(dweight, dweight0), "dweight");
  ExpectGradientMatches(bias, loss, Difference(dbias, dbias0), "dbias");
}

TEST(RmsNormTest, BackwardMatchesFiniteDifferences) {
  auto inp = RandomVector(kRows * kChannels, 1);
  auto weight = RandomVector(kChannels, 2, 0.5, 1.5);
  const auto r = RandomVector(kRows * kChannels, 4);
  std::vector<double> out(kRows * kChannels), rstd(kRows);
  auto loss = [&] {
    RmsNormForward(out.data(), rstd.data(), inp.data(), weight.data(), kRows, kChannels, kEps,
                   nullptr);
    return Dot(out, r);
  };
  loss();
  const auto dinp0 = RandomVector(kRows * kChannels, 5);
  const auto dweight0 = RandomVector(kChannels, 6);
  auto dinp = dinp0, dweight = dweight0;
  RmsNormBackward(dinp.data(), dweight.data(), r.data(), inp.data(), weight.data(), rstd.data(),
                  kRows, kChannels, nullptr);
  ExpectGradientMatches(inp, loss, Difference(dinp, dinp0), "dinp");
  ExpectGradientMatches(weight, loss, Difference(dweight, dweight0), "dweight");
}

// Many rows and channels so both passes split across the pool.
constexpr int kBigRows = 67, kBigChannels = 200;

TEST(LayerNormTest, FloatBackendMatchesDouble) {
  const auto inp = RoundToFloat(RandomVector(kBigRows * kBigChannels, 1));
  const auto weight = RoundToFloat(RandomVector(kBigChannels, 2));
  const auto bias = RoundToFloat(RandomVector(kBigChannels, 3));
  const auto dout = RoundToFloat(RandomVector(kBigRows * kBigChannels, 4));
  std::vector<double> out(inp.size()), mean(kBigRows), rstd(kBigRows), dinp(inp.size()),
      dweight(kBigChannels), dbias(kBigChannels);
  LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(),
                   kBigRows, kBigChannels, kEps, nullptr);
  LayerNormBackward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                    weight.data(), mean.data(), rstd.data(), kBigRows, kBigChannels, nullptr);

  CpuBackend backend(2);
  const auto inp_f = ToFloat(inp), weight_f = ToFloat(weight), bias_f = ToFloat(bias),
             dout_f = ToFloat(dout);
  std::vector<float> out_f(inp.size()), mean_f(kBigRows), rstd_f(kBigRows), dinp_f(inp.size()),
      dweight_f(kBigChannels), dbias_f(kBigChannels);
  backend.LayerNormForward(out_f.data(), mean_f.data(), rstd_f.data(), inp_f.data(),
                           weight_f.data(), bias_f.data(), kBigRows, kBigChannels, kEps);
  backend.LayerNormBackward(dinp_f.data(), dweight_f.data(), dbias_f.data(), dout_f.data(),
                            inp_f.data(), weight_f.data(), mean_f.data(), rstd_f.data(), kBigRows,
                            kBigChannels);
  ExpectFloatMatches(out_f, out, "out");
  ExpectFloatMatches(mean_f, mean, "mean");
  ExpectFloatMatches(rstd_f, rstd, "rstd");
  ExpectFloatMatches(dinp_f, dinp, "dinp");
  ExpectFloatMatches(dweight_f, dweight, "dweight");
  ExpectFloatMatches(dbias_f, dbias, "dbias");
}

TEST(RmsNormTest, FloatBackendMatchesDouble) {
  const auto inp = RoundToFloat(RandomVector(kBigRows * kBigChannels, 1));
  const auto weight = RoundToFloat(RandomVector(kBigChannels, 2));
  const auto dout = RoundToFloat(RandomVector(kBigRows * kBigChannels, 4));
  std::vector<double> out(inp.size()), rstd(kBigRows), dinp(inp.size()), dweight(kBigChannels);
  RmsNormForward(out.data(), rstd.data(), inp.data(), weight.data(), kBigRows, kBigChannels, kEps,
                 nullptr);
  RmsNormBackward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(), rstd.data(),
                  kBigRows, kBigChannels, nullptr);

  CpuBackend backend(2);
  const auto inp_f = ToFloat(inp), weight_f = ToFloat(weight), dout_f = ToFloat(dout);
  std::vector<float> out_f(inp.size()), rstd_f(kBigRows), dinp_f(inp.size()),
      dweight_f(kBigChannels);
  backend.RmsNormForward(out_f.data(), rstd_f.data(), inp_f.data(), weight_f.data(), kBigRows,
                         kBigChannels, kEps);
  backend.RmsNormBackward(dinp_f.data(), dweight_f.data(), dout_f.data(), inp_f.data(),
                          weight_f.data(), rstd_f.data(), kBigRows, kBigChannels);
  ExpectFloatMatches(out_f, out, "out");
  ExpectFloatMatches(rstd_f, rstd, "rstd");
  ExpectFloatMatches(dinp_f, dinp, "dinp");
  ExpectFloatMatches(dweight_f, dweight, "dweight");
}

}  // namespace
}  // namespace dtrain::cpu
