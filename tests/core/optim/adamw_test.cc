#include "core/optim/adamw.h"

#include <cmath>
#include <vector>

#include "core/backend/cpu/cpu_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/small_model.h"

namespace dtrain {
namespace {

// With a zero gradient, AdamW only decays: p *= 1 - lr * wd for decayed tensors, unchanged for
// those matching train.no_decay.
TEST(AdamWTest, NoDecayPatternsSelectTensorsByName) {
  CpuBackend backend(1);
  const ParamTable table(testing::SmallModelConfig(ModelFamily::kGpt2), ModelSlice{});
  TrainSection train;
  train.weight_decay = 0.5;
  train.no_decay = {"*.bias", "*norm*", "embed.positions"};
  AdamW optimizer(table, train, backend, 0, table.total_numel());
  std::vector<float> params(table.total_numel(), 1.0f), grads(table.total_numel(), 0.0f);
  optimizer.Step(backend, params.data(), nullptr, grads.data(), 0.1f, 1.0f);
  for (const TensorEntry& entry : table.entries()) {
    const bool matrix =
        entry.name.ends_with(".weight") && entry.name.find("norm") == std::string::npos;
    const bool decayed = entry.name == "embed.tokens" || matrix;
    const float expected = decayed ? 1.0f - 0.1f * 0.5f : 1.0f;
    // Within 4 ulps: the kernel rounds 1 - lr * wd from double, the test computes it in float.
    EXPECT_FLOAT_EQ(params[entry.offset], expected) << entry.name;
  }
  size_t decayed_numel = 0;
  for (const TensorEntry& entry : table.entries()) {
    if (params[entry.offset] != 1.0f) decayed_numel += entry.numel;
  }
  EXPECT_EQ(optimizer.decayed_numel(), decayed_numel);
}

// Users know Hugging Face names: a glob matches a tensor by either name, and where one internal
// tensor holds several Hugging Face tensors (Llama's fused q/k/v rows) only the matching rows
// are exempt.
TEST(AdamWTest, NoDecayPatternsMatchHuggingFaceNames) {
  CpuBackend backend(1);
  const ModelConfig small = testing::SmallModelConfig(ModelFamily::kGpt2);
  const ParamTable gpt2(small, ModelSlice{});
  TrainSection train;
  // blocks.N.norm1.weight of every block, by the names of GPT-2's own file and of
  // GPT2LMHeadModel's (with "transformer.").
  for (const char* pattern : {"h.*.ln_1.weight", "transformer.h.*.ln_1.weight"}) {
    train.no_decay = {pattern};
    EXPECT_EQ(AdamW(gpt2, train, backend, 0, gpt2.total_numel()).decayed_numel(),
              gpt2.total_numel() - small.n_layer * gpt2.Find("blocks.0.norm1.weight")->numel)
        << pattern;
  }

  ModelConfig config = testing::SmallModelConfig(ModelFamily::kGpt2);
  config.family = ModelFamily::kLlama;
  config.n_kv_head = 1;
  const ParamTable llama(config, ModelSlice{});
  const TensorEntry& qkv = *llama.Find("blocks.0.attn.qkv.weight");
  train.no_decay = {"model.layers.0.self_attn.q_proj.weight", "model.norm.weight"};
  const size_t q_numel = static_cast<size_t>(config.n_head) * config.head_dim * config.d_model;
  AdamW optimizer(llama, train, backend, 0, llama.total_numel());
  EXPECT_EQ(optimizer.decayed_numel(),
            llama.total_numel() - q_numel - llama.Find("final_norm.weight")->numel);

  // The exempt rows are the query rows, the first of the fused tensor.
  train.weight_decay = 0.5;
  AdamW decaying(llama, train, backend, 0, llama.total_numel());
  std::vector<float> params(llama.total_numel(), 1.0f), grads(llama.total_numel(), 0.0f);
  decaying.Step(backend, params.data(), nullptr, grads.data(), 0.1f, 1.0f);
  EXPECT_EQ(params[qkv.offset + q_numel - 1], 1.0f);
  EXPECT_FLOAT_EQ(params[qkv.offset + q_numel], 1.0f - 0.1f * 0.5f);
}

// A glob that matches no tensor by any of its names would exempt nothing: an error naming it,
// but for the defaults (a Llama has no biases for "*.bias").
TEST(AdamWTest, NoDecayGlobThatMatchesNothingIsAnError) {
  const ModelConfig gpt2 = testing::SmallModelConfig(ModelFamily::kGpt2);
  const ModelConfig llama = testing::SmallModelConfig(ModelFamily::kLlama);
  EXPECT_TRUE(CheckNoDecay(llama, TrainSection{}.no_decay).ok());
  EXPECT_TRUE(CheckNoDecay(gpt2, {"transformer.wpe.weight", "h.*.ln_*", "blocks.1.*"}).ok());
  EXPECT_TRUE(CheckNoDecay(llama, {"model.layers.*.input_layernorm.weight"}).ok());

  const absl::Status typo = CheckNoDecay(llama, {"*norm*", "model.layer.*.input_layernorm.weight"});
  EXPECT_TRUE(absl::IsInvalidArgument(typo));
  EXPECT_EQ(typo.message(),
            "train.no_decay: 'model.layer.*.input_layernorm.weight' matches no tensor of this "
            "llama model, so it exempts nothing from weight decay; globs match dtrain's names "
            "(blocks.0.norm1.weight) or Hugging Face's (model.layers.0.input_layernorm.weight): "
            "fix the glob or remove it");
  // Llama's names are not GPT-2's, and GPT-2's head is its embedding.
  EXPECT_FALSE(CheckNoDecay(llama, {"transformer.h.*"}).ok());
  EXPECT_THAT(std::string(CheckNoDecay(gpt2, {"lm_head.weight"}).message()),
              ::testing::HasSubstr("; GPT-2's head is its token embedding, wte.weight: fix"));
}

// A tensor-parallel shard decays as the whole model's tensor does: a Hugging Face glob exempts
// the same values at tp 2 as at tp 1, in the vocabulary-sharded embedding and head, the
// head-sharded q/k/v rows and the column-sharded output projection alike.
TEST(AdamWTest, NoDecayPatternsExemptTheSameValuesAtEveryTensorParallelSize) {
  CpuBackend backend(1);
  const ModelConfig config = testing::SmallModelConfig(ModelFamily::kLlama);
  TrainSection train;
  train.weight_decay = 0.5;
  train.no_decay = {"*embed_tokens*", "*.q_proj.weight", "*.o_proj.weight", "*norm*"};
  // One step on zero gradients: each value reads 1 where exempt, 1 - lr * wd where decayed.
  const auto step = [&](const ParamTable& table) {
    AdamW optimizer(table, train, backend, 0, table.total_numel());
    std::vector<float> params(table.total_numel(), 1.0f), grads(table.total_numel(), 0.0f);
    optimizer.Step(backend, params.data(), nullptr, grads.data(), 0.1f, 1.0f);
    return params;
  };
  const ParamTable whole(config, ModelSlice{});
  const std::vector<float> expected = step(whole);
  size_t compared = 0, exempt = 0, shards_numel = 0;
  for (int tp_rank = 0; tp_rank < 2; ++tp_rank) {
    const ParamTable shard(config, ModelSlice{.tp_rank = tp_rank, .tp_size = 2});
    const std::vector<float> got = step(shard);
    shards_numel += shard.total_numel();
    for (const TensorEntry& entry : shard.entries()) {
      const TensorEntry& global = *whole.Find(entry.name);
      ForEachGlobalRun(entry, 0, entry.numel, [&](size_t local, size_t at, size_t count) {
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(got[entry.offset + local + i], expected[global.offset + at + i])
              << entry.name << " tp rank " << tp_rank << " element " << local + i;
          exempt += got[entry.offset + local + i] == 1.0f;
        }
        compared += count;
      });
    }
  }
  EXPECT_EQ(compared, shards_numel);
  EXPECT_GT(exempt, 0u);
}

// A sharded optimizer updates only its own range, and its result there equals the unsharded
// optimizer's.
TEST(AdamWTest, RangeStepMatchesTheWholeBufferStep) {
  CpuBackend backend(1);
  const ParamTable table(testing::SmallModelConfig(ModelFamily::kGpt2), ModelSlice{});
  TrainSection train;
  std::vector<float> whole(table.total_numel()), grads(table.total_numel());
  for (size_t i = 0; i < whole.size(); ++i) {
    whole[i] = std::sin(0.1f * i);
    grads[i] = std::cos(0.3f * i);
  }
  std::vector<float> sharded = whole;
  AdamW full(table, train, backend, 0, table.total_numel());
  const size_t begin = 7, end = table.total_numel() - 5;
  AdamW shard(table, train, backend, begin, end);
  for (int step = 0; step < 3; ++step) {
    full.Step(backend, whole.data(), nullptr, grads.data(), 1e-2f, 1.0f);
    shard.Step(backend, sharded.data() + begin, nullptr, grads.data() + begin, 1e-2f, 1.0f);
  }
  for (size_t i = 0; i < whole.size(); ++i) {
    if (i >= begin && i < end) {
      // Bit for bit: every value takes the same instructions wherever the range starts.
      EXPECT_EQ(sharded[i], whole[i]) << i;
    } else {
      EXPECT_EQ(sharded[i], std::sin(0.1f * i)) << i;  // untouched outside the shard
    }
  }
}

// The step reads the gradients scaled (here by 0.5, exact, so bit for bit the step on gradients
// scaled beforehand, as the engine did before AdamW took the scale) and writes the bf16 copy of
// every updated value.
TEST(AdamWTest, TheStepScalesTheGradientsAndWritesTheBf16Copy) {
  CpuBackend backend(1);
  const ParamTable table(testing::SmallModelConfig(ModelFamily::kGpt2), ModelSlice{});
  TrainSection train;
  train.weight_decay = 0.1;
  const size_t n = table.total_numel();
  std::vector<float> scaled_in_step(n), grads(n), halved(n);
  for (size_t i = 0; i < n; ++i) {
    scaled_in_step[i] = std::sin(0.1f * i);
    grads[i] = std::cos(0.3f * i);
    halved[i] = grads[i] * 0.5f;
  }
  std::vector<float> scaled_before = scaled_in_step;
  std::vector<Bf16> copy(n);
  AdamW fused(table, train, backend, 0, n), plain(table, train, backend, 0, n);
  for (int step = 0; step < 3; ++step) {
    fused.Step(backend, scaled_in_step.data(), copy.data(), grads.data(), 1e-2f, 0.5f);
    plain.Step(backend, scaled_before.data(), nullptr, halved.data(), 1e-2f, 1.0f);
  }
  EXPECT_EQ(scaled_in_step, scaled_before);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(copy[i].bits, cuda::FromFloat<Bf16>(scaled_in_step[i]).bits) << i;
  }
}

}  // namespace
}  // namespace dtrain
