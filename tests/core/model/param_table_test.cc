#include "core/model/param_table.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/model/init.h"
#include "gtest/gtest.h"
#include "tests/testing/configs.h"
#include "tests/testing/small_model.h"

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
  const ParamTable table(config, ModelSlice{.chunks = {{0, 1}}});
  const TensorEntry* qkv = table.Find("blocks.0.attn.qkv.weight");
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->shape, (std::vector<int64_t>{(64 + 2 * 8) * 128, 8192}));
  EXPECT_EQ(table.Find("blocks.1.attn.qkv.weight"), nullptr);  // the slice holds block 0 only
  EXPECT_EQ(table.Find("final_norm.weight"), nullptr);
}

// A tensor-parallel rank holds its heads' rows of each of Q, K and V (not a contiguous third of
// the fused weight), a column block of attn.out, rows of mlp.up (both of Llama's gate and up),
// a column block of mlp.down; its shard initialises bit for bit as that slice of the whole
// model (the same code draws the same stream positions), and the ranks together cover every
// element of every tensor.
// Vocabulary 97 splits into slots of 64 (tp 2: 64 + 33 real rows; tp 4: 64 + 33 + 0 + 0).
TEST(ParamTableTest, TensorParallelShardsAreSlicesOfTheWholeModel) {
  for (const auto& [family, vocab] :
       {std::pair{ModelFamily::kGpt2, 61}, std::pair{ModelFamily::kLlama, 61},
        std::pair{ModelFamily::kGpt2, 97}, std::pair{ModelFamily::kLlama, 97}}) {
    ModelConfig config = testing::SmallModelConfig(family);  // llama: 4 heads, 2 kv heads
    config.vocab_size = vocab;
    const ParamTable whole(config, ModelSlice{});
    std::vector<float> whole_params(whole.total_numel());
    InitParameters(config, whole, 7, 0, whole.total_numel(), whole_params.data());
    for (int tp : {2, 4}) {
      SCOPED_TRACE(::testing::Message()
                   << FamilyName(family) << " vocab " << vocab << " tp " << tp);
      std::vector<int> covered(whole.total_numel(), 0);
      for (int rank = 0; rank < tp; ++rank) {
        const ParamTable shard(config, ModelSlice{.tp_rank = rank, .tp_size = tp});
        EXPECT_EQ(shard.dims().heads, 4 / tp);
        EXPECT_EQ(shard.dims().mlp_width, 48 / tp);
        std::vector<float> params(shard.total_numel());
        InitParameters(config, shard, 7, 0, shard.total_numel(), params.data());
        for (const TensorEntry& entry : shard.entries()) {
          const TensorEntry* global = whole.Find(entry.name);
          ASSERT_NE(global, nullptr) << entry.name;
          EXPECT_EQ(entry.global_shape, global->shape) << entry.name;
          ForEachGlobalRun(entry, 0, entry.numel, [&](size_t local, size_t g, size_t count) {
            ASSERT_LE(g + count, global->numel) << entry.name;
            for (size_t i = 0; i < count; ++i) {
              ASSERT_EQ(params[entry.offset + local + i], whole_params[global->offset + g + i])
                  << entry.name << " local " << local + i;
              ++covered[global->offset + g + i];
            }
          });
        }
      }
      for (size_t i = 0; i < covered.size(); ++i) ASSERT_GT(covered[i], 0) << i;
    }
  }
  // Rank 1 of 2 in GPT-2: Q rows [16, 32), K rows 32 + [16, 32), V rows 64 + [16, 32) of the
  // (96, 32) weight; attn.out columns [16, 32) of (32, 32).
  const ParamTable gpt2(testing::SmallModelConfig(ModelFamily::kGpt2),
                        ModelSlice{.tp_rank = 1, .tp_size = 2});
  const TensorEntry& qkv = *gpt2.Find("blocks.0.attn.qkv.weight");
  EXPECT_EQ(qkv.shape, (std::vector<int64_t>{48, 32}));
  ASSERT_EQ(qkv.rows.size(), 3u);
  EXPECT_EQ(qkv.rows[0].global_begin, 16);
  EXPECT_EQ(qkv.rows[1].global_begin, 48);
  EXPECT_EQ(qkv.rows[2].global_begin, 80);
  EXPECT_EQ(gpt2.Find("blocks.0.attn.out.weight")->column_begin, 16);
}

