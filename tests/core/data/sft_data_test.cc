#include "core/data/sft_data.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "core/data/data_pack.h"
#include "core/data/tokenizers/load_tokenizer.h"
#include "gtest/gtest.h"
#include "tests/core/data/tokenizers/tokenizer_json.h"
#include "tests/testing/run_dtrain.h"
#include "tests/testing/special_tokens_tokenizer.h"

namespace dtrain {
namespace {

using testing::SpecialTokensTokenizer;

std::string Decode(const std::vector<int32_t>& ids) {
  return *SpecialTokensTokenizer().Decode(ids);
}

// The trained tokens' text, in order.
std::string TrainedText(const SftSample& sample) {
  std::vector<int32_t> trained;
  for (size_t i = 0; i < sample.tokens.size(); ++i) {
    if (sample.trained[i]) trained.push_back(sample.tokens[i]);
  }
  return Decode(trained);
}

TEST(SftDataTest, MessagesAndPromptCompletionMaskAllButTheAnswer) {
  const SpecialTokensTokenizer tokenizer;
  const ChatTemplate llama3 = *LoadChatTemplate("llama3");
  absl::StatusOr<SftSample> sample = EncodeSftLine(
      R"({"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
                       {"role": "user", "content": "3+3?"}, {"role": "assistant", "content": "6"}]})",
      llama3, tokenizer, "chat.jsonl:1");
  ASSERT_TRUE(sample.ok()) << sample.status();
  EXPECT_EQ(Decode(sample->tokens),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\n3+3?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n6<|eot_id|>");
  // Each marker is one id of the tokenizer: the mask lines up with them.
  EXPECT_EQ(sample->tokens[0], *tokenizer.SpecialToken("<|begin_of_text|>"));
  EXPECT_EQ(TrainedText(*sample), "4<|eot_id|>6<|eot_id|>");

  sample = EncodeSftLine(R"({"prompt": "Q: sky?", "completion": " blue"})",
                         *LoadChatTemplate("none"), tokenizer, "qa.jsonl:1");
  ASSERT_TRUE(sample.ok()) << sample.status();
  EXPECT_EQ(Decode(sample->tokens), "Q: sky? blue");
  EXPECT_EQ(TrainedText(*sample), " blue");
}

// The rendered conversation is encoded whole, as transformers encodes it: a SentencePiece
// tokenizer prepends "▁" once, not before every piece (prefix, content, suffix), and the space of
// "[/INST] yo" joins the answer's first word. Before, the pieces were encoded one by one, each
// with a "▁" of its own (a lone "▁" and a "▁▁" among them).
TEST(SftDataTest, ConversationsAreEncodedWholeAsTheirModelReadsThem) {
  const std::string space = "\xe2\x96\x81";
  std::vector<std::string> characters = {space};
  for (const char c : std::string("[]/INSThiyo")) characters.emplace_back(1, c);
  const std::string dir = testing::FreshTempDir("sft_llama2_tokenizer");
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/tokenizer.json")
      << testing::Llama2TokenizerJson(characters, {{space, "["},
                                                   {space, "h"},
                                                   {space + "h", "i"},
                                                   {space, "y"},
                                                   {space + "y", "o"},
                                                   {"I", "N"},
                                                   {"IN", "S"},
                                                   {"INS", "T"}})
             .dump();
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const ChatTemplate llama2{
      .name = "llama2",
      .begin = "<s>",
      .roles = {{"user", {"[INST] ", " [/INST]"}}, {"assistant", {" ", "</s>"}}}};
  const absl::StatusOr<SftSample> sample =
      EncodeSftLine(R"({"prompt": "hi", "completion": "yo"})", llama2, **tokenizer, "chat.jsonl:1");
  ASSERT_TRUE(sample.ok()) << sample.status();
  std::vector<int32_t> whole;
  ASSERT_TRUE((*tokenizer)->Encode("<s>[INST] hi [/INST] yo</s>", &whole).ok());
  EXPECT_EQ(sample->tokens, whole);
  // Trained: "▁yo" (its space from the assistant's prefix, its word the answer's) and "</s>".
  std::vector<int32_t> answer;
  ASSERT_TRUE((*tokenizer)->Encode("yo</s>", &answer).ok());  // the tokenizer prepends "▁"
  ASSERT_EQ(answer.size(), 2u);
  std::vector<int32_t> trained;
  for (size_t i = 0; i < sample->tokens.size(); ++i) {
    if (sample->trained[i]) trained.push_back(sample->tokens[i]);
  }
  EXPECT_EQ(trained, answer);
}

