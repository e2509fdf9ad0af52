#include "core/backend/cuda/rope_math.h"

#include <vector>

#include "core/backend/cpu/rope.h"
#include "core/backend/cuda/positions_math.h"
#include "gtest/gtest.h"
#include "tests/core/backend/cuda/test_util.h"

namespace dtrain::cuda {
namespace {

using testing::ExpectMatches;
using testing::Load;
using testing::Store;

// Grouped-query heads (4 query, 2 key/value), positions offset as in a decode step.
constexpr AttentionShape kShape{.batch = 2, .time = 5, .heads = 4, .kv_heads = 2, .head_dim = 8};
constexpr double kTheta = 10000;
constexpr int kPosOffset = 3;
// Documents packed into the rows: [0, 3) and [3, 5), then [0, 5).
const std::vector<int32_t> kPositions = {0, 1, 2, 0, 1, 0, 1, 2, 3, 4};

// The kernel's index space: every (row, rotated head, i) pair, value heads left alone.
template <typename T>
void RotateAll(std::vector<T>& qkv, const int32_t* positions, float direction) {
  const int half = kShape.head_dim / 2;
  for (int row = 0; row < kShape.batch * kShape.time; ++row) {
    for (int head = 0; head < kShape.heads + kShape.kv_heads; ++head) {
      for (int i = 0; i < half; ++i) {
        float cos_angle, sin_angle;
        RopeCosSin(kPosOffset + TokenPosition(positions, row, kShape.time), i, kShape.head_dim,
                   kTheta, direction, &cos_angle, &sin_angle);
        T* x1 =
            qkv.data() + static_cast<size_t>(row) * kShape.qkv_width() + head * kShape.head_dim + i;
        RotatePair(x1, x1 + half, cos_angle, sin_angle);
      }
    }
  }
}

template <typename T>
void CheckRope(const int32_t* positions) {
  SCOPED_TRACE(positions != nullptr ? "documents" : "one document per row");
  const size_t size = static_cast<size_t>(kShape.batch) * kShape.time * kShape.qkv_width();
  std::vector<T> qkv = Store<T>(testing::RandomFloats(size, 1));
  std::vector<float> expected = Load(qkv);
  RotateAll(qkv, positions, 1.0f);
  cpu::RopeForward(expected.data(), kShape, kTheta, kPosOffset, nullptr, positions);
  ExpectMatches(qkv, expected, "forward");
  // Backward from the same stored values, so that bf16 rounding does not accumulate.
  expected = Load(qkv);
  RotateAll(qkv, positions, -1.0f);
  cpu::RopeBackward(expected.data(), kShape, kTheta, kPosOffset, nullptr, positions);
  ExpectMatches(qkv, expected, "backward");
}

TEST(CudaRopeTest, Fp32MatchesCpuBackend) {
  CheckRope<float>(nullptr);
  CheckRope<float>(kPositions.data());
}

TEST(CudaRopeTest, Bf16MatchesCpuBackendOnRoundedInputs) {
  CheckRope<Bf16>(nullptr);
  CheckRope<Bf16>(kPositions.data());
}

}  // namespace
}  // namespace dtrain::cuda
