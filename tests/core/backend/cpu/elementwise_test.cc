#include "core/backend/cpu/elementwise.h"

#include <vector>

#include "core/backend/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/core/backend/cpu/test_util.h"

namespace dtrain::cpu {
namespace {

using testing::RandomVector;
using testing::ToFloat;

// Not a multiple of the 4096-value sum block nor of the pool's chunks.
constexpr size_t kSize = 3 * 4096 + 1234 + (1 << 16);

TEST(ElementwiseTest, AddScaleZero) {
  const auto a = ToFloat(RandomVector(kSize, 1)), b = ToFloat(RandomVector(kSize, 2));
  CpuBackend backend(2);
  std::vector<float> out(kSize);
  backend.Add(out.data(), a.data(), b.data(), kSize);
  for (size_t i = 0; i < kSize; ++i) ASSERT_EQ(out[i], a[i] + b[i]);
  backend.Scale(out.data(), 0.5f, kSize);
  for (size_t i = 0; i < kSize; ++i) ASSERT_EQ(out[i], (a[i] + b[i]) * 0.5f);
  backend.Zero(out.data(), kSize);
  for (float x : out) ASSERT_EQ(x, 0.0f);
}

TEST(ElementwiseTest, SumSquaresIsAccurateAndIndependentOfThreads) {
  const auto x = RandomVector(kSize, 3);
  double expected = 0;
  for (double v : x) expected += v * v;
  EXPECT_NEAR(SumSquares(x.data(), kSize, nullptr), expected, 1e-12 * expected);

  const auto x_f = ToFloat(x);
  double expected_f = 0;
  for (float v : x_f) expected_f += static_cast<double>(v) * v;
  CpuBackend one(1), two(2), three(3);
  // The backend adds into its scalar.
  const auto sum_squares = [&](CpuBackend& backend, size_t n) {
    double sum = 0;
    backend.SumSquares(x_f.data(), n, &sum);
    return sum;
  };
  const double sum = sum_squares(one, kSize);
  EXPECT_NEAR(sum, expected_f, 1e-12 * expected_f);
  EXPECT_EQ(sum_squares(two, kSize), sum);
  EXPECT_EQ(sum_squares(three, kSize), sum);
  EXPECT_EQ(sum_squares(one, 0), 0.0);
  double twice = sum;
  one.SumSquares(x_f.data(), kSize, &twice);
  EXPECT_EQ(twice, 2 * sum);
}

}  // namespace
}  // namespace dtrain::cpu
