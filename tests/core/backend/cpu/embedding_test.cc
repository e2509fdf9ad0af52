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
                     nullptr);
    return Dot(out, r);
  };
  const auto dwte0 = RandomVector(wte.size(), 4), dwpe0 = RandomVector(wpe.size(), 5);
  auto dwte = dwte0, dwpe = dwpe0;
  EmbeddingBackward(dwte.data(), dwpe.data(), r.data(), kTokens.data(), kBatch, kTime, kChannels,
                    nullptr);
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
                     time, channels, nullptr);
    EmbeddingBackward(dwte.data(), positions ? dwpe.data() : nullptr, dout.data(), tokens.data(),
                      batch, time, channels, nullptr);
    const auto wte_f = ToFloat(wte), wpe_f = ToFloat(wpe), dout_f = ToFloat(dout);
    std::vector<float> out_f(dout.size()), dwte_f(wte.size()), dwpe_f(wpe.size());
    backend.EmbeddingForward(out_f.data(), tokens.data(), wte_f.data(),
                             positions ? wpe_f.data() : nullptr, batch, time, channels);
    backend.EmbeddingBackward(dwte_f.data(), positions ? dwpe_f.data() : nullptr, dout_f.data(),
                              tokens.data(), batch, time, channels);
    ExpectFloatMatches(out_f, out, "out");
    ExpectFloatMatches(dwte_f, dwte, "dwte");
    ExpectFloatMatches(dwpe_f, dwpe, "dwpe");
  }
}

}  // namespace
}  // namespace dtrain::cpu
