#include "core/data/sft_data.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "core/data/sample_grouper.h"
#include "core/data/shard_source.h"
#include "core/data/tar_reader.h"
#include "core/data/token_decode.h"
#include "core/util/status.h"

namespace dtrain {
namespace {

absl::Status LineError(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
}

// The conversation of a record in either shape.
absl::StatusOr<std::vector<ChatMessage>> Messages(const nlohmann::json& record,
                                                  const std::string& where) {
  constexpr char kShapes[] =
      "; expected {\"prompt\": \"...\", \"completion\": \"...\"} or {\"messages\": [{\"role\": "
      "\"...\", \"content\": \"...\"}, ...]}";
  if (!record.is_object()) return LineError(where, absl::StrCat("not a JSON object", kShapes));
  if (record.contains("messages") && (record.contains("prompt") || record.contains("completion"))) {
    return LineError(where, absl::StrCat("has both \"messages\" and \"prompt\"/\"completion\"; "
                                         "give one of the two shapes",
                                         kShapes));
  }
  if (record.contains("messages")) {
    const nlohmann::json& list = record["messages"];
    if (!list.is_array())
      return LineError(where, absl::StrCat("\"messages\" is not a list", kShapes));
    std::vector<ChatMessage> messages;
    for (size_t i = 0; i < list.size(); ++i) {
      const nlohmann::json& m = list[i];
      for (const char* key : {"role", "content"}) {
        if (!m.is_object() || !m.contains(key) || !m[key].is_string()) {
          return LineError(where,
                           absl::StrCat("messages[", i, "] has no \"", key, "\" string", kShapes));
        }
      }
      messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
    return messages;
  }
  for (const char* key : {"prompt", "completion"}) {
    if (!record.contains(key) || !record[key].is_string()) {
      return LineError(where, absl::StrCat("no \"", key, "\" string", kShapes));
    }
  }
  return std::vector<ChatMessage>{{"user", record["prompt"].get<std::string>()},
                                  {"assistant", record["completion"].get<std::string>()}};
}

}  // namespace

absl::StatusOr<SftSample> EncodeSftLine(std::string_view line, const ChatTemplate& chat_template,
                                        const Tokenizer& tokenizer, const std::string& where) {
  const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
  if (record.is_discarded()) {
    return LineError(where, "not valid JSON (a syntax error, or text that is not UTF-8)");
  }
  ASSIGN_OR_RETURN(const std::vector<ChatMessage> messages, Messages(record, where));
  absl::StatusOr<std::vector<TextSegment>> segments = RenderConversation(chat_template, messages);
  if (!segments.ok()) return LineError(where, std::string(segments.status().message()));
  // (RenderConversation refuses an assistant message without text.)
  constexpr char kNothingToTrain[] =
      "nothing to train on: no assistant message (the loss counts only the assistant's "
      "tokens); drop the line or add the answer";
  if (std::none_of(messages.begin(), messages.end(),
                   [](const ChatMessage& m) { return m.role == "assistant"; })) {
    return LineError(where, kNothingToTrain);
  }
  // The rendered text is encoded whole, as its model reads it at inference (apart, each piece
  // would start a word of its own: SentencePiece's "▁" before every piece, a word split where
  // a prefix ends in a space).
  std::string text;
  for (const TextSegment& segment : *segments) text += segment.text;
  SftSample sample;
  if (absl::Status status = tokenizer.Encode(text, &sample.tokens); !status.ok()) {
    return LineError(where, std::string(status.message()));
  }
  sample.trained.assign(sample.tokens.size(), 0);
  // Where the trained flag changes, the tokens of the text before agree with the whole's up to
  // a token: the later stretch starts there (a token across the boundary is the later one's).
  // Encoded apart, that text can end in another split than the whole's (GPT-2's `\s+(?!\S)`
  // keeps trailing spaces together only at the end of a text): a token of the whole whose text
  // still lies within it, as decoding tells, is the earlier stretch's.
  std::vector<int32_t> before;
  const auto token_at = [&](size_t offset) -> absl::StatusOr<size_t> {
    before.clear();
    const std::string_view earlier = std::string_view(text).substr(0, offset);
    RETURN_IF_ERROR(tokenizer.Encode(earlier, &before));
    size_t token = static_cast<size_t>(
        std::mismatch(before.begin(), before.end(), sample.tokens.begin(), sample.tokens.end())
            .first -
        before.begin());
    // A token that decodes to nothing (a control token) gives no text to place: the later one's.
    const absl::StatusOr<std::string> before_token =
        tokenizer.Decode(absl::MakeConstSpan(sample.tokens).first(token));
    for (size_t covered = before_token.ok() ? before_token->size() : 0;
         token < sample.tokens.size(); ++token) {
      const absl::StatusOr<std::string> decoded =
          tokenizer.Decode(absl::MakeConstSpan(sample.tokens).first(token + 1));
      if (!decoded.ok() || decoded->size() <= covered ||
          earlier.substr(0, decoded->size()) != *decoded) {
        break;
      }
      covered = decoded->size();
    }
    return token;
  };
  size_t offset = 0, stretch_token = 0;
  bool trained = false;
  for (const TextSegment& segment : *segments) {
    if (segment.trained != trained) {
      absl::StatusOr<size_t> token = token_at(offset);
      if (!token.ok()) return LineError(where, std::string(token.status().message()));
      const size_t boundary = std::max(stretch_token, *token);
      if (trained) {
        std::fill(sample.trained.begin() + stretch_token, sample.trained.begin() + boundary, 1);
      }
      stretch_token = boundary;
      trained = segment.trained;
    }
    offset += segment.text.size();
  }
  if (trained) std::fill(sample.trained.begin() + stretch_token, sample.trained.end(), 1);
  // The first token is never a target (nothing precedes it).
  if (!sample.trained.empty()) sample.trained[0] = 0;
  if (std::find(sample.trained.begin(), sample.trained.end(), 1) == sample.trained.end()) {
    return LineError(where, kNothingToTrain);
  }
  return sample;
}

absl::StatusOr<std::vector<SftSample>> ReadSftShards(const std::vector<std::string>& files,
                                                     int vocab_size) {
  std::vector<SftSample> samples;
  std::string first_tokenizer;  // the first recorded
  for (const std::string& file : files) {
    ASSIGN_OR_RETURN(std::unique_ptr<ByteSource> source, OpenShard(file, {}));
    TarReader reader(source.get());
    SampleGrouper grouper(&reader);
    Sample sample;
    while (true) {
      ASSIGN_OR_RETURN(const bool more, grouper.Next(&sample));
      if (!more) break;
      SftSample out;
      if (first_tokenizer.empty()) first_tokenizer = RecordedTokenizerName(sample);
      RETURN_IF_ERROR(DecodeSampleTokens(sample, vocab_size, &out.tokens, first_tokenizer));
      const SampleField* mask = sample.Find("mask");
      if (mask == nullptr || mask->data.size() != out.tokens.size()) {
        return absl::DataLossError(absl::StrCat(
            file, ": sample ", sample.key,
            mask == nullptr ? " has no .mask member"
                            : absl::StrCat("'s .mask has ", mask->data.size(), " bytes for ",
                                           out.tokens.size(), " tokens"),
            "; SFT data needs one mask byte per token: pack it with dtrain data pack --sft"));
      }
      out.trained.assign(mask->data.begin(), mask->data.end());
      samples.push_back(std::move(out));
    }
  }
  return samples;
}

absl::StatusOr<LongSamplePolicy> ParseLongSamplePolicy(const std::string& name) {
  if (name == "truncate") return LongSamplePolicy::kTruncate;
  if (name == "skip") return LongSamplePolicy::kSkip;
  return absl::InvalidArgumentError(
      absl::StrCat("data.on_long_sample: '", name, "' is not one of truncate, skip"));
}

SftRows PackSftRows(const std::vector<SftSample>& samples, int seq_len, bool packing,
                    LongSamplePolicy on_long_sample) {
  SftRows out;
  out.seq_len = seq_len;
  int used = seq_len;  // slots filled in the last row; a full row makes the first sample open one
  auto finish_row = [&] {
    // The tail is a padding document: it attends only to itself and has no targets.
    for (int i = 0; used < seq_len; ++used, ++i) {
      out.inputs.push_back(0);
      out.targets.push_back(-1);
      out.positions.push_back(i);
      ++out.padding_tokens;
    }
  };
  for (const SftSample& sample : samples) {
    int64_t slots = static_cast<int64_t>(sample.tokens.size()) - 1;
    if (slots < 1) {
      ++out.skipped;
      continue;
    }
    if (slots > seq_len) {
      if (on_long_sample == LongSamplePolicy::kSkip) {
        ++out.skipped;
        continue;
      }
      ++out.truncated;
      slots = seq_len;
    }
    if (!packing || used + slots > seq_len) {
      finish_row();
      used = 0;
      ++out.rows;
    }
    const int64_t trained_before = out.trained_tokens;
    for (int64_t i = 0; i < slots; ++i) {
      out.inputs.push_back(sample.tokens[i]);
      const bool trained = sample.trained[i + 1] != 0;
      out.targets.push_back(trained ? sample.tokens[i + 1] : -1);
      out.positions.push_back(static_cast<int32_t>(i));
      out.trained_tokens += trained ? 1 : 0;
    }
    if (out.trained_tokens == trained_before) ++out.untrained;
    used += static_cast<int>(slots);
    ++out.samples;
  }
  if (out.rows > 0) finish_row();
  return out;
}

}  // namespace dtrain
