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

// Around added tokens, whitespace and word characters are Unicode's, as Hugging Face's regex
// reads them: lstrip takes an ideographic space (U+3000), and a single_word token stands after
// "。" (no word character) but not after "é" (one). Before, every non-ASCII byte was a word
// character and only ASCII whitespace was stripped.
TEST(LoadTokenizerTest, AddedTokensSeeUnicodeWhitespaceAndWordCharacters) {
  const std::string dir = FreshTempDir("tok_unicode_added");
  nlohmann::json json = TokenizerJson({}, {"<mask>", "word", "wo"});
  json["added_tokens"][0]["lstrip"] = true;
  json["added_tokens"][1]["single_word"] = true;
  WriteFile(dir, "tokenizer.json", json.dump());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ(EncodeOk(**tokenizer, "x\u3000<mask>"), (std::vector<int32_t>{'x', 256}));
  EXPECT_EQ(EncodeOk(**tokenizer, "\u3002word"), (std::vector<int32_t>{0xE3, 0x80, 0x82, 257}));
  EXPECT_EQ(EncodeOk(**tokenizer, "\u00e9word"),
            (std::vector<int32_t>{0xC3, 0xA9, 'w', 'o', 'r', 'd'}));
  EXPECT_EQ(EncodeOk(**tokenizer, "word_"), (std::vector<int32_t>{'w', 'o', 'r', 'd', '_'}));
  // The longest match inside a word is dropped, and the search goes on after it: "wo" within
  // it is not taken in its place (Hugging Face's matches do not overlap).
  EXPECT_EQ(EncodeOk(**tokenizer, "xword"), (std::vector<int32_t>{'x', 'w', 'o', 'r', 'd'}));
  EXPECT_EQ(EncodeOk(**tokenizer, "xwo"), (std::vector<int32_t>{'x', 258}));
}

// A normalized added token is found by its normalized content, as Hugging Face finds it: under
// Llama 2's Prepend("▁"), "<t>" is "▁<t>", which matches after a space (and takes it) and not
// inside a word. It decodes to "<t>" as written.
TEST(LoadTokenizerTest, NormalizedAddedTokensMatchTheirNormalizedContent) {
  const std::string space = "\xe2\x96\x81";
  nlohmann::json json = testing::Llama2TokenizerJson({space, "x"}, {});
  json["added_tokens"].push_back(
      {{"id", 261}, {"content", "<t>"}, {"special", false}, {"normalized", true}});
  const std::string dir = FreshTempDir("tok_normalized_added");
  WriteFile(dir, "tokenizer.json", json.dump());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ(EncodeOk(**tokenizer, "x <t>"), (std::vector<int32_t>{259, 260, 261}));
  // "▁x<t>": no match; "<", "t", ">" fall back to their bytes (3 + byte).
  EXPECT_EQ(EncodeOk(**tokenizer, "x<t>"),
            (std::vector<int32_t>{259, 260, 3 + '<', 3 + 't', 3 + '>'}));
  EXPECT_EQ(*(*tokenizer)->Decode(std::vector<int32_t>{260, 261}), "x<t>");
}

