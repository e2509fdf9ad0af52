#include "core/model/sampler.h"

#include "core/backend/cpu/cpu_backend.h"
#include "core/model/flat_parameters.h"
#include "core/model/init.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace {

ModelConfig Tiny() {
  ModelConfig config;
  config.n_layer = 1;
  config.n_head = 2;
  config.n_kv_head = 2;
  config.d_model = 16;
  config.head_dim = 8;
  config.d_ff = 32;
  config.vocab_size = 40;
  config.max_seq_len = 8;
  config.init_std = 0.5f;  // large logits: sampling has something to choose between
  return config;
}

TEST(SamplerTest, SameSeedSameTextAndTopOneIsGreedy) {
  CpuBackend backend(1);
  const ModelConfig config = Tiny();
  const ParamTable table(config, ModelSlice{});
  FlatParameters parameters(table);
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
  for (int32_t token : greedy) EXPECT_LT(token, 40);
}

}  // namespace
}  // namespace dtrain
