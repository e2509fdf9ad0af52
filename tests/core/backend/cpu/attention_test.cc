#include "core/backend/cpu/attention.h"

#include <cmath>
#include <limits>
#include <vector>

#include "core/backend/cpu/cpu_backend.h"
#include "core/backend/cpu/parallel.h"
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

// Grouped-query, T not a power of two (one query block).
constexpr AttentionShape kSmall = {
    .batch = 2, .time = 13, .heads = 4, .kv_heads = 2, .head_dim = 8};
// T past one 64-row query block, so blocks and the dK/dV accumulation across them are covered.
constexpr AttentionShape kMultiBlock = {
    .batch = 1, .time = 67, .heads = 3, .kv_heads = 1, .head_dim = 4};

size_t QkvSize(const AttentionShape& s) {
  return static_cast<size_t>(s.batch) * s.time * s.qkv_width();
}
size_t OutSize(const AttentionShape& s) {
  return static_cast<size_t>(s.batch) * s.time * s.heads * s.head_dim;
}
size_t LseSize(const AttentionShape& s) { return static_cast<size_t>(s.batch) * s.heads * s.time; }

// The textbook computation: the full (T, T) score matrix per (b, h), masked to -inf above the
// diagonal (and, with document positions, left of the row's document start: a block-diagonal
// mask), softmax, times V.
void NaiveAttention(std::vector<double>& out, std::vector<double>& lse,
                    const std::vector<double>& qkv, const AttentionShape& s,
                    const int32_t* positions = nullptr) {
  const int w = s.qkv_width(), d = s.head_dim, group = s.heads / s.kv_heads;
  for (int b = 0; b < s.batch; ++b) {
    for (int h = 0; h < s.heads; ++h) {
      const int kv = h / group;
      for (int i = 0; i < s.time; ++i) {
        const int first = positions == nullptr ? 0 : i - positions[b * s.time + i];
        std::vector<double> scores(s.time, -std::numeric_limits<double>::infinity());
        double max = scores[0];
        for (int j = first; j <= i; ++j) {
          double dot = 0;
          for (int c = 0; c < d; ++c) {
            dot += qkv[(b * s.time + i) * w + h * d + c] *
                   qkv[(b * s.time + j) * w + (s.heads + kv) * d + c];
          }
          scores[j] = dot / std::sqrt(static_cast<double>(d));
          max = std::max(max, scores[j]);
        }
        double sum = 0;
        for (int j = first; j <= i; ++j) sum += std::exp(scores[j] - max);
        lse[(b * s.heads + h) * s.time + i] = max + std::log(sum);
        for (int c = 0; c < d; ++c) {
          double acc = 0;
          for (int j = first; j <= i; ++j) {
            acc += std::exp(scores[j] - max) / sum *
                   qkv[(b * s.time + j) * w + (s.heads + s.kv_heads + kv) * d + c];
          }
          out[(b * s.time + i) * s.heads * d + h * d + c] = acc;
        }
      }
    }
  }
}

void ExpectMatchesNaive(const AttentionShape& shape) {
  const auto qkv = RandomVector(QkvSize(shape), 1, -2, 2);
  std::vector<double> out(OutSize(shape)), lse(LseSize(shape));
  std::vector<double> scratch(AttentionScratchSize(shape));
  AttentionForward(out.data(), lse.data(), qkv.data(), shape, scratch.data(), nullptr);
  std::vector<double> expected_out(out.size()), expected_lse(lse.size());
  NaiveAttention(expected_out, expected_lse, qkv, shape);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], expected_out[i], 1e-12);
  for (size_t i = 0; i < lse.size(); ++i) EXPECT_NEAR(lse[i], expected_lse[i], 1e-12);
}

TEST(AttentionTest, ForwardMatchesNaiveFullMatrix) {
  ExpectMatchesNaive(kSmall);
  ExpectMatchesNaive(kMultiBlock);
}

void ExpectBackwardMatchesFiniteDifferences(const AttentionShape& shape) {
  auto qkv = RandomVector(QkvSize(shape), 1, -2, 2);
  const auto r = RandomVector(OutSize(shape), 2);
  std::vector<double> out(OutSize(shape)), lse(LseSize(shape));
  std::vector<double> scratch(AttentionScratchSize(shape));
  auto loss = [&] {
    AttentionForward(out.data(), lse.data(), qkv.data(), shape, scratch.data(), nullptr);
    return Dot(out, r);
  };
  loss();
  // dqkv is written: start it non-zero to check nothing is added to stale values.
  auto dqkv = RandomVector(qkv.size(), 3);
  AttentionBackward(dqkv.data(), r.data(), qkv.data(), out.data(), lse.data(), shape,
                    scratch.data(), nullptr);
  ExpectGradientMatches(qkv, loss, dqkv, "dqkv");
}

