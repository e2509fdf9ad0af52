#include "core/backend/cuda/elementwise_math.h"

#include <vector>

#include "core/backend/cpu/elementwise.h"
#include "gtest/gtest.h"
#include "tests/core/backend/cuda/test_util.h"

namespace dtrain::cuda {
namespace {

using testing::ExpectMatches;
using testing::HostBlock;
using testing::HostWarp;
using testing::Load;
using testing::RunOnHostBlock;
using testing::RunOnHostWarp;
using testing::Store;

// SumInDouble on an emulated block of kSumThreads threads.
double SumOnHostBlock(const float* values, size_t n) {
  std::vector<double> shared(kSumThreads / kWarpSize);
  double total = -1;
  RunOnHostBlock<kSumThreads>([&](const HostBlock<kSumThreads>& block) {
    const double sum = SumInDouble<kSumThreads>(block, shared.data(), values, n);
    if (block.thread() == 0) total = sum;
  });
  return total;
}

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
  const double sum_squares = SumOnHostBlock(block_sums.data(), blocks);
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

// No values: no blocks, and the second step's empty block sums to zero.
TEST(CudaElementwiseTest, EmptyIsZero) {
  EXPECT_EQ(SumSquaresBlocks(0), 0u);
  EXPECT_EQ(SumOnHostBlock(nullptr, 0), 0.0);
}

// A micro-batch's 16,384 row losses and one value past a whole pass of the block: each the sum
// in double of the same floats, which differs from a sequential one only in its order (about
// 2^-52 of the sum for each of a thread's 16 and the block's 10 levels of additions).
TEST(CudaElementwiseTest, TheBlockSumIsTheSumInDouble) {
  for (const size_t n : {size_t{16384}, size_t{kSumThreads + 1}}) {
    const std::vector<float> losses = testing::RandomFloats(n, 3, 0, 11);
    double expected = 0;
    for (const float loss : losses) expected += loss;
    EXPECT_NEAR(SumOnHostBlock(losses.data(), n), expected, 1e-13 * expected) << n;
  }
}

}  // namespace
}  // namespace dtrain::cuda