// A stretch's edge where the text before it ends in spaces: encoded apart, GPT-2's split keeps
// them together ("ĠĠ"), the whole text splits them ("Ġ" + "ĠA"). The whole's tokens that lie
// within one side are that side's: the prompt's own space was trained, the answer's own not.
TEST(SftDataTest, AnEdgeAfterTrailingSpacesMasksEachSidesOwnTokens) {
  const std::string dir = testing::FreshTempDir("sft_gpt2_spaces_tokenizer");
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/tokenizer.json")
      << testing::TokenizerJson({{" ", " "}, {" ", "A"}, {" ", "N"}}).dump();
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const auto trained_text = [&](const std::string& line) -> std::string {
    const absl::StatusOr<SftSample> sample =
        EncodeSftLine(line, *LoadChatTemplate("none"), **tokenizer, "edge.jsonl:1");
    EXPECT_TRUE(sample.ok()) << sample.status();
    if (!sample.ok()) return "";
    std::vector<int32_t> trained;
    for (size_t i = 0; i < sample->tokens.size(); ++i) {
      if (sample->trained[i]) trained.push_back(sample->tokens[i]);
    }
    return *(*tokenizer)->Decode(trained);
  };
  // "Q:  A" is Q : Ġ ĠA; "ĠA" crosses the edge, so it is the answer's.
  EXPECT_EQ(trained_text(R"({"prompt": "Q:  ", "completion": "A"})"), " A");
  // "Q A  NB" is Q ĠA Ġ ĠN B: the answer " A  " holds "Ġ" whole; "ĠN" is the next user's.
  EXPECT_EQ(trained_text(R"({"messages": [{"role": "user", "content": "Q"},
                                          {"role": "assistant", "content": " A  "},
                                          {"role": "user", "content": "N"},
                                          {"role": "assistant", "content": "B"}]})"),
            " A B");
}

// Every bad line is one error naming the file and line; none is dropped silently.
TEST(SftDataTest, BadLinesAreErrorsNamingFileAndLine) {
  const SpecialTokensTokenizer tokenizer;
  const ChatTemplate chatml = *LoadChatTemplate("chatml");
  for (const auto& [line, what] : {
           std::pair{R"({"prompt": "x", "completion": )", "not valid JSON"},
           {R"(["prompt", "completion"])", "not a JSON object"},
           {R"({"text": "pretraining"})", "no \"prompt\" string"},
           {R"({"prompt": "x", "completion": 5})", "no \"completion\" string"},
           {R"({"messages": {"role": "user"}})", "\"messages\" is not a list"},
           {R"({"messages": [{"role": "user", "content": ["a"]}]})",
            "messages[0] has no \"content\" string"},
           {R"({"messages": [{"content": "a"}]})", "messages[0] has no \"role\" string"},
           {R"({"messages": [{"role": "robot", "content": "a"}]})", "role \"robot\" is not one of"},
           {R"({"messages": [{"role": "user", "content": "a"}]})", "nothing to train on"},
           {R"({"prompt": "x", "completion": ""})", "message 2 of 2 (the assistant's) has no text"},
           {R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": ""},
                {"role": "user", "content": "b"}, {"role": "assistant", "content": "c"}]})",
            "message 2 of 4 (the assistant's) has no text"},
           {R"({"prompt": "x", "completion": "y", "messages": []})", "has both \"messages\""},
           {"{\"prompt\": \"\xff\", \"completion\": \"a\"}", "not valid JSON"},
       }) {
    const absl::Status status = EncodeSftLine(line, chatml, tokenizer, "chat.jsonl:7").status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << line;
    EXPECT_EQ(status.message().find(std::string("chat.jsonl:7: ") + what), 0u) << status.message();
  }
}

