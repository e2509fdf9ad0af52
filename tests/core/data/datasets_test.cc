#include "core/data/datasets.h"

#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "core/data/chat_template.h"
#include "core/data/data_pack.h"
#include "core/data/tokenizer.h"
#include "core/util/exit_codes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace {

class DatasetsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "datasets_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    recipe_.train.seq_len = 4;
    recipe_.train.batch_size = 2;
    recipe_.model.vocab_size = 256;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A text file of `n` bytes whose byte i is first + i.
  std::string WriteText(const std::string& name, int n, int first = 0) const {
    std::string text;
    for (int i = 0; i < n; ++i) text.push_back(static_cast<char>(first + i));
    std::ofstream((dir_ / name).string(), std::ios::binary) << text;
    return (dir_ / name).string();
  }

  std::filesystem::path dir_;
  Recipe recipe_;
};

TEST_F(DatasetsTest, SplitsTheLastValFractionOffTheTrainingTokens) {
  WriteText("a.txt", 60);
  WriteText("b.txt", 40, 60);  // tokens 0..99 in glob order
  recipe_.data.train = {(dir_ / "*.txt").string()};
  recipe_.data.val_fraction = 0.2;  // 100 tokens: train [0, 80), val [80, 100)
  absl::StatusOr<Datasets> data = OpenDatasets(recipe_, 0, 1);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->train_tokens, 80);
  EXPECT_EQ(data->val_tokens, 20);

  // One training epoch: the (80 - 1) / 4 = 19 windows of tokens 0..79, targets up to 76.
  std::vector<int32_t> inputs(19 * 4), targets(19 * 4);
  ASSERT_TRUE(data->train->Next(19, inputs.data(), targets.data()).ok());
  EXPECT_EQ(*std::max_element(targets.begin(), targets.end()), 76);

  // Validation: windows over tokens 80..99.
  std::vector<int32_t> val_in(8), val_out(8);
  absl::StatusOr<int> rows = data->val->Next(2, val_in.data(), val_out.data());
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(*rows, 2);
  EXPECT_EQ(val_in[0], 80);
  EXPECT_EQ(val_in[4], 84);
}

TEST_F(DatasetsTest, UsesValFilesWhenGiven) {
  recipe_.data.train = {WriteText("train.txt", 50)};
  recipe_.data.val = {WriteText("val.txt", 9)};
  absl::StatusOr<Datasets> data = OpenDatasets(recipe_, 1, 2);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->train_tokens, 50);
  EXPECT_EQ(data->val_tokens, 9);
  // Rank 1 of 2 reading one row per call gets the second of the two windows.
  std::vector<int32_t> in(4), out(4);
  absl::StatusOr<int> rows = data->val->Next(1, in.data(), out.data());
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(*rows, 1);
  EXPECT_EQ(in[0], 4);
}

TEST_F(DatasetsTest, NoValidationDataIsAnErrorOnlyWhenEvaluating) {
  recipe_.data.train = {WriteText("train.txt", 50)};
  recipe_.data.val_fraction = 0;
  EXPECT_TRUE(
      absl::StrContains(OpenDatasets(recipe_, 0, 1).status().message(), "no validation data"));
  recipe_.train.eval_every = 0;
  absl::StatusOr<Datasets> data = OpenDatasets(recipe_, 0, 1);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->val, nullptr);
  EXPECT_EQ(data->train_tokens, 50);
}

// A validation split too small for one sequence is that error while evaluating (an SFT set of 6
// samples held out 0 of its sequences, and the error said that no sample fit train.seq_len), and
// nothing without evaluation, which reads no validation data.
TEST_F(DatasetsTest, AValidationSplitOfNothingMattersOnlyWhenEvaluating) {
  const std::string chat = (dir_ / "chat.jsonl").string();
  {
    std::ofstream out(chat);
    for (int i = 0; i < 6; ++i) out << R"({"prompt": "q", "completion": "answer )" << i << "\"}\n";
  }
  const ByteTokenizer bytes;
  ASSERT_TRUE(
      PackSftShards({chat}, (dir_ / "sft").string(), 1 << 20, bytes, *LoadChatTemplate("none"))
          .ok());
  recipe_.data.format = "sft";
  recipe_.data.packing = false;  // 6 sequences
  recipe_.data.train = {(dir_ / "sft" / "*.tar").string()};
  recipe_.data.val_fraction = 0.05;
  recipe_.train.seq_len = 16;
  const absl::Status status = OpenDatasets(recipe_, 0, 1).status();
  EXPECT_EQ(status.message(),
            "the last data.val_fraction = 0.05 of the 6 data.train sequences is no sequence; "
            "raise data.val_fraction to at least 1/6, give data.val, or set train.eval_every: 0 "
            "to train without evaluation");
  recipe_.train.eval_every = 0;
  absl::StatusOr<Datasets> data = OpenDatasets(recipe_, 0, 1);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->val, nullptr);
  // The shards record the template they were packed with, for the export.
  const absl::StatusOr<std::optional<ChatTemplate>> recorded = ShardsChatTemplate(recipe_);
  ASSERT_TRUE(recorded.ok()) << recorded.status();
  ASSERT_TRUE(recorded->has_value());
  EXPECT_EQ((*recorded)->name, "none");

  recipe_ = Recipe();
  recipe_.train.seq_len = 4;
  recipe_.train.batch_size = 2;
  recipe_.train.eval_every = 0;
  recipe_.data.train = {WriteText("short.txt", 40)};
  recipe_.data.val_fraction = 0.05;  // 2 validation tokens: less than one window
  data = OpenDatasets(recipe_, 0, 1);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->val, nullptr);
  EXPECT_EQ(data->train_tokens, 38);  // the split is the same with or without evaluation
}

