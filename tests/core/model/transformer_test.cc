#include "core/model/transformer.h"

#include <cmath>
#include <vector>

#include "core/backend/cpu/cpu_backend.h"
#include "core/data/sft_data.h"
#include "core/model/init.h"
#include "gtest/gtest.h"
#include "tests/testing/flat_parameters.h"
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
            Recompute recompute, uint64_t seed)
      : table(config, ModelSlice{}),
        parameters(table, backend),
        model(config, table, parameters, backend, max_batch, max_time, recompute) {
    InitParameters(config, table, seed, 0, table.total_numel(), parameters.params().data());
  }
  ParamTable table;
  testing::FlatParameters parameters;
  Transformer model;
};

class TransformerTest : public ::testing::TestWithParam<ModelFamily> {};

// Recomputing the attention core (selective) or each block's forward (full) in backward must not
// change a single bit of the loss or the gradients, and must keep fewer activations.
TEST_P(TransformerTest, RecomputationGivesIdenticalGradients) {
  const ModelConfig config = testing::SmallModelConfig(GetParam());
  CpuBackend backend(2);
  TestModel plain(config, backend, 2, 11, Recompute::kNone, 5);
  const auto inputs = Tokens(22, config.vocab_size, 1), targets = Tokens(22, config.vocab_size, 2);
  const double loss =
      testing::ForwardBackwardLoss(plain.model, inputs.data(), targets.data(), 2, 11, 0.5f);
  const auto grads = plain.parameters.grads();
  size_t previous_bytes = plain.model.activation_bytes();
  for (Recompute recompute : {Recompute::kSelective, Recompute::kFull}) {
    SCOPED_TRACE(RecomputeName(recompute));
    TestModel recomputed(config, backend, 2, 11, recompute, 5);
    EXPECT_EQ(
        testing::ForwardBackwardLoss(recomputed.model, inputs.data(), targets.data(), 2, 11, 0.5f),
        loss);
    const auto recomputed_grads = recomputed.parameters.grads();
    ASSERT_EQ(recomputed_grads.size(), grads.size());
    for (size_t i = 0; i < grads.size(); ++i) ASSERT_EQ(recomputed_grads[i], grads[i]) << i;
    EXPECT_LT(recomputed.model.activation_bytes(), previous_bytes);
    previous_bytes = recomputed.model.activation_bytes();
  }
}

// Selective drops exactly the attention cores of all blocks but one: the output (N, H*D) and
// the log-sum-exp (B, H, T) of each.
TEST_P(TransformerTest, SelectiveDropsTheAttentionCoresOfAllBlocksButOne) {
  const ModelConfig config = testing::SmallModelConfig(GetParam());
  CpuBackend backend(1);
  const int b = 2, t = 11;
  TestModel plain(config, backend, b, t, Recompute::kNone, 5);
  TestModel selective(config, backend, b, t, Recompute::kSelective, 5);
  const size_t core_floats = static_cast<size_t>(b) * t * config.n_head * config.head_dim +
                             static_cast<size_t>(b) * config.n_head * t;
  EXPECT_EQ(plain.model.activation_bytes() - selective.model.activation_bytes(),
            (config.n_layer - 1) * core_floats * sizeof(float));
}

// The size checks before allocation (core/model/model_size.h, parallel/rank_memory.h) rest on
// this estimate: it must be what the model allocates.
TEST_P(TransformerTest, ActivationBytesIsWhatTheModelAllocates) {
  const ModelConfig config = testing::SmallModelConfig(GetParam());
  CpuBackend backend(1);
  for (const Recompute recompute : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    TestModel test(config, backend, 3, 7, recompute, 5);
    EXPECT_EQ(Transformer::ActivationBytes(config, 3, 7, recompute),
              static_cast<double>(test.model.activation_bytes()));
  }
}

