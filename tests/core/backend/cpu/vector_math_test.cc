#include "core/backend/cpu/vector_math.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "tests/core/backend/cpu/test_util.h"

namespace dtrain::cpu {
namespace {

TEST(VectorMathTest, FloatExpIsWithinAFewUlpOverTheSoftmaxRange) {
  std::vector<float> x;
  for (double a = -87.0; a <= 88.0; a += 0.001) x.push_back(static_cast<float>(a));
  std::vector<float> y = x;
  ExpShifted(y.data(), y.size(), 0.0f);
  for (size_t i = 0; i < x.size(); ++i) {
    const double expected = std::exp(static_cast<double>(x[i]));
    ASSERT_NEAR(y[i], expected, 4e-7 * expected) << "exp(" << x[i] << ")";
  }
  // Far below the range the result is negligible, never garbage.
  std::vector<float> tiny = {-1000.0f, -100.0f};
  ExpShifted(tiny.data(), tiny.size(), 0.0f);
  for (float t : tiny) EXPECT_LT(t, 1e-37f);
  // A diverged run's NaN logits stay NaN.
  EXPECT_TRUE(std::isnan(FastExp(std::nanf(""))));
  std::vector<float> shifted = {3.0f};
  ExpShifted(shifted.data(), 1, 1.0f);
  EXPECT_NEAR(shifted[0], std::exp(2.0), 4e-7 * std::exp(2.0));
}

TEST(VectorMathTest, FloatTanhIsWithinTwoMillionthsAbsolute) {
  for (double a = -20.0; a <= 20.0; a += 0.0005) {
    const float x = static_cast<float>(a);
    ASSERT_NEAR(Tanh(x), std::tanh(static_cast<double>(x)), 2e-7) << "tanh(" << x << ")";
  }
  EXPECT_EQ(Tanh(1000.0f), 1.0f);
  EXPECT_EQ(Tanh(-1000.0f), -1.0f);
}

TEST(VectorMathTest, MaxAndSumForLengthsAroundTheLaneCount) {
  for (size_t n : {1, 2, 15, 16, 17, 33, 1001}) {
    const auto values = testing::RandomVector(n, static_cast<unsigned>(n));
    const auto values_f = testing::ToFloat(values);
    double max = values[0], sum = 0, sum_f = 0;
    for (size_t i = 0; i < n; ++i) {
      max = std::max(max, values[i]);
      sum += values[i];
      sum_f += values_f[i];
    }
    EXPECT_EQ(MaxOf(values.data(), n), max) << n;
    EXPECT_EQ(MaxOf(values_f.data(), n), static_cast<float>(max)) << n;
    EXPECT_NEAR(SumOf(values.data(), n), sum, 1e-12) << n;
    EXPECT_NEAR(SumOf(values_f.data(), n), sum_f, 1e-12) << n;
  }
}

}  // namespace
}  // namespace dtrain::cpu
