#include "core/backend/cuda/norm_math.h"

#include <vector>

#include "core/backend/cpu/elementwise.h"
#include "core/backend/cpu/norm.h"
#include "gtest/gtest.h"
#include "tests/core/backend/cuda/test_util.h"

namespace dtrain::cuda {
namespace {

using testing::ExpectFloatMatches;
using testing::ExpectMatches;
using testing::HostWarp;
using testing::Load;
using testing::RunOnHostWarp;
using testing::Store;

// More rows than the parameter gradients have slices (kColumnSlices): slices 0-4 sum two rows.
constexpr int kRows = kColumnSlices + 5;
constexpr float kEps = 1e-5f;

// The inputs of one test, stored as T.
template <typename T>
struct NormInputs {
  NormInputs(int c)
      : inp(Store<T>(testing::RandomFloats(kRows * c, 1))),
        residual(Store<T>(testing::RandomFloats(kRows * c, 2))),
        weight(Store<T>(testing::RandomFloats(c, 3, 0.5, 1.5))),
        bias(Store<T>(testing::RandomFloats(c, 4))),
        dout(Store<T>(testing::RandomFloats(kRows * c, 5))),
        dinp(Store<T>(testing::RandomFloats(kRows * c, 6))),
        dweight(testing::RandomFloats(c, 7)),
        dbias(testing::RandomFloats(c, 8)) {}
  std::vector<T> inp, residual, weight, bias, dout, dinp;
  std::vector<float> dweight, dbias;  // parameter gradients: float32 whatever T
};

// The row x the CPU backend normalises: inp, or residual + inp stored as T (what the fused
// kernel writes to residual_out); `sum` gets residual + inp before that rounding.
template <typename T>
std::vector<float> CpuNormInput(const NormInputs<T>& in, bool fused, std::vector<float>* sum) {
  if (!fused) return Load(in.inp);
  sum->resize(in.inp.size());
  cpu::Add(sum->data(), Load(in.residual).data(), Load(in.inp).data(), sum->size(), nullptr);
  return Load(Store<T>(*sum));
}

// LayerNorm forward and backward over rows of c channels: the kernels' row and column functions
// (rows on an emulated warp) against the CPU backend on the same stored values.
template <typename T>
void CheckLayerNorm(int c, bool fused) {
  SCOPED_TRACE(::testing::Message() << "c " << c << (fused ? " fused" : ""));
  const NormInputs<T> in(c);
  std::vector<T> out(kRows * c), residual_out(kRows * c);
  std::vector<T> dinp = in.dinp;
  std::vector<float> dweight = in.dweight, dbias = in.dbias;
  std::vector<float> mean(kRows), rstd(kRows);
  for (int row = 0; row < kRows; ++row) {
    const size_t at = static_cast<size_t>(row) * c;
    RunOnHostWarp([&](const HostWarp& warp) {
      LayerNormForwardRow(warp, out.data() + at, &mean[row], &rstd[row],
                          fused ? residual_out.data() + at : nullptr,
                          fused ? in.residual.data() + at : nullptr, in.inp.data() + at,
                          in.weight.data(), in.bias.data(), c, kEps);
    });
  }
  const std::vector<T>& x = fused ? residual_out : in.inp;
  for (int row = 0; row < kRows; ++row) {
    const size_t at = static_cast<size_t>(row) * c;
    RunOnHostWarp([&](const HostWarp& warp) {
      LayerNormBackwardRow(warp, dinp.data() + at, in.dout.data() + at, x.data() + at,
                           in.weight.data(), mean[row], rstd[row], c);
    });
  }
  for (int j = 0; j < c; ++j) {
    ColumnGrads slices[kColumnSlices];
    for (int slice = 0; slice < kColumnSlices; ++slice) {
      slices[slice] = LayerNormParamGradSlice(in.dout.data(), x.data(), mean.data(), rstd.data(),
                                              kRows, c, j, slice);
    }
    AddColumnGrads(dweight.data(), dbias.data(), slices, j);
  }

  std::vector<float> sum;
  const std::vector<float> x_cpu = CpuNormInput(in, fused, &sum);
  const std::vector<float> weight = Load(in.weight), dout = Load(in.dout);
  std::vector<float> out_cpu(kRows * c), mean_cpu(kRows), rstd_cpu(kRows);
  cpu::LayerNormForward(out_cpu.data(), mean_cpu.data(), rstd_cpu.data(), x_cpu.data(),
                        weight.data(), Load(in.bias).data(), kRows, c, kEps, nullptr);
  std::vector<float> dinp_cpu = Load(in.dinp), dweight_cpu = in.dweight, dbias_cpu = in.dbias;
  cpu::LayerNormBackward(dinp_cpu.data(), dweight_cpu.data(), dbias_cpu.data(), dout.data(),
                         x_cpu.data(), weight.data(), mean_cpu.data(), rstd_cpu.data(), kRows, c,
                         nullptr);
  if (fused) ExpectMatches(residual_out, sum, "residual_out");
  ExpectMatches(out, out_cpu, "out");
  ExpectFloatMatches(mean, mean_cpu, "mean");
  ExpectFloatMatches(rstd, rstd_cpu, "rstd");
  ExpectMatches(dinp, dinp_cpu, "dinp");
  ExpectMatches(dweight, dweight_cpu, "dweight");
  ExpectMatches(dbias, dbias_cpu, "dbias");
}

template <typename T>
void CheckRmsNorm(int c, bool fused) {
  SCOPED_TRACE(::testing::Message() << "c " << c << (fused ? " fused" : ""));
  const NormInputs<T> in(c);
  std::vector<T> out(kRows * c), residual_out(kRows * c);
  std::vector<T> dinp = in.dinp;
  std::vector<float> dweight = in.dweight;
  std::vector<float> rstd(kRows);
  for (int row = 0; row < kRows; ++row) {
    const size_t at = static_cast<size_t>(row) * c;
    RunOnHostWarp([&](const HostWarp& warp) {
      RmsNormForwardRow(
          warp, out.data() + at, &rstd[row], fused ? residual_out.data() + at : nullptr,
          fused ? in.residual.data() + at : nullptr, in.inp.data() + at, in.weight.data(), c, kEps);
    });
  }
  const std::vector<T>& x = fused ? residual_out : in.inp;
  for (int row = 0; row < kRows; ++row) {
    const size_t at = static_cast<size_t>(row) * c;
    RunOnHostWarp([&](const HostWarp& warp) {
      RmsNormBackwardRow(warp, dinp.data() + at, in.dout.data() + at, x.data() + at,
                         in.weight.data(), rstd[row], c);
    });
  }
  for (int j = 0; j < c; ++j) {
    ColumnGrads slices[kColumnSlices];
    for (int slice = 0; slice < kColumnSlices; ++slice) {
      slices[slice] =
          RmsNormWeightGradSlice(in.dout.data(), x.data(), rstd.data(), kRows, c, j, slice);
    }
    AddColumnGrads(dweight.data(), nullptr, slices, j);
  }

  std::vector<float> sum;
  const std::vector<float> x_cpu = CpuNormInput(in, fused, &sum);
  const std::vector<float> weight = Load(in.weight), dout = Load(in.dout);
  std::vector<float> out_cpu(kRows * c), rstd_cpu(kRows);
  cpu::RmsNormForward(out_cpu.data(), rstd_cpu.data(), x_cpu.data(), weight.data(), kRows, c, kEps,
                      nullptr);
  std::vector<float> dinp_cpu = Load(in.dinp), dweight_cpu = in.dweight;
  cpu::RmsNormBackward(dinp_cpu.data(), dweight_cpu.data(), dout.data(), x_cpu.data(),
                       weight.data(), rstd_cpu.data(), kRows, c, nullptr);
  if (fused) ExpectMatches(residual_out, sum, "residual_out");
  ExpectMatches(out, out_cpu, "out");
  ExpectFloatMatches(rstd, rstd_cpu, "rstd");
  ExpectMatches(dinp, dinp_cpu, "dinp");
  ExpectMatches(dweight, dweight_cpu, "dweight");
}

// 20: lanes 20-31 hold nothing; 37: lanes hold one or two values; 128: four each.
constexpr int kChannelCounts[] = {20, 37, 128};

TEST(CudaNormTest, LayerNormFp32MatchesCpuBackend) {
  for (int c : kChannelCounts) {
    for (bool fused : {false, true}) CheckLayerNorm<float>(c, fused);
  }
}

TEST(CudaNormTest, LayerNormBf16MatchesCpuBackendOnRoundedInputs) {
  for (int c : kChannelCounts) {
    for (bool fused : {false, true}) CheckLayerNorm<Bf16>(c, fused);
  }
}

TEST(CudaNormTest, RmsNormFp32MatchesCpuBackend) {
  for (int c : kChannelCounts) {
    for (bool fused : {false, true}) CheckRmsNorm<float>(c, fused);
  }
}

TEST(CudaNormTest, RmsNormBf16MatchesCpuBackendOnRoundedInputs) {
  for (int c : kChannelCounts) {
    for (bool fused : {false, true}) CheckRmsNorm<Bf16>(c, fused);
  }
}

}  // namespace
}  // namespace dtrain::cuda
