#include "core/backend/matmul_precision.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/backend/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/core/backend/cpu/test_util.h"

namespace dtrain {
namespace {

constexpr MatmulPrecision kLevels[] = {MatmulPrecision::kHighest, MatmulPrecision::kHigh,
                                       MatmulPrecision::kMedium};

TEST(MatmulPrecisionTest, NamesRoundTripAndAnUnknownOneIsNamed) {
  for (const MatmulPrecision precision : kLevels) {
    EXPECT_EQ(*ParseMatmulPrecision(MatmulPrecisionName(precision)), precision);
  }
  const absl::StatusOr<MatmulPrecision> bad = ParseMatmulPrecision("bf16");
  EXPECT_EQ(bad.status().message(), "run.matmul_precision 'bf16' is none of highest, high, medium");
}

// x rounded to 10 mantissa bits, to nearest, ties to even, in double arithmetic: x divided by the
// spacing of 10-bit values at its exponent (subnormals: at the least normal exponent), rounded
// by nearbyint (ties to even), multiplied back; past the largest float it overflows to infinity.
float Tf32Reference(float x) {
  const double spacing = std::ldexp(1.0, std::max(std::ilogb(x), -126) - 10);
  return static_cast<float>(std::nearbyint(x / spacing) * spacing);
}

// high keeps 10 mantissa bits, to nearest, ties to even, on every kind of finite float (an
// independent reference in double); medium is bf16.h's rounding (tested against PyTorch there).
TEST(MatmulPrecisionTest, RoundsAsTf32AndBfloat16) {
  std::mt19937 random(3);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 100000; ++i) {
    const float x = std::bit_cast<float>(bits(random));
    if (!std::isfinite(x) || x == 0) continue;
    ASSERT_EQ(RoundForMatmul(x, MatmulPrecision::kHigh), Tf32Reference(x)) << x;
    ASSERT_EQ(RoundForMatmul(x, MatmulPrecision::kHighest), x);
  }
  EXPECT_EQ(RoundForMatmul(1 + std::ldexp(1.0f, -8), MatmulPrecision::kMedium), 1.0f);  // a tie
  EXPECT_EQ(RoundForMatmul(1 + 3 * std::ldexp(1.0f, -8), MatmulPrecision::kMedium),
            1 + std::ldexp(1.0f, -6));  // a tie, to the even 1 + 2 ulp
  const auto high = [](float x) { return RoundForMatmul(x, MatmulPrecision::kHigh); };
  const float ulp = std::ldexp(1.0f, -10);                        // of [1, 2) with 10 mantissa bits
  EXPECT_EQ(high(1 + ulp / 2), 1.0f);                             // a tie, to the even 1
  EXPECT_EQ(high(1 + 3 * ulp / 2), 1 + 2 * ulp);                  // a tie, to the even 1 + 2 ulp
  EXPECT_EQ(high(1 + ulp / 2 + std::ldexp(1.0f, -20)), 1 + ulp);  // above half: up
  EXPECT_EQ(high(-(1 + ulp / 2 - std::ldexp(1.0f, -20))), -1.0f);  // below half: down
  EXPECT_EQ(high(std::numeric_limits<float>::infinity()), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(high(std::numeric_limits<float>::quiet_NaN())));
}

std::vector<float> Rounded(const std::vector<float>& values, MatmulPrecision precision) {
  std::vector<float> rounded(values.size());
  for (size_t i = 0; i < values.size(); ++i) rounded[i] = RoundForMatmul(values[i], precision);
  return rounded;
}

// Below highest the CPU backend's linear layers and classifier multiply rounded inputs: what
// the highest backend computes from inputs rounded beforehand, bit for bit (the same sgemm
// calls), while the bias sums and the loss's softmax stay float32.
TEST(MatmulPrecisionTest, CpuBackendMultipliesRoundedInputs) {
  constexpr int n = 12, in = 40, out = 24, v = 30;
  const auto random = [](size_t count, unsigned seed) {
    return cpu::testing::ToFloat(cpu::testing::RandomVector(count, seed));
  };
  const std::vector<float> x = random(n * in, 1), w = random(out * in, 2), bias = random(out, 3),
                           dy = random(n * out, 4), head = random(v * in, 5);
  std::vector<int32_t> targets(n);
  for (int i = 0; i < n; ++i) targets[i] = (i * 7) % v;
  for (const MatmulPrecision precision : {MatmulPrecision::kHigh, MatmulPrecision::kMedium}) {
    SCOPED_TRACE(MatmulPrecisionName(precision));
    CpuBackend rounding(2, precision), exact(2);
    const std::vector<float> xr = Rounded(x, precision), wr = Rounded(w, precision),
                             dyr = Rounded(dy, precision), headr = Rounded(head, precision);

    std::vector<float> y(n * out), y_expected(n * out);
    rounding.LinearForward(y.data(), x.data(), w.data(), bias.data(), n, in, out);
    exact.LinearForward(y_expected.data(), xr.data(), wr.data(), bias.data(), n, in, out);
    EXPECT_EQ(y, y_expected);
    std::vector<float> y_plain(n * out);
    exact.LinearForward(y_plain.data(), x.data(), w.data(), bias.data(), n, in, out);
    EXPECT_NE(y, y_plain) << "the rounding changed nothing";

    std::vector<float> dx(n * in), dw(out * in), db(out), dx_expected(n * in),
        dw_expected(out * in), db_expected(out);
    rounding.LinearBackward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), n, in,
                            out);
    exact.LinearBackward(dx_expected.data(), dw_expected.data(), nullptr, dyr.data(), xr.data(),
                         wr.data(), n, in, out);
    exact.LinearBackward(nullptr, std::vector<float>(out * in).data(), db_expected.data(),
                         dy.data(), x.data(), w.data(), n, in, out);
    EXPECT_EQ(dx, dx_expected);
    EXPECT_EQ(dw, dw_expected);
    EXPECT_EQ(db, db_expected) << "the bias gradient sums dout unrounded";

    double loss = 0, loss_expected = 0;
    std::vector<float> dxc(n * in), dhead(v * in), dxc_expected(n * in), dhead_expected(v * in);
    rounding.ClassifierForwardBackward(dxc.data(), dhead.data(), x.data(), head.data(),
                                       targets.data(), n, in, v, 0.5f, &loss);
    exact.ClassifierForwardBackward(dxc_expected.data(), dhead_expected.data(), xr.data(),
                                    headr.data(), targets.data(), n, in, v, 0.5f, &loss_expected);
    EXPECT_EQ(loss, loss_expected);
    // The backward GEMMs also take the logits' gradient rounded: within its rounding (2^-8
    // relative for bf16, 2^-11 for TF32) of a sum of v products of magnitude <= |head|, |x| <= 1.
    const double bound = v * std::ldexp(1.0, precision == MatmulPrecision::kMedium ? -8 : -11);
    for (size_t i = 0; i < dxc.size(); ++i) ASSERT_NEAR(dxc[i], dxc_expected[i], bound) << i;
    for (size_t i = 0; i < dhead.size(); ++i) ASSERT_NEAR(dhead[i], dhead_expected[i], bound) << i;
  }
}

}  // namespace
}  // namespace dtrain
