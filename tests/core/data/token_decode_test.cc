#include "core/data/token_decode.h"

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "core/data/tokenizers/load_tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/core/data/tokenizers/tokenizer_json.h"
#include "tests/testing/run_dtrain.h"

namespace dtrain {
namespace {

Sample OneField(const std::string& extension, const std::string& data) {
  Sample sample{.key = "k", .url = "s.tar"};
  sample.fields.push_back({.extension = extension, .data = data, .member = "k." + extension});
  return sample;
}

TEST(TokenDecodeTest, DecodesEveryFormat) {
  std::vector<int32_t> tokens;
  ASSERT_TRUE(
      DecodeSampleTokens(OneField("tokens", std::string("\x01\x02\xff\x00", 4)), 1 << 16, &tokens)
          .ok());
  EXPECT_EQ(tokens, (std::vector<int32_t>{0x0201, 0xff}));
  ASSERT_TRUE(
      DecodeSampleTokens(OneField("tokens32", std::string("\x01\x00\x01\x00", 4)), 1 << 20, &tokens)
          .ok());
  EXPECT_EQ(tokens, (std::vector<int32_t>{0x10001}));
  ASSERT_TRUE(DecodeSampleTokens(OneField("json", "[5, 0, 7]"), 8, &tokens).ok());
  EXPECT_EQ(tokens, (std::vector<int32_t>{5, 0, 7}));
  ASSERT_TRUE(DecodeSampleTokens(OneField("txt", "hi\xff"), 256, &tokens).ok());
  EXPECT_EQ(tokens, (std::vector<int32_t>{'h', 'i', 255}));
  // WebDataset's text samples: a .txt with a .json of metadata reads the text (the .json was
  // taken for ids and refused).
  Sample text = OneField("json", R"({"source": "web", "lang": "en"})");
  text.fields.push_back({.extension = "txt", .data = "ok", .member = "k.txt"});
  ASSERT_TRUE(DecodeSampleTokens(text, 256, &tokens).ok());
  EXPECT_EQ(tokens, (std::vector<int32_t>{'o', 'k'}));
}

TEST(TokenDecodeTest, ErrorsNameTheSampleAndTheProblem) {
  std::vector<int32_t> tokens;
  absl::Status status = DecodeSampleTokens(OneField("tokens", "abc"), 1 << 16, &tokens);
  EXPECT_TRUE(absl::StrContains(status.message(), "sample 'k'")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "3 bytes")) << status;
  status = DecodeSampleTokens(OneField("txt", "ab"), 98, &tokens);
  EXPECT_TRUE(absl::StrContains(status.message(), "token 1 is 98")) << status;
  status = DecodeSampleTokens(OneField("json", "{\"a\": 1}"), 10, &tokens);
  EXPECT_FALSE(status.ok());
  status = DecodeSampleTokens(OneField("json", "[1, -2]"), 10, &tokens);
  EXPECT_TRUE(absl::StrContains(status.message(), "item 1 is -2")) << status;
  status = DecodeSampleTokens(OneField("png", "x"), 10, &tokens);
  EXPECT_TRUE(absl::StrContains(status.message(), "no token field among its files (.png)"))
      << status;
}

TEST(TokenDecodeTest, TakesTokenBytesWithoutCopyingAndWidensOnCopyOut) {
  Sample sample = OneField("tokens", std::string("\x01\x02\xff\x00\x07\x00", 6));
  TokenDocument document{.words = "old", .width = 4};
  ASSERT_TRUE(TakeSampleTokens(&sample, 1 << 16, &document).ok());
  EXPECT_EQ(document.width, 2);
  EXPECT_EQ(document.size(), 3);
  EXPECT_EQ(sample.fields[0].data, "old");  // the document's old buffer, for reuse
  int32_t out[2];
  document.CopyTo(1, 2, out);
  EXPECT_EQ(out[0], 0xff);
  EXPECT_EQ(out[1], 7);

  sample = OneField("tokens32", std::string("\x01\x00\x01\x00", 4));
  ASSERT_TRUE(TakeSampleTokens(&sample, 1 << 20, &document).ok());
  document.CopyTo(0, 1, out);
  EXPECT_EQ(out[0], 0x10001);
  sample = OneField("json", "[5, 0, 7]");
  ASSERT_TRUE(TakeSampleTokens(&sample, 8, &document).ok());
  ASSERT_EQ(document.size(), 3);
  document.CopyTo(1, 2, out);
  EXPECT_EQ(out[0], 0);
  EXPECT_EQ(out[1], 7);
  sample = OneField("txt", "hi\xff");
  ASSERT_TRUE(TakeSampleTokens(&sample, 256, &document).ok());
  document.CopyTo(2, 1, out);
  EXPECT_EQ(out[0], 255);
}

// A .txt through the data's tokenizer: its ids, in 2 bytes where the vocabulary fits; an id the
// model has no row for, or text the tokenizer does not take, names the sample.
TEST(TokenDecodeTest, TakeEncodesTextThroughTheTokenizer) {
  const absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(
      testing::WriteTempFile("decode_tokenizer.json", testing::TokenizerJson({{"h", "i"}}).dump()));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  Sample sample = OneField("txt", "hi hi");
  TokenDocument document;
  ASSERT_TRUE(TakeSampleTokens(&sample, 300, &document, {}, tokenizer->get()).ok());
  EXPECT_EQ(document.width, 2);
  std::vector<int32_t> ids(static_cast<size_t>(document.size()));
  document.CopyTo(0, document.size(), ids.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{256, ' ', 256}));  // "hi", " ", "hi"

