#include "core/model/param_table.h"

#include "gtest/gtest.h"
#include "tests/testing/configs.h"

namespace dtrain {
namespace {

using testing::ShippedModelConfig;

// Published parameter counts (GPT-2 with V = 50257 and 1024 positions; Llama from Meta's
// model cards, untied head).
TEST(ParamTableTest, ParameterCountsMatchPublishedModels) {
  EXPECT_EQ(ShippedModelConfig("gpt2-124m").num_parameters(), 124'439'808);
  EXPECT_EQ(ShippedModelConfig("gpt2-350m").num_parameters(), 354'823'168);
  EXPECT_EQ(ShippedModelConfig("gpt2-774m").num_parameters(), 774'030'080);
  EXPECT_EQ(ShippedModelConfig("gpt2-1.5b").num_parameters(), 1'557'611'200);
  EXPECT_EQ(ShippedModelConfig("llama-7b").num_parameters(), 6'738'415'616);
  EXPECT_EQ(ShippedModelConfig("llama-13b").num_parameters(), 13'015'864'320);
  EXPECT_EQ(ShippedModelConfig("llama-70b").num_parameters(), 68'976'648'192);
}

TEST(ParamTableTest, TableCoversExactlyTheParameters) {
  for (const char* name : {"tiny", "llama-tiny", "gpt2-124m"}) {
    const ModelConfig config = ShippedModelConfig(name);
    const ParamTable table(config, ModelSlice{});
    EXPECT_EQ(static_cast<int64_t>(table.total_numel()), config.num_parameters()) << name;
    size_t next = 0;
    for (const TensorEntry& entry : table.entries()) {
      EXPECT_EQ(entry.offset, next) << entry.name;  // contiguous, in table order
      next += entry.numel;
    }
  }
}

TEST(ParamTableTest, BlocksAreContiguousRangesInOrder) {
  const ModelConfig config = ShippedModelConfig("llama-tiny");
  const ParamTable table(config, ModelSlice{});
  size_t previous_end = table.BlockRange(-1).second;
  for (int b = 0; b < config.n_layer; ++b) {
    const auto [begin, end] = table.BlockRange(b);
    EXPECT_EQ(begin, previous_end) << "block " << b;
    EXPECT_GT(end, begin);
    previous_end = end;
  }
  EXPECT_EQ(table.BlockRange(config.n_layer).second, table.total_numel());
}

TEST(ParamTableTest, Gpt2TiesTheHeadToTheTokenEmbedding) {
  const ParamTable gpt2(ShippedModelConfig("tiny"), ModelSlice{});
  EXPECT_EQ(gpt2.head(), gpt2.token_embedding());
  EXPECT_EQ(gpt2.Find("head.weight"), nullptr);
  const ParamTable llama(ShippedModelConfig("llama-tiny"), ModelSlice{});
  EXPECT_NE(llama.head(), llama.token_embedding());
  ASSERT_NE(llama.Find("head.weight"), nullptr);
}

TEST(ParamTableTest, GroupedQueryAttentionShapesTheQkvProjection) {
  const ModelConfig config = ShippedModelConfig("llama-70b");  // 64 heads, 8 kv heads of 128
  const ParamTable table(config, ModelSlice{0, 1});
  const TensorEntry* qkv = table.Find("blocks.0.attn.qkv.weight");
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->shape, (std::vector<int64_t>{(64 + 2 * 8) * 128, 8192}));
  EXPECT_EQ(table.Find("blocks.1.attn.qkv.weight"), nullptr);  // the slice holds block 0 only
  EXPECT_EQ(table.Find("final_norm.weight"), nullptr);
}

}  // namespace
}  // namespace dtrain