// At tp > 1 the vocabulary is padded to a multiple of tp x 64 and each rank holds the real rows
// of its slot (none when the slot is all padding); tp = 1 pads nothing. The token embedding
// (GPT-2's tied head) and Llama's head are split alike, as (rows, C) shards of (V, C).
TEST(ParamTableTest, VocabularySlotsArePaddedAndHoldOnlyRealRows) {
  struct Expected {
    int tp, rank, slot, begin, end;
  };
  for (const Expected& e :
       {Expected{1, 0, 97, 0, 97}, Expected{2, 0, 64, 0, 64}, Expected{2, 1, 64, 64, 97},
        Expected{4, 1, 64, 64, 97}, Expected{4, 2, 64, 97, 97}, Expected{4, 3, 64, 97, 97}}) {
    SCOPED_TRACE(::testing::Message() << "tp " << e.tp << " rank " << e.rank);
    for (ModelFamily family : {ModelFamily::kGpt2, ModelFamily::kLlama}) {
      ModelConfig config = testing::SmallModelConfig(family);
      config.vocab_size = 97;
      const ParamTable table(config, ModelSlice{.tp_rank = e.rank, .tp_size = e.tp});
      EXPECT_EQ(table.dims().vocab_parallel, e.tp > 1);
      EXPECT_EQ(table.dims().vocab_slot, e.slot);
      EXPECT_EQ(table.dims().vocab_begin, e.begin);
      EXPECT_EQ(table.dims().vocab_end, e.end);
      for (const char* name : {"embed.tokens", "head.weight"}) {
        const TensorEntry* entry = table.Find(name);
        if (entry == nullptr) continue;  // GPT-2 ties its head
        EXPECT_EQ(entry->shape, (std::vector<int64_t>{e.end - e.begin, 32})) << name;
        EXPECT_EQ(entry->global_shape, (std::vector<int64_t>{97, 32})) << name;
        ASSERT_EQ(entry->rows.size(), 1u);
        EXPECT_EQ(entry->rows[0].global_begin, e.begin) << name;
      }
    }
  }
}

// Adds 1 to counted[i] for every element i of the whole model's table that `part`'s counted
// ranges hold.
void CountInWhole(const ParamTable& whole, const ParamTable& part, std::vector<int>& counted) {
  for (const auto& [begin, end] : part.CountedRanges()) {
    for (const TensorEntry& entry : part.entries()) {
      const size_t lo = std::max(begin, entry.offset);
      const size_t hi = std::min(end, entry.offset + entry.numel);
      if (lo >= hi) continue;
      const size_t global_offset = whole.Find(entry.name)->offset;
      ForEachGlobalRun(entry, lo - entry.offset, hi - entry.offset,
                       [&](size_t, size_t global, size_t count) {
                         for (size_t i = 0; i < count; ++i) ++counted[global_offset + global + i];
                       });
    }
  }
}

