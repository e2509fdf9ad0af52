#include "core/model/sampler.h"

#include "core/backend/cpu/cpu_backend.h"
#include "core/model/flat_parameters.h"
#include "core/model/init.h"
#include "gtest/gtest.h"
#include "tests/testing/small_model.h"

namespace dtrain {
namespace {

TEST(SamplerTest, SameSeedSameTextAndTopOneIsGreedy) {
  CpuBackend backend(1);
  ModelConfig config = testing::SmallModelConfig(ModelFamily::kGpt2);
  config.init_std = 0.5f;  // large logits: sampling has something to choose between
  const ParamTable table(config, ModelSlice{});
  FlatParameters parameters(table, backend);
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
