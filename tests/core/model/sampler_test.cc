#include "core/model/sampler.h"

#include <cmath>
#include <iterator>
#include <utility>
#include <vector>

#include "core/backend/cpu/cpu_backend.h"
#include "core/model/init.h"
#include "gtest/gtest.h"
#include "tests/testing/flat_parameters.h"
#include "tests/testing/small_model.h"

namespace dtrain {
namespace {

// Logits that do not depend on the context, z = {2, 1, 0.5, 0, -1}, so that every draw is from
// one distribution; `contexts` records what each call was handed.
struct FixedLogits {
  static constexpr float kZ[] = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f};
  std::vector<std::vector<int32_t>> contexts;
  NextTokenLogits Callback() {
    return [this](const int32_t* context, int t, float* logits) {
      contexts.emplace_back(context, context + t);
      std::copy(std::begin(kZ), std::end(kZ), logits);
      return absl::OkStatus();
    };
  }
};

TEST(SamplerTest, GreedyTakesTheLargestLogitOverTheLastMaxTimeTokens) {
  FixedLogits fixed;
  SamplingOptions options{.max_new_tokens = 5, .temperature = 0.0f};
  const absl::StatusOr<std::vector<int32_t>> tokens =
      Generate(fixed.Callback(), 5, {4, 3, 2}, /*max_time=*/3, options);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(*tokens, (std::vector<int32_t>{4, 3, 2, 0, 0, 0, 0, 0}));
  ASSERT_EQ(fixed.contexts.size(), 5u);
  EXPECT_EQ(fixed.contexts[0], (std::vector<int32_t>{4, 3, 2}));
  EXPECT_EQ(fixed.contexts[1], (std::vector<int32_t>{3, 2, 0}));  // the last max_time tokens
}

// Drawn tokens follow softmax(z / T) over the top k: 20000 draws, each token's count within 5
// standard deviations of the binomial's mean (a sampler that ignored T, kept k + 1 tokens or
// drew uniformly is off by tens of them); none outside the top k.
TEST(SamplerTest, DrawsFollowTheSoftmaxOfTheTopKAtTheTemperature) {
  constexpr int kDraws = 20000;
  for (const auto& [temperature, top_k] : {std::pair{0.7f, 0}, std::pair{1.5f, 3}}) {
    SCOPED_TRACE(::testing::Message() << "T " << temperature << ", top_k " << top_k);
    FixedLogits fixed;
    const SamplingOptions options{
        .max_new_tokens = kDraws, .temperature = temperature, .top_k = top_k, .seed = 3};
    const absl::StatusOr<std::vector<int32_t>> tokens =
        Generate(fixed.Callback(), 5, {0}, /*max_time=*/2, options);
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    ASSERT_EQ(tokens->size(), kDraws + 1u);
    std::vector<int> counts(5, 0);
    for (size_t i = 1; i < tokens->size(); ++i) ++counts[(*tokens)[i]];
    const int kept = top_k == 0 ? 5 : top_k;
    double total = 0;
    for (int v = 0; v < kept; ++v) total += std::exp(FixedLogits::kZ[v] / temperature);
    for (int v = 0; v < 5; ++v) {
      const double p = v < kept ? std::exp(FixedLogits::kZ[v] / temperature) / total : 0;
      const double sigma = std::sqrt(kDraws * p * (1 - p));
      EXPECT_NEAR(counts[v], kDraws * p, 5 * sigma + 1e-9) << "token " << v;
    }
  }
}

TEST(SamplerTest, SameSeedSameTextAndTopOneIsGreedy) {
  CpuBackend backend(1);
  ModelConfig config = testing::SmallModelConfig(ModelFamily::kGpt2);
  config.init_std = 0.5f;  // large logits: sampling has something to choose between
  const ParamTable table(config, ModelSlice{});
  testing::FlatParameters parameters(table, backend);
  InitParameters(config, table, 2, 0, table.total_numel(), parameters.params().data());
  Transformer model(config, table, parameters, backend, 1, 8, Recompute::kNone);
  SamplingOptions options;
  options.max_new_tokens = 12;
  options.seed = 7;
  const auto a = Generate(model, {1, 2}, 8, options);
  EXPECT_EQ(a.size(), 14u);
  EXPECT_EQ(Generate(model, {1, 2}, 8, options), a);
  options.seed = 8;
  EXPECT_NE(Generate(model, {1, 2}, 8, options), a);

  options.temperature = 0.0f;
  const auto greedy = Generate(model, {1, 2}, 8, options);
  options.temperature = 1.0f;
  options.top_k = 1;
  EXPECT_EQ(Generate(model, {1, 2}, 8, options), greedy);
  for (int32_t token : greedy) EXPECT_LT(token, config.vocab_size);
}

}  // namespace
}  // namespace dtrain