// Whole-model totals (the gradient norm) count each element once: the ranks' counted ranges
// cover every element of the whole model exactly once, replicated tensors and kv heads
// included; the whole model counts everything.
TEST(ParamTableTest, TensorParallelRanksCountEveryElementOnce) {
  for (const auto& [family, vocab] :
       {std::pair{ModelFamily::kGpt2, 61}, std::pair{ModelFamily::kLlama, 61},
        std::pair{ModelFamily::kGpt2, 97}, std::pair{ModelFamily::kLlama, 97}}) {
    ModelConfig config = testing::SmallModelConfig(family);
    config.vocab_size = vocab;
    const ParamTable whole(config, ModelSlice{});
    EXPECT_EQ(whole.CountedRanges(),
              (std::vector<std::pair<size_t, size_t>>{{0, whole.total_numel()}}));
    for (int tp : {2, 4}) {
      SCOPED_TRACE(::testing::Message()
                   << FamilyName(family) << " vocab " << vocab << " tp " << tp);
      std::vector<int> counted(whole.total_numel(), 0);
      for (int rank = 0; rank < tp; ++rank) {
        const ParamTable shard(config, ModelSlice{.tp_rank = rank, .tp_size = tp});
        CountInWhole(whole, shard, counted);
      }
      for (size_t i = 0; i < counted.size(); ++i) ASSERT_EQ(counted[i], 1) << i;
    }
  }
}

// Pipeline stages (with and without tensor parallelism inside) together count every element of
// the whole model once. GPT-2's last stage, without the embedding, holds the tied head as its
// own copy named like the embedding, in the final region: initialised to the embedding's
// values, and never counted (the first stage's embedding is).
TEST(ParamTableTest, PipelineStagesCountEveryElementOnceAndCopyTheTiedHead) {
  for (const ModelFamily family : {ModelFamily::kGpt2, ModelFamily::kLlama}) {
    const ModelConfig config = testing::SmallModelConfig(family);  // 3 blocks
    const ParamTable whole(config, ModelSlice{});
    for (int tp : {1, 2}) {
      SCOPED_TRACE(::testing::Message() << FamilyName(family) << " tp " << tp);
      std::vector<int> counted(whole.total_numel(), 0);
      for (int stage = 0; stage < 3; ++stage) {
        for (int rank = 0; rank < tp; ++rank) {
          const ParamTable table(
              config, ModelSlice{.chunks = {{stage, 1}}, .tp_rank = rank, .tp_size = tp});
          CountInWhole(whole, table, counted);
          if (stage < 2) {
            EXPECT_FALSE(table.HasRegion(config.n_layer));
            continue;
          }
          EXPECT_FALSE(table.HasRegion(-1));
          const TensorEntry* head = table.Find(config.tied_head() ? "embed.tokens" : "head.weight");
          ASSERT_NE(head, nullptr);
          EXPECT_EQ(head->block, config.n_layer);
          EXPECT_EQ(head->offset, table.head());
          EXPECT_EQ(table.IsTiedHeadCopy(*head), config.tied_head());
          if (!config.tied_head()) continue;
          const ParamTable first(config,
                                 ModelSlice{.chunks = {{0, 1}}, .tp_rank = rank, .tp_size = tp});
          const TensorEntry& embedding = *first.Find("embed.tokens");
          EXPECT_FALSE(first.IsTiedHeadCopy(embedding));
          ASSERT_EQ(head->numel, embedding.numel);
          std::vector<float> copy(table.total_numel()), original(first.total_numel());
          InitParameters(config, table, 7, 0, copy.size(), copy.data());
          InitParameters(config, first, 7, 0, original.size(), original.data());
          EXPECT_TRUE(std::equal(copy.begin() + head->offset,
                                 copy.begin() + head->offset + head->numel,
                                 original.begin() + embedding.offset));
        }
      }
      for (size_t i = 0; i < counted.size(); ++i) ASSERT_EQ(counted[i], 1) << i;
    }
  }
}

