#include "core/data/tokenizers/sentencepiece_style.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

// The Metaspace values were read off Hugging Face tokenizers 0.20.3 on the same inputs (quoted
// beside them); the others follow from the steps' definitions.
namespace dtrain {
namespace {

const std::string kSpace = kMetaspace;  // "▁"

std::vector<std::string> Words(const MetaspaceSpec& spec, std::string_view text, bool first) {
  std::vector<std::string> words;
  MetaspaceWords(spec, text, first, [&](std::string_view word) { words.emplace_back(word); });
  return words;
}

TEST(SentencePieceStyleTest, Llama2NormalizerPrependsAndReplacesSpaces) {
  absl::StatusOr<Normalizer> normalizer =
      Normalizer::Make({{NormalizerStep::Kind::kPrepend, "", "", kSpace},
                        {NormalizerStep::Kind::kReplace, "", " ", kSpace}});
  ASSERT_TRUE(normalizer.ok()) << normalizer.status();
  EXPECT_EQ(normalizer->Apply("Hello  world"), kSpace + "Hello" + kSpace + kSpace + "world");
  EXPECT_EQ(normalizer->Apply(" x"), kSpace + kSpace + "x");  // Prepend does not look first
  EXPECT_EQ(normalizer->Apply(""), "");                       // ... but skips empty text
}

TEST(SentencePieceStyleTest, NfkcThroughIcuKeepsBytesThatAreNotUtf8) {
  absl::StatusOr<Normalizer> nfkc = Normalizer::Make({{NormalizerStep::Kind::kUnicode, "NFKC"}});
  ASSERT_TRUE(nfkc.ok()) << nfkc.status();
  // The ligature "ﬁ", full-width "Ａ", "e" + combining acute -> "é", "①" -> "1".
  EXPECT_EQ(nfkc->Apply("\xef\xac\x81 \xef\xbc\xa1 e\xcc\x81 \xe2\x91\xa0"), "fi A \xc3\xa9 1");
  EXPECT_EQ(nfkc->Apply(std::string("\xef\xbc\xa1\xff\xef\xbc\xa1", 7)),
            "A\xff"
            "A");
  EXPECT_FALSE(Normalizer::Make({{NormalizerStep::Kind::kUnicode, "NFX"}}).ok());
}

TEST(SentencePieceStyleTest, MetaspaceSplitsBeforeEachReplacement) {
  const MetaspaceSpec always{kSpace, PrependScheme::kAlways, true};
  // tokenizers: Metaspace().pre_tokenize_str("  a  b▁c \n x") gives
  // ▁, ▁a, ▁, ▁b, ▁c, ▁\n, ▁x.
  EXPECT_EQ(Words(always, "  a  b" + kSpace + "c \n x", false),
            (std::vector<std::string>{kSpace, kSpace + "a", kSpace, kSpace + "b", kSpace + "c",
                                      kSpace + "\n", kSpace + "x"}));
  const MetaspaceSpec first{kSpace, PrependScheme::kFirst, false};
  EXPECT_EQ(Words(first, "a b", true), (std::vector<std::string>{kSpace + "a" + kSpace + "b"}));
  EXPECT_EQ(Words(first, "a b", false), (std::vector<std::string>{"a" + kSpace + "b"}));
  const MetaspaceSpec never{kSpace, PrependScheme::kNever, true};
  EXPECT_EQ(Words(never, "a b", true), (std::vector<std::string>{"a", kSpace + "b"}));
}

TEST(SentencePieceStyleTest, Llama2DecoderFusesBytesAndStripsOneLeadingSpace) {
  const std::vector<DecoderStep> llama2 = {
      {DecoderStep::Kind::kReplace, kSpace, " "},
      {DecoderStep::Kind::kByteFallback},
      {DecoderStep::Kind::kFuse},
      {DecoderStep::Kind::kStrip, "", " ", 1, 0},
  };
  // "<0xE2><0x82><0xAC>" is the euro sign; a lone <0xFF> stays its byte (Hugging Face: U+FFFD).
  EXPECT_EQ(DecodeTokens(llama2, {kSpace + kSpace + "Hi", "<0xE2>", "<0x82>", "<0xAC>", "<s>",
                                  kSpace + "x", "<0xFF>"}),
            " Hi\xe2\x82\xac<s> x\xff");
  EXPECT_EQ(ByteFallbackByte("<0x0A>"), 0x0a);
  EXPECT_EQ(ByteFallbackByte("<0x0G>"), -1);
  EXPECT_EQ(ByteFallbackByte("<s>"), -1);
}

TEST(SentencePieceStyleTest, MetaspaceDecoderDropsEveryReplacementOfTheFirstToken) {
  DecoderStep metaspace{DecoderStep::Kind::kMetaspace};
  metaspace.metaspace = {kSpace, PrependScheme::kAlways, true};
  // tokenizers: decoders.Metaspace().decode(["▁▁a", "▁b▁", "<s>", "▁"]) == "a b <s> "
  EXPECT_EQ(
      DecodeTokens({metaspace}, {kSpace + kSpace + "a", kSpace + "b" + kSpace, "<s>", kSpace}),
      "a b <s> ");
  metaspace.metaspace.prepend_scheme = PrependScheme::kNever;
  EXPECT_EQ(DecodeTokens({metaspace}, {kSpace + kSpace + "a", kSpace + "b" + kSpace}), "  a b ");
}

}  // namespace
}  // namespace dtrain