SftSample Sample(int size, int prompt) {
  SftSample sample;
  for (int i = 0; i < size; ++i) {
    sample.tokens.push_back(10 + i);
    sample.trained.push_back(i >= prompt ? 1 : 0);
  }
  return sample;
}

// Samples of 4, 3 and 6 tokens in rows of 6 slots: 3 + 2 fit the first row (one slot of
// padding), 5 the second (one slot). Positions restart per sample and in the padding; a target
// is the next token where it is trained, else -1, and never crosses into the next sample.
TEST(SftDataTest, GreedyPackingKeepsSamplesWholeWithTheirPositionsAndMasks) {
  const std::vector<SftSample> samples = {Sample(4, 2), Sample(3, 1), Sample(6, 3)};
  const SftRows rows = PackSftRows(samples, 6, true, LongSamplePolicy::kTruncate);
  EXPECT_EQ(rows.rows, 2);
  EXPECT_EQ(rows.inputs, (std::vector<int32_t>{10, 11, 12, 10, 11, 0, 10, 11, 12, 13, 14, 0}));
  EXPECT_EQ(rows.targets, (std::vector<int32_t>{-1, 12, 13, 11, 12, -1, -1, -1, 13, 14, 15, -1}));
  EXPECT_EQ(rows.positions, (std::vector<int32_t>{0, 1, 2, 0, 1, 0, 0, 1, 2, 3, 4, 0}));
  EXPECT_EQ(rows.trained_tokens, 7);
  EXPECT_EQ(rows.padding_tokens, 2);
  EXPECT_EQ(rows.samples, 3);

  // Without packing each sample has its own row.
  const SftRows single = PackSftRows(samples, 6, false, LongSamplePolicy::kTruncate);
  EXPECT_EQ(single.rows, 3);
  EXPECT_EQ(std::vector<int32_t>(single.positions.begin() + 6, single.positions.begin() + 12),
            (std::vector<int32_t>{0, 1, 0, 1, 2, 3}));
  EXPECT_EQ(single.padding_tokens, 3 + 4 + 1);
}

// A sample of more than seq_len + 1 tokens is cut to its first seq_len + 1 or left out, counted
// either way, as is a sample too short to have a target.
TEST(SftDataTest, LongAndEmptySamplesAreCounted) {
  const std::vector<SftSample> samples = {Sample(9, 1), Sample(1, 0), Sample(4, 1)};
  const SftRows truncated = PackSftRows(samples, 5, true, LongSamplePolicy::kTruncate);
  EXPECT_EQ(truncated.truncated, 1);
  EXPECT_EQ(truncated.skipped, 1);
  EXPECT_EQ(truncated.samples, 2);
  EXPECT_EQ(std::vector<int32_t>(truncated.targets.begin(), truncated.targets.begin() + 5),
            (std::vector<int32_t>{11, 12, 13, 14, 15}));
  const SftRows skipped = PackSftRows(samples, 5, true, LongSamplePolicy::kSkip);
  EXPECT_EQ(skipped.truncated, 0);
  EXPECT_EQ(skipped.skipped, 2);
  EXPECT_EQ(skipped.rows, 1);
  EXPECT_EQ(ParseLongSamplePolicy("drop").status().message(),
            "data.on_long_sample: 'drop' is not one of truncate, skip");
}

