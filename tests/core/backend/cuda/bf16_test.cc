#include "core/backend/cuda/bf16.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/core/data/tar_test_util.h"

// With the CUDA toolkit (its headers come with dtrain_lib's cudart), NVIDIA's conversion too.
#if __has_include(<cuda_bf16.h>)
#include <cuda_bf16.h>
#define DTRAIN_HAVE_CUDA_BF16_H 1
#endif

namespace dtrain::cuda {
namespace {

// Round to nearest even derived from the definition rather than from bit tricks: of the two
// bf16 values around x (x truncated, and the next one away from zero), the nearer, the one with
// an even last bit on a tie. Differences of floats this close are exact in double. Past the
// largest finite bf16 the next value is 2^128, which IEEE's unbounded-exponent rule rounds to
// infinity (0x7f80 is that value's bit pattern).
uint16_t ReferenceRound(float x) {
  if (std::isnan(x)) return 0x7fff;
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t toward_zero = bits & 0xffff0000u;
  if (toward_zero == bits || std::isinf(x)) return static_cast<uint16_t>(bits >> 16);
  const uint32_t away = toward_zero + 0x10000u;
  const double magnitude = std::abs(static_cast<double>(x));
  const double low = std::abs(static_cast<double>(std::bit_cast<float>(toward_zero)));
  const double high = (away & 0x7fffffffu) == 0x7f800000u
                          ? std::ldexp(1.0, 128)
                          : std::abs(static_cast<double>(std::bit_cast<float>(away)));
  const double to_low = magnitude - low, to_high = high - magnitude;
  const bool pick_high = to_high < to_low || (to_high == to_low && ((toward_zero >> 16) & 1u));
  return static_cast<uint16_t>((pick_high ? away : toward_zero) >> 16);
}

// Every bf16 value (every upper half) with lower halves that cover zero, a tie, both sides of a
// tie, the largest, and a few random ones: every exponent, sign, NaN payload and rounding case.
std::vector<uint32_t> SampleBits() {
  std::mt19937 rng(7);
  std::vector<uint32_t> bits;
  for (uint32_t high = 0; high < 0x10000u; ++high) {
    for (uint32_t low :
         {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu,
          static_cast<uint32_t>(rng() & 0xffffu), static_cast<uint32_t>(rng() & 0xffffu)}) {
      bits.push_back(high << 16 | low);
    }
  }
  return bits;
}

TEST(CudaBf16Test, RoundsToNearestEvenAsDerived) {
  for (uint32_t bits : SampleBits()) {
    const float x = std::bit_cast<float>(bits);
    ASSERT_EQ(FloatToBf16Bits(x), ReferenceRound(x)) << std::hex << "bits 0x" << bits;
  }
}

TEST(CudaBf16Test, EdgeCases) {
  const auto round = [](uint32_t bits) { return FloatToBf16Bits(std::bit_cast<float>(bits)); };
  EXPECT_EQ(round(0x3f808000u), 0x3f80);  // 1 + 2^-8: a tie, the even neighbour is below
  EXPECT_EQ(round(0x3f818000u), 0x3f82);  // a tie whose lower neighbour is odd rounds up
  EXPECT_EQ(round(0x3f808001u), 0x3f81);  // just past a tie
  EXPECT_EQ(round(0x3f7fffffu), 0x3f80);  // the carry steps the exponent
  EXPECT_EQ(round(0x7f7fffffu), 0x7f80);  // largest float: past the largest bf16, infinity
  EXPECT_EQ(round(0x7f7f7fffu), 0x7f7f);  // below the halfway point stays finite
  EXPECT_EQ(round(0xff7fffffu), 0xff80);  // -infinity
  EXPECT_EQ(round(0x00000001u), 0x0000);  // the smallest subnormal rounds to zero
  EXPECT_EQ(round(0x00008000u), 0x0000);  // a subnormal tie, even below
  EXPECT_EQ(round(0x00018000u), 0x0002);  // a subnormal tie, odd below
  EXPECT_EQ(round(0x80000000u), 0x8000);  // -0 keeps its sign
  EXPECT_EQ(round(0x7f800000u), 0x7f80);
  EXPECT_EQ(round(0xff800000u), 0xff80);
  EXPECT_EQ(round(0x7fc00000u), 0x7fff);  // quiet NaN, canonical
  EXPECT_EQ(round(0xffffffffu), 0x7fff);  // negative NaN loses its sign, as in CUDA
  EXPECT_EQ(round(0x7f800001u), 0x7fff);  // signalling NaN whose payload truncation would lose
}

TEST(CudaBf16Test, WideningIsExactAndRoundTrips) {
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const float x = Bf16BitsToFloat(static_cast<uint16_t>(bits));
    ASSERT_EQ(std::bit_cast<uint32_t>(x), bits << 16);
    if (!std::isnan(x)) {
      ASSERT_EQ(FloatToBf16Bits(x), bits);
    }
  }
  EXPECT_EQ(ToFloat(FromFloat<Bf16>(0.1f)), 0.10009765625f);
  EXPECT_EQ(FromFloat<float>(0.1f), 0.1f);
}

#ifdef DTRAIN_HAVE_CUDA_BF16_H
// NVIDIA's own definition: the host branch of __float2bfloat16_rn in cuda_bf16.hpp, which the
// device's cvt.rn.bf16.f32 matches.
TEST(CudaBf16Test, MatchesCudaFloat2Bfloat16Rn) {
  for (uint32_t bits : SampleBits()) {
    const __nv_bfloat16 expected = __float2bfloat16_rn(std::bit_cast<float>(bits));
    ASSERT_EQ(FloatToBf16Bits(std::bit_cast<float>(bits)), std::bit_cast<uint16_t>(expected))
        << std::hex << "bits 0x" << bits;
  }
}
#endif

// PyTorch's rounding (c10::BFloat16), through Debian's python3-torch. PyTorch maps NaN to 0x7fc0,
// CUDA to 0x7fff, so NaNs are left to the tests above.
TEST(CudaBf16Test, MatchesPyTorch) {
  if (!testing::RunPython("-c 'import torch' 2>/dev/null")) GTEST_SKIP() << "no python3-torch";
  std::vector<float> values;
  for (uint32_t bits : SampleBits()) {
    const float x = std::bit_cast<float>(bits);
    if (!std::isnan(x)) values.push_back(x);
  }
  testing::TempDir dir;
  std::ofstream(dir / "in.f32", std::ios::binary)
      .write(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  ASSERT_TRUE(testing::RunPython(std::string(DTRAIN_SOURCE_DIR) +
                                 "/tests/core/backend/cuda/torch_bf16.py " + (dir / "in.f32") +
                                 " " + (dir / "out.bf16")));
  std::vector<uint16_t> rounded(values.size());
  std::ifstream in(dir / "out.bf16", std::ios::binary);
  in.read(reinterpret_cast<char*>(rounded.data()), rounded.size() * sizeof(uint16_t));
  ASSERT_EQ(in.gcount(), static_cast<std::streamsize>(rounded.size() * sizeof(uint16_t)));
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(FloatToBf16Bits(values[i]), rounded[i])
        << std::hex << "bits 0x" << std::bit_cast<uint32_t>(values[i]);
  }
}

}  // namespace
}  // namespace dtrain::cuda