// Two micro-batches accumulate to the gradient of the whole batch (up to float rounding).
TEST_P(TransformerTest, MicroBatchesAccumulateToTheWholeBatchGradient) {
  const ModelConfig config = testing::SmallModelConfig(GetParam());
  CpuBackend backend(1);
  TestModel whole(config, backend, 4, 8, Recompute::kNone, 9);
  TestModel halves(config, backend, 2, 8, Recompute::kNone, 9);
  const auto inputs = Tokens(32, config.vocab_size, 3), targets = Tokens(32, config.vocab_size, 4);
  const float scale = 1.0f / 32;
  const double loss =
      testing::ForwardBackwardLoss(whole.model, inputs.data(), targets.data(), 4, 8, scale);
  double loss_halves =
      testing::ForwardBackwardLoss(halves.model, inputs.data(), targets.data(), 2, 8, scale);
  loss_halves += testing::ForwardBackwardLoss(halves.model, inputs.data() + 16, targets.data() + 16,
                                              2, 8, scale);
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
  TestModel test_model(config, backend, 2, 9, Recompute::kNone, 1);
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
  // Bit for bit: both run the same classifier kernel on the same (18, C) x (C, V) product.
  EXPECT_EQ(testing::ForwardBackwardLoss(model, inputs.data(), targets.data(), 2, 9, 1.0f), loss);
  EXPECT_NEAR(loss / 18, std::log(static_cast<double>(config.vocab_size)), 0.1);

  // The last positions' logits come from (1, C) x (C, V) products, the others from one
  // (18, C) x (C, V) product: BLAS picks its kernel by shape and CPU (OPENBLAS_CORETYPE), so
  // each logit's C-term dot product may be summed in another order. Summed in any order, a
  // float dot product is within gamma_C * sum_k |x_k w_jk| of the exact one, gamma_C =
  // C u / (1 - C u), u = 2^-24 (Higham, Accuracy and Stability of Numerical Algorithms, 3.1).
  // At init the final norm's rows have mean square <= 1 (weight 1, bias 0), so by
  // Cauchy-Schwarz sum_k |x_k w_jk| <= sqrt(C) |w_j|: the two paths differ by at most twice that.
  const int c = config.d_model;
  const double u = std::ldexp(1.0, -24), gamma = c * u / (1 - c * u);
  const float* head = test_model.parameters.params().data() + test_model.table.head();
  std::vector<float> last(2 * config.vocab_size);
  model.ForwardLogits(inputs.data(), 2, 9, true, last.data());
  for (int j = 0; j < config.vocab_size; ++j) {
    double row_norm = 0;
    for (int k = 0; k < c; ++k) row_norm += static_cast<double>(head[j * c + k]) * head[j * c + k];
    const double tolerance = 2 * gamma * std::sqrt(c * row_norm);
    EXPECT_NEAR(last[j], logits[8 * config.vocab_size + j], tolerance) << j;
    EXPECT_NEAR(last[config.vocab_size + j], logits[17 * config.vocab_size + j], tolerance) << j;
  }
}

TEST_P(TransformerTest, InitFollowsGpt2) {
  ModelConfig config = testing::SmallModelConfig(GetParam());
  config.d_model = 256;
  config.head_dim = 64;
  config.d_ff = 512;
  CpuBackend backend(1);
  TestModel model(config, backend, 1, 4, Recompute::kNone, 3);
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

// Documents packed into rows (SFT): with each token's position in its own document, every
// document gets the logits, the loss and the gradients it gets alone in a row. Rows of 150
// tokens span three 64-row query blocks of the attention kernel, so a block that starts inside
// a later document is exercised too. Packed and alone run the same kernels on GEMMs of other
// shapes (M = 300 rows against 30..70), so BLAS may sum a dot product in another order: each
// float32 GEMM is then within gamma_K (K <= 96 terms, about 6e-6) of the exact product in
// relative terms, and three blocks' worth of such differences stay far below 1e-4 of the largest
// logit or gradient; a wrong mask or position moves them by O(1) of it.
TEST_P(TransformerTest, PackedDocumentsMatchEachDocumentAlone) {
  ModelConfig config = testing::SmallModelConfig(GetParam());
  config.max_seq_len = 160;
  CpuBackend backend(2);
  const int t = 150;
  // Two rows: documents of 70, 50 and 30 tokens, then of 30, 50 and 70.
  const std::vector<std::vector<int>> rows = {{70, 50, 30}, {30, 50, 70}};
  const auto inputs = Tokens(2 * t, config.vocab_size, 7);
  auto targets = Tokens(2 * t, config.vocab_size, 8);
  std::vector<int32_t> positions(2 * t);
  int at = 0;
  for (const auto& row : rows) {
    for (const int length : row) {
      for (int i = 0; i < length; ++i) positions[at + i] = i;
      targets[at + length - 1] = -1;  // no target across a document's end
      at += length;
    }
  }
  TestModel packed(config, backend, 2, t, Recompute::kSelective, 3);
  TestModel alone(config, backend, 1, t, Recompute::kSelective, 3);
  const int v = config.vocab_size;
  std::vector<float> packed_logits(2 * t * v);
  packed.model.ForwardLogits(inputs.data(), 2, t, false, packed_logits.data(), positions.data());
  const double packed_loss = testing::ForwardBackwardLoss(
      packed.model, inputs.data(), targets.data(), 2, t, 0.01f, positions.data());
  double alone_loss = 0;
  double max_logit = 0, max_logit_diff = 0;
  at = 0;
  for (const auto& row : rows) {
    for (const int length : row) {
      std::vector<float> logits(length * v);
      alone.model.ForwardLogits(inputs.data() + at, 1, length, false, logits.data());
      for (size_t i = 0; i < logits.size(); ++i) {
        const double packed_value = packed_logits[static_cast<size_t>(at) * v + i];
        max_logit = std::max(max_logit, std::abs(packed_value));
        max_logit_diff = std::max(max_logit_diff, std::abs(packed_value - logits[i]));
      }
      alone_loss += testing::ForwardBackwardLoss(alone.model, inputs.data() + at,
                                                 targets.data() + at, 1, length, 0.01f);
      at += length;
    }
  }
  EXPECT_LT(max_logit_diff, 1e-4 * max_logit);
  EXPECT_NEAR(packed_loss, alone_loss, 1e-5 * alone_loss);
  const auto a = packed.parameters.grads(), b = alone.parameters.grads();
  double max_abs = 0, max_diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_abs = std::max(max_abs, std::abs(static_cast<double>(b[i])));
    max_diff = std::max(max_diff, std::abs(static_cast<double>(a[i]) - b[i]));
  }
  EXPECT_LT(max_diff, 1e-4 * max_abs);

  // Without positions the row is one causal sequence: the later documents see the earlier ones.
  std::vector<float> causal_logits(2 * t * v);
  packed.model.ForwardLogits(inputs.data(), 2, t, false, causal_logits.data());
  double causal_diff = 0;
  for (size_t i = 0; i < causal_logits.size(); ++i) {
    causal_diff =
        std::max(causal_diff, std::abs(static_cast<double>(causal_logits[i]) - packed_logits[i]));
  }
  EXPECT_GT(causal_diff, 1e-2 * max_logit);
}