  sample = OneField("txt", "hi");
  EXPECT_THAT(TakeSampleTokens(&sample, 256, &document, {}, tokenizer->get()).message(),
              ::testing::HasSubstr("sample 'k': .txt token 0 is 256, not below model.vocab_size"));

  nlohmann::json characters = testing::Llama2TokenizerJson({"h", "i"}, {});
  characters["model"]["byte_fallback"] = false;
  const absl::StatusOr<std::unique_ptr<Tokenizer>> utf8_only =
      LoadTokenizer(testing::WriteTempFile("decode_utf8_only.json", characters.dump()));
  ASSERT_TRUE(utf8_only.ok()) << utf8_only.status();
  sample = OneField("txt", "h\xff");
  EXPECT_THAT(TakeSampleTokens(&sample, 300, &document, {}, utf8_only->get()).message(),
              ::testing::HasSubstr("sample 'k': .txt does not encode with data.tokenizer"));
}

TEST(TokenDecodeTest, TakeChecksLikeDecode) {
  TokenDocument document;
  Sample sample = OneField("tokens", std::string("\x01\x00\x10\xc4", 4));  // 1, 50192
  EXPECT_TRUE(TakeSampleTokens(&sample, 50257, &document).ok());
  sample = OneField("tokens", std::string("\x01\x00\x51\xc4", 4));  // 1, 50257
  absl::Status status = TakeSampleTokens(&sample, 50257, &document);
  EXPECT_TRUE(absl::StrContains(status.message(), "token 1 is 50257")) << status;
  sample = OneField("tokens", "abc");
  status = TakeSampleTokens(&sample, 1 << 16, &document);
  EXPECT_TRUE(absl::StrContains(status.message(), "3 bytes")) << status;
  sample = OneField("tokens32", std::string("\x00\x00\x00\x80", 4));  // 2^31
  status = TakeSampleTokens(&sample, std::numeric_limits<int32_t>::max(), &document);
  EXPECT_TRUE(absl::StrContains(status.message(), "token 0 is 2147483648")) << status;
  sample = OneField("png", "x");
  EXPECT_FALSE(TakeSampleTokens(&sample, 10, &document).ok());
}

// `dtrain data pack` records its tokenizer in the first sample of a shard; ids of a vocabulary
// larger than the model's are refused before any is read, naming both sizes.
TEST(TokenDecodeTest, RecordedTokenizerMustFitTheVocabulary) {
  Sample sample = OneField("tokens", std::string("\x01\x00", 2));
  sample.fields.push_back({.extension = "tokenizer.json",
                           .data = R"({"name": "hf-bpe:gpt2/tokenizer.json#abc", )"
                                   R"("vocab_size": 50257})"});
  std::vector<int32_t> tokens;
  absl::Status status = DecodeSampleTokens(sample, 256, &tokens);
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  for (const char* part :
       {"shard s.tar", "hf-bpe:gpt2/tokenizer.json#abc", "50257", "model.vocab_size 256"}) {
    EXPECT_TRUE(absl::StrContains(status.message(), part)) << part << ": " << status;
  }
  TokenDocument document;
  EXPECT_TRUE(absl::IsFailedPrecondition(TakeSampleTokens(&sample, 50256, &document)));
  EXPECT_TRUE(TakeSampleTokens(&sample, 50257, &document).ok());
  sample.fields[1].data = "[1, 2]";
  EXPECT_TRUE(absl::StrContains(DecodeSampleTokens(sample, 1 << 16, &tokens).message(),
                                ".tokenizer.json is not"));
}

}  // namespace
}  // namespace dtrain
