#include "core/backend/cuda/mma_math.h"

#include <vector>

#include "gtest/gtest.h"
#include "tests/core/backend/cuda/mma_probe.h"
#include "tests/core/backend/cuda/test_util.h"

namespace dtrain::cuda {
namespace {

using testing::HostWarp;
using testing::kProbeOutputs;
using testing::kProbeProducts;

// The fragment loaders against the layout the emulated instruction reads (the index functions):
// A from a row-major tile, B both from its rows (LoadB) and from its transpose's
// (LoadBTransposed), each product against a double one; a product's C tiles fed back as A (ToA)
// multiply as the product rounded to bf16; the quad reductions stay within the quad. The sums of
// 16 products of values in [-1, 1) are within 16 * 2^-24 * 16 < 2e-5 of the double ones.
TEST(MmaTest, TheEmulatedWarpComputesTheProducts) {
  const testing::ProbeCase probe = testing::MakeProbeCase();
  std::vector<float> out(kProbeOutputs);
  testing::RunOnHostWarp([&](const HostWarp& warp) {
    testing::MmaProbe(warp, probe.a.data(), probe.b.data(), probe.b_transposed.data(), out.data());
  });
  for (int i = 0; i < kProbeProducts * 128; ++i) {
    EXPECT_NEAR(out[i], probe.products[i], 2e-5) << "product " << i / 128 << " at " << i % 128;
  }
  for (int lane = 0; lane < kWarpSize; ++lane) {
    EXPECT_EQ(out[kProbeProducts * 128 + lane], lane / 4 * 4 + 3) << lane;
    EXPECT_EQ(out[kProbeProducts * 128 + kWarpSize + lane], 4 * (lane / 4 * 4) + 6) << lane;
  }
}

// Every lane's C elements cover the 16 x 8 tile once, A's and B's their 16 x 16 and 16 x 8, and
// the four lanes of a quad share rows.
TEST(MmaTest, FragmentsCoverTheirMatricesOnce) {
  std::vector<int> a(16 * 16), b(16 * 8), c(16 * 8);
  for (int lane = 0; lane < kWarpSize; ++lane) {
    for (int e = 0; e < 8; ++e) ++a[MmaAIndex(lane, e).row * 16 + MmaAIndex(lane, e).col];
    for (int e = 0; e < 4; ++e) {
      ++b[MmaBIndex(lane, e).row * 8 + MmaBIndex(lane, e).col];
      ++c[MmaCIndex(lane, e).row * 8 + MmaCIndex(lane, e).col];
      EXPECT_EQ(MmaCIndex(lane, e).row, MmaCIndex(lane / 4 * 4, e).row);
    }
  }
  for (int count : a) EXPECT_EQ(count, 1);
  for (int count : b) EXPECT_EQ(count, 1);
  for (int count : c) EXPECT_EQ(count, 1);
}

}  // namespace
}  // namespace dtrain::cuda