// The mask test of SFT: a packed batch of samples whose prompts are masked (targets -1). Its
// loss sum over the counted targets, divided by their count, is the mean cross-entropy of the
// completion tokens computed independently: from each sample's own logits, alone in a row, in
// double. Float32 activations and other GEMM shapes (as above) keep them within 1e-5 relative.
// A batch whose targets are all masked has loss 0 and exactly zero gradient everywhere.
TEST_P(TransformerTest, MaskedTargetsCountNothing) {
  const ModelConfig config = testing::SmallModelConfig(GetParam());
  CpuBackend backend(2);
  const int t = 16, v = config.vocab_size;
  std::vector<SftSample> samples;
  for (const auto& [size, prompt] : {std::pair{7, 3}, {6, 4}, {9, 2}, {5, 1}, {8, 5}}) {
    SftSample sample;
    sample.tokens = Tokens(size, v, size + prompt);
    for (int i = 0; i < size; ++i) sample.trained.push_back(i >= prompt ? 1 : 0);
    samples.push_back(sample);
  }
  const SftRows rows = PackSftRows(samples, t, true, LongSamplePolicy::kTruncate);
  ASSERT_EQ(rows.rows, 3);
  TestModel packed(config, backend, 3, t, Recompute::kNone, 4);
  const double loss_sum =
      testing::ForwardBackwardLoss(packed.model, rows.inputs.data(), rows.targets.data(), 3, t,
                                   1.0f / rows.trained_tokens, rows.positions.data());

  double independent = 0;
  int counted = 0;
  for (const SftSample& sample : samples) {
    const int n = static_cast<int>(sample.tokens.size()) - 1;
    std::vector<float> logits(static_cast<size_t>(n) * v);
    packed.model.ForwardLogits(sample.tokens.data(), 1, n, false, logits.data());
    for (int i = 0; i < n; ++i) {
      if (!sample.trained[i + 1]) continue;
      const float* l = logits.data() + static_cast<size_t>(i) * v;
      double max = l[0], sum = 0;
      for (int j = 0; j < v; ++j) max = std::max<double>(max, l[j]);
      for (int j = 0; j < v; ++j) sum += std::exp(l[j] - max);
      independent += max + std::log(sum) - l[sample.tokens[i + 1]];
      ++counted;
    }
  }
  ASSERT_EQ(counted, rows.trained_tokens);
  EXPECT_NEAR(loss_sum / counted, independent / counted, 1e-5 * independent / counted);

  TestModel masked(config, backend, 3, t, Recompute::kNone, 4);
  const std::vector<int32_t> none(rows.targets.size(), -1);
  EXPECT_EQ(testing::ForwardBackwardLoss(masked.model, rows.inputs.data(), none.data(), 3, t, 1.0f,
                                         rows.positions.data()),
            0.0);
  for (const float g : masked.parameters.grads()) ASSERT_EQ(g, 0.0f);
}

INSTANTIATE_TEST_SUITE_P(Families, TransformerTest,
                         ::testing::Values(ModelFamily::kGpt2, ModelFamily::kLlama),
                         [](const auto& info) { return std::string(FamilyName(info.param)); });

}  // namespace
}  // namespace dtrain