// An interleaved pipeline's stages hold two model chunks each (stage 0 blocks 0 and 2, stage 1
// blocks 1 and 3): each finds its blocks' tensors, knows which chunk holds a region, and
// together they count every element of the whole model once.
TEST(ParamTableTest, InterleavedStagesHoldTheirChunks) {
  for (const ModelFamily family : {ModelFamily::kGpt2, ModelFamily::kLlama}) {
    SCOPED_TRACE(FamilyName(family));
    ModelConfig config = testing::SmallModelConfig(family);
    config.n_layer = 4;
    const ParamTable whole(config, ModelSlice{});
    EXPECT_TRUE(whole.HoldsWholeModel());
    std::vector<int> counted(whole.total_numel(), 0);
    for (int stage = 0; stage < 2; ++stage) {
      const ParamTable table(config, ModelSlice{.chunks = {{stage, 1}, {stage + 2, 1}}});
      CountInWhole(whole, table, counted);
      EXPECT_FALSE(table.HoldsWholeModel());
      EXPECT_EQ(table.HasRegion(-1), stage == 0);
      EXPECT_EQ(table.HasRegion(config.n_layer), stage == 1);
      EXPECT_FALSE(table.HasRegion(1 - stage));
      EXPECT_FALSE(table.HasRegion(3 - stage));
      for (const int block : {stage, stage + 2}) {
        EXPECT_EQ(table.ChunkOf(block), block / 2);
        EXPECT_EQ(table.block(block).mlp_down_w,
                  table.Find(absl::StrCat("blocks.", block, ".mlp.down.weight"))->offset);
      }
      EXPECT_EQ(table.ChunkOf(-1), 0);
      EXPECT_EQ(table.ChunkOf(config.n_layer), 1);
    }
    for (size_t i = 0; i < counted.size(); ++i) ASSERT_EQ(counted[i], 1) << i;
  }
}

// Llama with 2 kv heads: tp 2 splits them, tp 4 replicates each on two ranks (ranks 2 and 3
// hold kv head 1).
TEST(ParamTableTest, GroupedQueryKvHeadsSplitOrReplicate) {
  const ModelConfig config = testing::SmallModelConfig(ModelFamily::kLlama);
  const ParamTable split(config, ModelSlice{.tp_rank = 1, .tp_size = 2});
  EXPECT_EQ(split.dims().kv_heads, 1);
  EXPECT_EQ(split.dims().kv_replicas, 1);
  const ParamTable replicated(config, ModelSlice{.tp_rank = 3, .tp_size = 4});
  EXPECT_EQ(replicated.dims().heads, 1);
  EXPECT_EQ(replicated.dims().kv_heads, 1);
  EXPECT_EQ(replicated.dims().kv_replicas, 2);
  const TensorEntry& qkv = *replicated.Find("blocks.2.attn.qkv.weight");
  ASSERT_EQ(qkv.rows.size(), 3u);
  EXPECT_EQ(qkv.rows[0].global_begin, 3 * 8);        // query head 3
  EXPECT_EQ(qkv.rows[1].global_begin, (4 + 1) * 8);  // kv head 1's key
  EXPECT_EQ(qkv.rows[2].global_begin, (4 + 2 + 1) * 8);
}

TEST(ParamTableTest, TensorParallelSizesThatDoNotFitAreRecipeErrors) {
  ModelConfig config = testing::SmallModelConfig(ModelFamily::kLlama);
  EXPECT_TRUE(CheckTensorParallel(config, 1).ok());
  EXPECT_TRUE(CheckTensorParallel(config, 2).ok());
  EXPECT_TRUE(CheckTensorParallel(config, 4).ok());
  EXPECT_NE(CheckTensorParallel(config, 8).message().find("model.n_head"), std::string::npos);
  config.n_head = 24;
  config.n_kv_head = 3;
  const absl::Status status = CheckTensorParallel(config, 2);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("model.n_kv_head = 3"), std::string::npos) << status;
  EXPECT_NE(status.message().find("parallel.tp = 2"), std::string::npos) << status;
  config.n_kv_head = 24;
  config.d_ff = 50;
  EXPECT_NE(CheckTensorParallel(config, 4).message().find("model.d_ff"), std::string::npos);
}

}  // namespace
}  // namespace dtrain
