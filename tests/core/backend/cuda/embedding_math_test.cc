#include "core/backend/cuda/embedding_math.h"

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/backend/cpu/embedding.h"
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

template <typename T>
void CheckEmbedding(bool with_positions) {
  SCOPED_TRACE(with_positions ? "with positions" : "without positions");
  const size_t vocab_rows = kVocabEnd - kVocabBegin;
  const std::vector<T> wte = Store<T>(testing::RandomFloats(vocab_rows * kC, 1));
  const std::vector<T> wpe = Store<T>(testing::RandomFloats(kMaxT * kC, 2));
  const std::vector<T> dout = Store<T>(testing::RandomFloats(kB * kT * kC, 3));
  const std::vector<T> dwte0 = Store<T>(testing::RandomFloats(vocab_rows * kC, 4));
  const std::vector<T> dwpe0 = Store<T>(testing::RandomFloats(kMaxT * kC, 5));
  const T* position_table = with_positions ? wpe.data() : nullptr;

  // The kernels' index spaces: every (row, j) of out; every column of the token table; every
  // (position, j) of the position table.
  std::vector<T> out(kB * kT * kC), dwte = dwte0, dwpe = dwpe0;
  for (int row = 0; row < kB * kT; ++row) {
    const T* token_row = TokenRow(wte.data(), kTokens[row], kC, kVocabBegin, kVocabEnd);
    for (int j = 0; j < kC; ++j) {
      out[row * kC + j] =
          EmbeddingValue(token_row == nullptr ? nullptr : token_row + j,
                         with_positions ? position_table + (row % kT) * kC + j : nullptr);
    }
  }
  for (int j = 0; j < kC; ++j) {
    TokenEmbeddingGradColumn(dwte.data(), dout.data(), kTokens.data(), kB * kT, kC, kVocabBegin,
                             kVocabEnd, j);
  }
  if (with_positions) {
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
                        kVocabEnd, nullptr);
  cpu::EmbeddingBackward(dwte_cpu.data(), with_positions ? dwpe_cpu.data() : nullptr,
                         Load(dout).data(), kTokens.data(), kB, kT, kC, kVocabBegin, kVocabEnd,
                         nullptr);
  ExpectMatches(out, out_cpu, "out");
  ExpectMatches(dwpe, dwpe_cpu, "dposition_embedding");
  if constexpr (std::is_same_v<T, float>) {
    ExpectFloatMatches(dwte, dwte_cpu, "dtoken_embedding");
  } else {
    // bf16 rounds after each of a row's k additions (k = 3 for token 5), the CPU once: each
    // rounding moves the partial sum by at most 2^-8 of its magnitude, which stays below
    // |initial| + sum |dout| <= 4 here.
    for (size_t i = 0; i < dwte.size(); ++i) {
      ASSERT_NEAR(ToFloat(dwte[i]), dwte_cpu[i], 3 * std::ldexp(4.0, -8)) << "dwte[" << i << "]";
    }
  }
}

TEST(CudaEmbeddingTest, Fp32MatchesCpuBackend) {
  CheckEmbedding<float>(true);
  CheckEmbedding<float>(false);
}

TEST(CudaEmbeddingTest, Bf16MatchesCpuBackendOnRoundedInputs) {
  CheckEmbedding<Bf16>(true);
  CheckEmbedding<Bf16>(false);
}

}  // namespace
}  // namespace dtrain::cuda
