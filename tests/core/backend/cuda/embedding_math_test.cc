#include "core/backend/cuda/embedding_math.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/backend/cpu/embedding.h"
#include "core/backend/cuda/positions_math.h"
#include "gtest/gtest.h"
#include "tests/core/backend/cuda/test_util.h"

namespace dtrain::cuda {
namespace {

using testing::ExpectFloatMatches;
using testing::ExpectMatches;
using testing::Load;
using testing::Store;

// A vocabulary-parallel rank's rows [2, 7) of a 10-token vocabulary; tokens repeat (5 three
// times) and fall outside the rank's rows on both sides (0, and 7 = vocab_end).
constexpr int kB = 2, kT = 4, kC = 20, kMaxT = 6, kVocabBegin = 2, kVocabEnd = 7;
const std::vector<int32_t> kTokens = {5, 0, 3, 5, 7, 6, 5, 2};
// Documents packed into the rows: [0, 2) and [2, 4), then [0, 3) and [3, 4); position 0 repeats
// four times.
const std::vector<int32_t> kPositions = {0, 1, 0, 1, 0, 1, 2, 0};

// A table's bf16 gradient accumulated row by row against the CPU's fp32: bf16 rounds after each
// of an entry's k additions (k <= 4 here), the CPU once; each rounding moves the partial sum by
// at most 2^-8 of its magnitude, which stays below |initial| + sum |dout| <= 5 here.
void ExpectAccumulated(const std::vector<Bf16>& actual, const std::vector<float>& expected,
                       const char* what) {
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_NEAR(ToFloat(actual[i]), expected[i], 4 * std::ldexp(5.0, -8))
        << what << "[" << i << "]";
  }
}
void ExpectAccumulated(const std::vector<float>& actual, const std::vector<float>& expected,
                       const char* what) {
  ExpectFloatMatches(actual, expected, what);
}

// with_positions: a learned position table (GPT-2) or none (Llama); positions: documents packed
// into the rows, or null.
template <typename T>
void CheckEmbedding(bool with_positions, const int32_t* positions) {
  SCOPED_TRACE(with_positions ? "with a position table" : "without a position table");
  SCOPED_TRACE(positions != nullptr ? "documents" : "one document per row");
  const size_t vocab_rows = kVocabEnd - kVocabBegin;
  const std::vector<T> wte = Store<T>(testing::RandomFloats(vocab_rows * kC, 1));
  const std::vector<T> wpe = Store<T>(testing::RandomFloats(kMaxT * kC, 2));
  const std::vector<T> dout = Store<T>(testing::RandomFloats(kB * kT * kC, 3));
  const std::vector<T> dwte0 = Store<T>(testing::RandomFloats(vocab_rows * kC, 4));
  const std::vector<T> dwpe0 = Store<T>(testing::RandomFloats(kMaxT * kC, 5));
  const T* position_table = with_positions ? wpe.data() : nullptr;

  // The kernels' index spaces: every (row, j) of out; every column of the token table; every
  // (position, j) of the position table, or with documents every column of it.
  std::vector<T> out(kB * kT * kC), dwte = dwte0, dwpe = dwpe0;
  for (int row = 0; row < kB * kT; ++row) {
    const T* token_row = TokenRow(wte.data(), kTokens[row], kC, kVocabBegin, kVocabEnd);
    for (int j = 0; j < kC; ++j) {
      out[row * kC + j] = EmbeddingValue(
          token_row == nullptr ? nullptr : token_row + j,
          with_positions ? position_table + TokenPosition(positions, row, kT) * kC + j : nullptr);
    }
  }
  for (int j = 0; j < kC; ++j) {
    EmbeddingGradColumn(dwte.data(), dout.data(), kTokens.data(), kB * kT, kC, kVocabBegin,
                        kVocabEnd, j);
    if (with_positions && positions != nullptr) {
      EmbeddingGradColumn(dwpe.data(), dout.data(), positions, kB * kT, kC, 0, kT, j);
    }
  }
  if (with_positions && positions == nullptr) {
    for (int position = 0; position < kT; ++position) {
      for (int j = 0; j < kC; ++j) {
        PositionEmbeddingGrad(dwpe.data(), dout.data(), kB, kT, kC, position, j);
      }
    }
  }

  const std::vector<float> wte_cpu = Load(wte), wpe_cpu = Load(wpe);
  std::vector<float> out_cpu(out.size()), dwte_cpu = Load(dwte0), dwpe_cpu = Load(dwpe0);
  cpu::EmbeddingForward(out_cpu.data(), kTokens.data(), wte_cpu.data(),
                        with_positions ? wpe_cpu.data() : nullptr, kB, kT, kC, kVocabBegin,
                        kVocabEnd, nullptr, positions);
  cpu::EmbeddingBackward(dwte_cpu.data(), with_positions ? dwpe_cpu.data() : nullptr,
                         Load(dout).data(), kTokens.data(), kB, kT, kC, kVocabBegin, kVocabEnd,
                         nullptr, positions);
  ExpectMatches(out, out_cpu, "out");
  ExpectAccumulated(dwte, dwte_cpu, "dtoken_embedding");
  // Without documents the position table's kernel sums a column's batches in fp32 and rounds once.
  if (positions == nullptr) {
    ExpectMatches(dwpe, dwpe_cpu, "dposition_embedding");
  } else {
    ExpectAccumulated(dwpe, dwpe_cpu, "dposition_embedding");
  }
}

void CheckEveryLayout(const auto& check) {
  for (const bool with_positions : {true, false}) {
    check(with_positions, nullptr);
    check(with_positions, kPositions.data());
  }
}

TEST(CudaEmbeddingTest, Fp32MatchesCpuBackend) {
  CheckEveryLayout(
      [](bool table, const int32_t* positions) { CheckEmbedding<float>(table, positions); });
}

TEST(CudaEmbeddingTest, Bf16MatchesCpuBackendOnRoundedInputs) {
  CheckEveryLayout(
      [](bool table, const int32_t* positions) { CheckEmbedding<Bf16>(table, positions); });
}

}  // namespace
}  // namespace dtrain::cuda
