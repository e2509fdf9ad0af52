#include "core/backend/cpu/embedding.h"

#include <vector>

#include "core/backend/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/core/backend/cpu/test_util.h"

namespace dtrain::cpu {
namespace {

using testing::Difference;
using testing::Dot;
using testing::ExpectFloatMatches;
using testing::ExpectGradientMatches;
using testing::RandomVector;
using testing::ToFloat;

constexpr int kBatch = 2, kTime = 3, kChannels = 4, kVocab = 5;
// Token 1 repeats, so its gradient row sums several positions.
const std::vector<int32_t> kTokens = {1, 4, 1, 0, 1, 3};

TEST(EmbeddingTest, BackwardMatchesFiniteDifferences) {
  auto wte = RandomVector(kVocab * kChannels, 1);
  auto wpe = RandomVector(kTime * kChannels, 2);
  const auto r = RandomVector(kBatch * kTime * kChannels, 3);
  auto loss = [&] {
    std::vector<double> out(r.size());
    EmbeddingForward(out.data(), kTokens.data(), wte.data(), wpe.data(), kBatch, kTime, kChannels,
                     0, kVocab, nullptr);
    return Dot(out, r);
  };
  const auto dwte0 = RandomVector(wte.size(), 4), dwpe0 = RandomVector(wpe.size(), 5);
  auto dwte = dwte0, dwpe = dwpe0;
  EmbeddingBackward(dwte.data(), dwpe.data(), r.data(), kTokens.data(), kBatch, kTime, kChannels, 0,
                    kVocab, nullptr);
  ExpectGradientMatches(wte, loss, Difference(dwte, dwte0), "dwte");
  ExpectGradientMatches(wpe, loss, Difference(dwpe, dwpe0), "dwpe");
}

TEST(EmbeddingTest, FloatBackendMatchesDoubleWithAndWithoutPositions) {
  const int batch = 3, time = 50, channels = 130, vocab = 7;
  std::vector<int32_t> tokens(batch * time);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 5) % vocab);
  const auto wte = RandomVector(vocab * channels, 1), wpe = RandomVector(time * channels, 2);
  const auto dout = RandomVector(tokens.size() * channels, 3);
  CpuBackend backend(2);
  for (bool positions : {true, false}) {
    std::vector<double> out(dout.size()), dwte(wte.size()), dwpe(wpe.size());
    EmbeddingForward(out.data(), tokens.data(), wte.data(), positions ? wpe.data() : nullptr, batch,
                     time, channels, 0, vocab, nullptr);
    EmbeddingBackward(dwte.data(), positions ? dwpe.data() : nullptr, dout.data(), tokens.data(),
                      batch, time, channels, 0, vocab, nullptr);
    const auto wte_f = ToFloat(wte), wpe_f = ToFloat(wpe), dout_f = ToFloat(dout);
    std::vector<float> out_f(dout.size()), dwte_f(wte.size()), dwpe_f(wpe.size());
    backend.EmbeddingForward(out_f.data(), tokens.data(), wte_f.data(),
                             positions ? wpe_f.data() : nullptr, batch, time, channels, 0, vocab,
                             nullptr);
    backend.EmbeddingBackward(dwte_f.data(), positions ? dwpe_f.data() : nullptr, dout_f.data(),
                              tokens.data(), batch, time, channels, 0, vocab, nullptr);
    ExpectFloatMatches(out_f, out, "out");
    ExpectFloatMatches(dwte_f, dwte, "dwte");
    ExpectFloatMatches(dwpe_f, dwpe, "dwpe");
  }
}

// A vocabulary-parallel rank's table holds rows [2, 4) of the whole one: the rank's lookups are
// the whole table's for its tokens and zero rows (plus positions) for the others, and its
// gradient is the whole table's rows [2, 4). Bit for bit: the same additions in the same order.
TEST(EmbeddingTest, VocabularyRangeLooksUpAndAccumulatesOnlyItsRows) {
  const auto wte = RandomVector(kVocab * kChannels, 1), wpe = RandomVector(kTime * kChannels, 2);
  const auto dout = RandomVector(kBatch * kTime * kChannels, 3);
  std::vector<double> whole_out(dout.size()), whole_dwte(wte.size()), dwpe(wpe.size());
  EmbeddingForward(whole_out.data(), kTokens.data(), wte.data(), wpe.data(), kBatch, kTime,
                   kChannels, 0, kVocab, nullptr);
  EmbeddingBackward(whole_dwte.data(), dwpe.data(), dout.data(), kTokens.data(), kBatch, kTime,
                    kChannels, 0, kVocab, nullptr);
  const int begin = 2, end = 4;
  const std::vector<double> rows(wte.begin() + begin * kChannels, wte.begin() + end * kChannels);
  std::vector<double> out(dout.size()), dwte(rows.size()), dwpe_range(wpe.size());
  EmbeddingForward(out.data(), kTokens.data(), rows.data(), wpe.data(), kBatch, kTime, kChannels,
                   begin, end, nullptr);
  EmbeddingBackward(dwte.data(), dwpe_range.data(), dout.data(), kTokens.data(), kBatch, kTime,
                    kChannels, begin, end, nullptr);
  for (size_t row = 0; row < kTokens.size(); ++row) {
    const bool held = kTokens[row] >= begin && kTokens[row] < end;
    for (int j = 0; j < kChannels; ++j) {
      const double expected =
          held ? whole_out[row * kChannels + j] : wpe[(row % kTime) * kChannels + j];
      EXPECT_EQ(out[row * kChannels + j], expected) << "row " << row << " channel " << j;
    }
  }
  EXPECT_EQ(dwte, std::vector<double>(whole_dwte.begin() + begin * kChannels,
                                      whole_dwte.begin() + end * kChannels));
  EXPECT_EQ(dwpe_range, dwpe);
}

}  // namespace
}  // namespace dtrain::cpu
