#include "core/backend/cuda/norm_math.h"

#include <cmath>
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

// More rows than the parameter gradients have slices (ColumnSlices: 32 here): slices 0-4 sum two
// rows.
constexpr int kRows = kSlicesPerBlock + 5;
constexpr float kEps = 1e-5f;

// The column kernels on the host: every slice's sums, slice_sum(j, slice, slices), then each
// column's added in slice order into dweight and dbias (may be null).
template <typename SliceSum>
void ColumnGradsOnHost(float* dweight, float* dbias, int n, int c, const SliceSum& slice_sum) {
  const int slices = ColumnSlices(n);
  std::vector<ColumnGrads> sums(static_cast<size_t>(slices) * c);
  for (int slice = 0; slice < slices; ++slice) {
    for (int j = 0; j < c; ++j)
      sums[static_cast<size_t>(slice) * c + j] = slice_sum(j, slice, slices);
  }
  for (int j = 0; j < c; ++j) AddColumnGrads(dweight, dbias, sums.data(), slices, c, j);
}

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
  ColumnGradsOnHost(dweight.data(), dbias.data(), kRows, c, [&](int j, int slice, int slices) {
    return LayerNormParamGradSlice(in.dout.data(), x.data(), mean.data(), rstd.data(), kRows, c, j,
                                   slice, slices);
  });

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
  ColumnGradsOnHost(dweight.data(), nullptr, kRows, c, [&](int j, int slice, int slices) {
    return RmsNormWeightGradSlice(in.dout.data(), x.data(), rstd.data(), kRows, c, j, slice,
                                  slices);
  });

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

// In 16-byte packs (4 floats, 8 bf16) a lane: 20, some lanes hold nothing and a pack is part of
// one; 37, rows after the first start off the 16-byte boundaries, inside their first pack; 128,
// one or two packs a lane; 768 (GPT-2 124M) and 770, three to six packs a lane, 770's rows
// misaligned too.
constexpr int kChannelCounts[] = {20, 37, 128, 768, 770};

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

// A column's slices: about one per kRowsPerSlice rows, whole blocks of kSlicesPerBlock, bounded.
TEST(CudaNormTest, ColumnSlicesGrowWithTheRows) {
  EXPECT_EQ(ColumnSlices(1), kSlicesPerBlock);
  EXPECT_EQ(ColumnSlices(kRows), kSlicesPerBlock);
  EXPECT_EQ(ColumnSlices(16 * 1024), 256);  // GPT-2 at B 16, T 1024: 8 blocks a column
  EXPECT_EQ(ColumnSlices(3 * kSlicesPerBlock * kRowsPerSlice + 9), 3 * kSlicesPerBlock);
  EXPECT_EQ(ColumnSlices(1 << 30), kMaxColumnSlices);
}

// The parameter gradients over rows enough for three blocks of slices a column, against sums in
// double of the same float32 terms. Float32 sums of a slice's rows, then of the slices, are each
// within (terms - 1) * 2^-24 of their terms' absolute sum, and each term is within 3 roundings:
// the bound is (kRowsPerSlice + slices + 3) * 2^-24 * sum |term| per column (a slice missed or
// counted twice moves a sum by far more).
TEST(CudaNormTest, ParameterGradientsOverSeveralBlocksOfSlicesMatchDoubleSums) {
  constexpr int n = 3 * kSlicesPerBlock * kRowsPerSlice + 9, c = 40;
  const int slices = ColumnSlices(n);
  ASSERT_EQ(slices, 3 * kSlicesPerBlock);
  const std::vector<float> x = testing::RandomFloats(n * c, 1),
                           dout = testing::RandomFloats(n * c, 2),
                           mean = testing::RandomFloats(n, 3),
                           rstd = testing::RandomFloats(n, 4, 0.5, 2);
  std::vector<float> dweight(c), dbias(c), rms_dweight(c);
  ColumnGradsOnHost(dweight.data(), dbias.data(), n, c, [&](int j, int slice, int count) {
    return LayerNormParamGradSlice(dout.data(), x.data(), mean.data(), rstd.data(), n, c, j, slice,
                                   count);
  });
  ColumnGradsOnHost(rms_dweight.data(), nullptr, n, c, [&](int j, int slice, int count) {
    return RmsNormWeightGradSlice(dout.data(), x.data(), rstd.data(), n, c, j, slice, count);
  });
  const double unit = (kRowsPerSlice + slices + 3) * 0x1p-24;
  for (int j = 0; j < c; ++j) {
    double w = 0, w_abs = 0, b = 0, b_abs = 0, r = 0, r_abs = 0;
    for (int i = 0; i < n; ++i) {
      const size_t at = static_cast<size_t>(i) * c + j;
      const double dy = dout[at];
      const double layer = (static_cast<double>(x[at]) - mean[i]) * rstd[i] * dy;
      const double rms = static_cast<double>(x[at]) * rstd[i] * dy;
      w += layer;
      w_abs += std::abs(layer);
      b += dy;
      b_abs += std::abs(dy);
      r += rms;
      r_abs += std::abs(rms);
    }
    EXPECT_NEAR(dweight[j], w, unit * w_abs) << "layernorm dweight " << j;
    EXPECT_NEAR(dbias[j], b, unit * b_abs) << "layernorm dbias " << j;
    EXPECT_NEAR(rms_dweight[j], r, unit * r_abs) << "rmsnorm dweight " << j;
  }
}

}  // namespace
}  // namespace dtrain::cuda