TEST(AttentionTest, BackwardMatchesFiniteDifferences) {
  ExpectBackwardMatchesFiniteDifferences(kSmall);
  ExpectBackwardMatchesFiniteDifferences(kMultiBlock);
}

// Documents packed into rows: positions restart at each document, so the second query block of
// the 67-row shape starts inside a document (its keys from that document's start), and the
// batch's two rows of the small shape cut their documents differently.
std::vector<int32_t> DocumentPositions(const AttentionShape& shape,
                                       const std::vector<std::vector<int>>& rows) {
  std::vector<int32_t> positions;
  for (const auto& lengths : rows) {
    for (const int length : lengths) {
      for (int i = 0; i < length; ++i) positions.push_back(i);
    }
  }
  EXPECT_EQ(positions.size(), static_cast<size_t>(shape.batch) * shape.time);
  return positions;
}

TEST(AttentionTest, DocumentsMatchTheBlockDiagonalMaskAndFiniteDifferences) {
  for (const auto& [shape, rows] :
       {std::pair{kSmall, std::vector<std::vector<int>>{{5, 1, 7}, {13}}},
        std::pair{kMultiBlock, std::vector<std::vector<int>>{{20, 30, 17}}}}) {
    const std::vector<int32_t> positions = DocumentPositions(shape, rows);
    auto qkv = RandomVector(QkvSize(shape), 1, -2, 2);
    std::vector<double> out(OutSize(shape)), lse(LseSize(shape));
    std::vector<double> scratch(AttentionScratchSize(shape));
    AttentionForward(out.data(), lse.data(), qkv.data(), shape, scratch.data(), nullptr,
                     positions.data());
    std::vector<double> expected_out(out.size()), expected_lse(lse.size());
    NaiveAttention(expected_out, expected_lse, qkv, shape, positions.data());
    for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], expected_out[i], 1e-12);
    for (size_t i = 0; i < lse.size(); ++i) EXPECT_NEAR(lse[i], expected_lse[i], 1e-12);

    const auto r = RandomVector(OutSize(shape), 2);
    auto loss = [&] {
      AttentionForward(out.data(), lse.data(), qkv.data(), shape, scratch.data(), nullptr,
                       positions.data());
      return Dot(out, r);
    };
    loss();
    auto dqkv = RandomVector(qkv.size(), 3);
    AttentionBackward(dqkv.data(), r.data(), qkv.data(), out.data(), lse.data(), shape,
                      scratch.data(), nullptr, positions.data());
    ExpectGradientMatches(qkv, loss, dqkv, "dqkv");
  }
}

struct FloatResult {
  std::vector<float> out, lse, dqkv;
};

FloatResult RunFloat(int threads, const AttentionShape& shape, const std::vector<float>& qkv,
                     const std::vector<float>& dout) {
  CpuBackend backend(threads);
  FloatResult result{std::vector<float>(OutSize(shape)), std::vector<float>(LseSize(shape)),
                     std::vector<float>(QkvSize(shape))};
  backend.AttentionForward(result.out.data(), result.lse.data(), qkv.data(), shape, nullptr);
  backend.AttentionBackward(result.dqkv.data(), dout.data(), qkv.data(), result.out.data(),
                            result.lse.data(), shape, nullptr);
  return result;
}

TEST(AttentionTest, FloatBackendMatchesDoubleAndIsIndependentOfThreads) {
  const AttentionShape shape = {.batch = 2, .time = 130, .heads = 4, .kv_heads = 2, .head_dim = 16};
  const auto qkv = RoundToFloat(RandomVector(QkvSize(shape), 1, -2, 2));
  const auto dout = RoundToFloat(RandomVector(OutSize(shape), 2));
  std::vector<double> out(OutSize(shape)), lse(LseSize(shape)), dqkv(QkvSize(shape));
  std::vector<double> scratch(AttentionScratchSize(shape));
  AttentionForward(out.data(), lse.data(), qkv.data(), shape, scratch.data(), nullptr);
  AttentionBackward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), shape,
                    scratch.data(), nullptr);

  const FloatResult one = RunFloat(1, shape, ToFloat(qkv), ToFloat(dout));
  ExpectFloatMatches(one.out, out, "out");
  ExpectFloatMatches(one.lse, lse, "lse");
  ExpectFloatMatches(one.dqkv, dqkv, "dqkv");

  // Bit for bit: each (batch, head) runs the same serial GEMMs whichever thread takes it.
  const FloatResult two = RunFloat(2, shape, ToFloat(qkv), ToFloat(dout));
  EXPECT_EQ(one.out, two.out);
  EXPECT_EQ(one.lse, two.lse);
  EXPECT_EQ(one.dqkv, two.dqkv);
}

}  // namespace
}  // namespace dtrain::cpu