// SFT samples whose answers truncation cut off train nothing: counted in a warning, and data
// with no trained token left is refused (it trained at a loss of 0 and exited 0). The byte
// tokenizer makes a prompt of 30 characters 30 tokens, past train.seq_len = 16.
TEST_F(DatasetsTest, SftDataWithoutATrainedTokenIsRefused) {
  const std::string chat = (dir_ / "chat.jsonl").string();
  const auto pack = [&](int short_prompts) {
    {
      std::ofstream out(chat);
      for (int i = 0; i < 6; ++i) {
        const std::string prompt(i < short_prompts ? 3 : 30, 'q');
        out << R"({"prompt": ")" << prompt << R"(", "completion": "answer"})"
            << "\n";
      }
    }
    std::filesystem::remove_all(dir_ / "sft");
    ASSERT_TRUE(PackSftShards({chat}, (dir_ / "sft").string(), 1 << 20, ByteTokenizer(),
                              *LoadChatTemplate("none"))
                    .ok());
  };
  recipe_.data.format = "sft";
  recipe_.data.packing = false;
  recipe_.data.train = {(dir_ / "sft" / "*.tar").string()};
  recipe_.train.seq_len = 16;
  recipe_.train.eval_every = 0;
  pack(0);
  const absl::Status untrained = OpenDatasets(recipe_, 0, 1).status();
  EXPECT_THAT(untrained.message(),
              ::testing::HasSubstr(" holds no trained token in 6 sequence(s) of 16: every target "
                                   "is masked"));
  EXPECT_EQ(ExitCodeOf(untrained), kExitUsage);  // a restart would read the same: none
  pack(2);
  absl::StatusOr<Datasets> data = OpenDatasets(recipe_, 0, 1);
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->warnings.size(), 1u);
  EXPECT_THAT(data->warnings[0],
              ::testing::HasSubstr("data.train: 4 of 6 SFT samples have no trained token within "
                                   "train.seq_len = 16"));
  // Evaluated, a held-out part of untrained samples alone is refused too.
  recipe_.data.val_fraction = 0.5;
  recipe_.train.eval_every = 10;
  EXPECT_THAT(OpenDatasets(recipe_, 0, 1).status().message(),
              ::testing::HasSubstr("the last data.val_fraction = 0.5 of the 6 data.train "
                                   "sequences holds no trained token in 3 sequence(s)"));
}

// Why an export has no tokenizer: a pack records its tokenizer's name, not its files, which the
// warning said the shards did not name.
TEST(NoDataTokenizerReasonTest, SaysWhatTheShardsRecord) {
  EXPECT_EQ(NoDataTokenizerReason(std::string()),
            "data.tokenizer is empty and the data's first shard names none");
  EXPECT_EQ(NoDataTokenizerReason(std::string("hf-bpe:tok/tokenizer.json#c393223c280f")),
            "data.tokenizer is empty and the data's first shard names "
            "hf-bpe:tok/tokenizer.json#c393223c280f but holds none of its files");
  EXPECT_EQ(NoDataTokenizerReason(absl::NotFoundError("no shard")),
            "data.tokenizer is empty and the data's first shard does not read from here (no "
            "shard)");
}

TEST_F(DatasetsTest, ErrorsNameTheKeyOrFile) {
  recipe_.data.train = {(dir_ / "missing-*.txt").string()};
  absl::Status status = OpenDatasets(recipe_, 0, 1).status();
  EXPECT_TRUE(absl::StrContains(status.message(), "data.train: file pattern"));
  EXPECT_TRUE(absl::StrContains(status.message(), "missing-*.txt"));

  recipe_.data.train = {WriteText("short.txt", 40)};
  recipe_.data.val_fraction = 0.05;  // 2 validation tokens: less than one window
  status = OpenDatasets(recipe_, 0, 1).status();
  EXPECT_TRUE(absl::StrContains(status.message(), "the last data.val_fraction = 0.05"));
  EXPECT_TRUE(absl::StrContains(status.message(), "fewer than one window"));
}

TEST_F(DatasetsTest, FewerShardsThanStreamsIsAWarning) {
  ByteTokenizer bytes;
  absl::StatusOr<PackResult> packed =
      PackShards({WriteText("a.txt", 200), WriteText("b.txt", 200)}, (dir_ / "shards").string(),
                 /*shard_bytes=*/300, bytes);  // one document per shard
  ASSERT_TRUE(packed.ok()) << packed.status();
  ASSERT_EQ(packed->shards.size(), 2);
  recipe_.data.format = "webdataset";
  recipe_.data.shards = (dir_ / "shards" / "shard-{000000..000001}.tar").string();
  recipe_.train.eval_every = 0;
  recipe_.data.streams = 2;
  absl::StatusOr<Datasets> data = OpenDatasets(recipe_, 0, 1);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_TRUE(data->warnings.empty());

  recipe_.data.streams = 4;
  data = OpenDatasets(recipe_, 0, 1);
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->warnings.size(), 1);
  EXPECT_TRUE(absl::StrContains(data->warnings[0], "2 shard(s) for data.streams = 4"));
  EXPECT_TRUE(absl::StrContains(data->warnings[0], "write at least 4 shards"));
}

}  // namespace
}  // namespace dtrain
