#include "core/backend/cpu/elementwise.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
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

// Convert's bf16 copies (the gradient reductions', the compute copies'): each value rounds to the
// nearer of the two bf16 values around it (found by truncation and its successor, compared in
// double), a tie to the one with an even last bit, and widening is exact. Ties and values near a
// power of two included.
TEST(ElementwiseTest, Bf16RoundsToNearestEvenAndWidensExactly) {
  std::vector<float> x = ToFloat(RandomVector(kSize, 4, -3, 3));
  const float ties[] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -1.0f - 0x1p-8f,
                        2.0f - 0x1p-8f, 0x1p-130f,          0.0f};
  std::copy(std::begin(ties), std::end(ties), x.begin());
  CpuBackend backend(2);
  std::vector<Bf16> rounded(kSize);
  backend.Convert(rounded.data(), x.data(), kSize);
  std::vector<float> widened(kSize);
  backend.Convert(widened.data(), rounded.data(), kSize);
  for (size_t i = 0; i < kSize; ++i) {
    uint32_t raw = 0;
    std::memcpy(&raw, &x[i], sizeof(raw));
    const uint32_t down_bits = raw & 0xFFFF0000u, up_bits = down_bits + 0x10000u;
    float down = 0, up = 0;
    std::memcpy(&down, &down_bits, sizeof(down));
    std::memcpy(&up, &up_bits, sizeof(up));
    const double to_down = std::abs(static_cast<double>(x[i]) - down);
    const double to_up = std::abs(static_cast<double>(up) - x[i]);
    const bool down_is_even = (down_bits & 0x10000u) == 0;
    const float expected = to_down < to_up || (to_down == to_up && down_is_even) ? down : up;
    ASSERT_EQ(widened[i], expected) << i << ": " << x[i];
    ASSERT_EQ(uint32_t{rounded[i].bits} << 16, expected == down ? down_bits : up_bits) << i;
  }
  EXPECT_EQ(widened[0], 1.0f);                // 1 + 2^-8: a tie, to the even 1
  EXPECT_EQ(widened[1], 1.0f + 4 * 0x1p-8f);  // 1 + 3 * 2^-8: a tie, to the even 1 + 2^-6
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
