#include "core/model/transformer.h"

#include <cmath>
#include <vector>

#include "core/backend/cpu/cpu_backend.h"
#include "core/model/flat_parameters.h"
#include "core/model/init.h"
#include "gtest/gtest.h"
#include "tests/testing/small_model.h"

namespace dtrain {
namespace {

std::vector<int32_t> Tokens(size_t n, int vocab, int salt) {
  std::vector<int32_t> tokens(n);
  for (size_t i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>((i * 7 + salt * 13) % vocab);
  return tokens;
}

// A model with its own flat parameters, initialised from `seed`.
struct TestModel {
  TestModel(const ModelConfig& config, Backend& backend, int max_batch, int max_time,
            bool checkpointing, uint64_t seed)
      : table(config, ModelSlice{}),
        parameters(table),
        model(config, table, parameters, backend, max_batch, max_time, checkpointing) {
    InitParameters(config, table, seed, 0, table.total_numel(), parameters.params().data());
  }
  ParamTable table;
  FlatParameters parameters;
  Transformer model;
};

class TransformerTest : public ::testing::TestWithParam<ModelFamily> {};

// Re-running each block's forward in backward must not change a single bit of the gradients.
TEST_P(TransformerTest, ActivationCheckpointingGivesIdenticalGradients) {
  const ModelConfig config = testing::SmallModelConfig(GetParam());
  CpuBackend backend(2);
  TestModel plain(config, backend, 2, 11, false, 5);
  TestModel checkpointed(config, backend, 2, 11, true, 5);
  const auto inputs = Tokens(22, config.vocab_size, 1), targets = Tokens(22, config.vocab_size, 2);
  const double loss_a = plain.model.ForwardBackward(inputs.data(), targets.data(), 2, 11, 0.5f);
  const double loss_b =
      checkpointed.model.ForwardBackward(inputs.data(), targets.data(), 2, 11, 0.5f);
  EXPECT_EQ(loss_a, loss_b);
  const auto a = plain.parameters.grads(), b = checkpointed.parameters.grads();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << i;
  EXPECT_LT(checkpointed.model.activation_bytes(), plain.model.activation_bytes());
}

// The size checks before allocation (core/model/model_size.h, parallel/rank_memory.h) rest on
// this estimate: it must be what the model allocates.
TEST_P(TransformerTest, ActivationBytesIsWhatTheModelAllocates) {
  const ModelConfig config = testing::SmallModelConfig(GetParam());
  CpuBackend backend(1);
  for (const bool checkpointing : {false, true}) {
    TestModel test(config, backend, 3, 7, checkpointing, 5);
    EXPECT_EQ(Transformer::ActivationBytes(config, 3, 7, checkpointing),
              static_cast<double>(test.model.activation_bytes()));
  }
}

// Two micro-batches accumulate to the gradient of the whole batch (up to float rounding).
TEST_P(TransformerTest, MicroBatchesAccumulateToTheWholeBatchGradient) {
  const ModelConfig config = testing::SmallModelConfig(GetParam());
  CpuBackend backend(1);
  TestModel whole(config, backend, 4, 8, false, 9);
  TestModel halves(config, backend, 2, 8, false, 9);
  const auto inputs = Tokens(32, config.vocab_size, 3), targets = Tokens(32, config.vocab_size, 4);
  const float scale = 1.0f / 32;
  const double loss = whole.model.ForwardBackward(inputs.data(), targets.data(), 4, 8, scale);
  double loss_halves = halves.model.ForwardBackward(inputs.data(), targets.data(), 2, 8, scale);
  loss_halves += halves.model.ForwardBackward(inputs.data() + 16, targets.data() + 16, 2, 8, scale);
  EXPECT_NEAR(loss_halves, loss, 1e-6 * loss);  // float32 activations
  double max_abs = 0, max_diff = 0;
  const auto a = whole.parameters.grads(), b = halves.parameters.grads();
  for (size_t i = 0; i < a.size(); ++i) {
    max_abs = std::max(max_abs, std::abs(static_cast<double>(a[i])));
    max_diff = std::max(max_diff, std::abs(static_cast<double>(a[i]) - b[i]));
  }
  EXPECT_LT(max_diff, 1e-5 * max_abs);
}

// The loss-only path, the logits path and the training path agree; at init the loss is near
// log(V) (GPT-2 init makes the logits small).
TEST_P(TransformerTest, LossLogitsAndTrainingPathsAgree) {
  const ModelConfig config = testing::SmallModelConfig(GetParam());
  CpuBackend backend(2);
  TestModel test_model(config, backend, 2, 9, false, 1);
  Transformer& model = test_model.model;
  const auto inputs = Tokens(18, config.vocab_size, 5), targets = Tokens(18, config.vocab_size, 6);
  const double loss = model.ForwardLoss(inputs.data(), targets.data(), 2, 9);
  std::vector<float> logits(18 * config.vocab_size);
  model.ForwardLogits(inputs.data(), 2, 9, false, logits.data());
  double from_logits = 0;
  for (int row = 0; row < 18; ++row) {
    const float* l = logits.data() + row * config.vocab_size;
    double max = l[0], sum = 0;
    for (int j = 0; j < config.vocab_size; ++j) max = std::max<double>(max, l[j]);
    for (int j = 0; j < config.vocab_size; ++j) sum += std::exp(l[j] - max);
    from_logits += max + std::log(sum) - l[targets[row]];
  }
  EXPECT_NEAR(loss, from_logits, 1e-5 * loss);
  EXPECT_EQ(model.ForwardBackward(inputs.data(), targets.data(), 2, 9, 1.0f), loss);
  EXPECT_NEAR(loss / 18, std::log(static_cast<double>(config.vocab_size)), 0.1);

  std::vector<float> last(2 * config.vocab_size);
  model.ForwardLogits(inputs.data(), 2, 9, true, last.data());
  for (int j = 0; j < config.vocab_size; ++j) {
    EXPECT_FLOAT_EQ(last[j], logits[8 * config.vocab_size + j]);
    EXPECT_FLOAT_EQ(last[config.vocab_size + j], logits[17 * config.vocab_size + j]);
  }
}

TEST_P(TransformerTest, InitFollowsGpt2) {
  ModelConfig config = testing::SmallModelConfig(GetParam());
  config.d_model = 256;
  config.head_dim = 64;
  config.d_ff = 512;
  CpuBackend backend(1);
  TestModel model(config, backend, 1, 4, false, 3);
  const auto params = model.parameters.params();
  auto stddev = [&](const std::string& name) {
    const TensorEntry* entry = model.table.Find(name);
    EXPECT_NE(entry, nullptr) << name;
    double sum = 0, sum_sq = 0;
    for (size_t i = 0; i < entry->numel; ++i) {
      const double x = params[entry->offset + i];
      sum += x;
      sum_sq += x * x;
    }
    const double mean = sum / entry->numel;
    return std::sqrt(sum_sq / entry->numel - mean * mean);
  };
  EXPECT_NEAR(stddev("blocks.0.attn.qkv.weight"), 0.02, 0.001);
  EXPECT_NEAR(stddev("blocks.0.mlp.down.weight"), 0.02 / std::sqrt(6.0), 0.0005);
  EXPECT_EQ(params[model.table.Find("blocks.1.norm2.weight")->offset], 1.0f);
  // The same seed gives the same weights; another seed others; any range of the buffer
  // initialises exactly as the whole (a shard of a sharded model).
  std::vector<float> again(params.size());
  InitParameters(config, model.table, 3, 0, again.size(), again.data());
  EXPECT_TRUE(std::equal(again.begin(), again.end(), params.begin()));
  const size_t begin = 1234, end = params.size() - 777;
  std::vector<float> shard(end - begin);
  InitParameters(config, model.table, 3, begin, end, shard.data());
  EXPECT_TRUE(std::equal(shard.begin(), shard.end(), params.begin() + begin));
  InitParameters(config, model.table, 4, 0, again.size(), again.data());
  EXPECT_FALSE(std::equal(again.begin(), again.end(), params.begin()));
}

INSTANTIATE_TEST_SUITE_P(Families, TransformerTest,
                         ::testing::Values(ModelFamily::kGpt2, ModelFamily::kLlama),
                         [](const auto& info) { return std::string(FamilyName(info.param)); });

}  // namespace
}  // namespace dtrain
