#include "core/backend/cuda/embedding_math.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "core/backend/cpu/embedding.h"
#include "core/backend/cuda/positions_math.h"
#include "gtest/gtest.h"
#include "tests/core/backend/cuda/test_util.h"

namespace dtrain::cuda {
namespace {

using testing::ExpectMatches;
using testing::Load;
using testing::Store;

// A vocabulary-parallel rank's rows [2, 7) of a 10-token vocabulary; tokens repeat (5 three
// times, not in a row) and fall outside the rank's rows on both sides (0, and 7 = vocab_end).
constexpr int kB = 2, kT = 4, kC = 20, kMaxT = 6, kVocabBegin = 2, kVocabEnd = 7;
const std::vector<int32_t> kTokens = {5, 0, 3, 5, 7, 6, 5, 2};
// Documents packed into the rows: [0, 2) and [2, 4), then [0, 3) and [3, 4); position 0 repeats
// four times.
const std::vector<int32_t> kPositions = {0, 1, 0, 1, 0, 1, 2, 0};

// The ids (rows) sorted stably with their row indices, as EmbeddingBackward's radix sort.
struct Sorted {
  std::vector<int32_t> ids, rows;
};
Sorted SortStably(const int32_t* ids, size_t count) {
  Sorted sorted{.ids = {}, .rows = std::vector<int32_t>(count)};
  std::iota(sorted.rows.begin(), sorted.rows.end(), 0);
  std::stable_sort(sorted.rows.begin(), sorted.rows.end(),
                   [&](int32_t a, int32_t b) { return ids[a] < ids[b]; });
  for (const int32_t row : sorted.rows) sorted.ids.push_back(ids[row]);
  return sorted;
}

// The backward kernel's index space over a table of c columns: every (sorted position, column).
// Each run's block, here of kBlockThreads threads, finds where the run ends as the kernel does,
// each thread testing one position a pass.
constexpr size_t kBlockThreads = 4;
template <typename T>
void TableGrad(float* dtable, const T* dout, const int32_t* ids, size_t count, int c, int id_begin,
               int id_end) {
  const Sorted sorted = SortStably(ids, count);
  const int32_t* sorted_ids = sorted.ids.data();
  for (size_t i = 0; i < count; ++i) {
    if (!StartsRun(sorted_ids, i)) continue;
    std::vector<size_t> ends;
    for (size_t pass = i + 1;; pass += kBlockThreads) {
      bool past = false;
      for (size_t k = pass; k < pass + kBlockThreads; ++k) {
        if (RunEndsAt(sorted_ids, count, i, k)) ends.push_back(k);
        past = past || PastRun(sorted_ids, count, i, k);
      }
      if (past) break;
    }
    ASSERT_EQ(ends.size(), 1u) << "threads that saw the run at " << i << " end";
    for (int j = 0; j < c; ++j) {
      EmbeddingGradRun(dtable, dout, sorted_ids, sorted.rows.data(), i, ends[0], c, id_begin,
                       id_end, j);
    }
  }
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
  const std::vector<float> dwte0 = testing::RandomFloats(vocab_rows * kC, 4);
  const std::vector<float> dwpe0 = testing::RandomFloats(kMaxT * kC, 5);
  const T* position_table = with_positions ? wpe.data() : nullptr;

  // The kernels' index spaces: every (row, j) of out; every (run, j) of the token table; every
  // (position, j) of the position table, or with documents every (run, j) of it.
  std::vector<T> out(kB * kT * kC);
  std::vector<float> dwte = dwte0, dwpe = dwpe0;
  for (int row = 0; row < kB * kT; ++row) {
    const T* token_row = TokenRow(wte.data(), kTokens[row], kC, kVocabBegin, kVocabEnd);
    for (int j = 0; j < kC; ++j) {
      out[row * kC + j] = EmbeddingValue(
          token_row == nullptr ? nullptr : token_row + j,
          with_positions ? position_table + TokenPosition(positions, row, kT) * kC + j : nullptr);
    }
  }
  TableGrad(dwte.data(), dout.data(), kTokens.data(), kB * kT, kC, kVocabBegin, kVocabEnd);
  if (with_positions && positions != nullptr) {
    TableGrad(dwpe.data(), dout.data(), positions, kB * kT, kC, 0, kT);
  }
  if (with_positions && positions == nullptr) {
    for (int position = 0; position < kT; ++position) {
      for (int j = 0; j < kC; ++j) {
        PositionEmbeddingGrad(dwpe.data(), dout.data(), kB, kT, kC, position, j);
      }
    }
  }

  const std::vector<float> wte_cpu = Load(wte), wpe_cpu = Load(wpe);
  std::vector<float> out_cpu(out.size()), dwte_cpu = dwte0, dwpe_cpu = dwpe0;
  cpu::EmbeddingForward(out_cpu.data(), kTokens.data(), wte_cpu.data(),
                        with_positions ? wpe_cpu.data() : nullptr, kB, kT, kC, kVocabBegin,
                        kVocabEnd, nullptr, positions);
  cpu::EmbeddingBackward(dwte_cpu.data(), with_positions ? dwpe_cpu.data() : nullptr,
                         Load(dout).data(), kTokens.data(), kB, kT, kC, kVocabBegin, kVocabEnd,
                         nullptr, positions);
  ExpectMatches(out, out_cpu, "out");
  // The float32 gradient tables sum each entry's rows in the CPU's order, whatever dout's type:
  // the CPU's sums of the same (widened) values, bit for bit.
  EXPECT_EQ(dwte, dwte_cpu) << "the token table's sums in the CPU's order";
  EXPECT_EQ(dwpe, dwpe_cpu) << "the position table's sums in the CPU's order";
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

// A frequent token's run, many of a block's passes long and many times kRunLoads rows, adds its
// rows in row order: the CPU's sums bit for bit. Runs of 33 (four groups of loads and one row
// more), 8 (one group), 6 (none: rows one by one) and 1, the last at the end of the sorted ids.
template <typename T>
void CheckLongRuns() {
  constexpr int b = 3, t = 16, c = 5, vocab = 6;
  std::vector<int32_t> tokens(b * t);
  for (int row = 0; row < b * t; ++row) {
    tokens[row] = row == 45 ? 5 : row % 8 == 3 ? 1 : row % 5 == 0 && row < 45 ? 2 : 4;
  }
  ASSERT_EQ(std::count(tokens.begin(), tokens.end(), 4), 33);
  ASSERT_EQ(std::count(tokens.begin(), tokens.end(), 2), 8);
  ASSERT_EQ(std::count(tokens.begin(), tokens.end(), 1), 6);
  const std::vector<T> dout = Store<T>(testing::RandomFloats(b * t * c, 6));
  std::vector<float> dwte = testing::RandomFloats(vocab * c, 7);
  std::vector<float> dwte_cpu = dwte;
  TableGrad(dwte.data(), dout.data(), tokens.data(), tokens.size(), c, 0, vocab);
  cpu::EmbeddingBackward(dwte_cpu.data(), static_cast<float*>(nullptr), Load(dout).data(),
                         tokens.data(), b, t, c, 0, vocab, nullptr);
  EXPECT_EQ(dwte, dwte_cpu);
}

TEST(CudaEmbeddingTest, ALongRunAddsItsRowsInRowOrder) {
  CheckLongRuns<float>();
  CheckLongRuns<Bf16>();
}

}  // namespace
}  // namespace dtrain::cuda
