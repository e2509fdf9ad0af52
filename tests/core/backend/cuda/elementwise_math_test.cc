#include "core/backend/cuda/elementwise_math.h"

#include <vector>

#include "core/backend/cpu/elementwise.h"
#include "gtest/gtest.h"
#include "tests/core/backend/cuda/test_util.h"

namespace dtrain::cuda {
namespace {

using testing::ExpectMatches;
using testing::HostWarp;
using testing::Load;
using testing::RunOnHostWarp;
using testing::Store;

// Three whole blocks and a partial one.
constexpr size_t kValues = 3 * kSumSquaresBlock + 123;

template <typename T>
void CheckSumSquaresAndScale() {
  std::vector<T> x = Store<T>(testing::RandomFloats(kValues, 1, -2, 2));
  const size_t blocks = SumSquaresBlocks(kValues);
  ASSERT_EQ(blocks, 4u);
  std::vector<float> block_sums(blocks);
  for (size_t block = 0; block < blocks; ++block) {
    RunOnHostWarp([&](const HostWarp& warp) {
      const float sum = SumSquaresOfBlock(warp, x.data(), kValues, block);
      if (warp.lane() == 0) block_sums[block] = sum;
    });
  }
  double sum_squares = 0;
  RunOnHostWarp([&](const HostWarp& warp) {
    const double sum = SumInDouble(warp, block_sums.data(), blocks);
    if (warp.lane() == 0) sum_squares = sum;
  });
  // The CPU sums in double: the fp32 block sums' relative error bound (elementwise_math.h).
  const double expected = cpu::SumSquares(Load(x).data(), kValues, nullptr);
  EXPECT_NEAR(sum_squares, expected, 1e-5 * expected);

  const float factor = 0.37f;
  std::vector<float> scaled_cpu = Load(x);
  for (T& value : x) value = ScaleValue(value, factor);
  cpu::Scale(scaled_cpu.data(), factor, kValues, nullptr);
  ExpectMatches(x, scaled_cpu, "scaled");
}

TEST(CudaElementwiseTest, Fp32MatchesCpuBackend) { CheckSumSquaresAndScale<float>(); }

TEST(CudaElementwiseTest, Bf16MatchesCpuBackendOnRoundedInputs) { CheckSumSquaresAndScale<Bf16>(); }

// No values: no blocks, and the second step's empty warp sums to zero.
TEST(CudaElementwiseTest, EmptyIsZero) {
  EXPECT_EQ(SumSquaresBlocks(0), 0u);
  double sum = -1;
  RunOnHostWarp([&](const HostWarp& warp) {
    const double s = SumInDouble(warp, static_cast<const float*>(nullptr), 0);
    if (warp.lane() == 0) sum = s;
  });
  EXPECT_EQ(sum, 0.0);
}

}  // namespace
}  // namespace dtrain::cuda
