#include "core/data/tokenizers/load_tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "tests/core/data/tokenizers/tokenizer_json.h"
#include "tests/testing/run_dtrain.h"

namespace dtrain {
namespace {

using testing::ByteLevelChar;
using testing::FreshTempDir;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using testing::TokenizerJson;

std::string WriteFile(const std::string& dir, const std::string& name, const std::string& text) {
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::vector<int32_t> EncodeOk(const Tokenizer& tokenizer, std::string_view text) {
  std::vector<int32_t> ids;
  const absl::Status status = tokenizer.Encode(text, &ids);
  EXPECT_TRUE(status.ok()) << status;
  return ids;
}

TEST(LoadTokenizerTest, MergesByRankLowestFirst) {
  const std::string dir = FreshTempDir("tok_rank");
  // "bc" (id 256) ranks before "ab" (257): "abc" is a + bc, never ab + c.
  WriteFile(dir, "tokenizer.json", TokenizerJson({{"b", "c"}, {"a", "b"}, {"ab", "c"}}).dump());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ(EncodeOk(**tokenizer, "abc"), (std::vector<int32_t>{'a', 256}));
  EXPECT_EQ(EncodeOk(**tokenizer, "abd"), (std::vector<int32_t>{257, 'd'}));
  // GPT-2's regex keeps the space with the word: " ab" is one piece, space then "ab".
  EXPECT_EQ(EncodeOk(**tokenizer, "x ab"), (std::vector<int32_t>{'x', ' ', 257}));
  EXPECT_EQ((*tokenizer)->vocab_size(), 259);
  EXPECT_THAT((*tokenizer)->name(), StartsWith("hf-bpe:"));
}

TEST(LoadTokenizerTest, SpecialTokensInTextBecomeTheirIds) {
  const std::string dir = FreshTempDir("tok_special");
  WriteFile(dir, "tokenizer.json", TokenizerJson({{"a", "b"}}, {"<|eot|>"}).dump());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ(EncodeOk(**tokenizer, "ab<|eot|>ab<|eot"),
            (std::vector<int32_t>{256, 257, 256, '<', '|', 'e', 'o', 't'}));
  EXPECT_EQ(*(*tokenizer)->SpecialToken("<|eot|>"), 257);
  const absl::StatusOr<int32_t> missing = (*tokenizer)->SpecialToken("<|bos|>");
  EXPECT_TRUE(absl::IsNotFound(missing.status()));
  EXPECT_THAT(missing.status().message(), HasSubstr("<|eot|>"));
  EXPECT_EQ(*(*tokenizer)->Decode(std::vector<int32_t>{256, 257}), "ab<|eot|>");
  EXPECT_THAT((*tokenizer)->Decode(std::vector<int32_t>{258}).status().message(),
              HasSubstr("token id 258 is not in the vocabulary"));
}

TEST(LoadTokenizerTest, AnyBytesEncodeAndDecodeBack) {
  const std::string dir = FreshTempDir("tok_bytes");
  WriteFile(dir, "tokenizer.json", TokenizerJson({{"a", "b"}}).dump());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::string text("ab\xff\xfe \xc3( ab\0x", 12);
  const std::vector<int32_t> ids = EncodeOk(**tokenizer, text);
  EXPECT_EQ(*(*tokenizer)->Decode(ids), text);
}

TEST(LoadTokenizerTest, ParallelEncodingGivesOneThreadsIds) {
  const std::string dir = FreshTempDir("tok_parallel");
  WriteFile(
      dir, "tokenizer.json",
      TokenizerJson({{"t", "h"}, {"th", "e"}, {" ", "the"}, {"\n", "\n"}, {" ", "\n"}}).dump());
  absl::StatusOr<std::unique_ptr<Tokenizer>> one = LoadTokenizer(dir, 1);
  absl::StatusOr<std::unique_ptr<Tokenizer>> four = LoadTokenizer(dir, 4);
  ASSERT_TRUE(one.ok() && four.ok());
  // 3 MB of lines, some with trailing spaces and blank lines, so that cuts are both allowed
  // and refused. A cut after " \n" would be wrong: the whole text splits " " from "\n" (the
  // newline is followed by a letter), a chunk ending there keeps " \n" whole, a token here.
  std::mt19937 rng(7);
  const char* words[] = {"the", "them", " ", "  ", "\n", "\n\n", "x.", "there", "\t", "42"};
  std::string text;
  while (text.size() < (3 << 20)) text += words[rng() % 10];
  const std::vector<int32_t> expected = EncodeOk(**one, text);
  EXPECT_EQ(EncodeOk(**four, text), expected);
  EXPECT_EQ(*(*four)->Decode(expected), text);
}

TEST(LoadTokenizerTest, FolderFallsBackToGpt2Files) {
  const std::string dir = FreshTempDir("tok_gpt2");
  nlohmann::json encoder = TokenizerJson({{"a", "b"}})["model"]["vocab"];
  encoder["<|endoftext|>"] = 257;
  WriteFile(dir, "encoder.json", encoder.dump());
  WriteFile(dir, "vocab.bpe", "#version: 0.2\na b\n");
  for (const std::string& path : {dir, dir + "/vocab.bpe", dir + "/encoder.json"}) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(path);
    ASSERT_TRUE(tokenizer.ok()) << path << ": " << tokenizer.status();
    EXPECT_THAT((*tokenizer)->name(), StartsWith("gpt2-bpe:"));
    EXPECT_EQ(EncodeOk(**tokenizer, "ab<|endoftext|>"), (std::vector<int32_t>{256, 257}));
  }
  WriteFile(dir, "vocab.bpe", "#version: 0.2\na b c\n");
  EXPECT_THAT(LoadTokenizer(dir).status().message(), HasSubstr("vocab.bpe:2:"));
}

TEST(LoadTokenizerTest, BadFilesAreOneErrorNamingTheFileAndTheProblem) {
  const std::string dir = FreshTempDir("tok_bad");
  const auto error_of = [](const std::string& path) {
    return std::string(LoadTokenizer(path).status().message());
  };
  EXPECT_THAT(error_of(dir + "/missing.json"), HasSubstr("does not exist"));
  const std::string truncated = WriteFile(dir, "truncated.json", "{\"model\": {");
  EXPECT_THAT(error_of(truncated), HasSubstr(truncated + " is not valid JSON"));
  nlohmann::json unigram = TokenizerJson({});
  unigram["model"]["type"] = "Unigram";
  const std::string unigram_path = WriteFile(dir, "unigram.json", unigram.dump());
  EXPECT_THAT(error_of(unigram_path), HasSubstr("model type \"Unigram\" is not supported"));
  nlohmann::json metaspace = TokenizerJson({});
  metaspace["pre_tokenizer"] = {{"type", "Metaspace"}};
  const std::string metaspace_path = WriteFile(dir, "metaspace.json", metaspace.dump());
  EXPECT_THAT(error_of(metaspace_path), HasSubstr("pre_tokenizer Metaspace is not supported"));
  nlohmann::json no_byte = TokenizerJson({});
  no_byte["model"]["vocab"].erase(ByteLevelChar(0xff));
  const std::string no_byte_path = WriteFile(dir, "no_byte.json", no_byte.dump());
  EXPECT_THAT(error_of(no_byte_path), HasSubstr("byte 0xff has no token"));
  nlohmann::json bad_merge = TokenizerJson({{"a", "b"}});
  bad_merge["model"]["merges"].push_back({"a", "zz"});
  const std::string bad_merge_path = WriteFile(dir, "bad_merge.json", bad_merge.dump());
  EXPECT_THAT(error_of(bad_merge_path), HasSubstr(bad_merge_path + ": merge 1"));
  nlohmann::json bad_regex = TokenizerJson({});
  bad_regex["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}},
        {{"type", "ByteLevel"}, {"use_regex", false}}}}};
  const std::string bad_regex_path = WriteFile(dir, "bad_regex.json", bad_regex.dump());
  EXPECT_THAT(error_of(bad_regex_path), HasSubstr("the split regex does not compile"));
  const std::string not_a_model = WriteFile(dir, "junk.model", "not a protobuf");
  EXPECT_THAT(error_of(not_a_model), HasSubstr(not_a_model + ": not a SentencePiece model"));
  EXPECT_THAT(error_of(FreshTempDir("tok_empty_dir") + "/"), HasSubstr("does not exist"));
  std::filesystem::create_directories(FreshTempDir("tok_empty"));
  EXPECT_THAT(error_of(testing::TempPath("tok_empty")), HasSubstr("holds no tokenizer.json"));
}

TEST(LoadTokenizerTest, EmptyPathIsBytes) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer("");
  ASSERT_TRUE(tokenizer.ok());
  EXPECT_EQ((*tokenizer)->name(), "bytes");
}

}  // namespace
}  // namespace dtrain