// `data pack --sft` writes tokens and masks that ReadSftShards gives back, a sample never split
// over two shards; token shards without masks are refused with the fix.
TEST(SftDataTest, PackedShardsReadBackWithTheirMasks) {
  const std::string dir = ::testing::TempDir() + "/sft_pack";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string input = dir + "/chat.jsonl";
  {
    std::ofstream out(input);
    for (int i = 0; i < 40; ++i) {
      out << R"({"prompt": "question )" << i << R"(", "completion": "answer )" << i << "\"}\n";
      if (i == 3) out << "\n";  // blank lines are not samples
    }
  }
  const SpecialTokensTokenizer tokenizer;
  absl::StatusOr<PackResult> packed =
      PackSftShards({input}, dir + "/shards", 4096, tokenizer, *LoadChatTemplate("chatml"));
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_EQ(packed->documents, 40);
  EXPECT_GT(packed->shards.size(), 1u);
  absl::StatusOr<std::vector<SftSample>> samples =
      ReadSftShards(packed->shards, tokenizer.vocab_size());
  ASSERT_TRUE(samples.ok()) << samples.status();
  ASSERT_EQ(samples->size(), 40u);
  int64_t trained = 0;
  for (int i = 0; i < 40; ++i) {
    const SftSample& sample = (*samples)[i];
    EXPECT_EQ(TrainedText(sample), "answer " + std::to_string(i) + "<|im_end|>");
    trained += std::count(sample.trained.begin(), sample.trained.end(), 1);
  }
  EXPECT_EQ(packed->trained_tokens, trained);

  // Encoded on 3 threads, the lines are written in the same order: the same bytes.
  absl::StatusOr<PackResult> threaded = PackSftShards({input}, dir + "/threaded", 4096, tokenizer,
                                                      *LoadChatTemplate("chatml"), /*threads=*/3);
  ASSERT_TRUE(threaded.ok()) << threaded.status();
  ASSERT_EQ(threaded->shards.size(), packed->shards.size());
  const auto bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  };
  for (size_t i = 0; i < packed->shards.size(); ++i) {
    EXPECT_EQ(bytes(threaded->shards[i]), bytes(packed->shards[i])) << packed->shards[i];
  }

  // The line of a bad record is named.
  std::ofstream(input, std::ios::app) << R"({"prompt": "no answer"})"
                                      << "\n";
  EXPECT_EQ(
      PackSftShards({input}, dir + "/bad_shards", 4096, tokenizer, *LoadChatTemplate("chatml"))
          .status()
          .message()
          .find(input + ":42: no \"completion\" string"),
      0u);
  // ... and the 41 samples before it leave no shard behind: a partial pack is no dataset, and
  // would block the next pack into the folder.
  EXPECT_TRUE(std::filesystem::is_empty(dir + "/bad_shards"));

  const std::string text = dir + "/plain.txt";
  std::ofstream(text) << "pretraining text";
  absl::StatusOr<PackResult> plain = PackShards({text}, dir + "/plain", 4096, ByteTokenizer());
  ASSERT_TRUE(plain.ok()) << plain.status();
  const absl::Status status = ReadSftShards(plain->shards, 256).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(status.message().find("has no .mask member"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("dtrain data pack --sft"), std::string::npos);

  // Shards of another tokenizer (here bytes) after the first's are refused, naming both: their
  // ids would train as one vocabulary.
  std::vector<std::string> mixed = packed->shards;
  mixed.push_back(plain->shards.front());
  const absl::Status mixed_status = ReadSftShards(mixed, tokenizer.vocab_size()).status();
  EXPECT_EQ(mixed_status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(mixed_status.message().find(absl::StrCat("shard ", plain->shards.front(),
                                                     " records tokenizer bytes, but the "
                                                     "data's first shard records ",
                                                     tokenizer.name())),
            std::string::npos)
      << mixed_status.message();
}

}  // namespace
}  // namespace dtrain