// Hugging Face's split regexes are Oniguruma's: \u0020 is a code point there (PCRE2 refused it).
TEST(LoadTokenizerTest, SplitRegexesReadOnigurumaCodePoints) {
  nlohmann::json json = TokenizerJson({{" ", "a"}});
  json["pre_tokenizer"] = {{"type", "Sequence"},
                           {"pretokenizers",
                            {{{"type", "Split"},
                              {"pattern", {{"Regex", "\\u0020?\\p{L}+|\\s+"}}},
                              {"behavior", "Isolated"}},
                             {{"type", "ByteLevel"}, {"use_regex", false}}}}};
  const std::string dir = FreshTempDir("tok_oniguruma");
  WriteFile(dir, "tokenizer.json", json.dump());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ(EncodeOk(**tokenizer, "b a"), (std::vector<int32_t>{'b', 256}));
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

// "bytes", the name shards record for byte-level tokens and `ckpt export --tokenizer` takes, is
// the byte-level tokenizer for every command, as an empty path is (it was a missing file).
TEST(LoadTokenizerTest, BytesNamesTheByteLevelTokenizer) {
  for (const std::string path : {"", "bytes"}) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(path);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    EXPECT_EQ((*tokenizer)->name(), "bytes");
    EXPECT_EQ(EncodeOk(**tokenizer, "a\xc3\xa9"), (std::vector<int32_t>{'a', 0xc3, 0xa9}));
  }
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

const std::string kSpace = "\xe2\x96\x81";  // "▁"

// Llama 2's shape: ids 259.. are the characters, then the merges' results.
nlohmann::json SmallLlama2Json() {
  return testing::Llama2TokenizerJson({kSpace, "a", "b", "c"},
                                      {{kSpace, "a"}, {"a", "b"}, {kSpace + "a", "b"}});
}
constexpr int32_t kByte0 = 3, kSpaceId = 259, kC = 262, kSpaceA = 263, kSpaceAb = 265;

TEST(LoadTokenizerTest, Llama2JsonPrependsMergesAcrossSpacesAndFallsBackToBytes) {
  const std::string dir = FreshTempDir("tok_llama2");
  WriteFile(dir, "tokenizer.json", SmallLlama2Json().dump());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  // "▁ab▁ab": ▁+a first (rank 0), then ▁a+b; "ab" (rank 1) never forms.
  EXPECT_EQ(EncodeOk(**tokenizer, "ab ab"), (std::vector<int32_t>{kSpaceAb, kSpaceAb}));
  // The euro sign has no token: its three bytes' tokens.
  EXPECT_EQ(EncodeOk(**tokenizer, "c\xe2\x82\xac"),
            (std::vector<int32_t>{kSpaceId, kC, kByte0 + 0xe2, kByte0 + 0x82, kByte0 + 0xac}));
  // Each stretch after a special token is normalized on its own, so prepended again.
  EXPECT_EQ(EncodeOk(**tokenizer, "<s>ab</s>a"), (std::vector<int32_t>{1, kSpaceAb, 2, kSpaceA}));
  for (const std::string text : {"ab ab", "c\xe2\x82\xac  a", "ab\xff\xfe c"}) {
    EXPECT_EQ(*(*tokenizer)->Decode(EncodeOk(**tokenizer, text)), text);
  }
  EXPECT_EQ(*(*tokenizer)->Decode(std::vector<int32_t>{1, kSpaceAb}), "<s> ab");
  EXPECT_EQ(*(*tokenizer)->SpecialToken("</s>"), 2);
  EXPECT_EQ((*tokenizer)->vocab_size(), 266);
}

TEST(LoadTokenizerTest, MetaspaceJsonSplitsWordsAndWritesUnknownCharactersAsUnk) {
  const std::string dir = FreshTempDir("tok_metaspace_unk");
  nlohmann::json json = SmallLlama2Json();
  json["normalizer"] = nullptr;
  const nlohmann::json metaspace = {{"type", "Metaspace"},
                                    {"replacement", kSpace},
                                    {"prepend_scheme", "always"},
                                    {"split", true}};
  json["pre_tokenizer"] = metaspace;
  json["decoder"] = metaspace;
  json["model"]["byte_fallback"] = false;
  WriteFile(dir, "tokenizer.json", json.dump());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  // Words "▁ab", "▁zzc": split keeps ▁ab whole, z z fuse into one <unk>.
  EXPECT_EQ(EncodeOk(**tokenizer, "ab zzc"), (std::vector<int32_t>{kSpaceAb, kSpaceId, 0, kC}));
  EXPECT_EQ(*(*tokenizer)->Decode(std::vector<int32_t>{kSpaceAb, kSpaceA}), "ab a");
  json["model"]["fuse_unk"] = false;
  WriteFile(dir, "tokenizer.json", json.dump());
  tokenizer = LoadTokenizer(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ(EncodeOk(**tokenizer, "zz"), (std::vector<int32_t>{kSpaceId, 0, 0}));
  // Without byte fallback invalid UTF-8 has no tokens: an error naming the byte.
  std::vector<int32_t> ids;
  EXPECT_THAT(std::string((*tokenizer)->Encode("ab\xff", &ids).message()),
              HasSubstr("byte offset 2"));
  // Without an unk_token either, an unknown character is an error, not dropped.
  json["model"]["unk_token"] = nullptr;
  WriteFile(dir, "tokenizer.json", json.dump());
  tokenizer = LoadTokenizer(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_THAT(std::string((*tokenizer)->Encode("az", &ids).message()),
              HasSubstr("'z' has no token"));
}

TEST(LoadTokenizerTest, SentencePieceStyleEncodesOnOneThreadsIds) {
  const std::string dir = FreshTempDir("tok_llama2_parallel");
  WriteFile(dir, "tokenizer.json", SmallLlama2Json().dump());
  absl::StatusOr<std::unique_ptr<Tokenizer>> one = LoadTokenizer(dir, 1);
  absl::StatusOr<std::unique_ptr<Tokenizer>> four = LoadTokenizer(dir, 4);
  ASSERT_TRUE(one.ok() && four.ok());
  std::mt19937 rng(7);
  const char* words[] = {"ab", " ", "\n", "c", "a", "\n\n"};
  std::string text;
  while (text.size() < (1 << 20)) text += words[rng() % 6];
  EXPECT_EQ(EncodeOk(**four, text), EncodeOk(**one, text));
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
  nlohmann::json whitespace = TokenizerJson({});
  whitespace["pre_tokenizer"] = {{"type", "Whitespace"}};
  const std::string whitespace_path = WriteFile(dir, "whitespace.json", whitespace.dump());
  EXPECT_THAT(error_of(whitespace_path), HasSubstr("pre_tokenizer Whitespace is not supported"));
  nlohmann::json nested = SmallLlama2Json();
  nested["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Metaspace"}}}}};
  const std::string nested_path = WriteFile(dir, "nested.json", nested.dump());
  EXPECT_THAT(error_of(nested_path), HasSubstr("Metaspace inside a Sequence is not supported"));
  nlohmann::json lowercase = SmallLlama2Json();
  lowercase["normalizer"] = {{"type", "Lowercase"}};
  const std::string lowercase_path = WriteFile(dir, "lowercase.json", lowercase.dump());
  EXPECT_THAT(error_of(lowercase_path),
              HasSubstr(lowercase_path + ": normalizer {\"type\":\"Lowercase\"} is not supported"));
  nlohmann::json wordpiece_decoder = SmallLlama2Json();
  wordpiece_decoder["decoder"] = {{"type", "WordPiece"}};
  const std::string decoder_path = WriteFile(dir, "decoder.json", wordpiece_decoder.dump());
  EXPECT_THAT(error_of(decoder_path),
              HasSubstr("decoder {\"type\":\"WordPiece\"} is not supported"));
  nlohmann::json bad_unk = SmallLlama2Json();
  bad_unk["model"]["unk_token"] = "<unknown>";
  const std::string bad_unk_path = WriteFile(dir, "bad_unk.json", bad_unk.dump());
  EXPECT_THAT(error_of(bad_unk_path), HasSubstr("unk_token '<unknown>' is not in the vocabulary"));
  nlohmann::json no_byte = TokenizerJson({});
  no_byte["model"]["vocab"].erase(ByteLevelChar(0xff));
  const std::string no_byte_path = WriteFile(dir, "no_byte.json", no_byte.dump());
  EXPECT_THAT(error_of(no_byte_path), HasSubstr("byte 0xff has no token"));
  nlohmann::json bad_merge = TokenizerJson({{"a", "b"}});
  bad_merge["model"]["merges"].push_back({"a", "zz"});
  const std::string bad_merge_path = WriteFile(dir, "bad_merge.json", bad_merge.dump());
  EXPECT_THAT(error_of(bad_merge_path), HasSubstr(bad_merge_path + ": merge 1"));
  // A huge id, in the vocabulary or among the added tokens, aborted (or took gigabytes).
  nlohmann::json huge_id = TokenizerJson({});
  huge_id["model"]["vocab"]["zz"] = 2147483647;
  const std::string huge_id_path = WriteFile(dir, "huge_id.json", huge_id.dump());
  EXPECT_THAT(error_of(huge_id_path),
              HasSubstr(huge_id_path + ": token id 2147483647 is too large"));
  nlohmann::json huge_added = TokenizerJson({}, {"<|x|>"});
  huge_added["added_tokens"][0]["id"] = 2000000000;
  const std::string huge_added_path = WriteFile(dir, "huge_added.json", huge_added.dump());
  EXPECT_THAT(error_of(huge_added_path), HasSubstr("token id 2000000000 is too large"));
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
