#include "core/backend/cpu/rope.h"

#include <cmath>
#include <vector>

#include "core/backend/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/core/backend/cpu/test_util.h"

namespace dtrain::cpu {
namespace {

using testing::Dot;
using testing::ExpectFloatMatches;
using testing::ExpectGradientMatches;
using testing::RandomVector;
using testing::RoundToFloat;
using testing::ToFloat;

constexpr AttentionShape kShape = {.batch = 2, .time = 5, .heads = 4, .kv_heads = 2, .head_dim = 6};
constexpr double kTheta = 10000.0;
constexpr int kPosOffset = 3;

size_t QkvSize(const AttentionShape& s) {
  return static_cast<size_t>(s.batch) * s.time * s.qkv_width();
}

TEST(RopeTest, ForwardRotatesQueryAndKeyPairsOnly) {
  const auto qkv0 = RandomVector(QkvSize(kShape), 1);
  auto qkv = qkv0;
  RopeForward(qkv.data(), kShape, kTheta, kPosOffset, nullptr);
  const int width = kShape.qkv_width(), d = kShape.head_dim, half = d / 2;
  for (int b = 0; b < kShape.batch; ++b) {
    for (int t = 0; t < kShape.time; ++t) {
      const size_t row = (static_cast<size_t>(b) * kShape.time + t) * width;
      for (int h = 0; h < kShape.heads + 2 * kShape.kv_heads; ++h) {
        for (int i = 0; i < half; ++i) {
          const size_t i1 = row + h * d + i, i2 = i1 + half;
          if (h >= kShape.heads + kShape.kv_heads) {  // value heads pass through
            EXPECT_EQ(qkv[i1], qkv0[i1]);
            EXPECT_EQ(qkv[i2], qkv0[i2]);
            continue;
          }
          const double angle = (kPosOffset + t) * std::pow(kTheta, -2.0 * i / d);
          EXPECT_NEAR(qkv[i1], qkv0[i1] * std::cos(angle) - qkv0[i2] * std::sin(angle), 1e-14);
          EXPECT_NEAR(qkv[i2], qkv0[i2] * std::cos(angle) + qkv0[i1] * std::sin(angle), 1e-14);
        }
      }
    }
  }
}

TEST(RopeTest, BackwardMatchesFiniteDifferences) {
  auto qkv = RandomVector(QkvSize(kShape), 1);
  const auto r = RandomVector(qkv.size(), 2);
  auto loss = [&] {
    auto rotated = qkv;
    RopeForward(rotated.data(), kShape, kTheta, kPosOffset, nullptr);
    return Dot(rotated, r);
  };
  auto dqkv = r;
  RopeBackward(dqkv.data(), kShape, kTheta, kPosOffset, nullptr);
  ExpectGradientMatches(qkv, loss, dqkv, "dqkv");
}

TEST(RopeTest, FloatBackendMatchesDouble) {
  const AttentionShape shape = {.batch = 3, .time = 37, .heads = 4, .kv_heads = 1, .head_dim = 16};
  const auto qkv = RoundToFloat(RandomVector(QkvSize(shape), 1));
  auto forward = qkv, backward = qkv;
  RopeForward(forward.data(), shape, kTheta, kPosOffset, nullptr);
  RopeBackward(backward.data(), shape, kTheta, kPosOffset, nullptr);

  CpuBackend backend(2);
  auto forward_f = ToFloat(qkv), backward_f = ToFloat(qkv);
  backend.RopeForward(forward_f.data(), shape, kTheta, kPosOffset, nullptr);
  backend.RopeBackward(backward_f.data(), shape, kTheta, kPosOffset, nullptr);
  ExpectFloatMatches(forward_f, forward, "forward");
  ExpectFloatMatches(backward_f, backward, "backward");
}

}  // namespace
}  // namespace dtrain::cpu
