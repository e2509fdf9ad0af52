#include "core/data/token_decode.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/util/exit_codes.h"
#include "core/util/status.h"

namespace dtrain {
namespace {

absl::Status SampleError(const Sample& sample, const std::string& what) {
  return absl::DataLossError(
      absl::StrCat("shard ", sample.url, ", sample '", sample.key, "': ", what));
}

// Little-endian `Word`s; this file assumes a little-endian host, as every
// machine dtrain targets is.
template <typename Word>
Word LoadWord(const char* bytes) {
  Word word;
  std::memcpy(&word, bytes, sizeof(Word));
  return word;
}

template <typename Word>
void Widen(const char* bytes, int64_t count, int32_t* out) {
  for (int64_t i = 0; i < count; ++i) {
    out[i] = static_cast<int32_t>(LoadWord<Word>(bytes + i * sizeof(Word)));
  }
}

void WidenWords(const char* bytes, int width, int64_t count, int32_t* out) {
  switch (width) {
    case 1:
      return Widen<uint8_t>(bytes, count, out);
    case 2:
      return Widen<uint16_t>(bytes, count, out);
    default:
      return Widen<uint32_t>(bytes, count, out);
  }
}

// Checks that the field holds whole `Word`s, each below vocab_size.
template <typename Word>
absl::Status CheckWords(const Sample& sample, const SampleField& field, int vocab_size) {
  if (field.data.size() % sizeof(Word) != 0) {
    return SampleError(sample, absl::StrCat(".", field.extension, " holds ", field.data.size(),
                                            " bytes, not a whole number of ", sizeof(Word),
                                            "-byte tokens; write it again"));
  }
  // A vocabulary wider than the word (uint16 tokens, 50k+ vocabularies or the 2^31 - 1 of
  // `dtrain data inspect`) admits every word: nothing to scan.
  if (vocab_size > 0 &&
      static_cast<uint64_t>(std::numeric_limits<Word>::max()) < static_cast<uint64_t>(vocab_size)) {
    return absl::OkStatus();
  }
  const size_t count = field.data.size() / sizeof(Word);
  const char* bytes = field.data.data();
  Word max_word = 0;
  for (size_t i = 0; i < count; ++i) {
    const Word word = LoadWord<Word>(bytes + i * sizeof(Word));
    max_word = word > max_word ? word : max_word;
  }
  // One branch-free pass above; only a bad sample pays for finding the culprit.
  if (count > 0 && static_cast<uint64_t>(max_word) >= static_cast<uint64_t>(vocab_size)) {
    for (size_t i = 0; i < count; ++i) {
      const uint64_t word = LoadWord<Word>(bytes + i * sizeof(Word));
      if (word >= static_cast<uint64_t>(vocab_size)) {
        return SampleError(sample, absl::StrCat(".", field.extension, " token ", i, " is ", word,
                                                ", not below model.vocab_size ", vocab_size,
                                                "; raise vocab_size or fix the tokenizer"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckField(const Sample& sample, const SampleField& field, int width, int vocab_size) {
  switch (width) {
    case 1:
      return CheckWords<uint8_t>(sample, field, vocab_size);
    case 2:
      return CheckWords<uint16_t>(sample, field, vocab_size);
    default:
      return CheckWords<uint32_t>(sample, field, vocab_size);
  }
}

absl::Status DecodeJson(const Sample& sample, const SampleField& field, int vocab_size,
                        std::vector<int32_t>* tokens) {
  const nlohmann::json ids = nlohmann::json::parse(field.data, nullptr, /*allow_exceptions=*/false);
  if (!ids.is_array()) {
    return SampleError(sample, ".json is not a JSON list of token ids like [15496, 995]");
  }
  tokens->clear();
  tokens->reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const nlohmann::json& id = ids[i];
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab_size) {
      // Without a vocabulary (`data inspect` without a tokenizer) any 32-bit id is one.
      return SampleError(
          sample, absl::StrCat(".json item ", i, " is ", id.dump(), ", not a token id ",
                               vocab_size == std::numeric_limits<int32_t>::max()
                                   ? std::string("(a non-negative 32-bit integer)")
                                   : absl::StrCat("in [0, model.vocab_size = ", vocab_size, ")")));
    }
    tokens->push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return absl::OkStatus();
}

// The field tokens come from, by preference, and its word width in bytes (0 for JSON).
absl::StatusOr<std::pair<size_t, int>> FindTokenField(const Sample& sample) {
  // .txt before .json: beside a text, a .json is WebDataset's metadata, not token ids.
  constexpr std::pair<const char*, int> kFormats[] = {
      {"tokens", 2}, {"tokens32", 4}, {"txt", 1}, {"json", 0}};
  for (const auto& [extension, width] : kFormats) {
    if (const SampleField* field = sample.Find(extension)) {
      return std::make_pair(static_cast<size_t>(field - sample.fields.data()), width);
    }
  }
  std::vector<std::string> extensions;
  for (const SampleField& field : sample.fields) extensions.push_back("." + field.extension);
  return SampleError(
      sample, absl::StrCat("no token field among its files (", absl::StrJoin(extensions, ", "),
                           "); give each sample a .tokens, .tokens32, .json or "
                           ".txt file, e.g. with 'dtrain data pack'"));
}

// The ids of a .txt field's text through `tokenizer`, in words of 2 bytes where they fit, else 4;
// each checked below vocab_size.
absl::Status EncodeText(const Sample& sample, const SampleField& field, const Tokenizer& tokenizer,
                        int vocab_size, TokenDocument* document) {
  std::vector<int32_t> ids;
  if (const absl::Status status = tokenizer.Encode(field.data, &ids); !status.ok()) {
    return SampleError(sample, absl::StrCat(".txt does not encode with data.tokenizer ",
                                            tokenizer.name(), ": ", status.message()));
  }
  int32_t max_id = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return SampleError(
          sample, absl::StrCat(".txt token ", i, " is ", ids[i], ", not below model.vocab_size ",
                               vocab_size, "; raise vocab_size or fix the tokenizer"));
    }
    max_id = std::max(max_id, ids[i]);
  }
  const bool narrow = max_id <= std::numeric_limits<uint16_t>::max();
  document->width = narrow ? sizeof(uint16_t) : sizeof(int32_t);
  document->words.resize(ids.size() * document->width);
  char* out = document->words.data();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (narrow) {
      const auto word = static_cast<uint16_t>(ids[i]);
      std::memcpy(out + i * sizeof(word), &word, sizeof(word));
    } else {
      std::memcpy(out + i * sizeof(int32_t), &ids[i], sizeof(int32_t));
    }
  }
  return absl::OkStatus();
}

// Shards from `dtrain data pack` record their tokenizer in the first sample of each shard
// (data_pack.h); ids from a vocabulary larger than the model's would index past its embedding.
absl::Status CheckRecordedTokenizer(const Sample& sample, int vocab_size,
                                    std::string_view tokenizer) {
  const nlohmann::json record = TokenizerRecord(sample);
  if (record.is_null()) return absl::OkStatus();
  if (!record.is_object() || !record.contains("vocab_size") ||
      !record["vocab_size"].is_number_integer()) {
    return SampleError(sample, absl::StrCat(".", kTokenizerExtension,
                                            " is not {\"name\": ..., \"vocab_size\": N}; "
                                            "pack the shard again"));
  }
  const int64_t recorded = record["vocab_size"].get<int64_t>();
  if (recorded > vocab_size) {
    const std::string name = RecordedTokenizerName(sample);
    // The recipe or the data is wrong: a restart would read the same (exit 2, not restarted).
    return WithExitCode(
        absl::FailedPreconditionError(absl::StrCat(
            "shard ", sample.url, " holds ids of tokenizer ", name.empty() ? "?" : name,
            " (vocabulary ", recorded, "), which do not fit model.vocab_size ", vocab_size,
            "; set model.vocab_size to at least ", recorded,
            " (the model's tokenizer), or pack the data with the model's tokenizer")),
        kExitUsage);
  }
  const std::string name = RecordedTokenizerName(sample);
  if (!tokenizer.empty() && !name.empty() && !SameTokenizer(name, tokenizer)) {
    return WithExitCode(
        absl::FailedPreconditionError(absl::StrCat(
            "shard ", sample.url, " records tokenizer ", name,
            ", but the data's first shard records ", std::string(tokenizer),
            ": ids of two tokenizers would train as one vocabulary; pack every shard with "
            "one tokenizer")),
        kExitUsage);
  }
  return absl::OkStatus();
}

}  // namespace

bool SameTokenizer(std::string_view a, std::string_view b) {
  // The kind and hash of a name ("hf-bpe", "#0123456789ab"); empty for another.
  const auto kind_and_hash =
      [](std::string_view name) -> std::pair<std::string_view, std::string_view> {
    const size_t colon = name.find(':');
    const size_t hash = name.rfind('#');
    if (colon == std::string_view::npos || hash == std::string_view::npos || hash < colon) {
      return {};
    }
    return {name.substr(0, colon), name.substr(hash)};
  };
  const auto a_kind_and_hash = kind_and_hash(a);
  return a_kind_and_hash.first.empty() ? a == b : a_kind_and_hash == kind_and_hash(b);
}

nlohmann::json TokenizerRecord(const Sample& sample) {
  const SampleField* field = sample.Find(kTokenizerExtension);
  return field == nullptr ? nlohmann::json() : nlohmann::json::parse(field->data, nullptr, false);
}

std::string RecordedTokenizerName(const Sample& sample) {
  const nlohmann::json record = TokenizerRecord(sample);
  return record.is_object() && record.contains("name") && record["name"].is_string()
             ? record["name"].get<std::string>()
             : "";
}

absl::Status CheckNotSftSample(const Sample& sample) {
  if (sample.Find("mask") == nullptr) return absl::OkStatus();
  return WithExitCode(
      absl::FailedPreconditionError(absl::StrCat(
          "shard ", sample.url, " holds SFT samples (sample '", sample.key,
          "' has a .mask, the tokens its loss counts, from `dtrain data pack --sft`), which "
          "data.format webdataset would train on whole, prompts included: train them with "
          "data.format: sft and data.train: [<their files>], or pack the text without --sft")),
      kExitUsage);
}

void TokenDocument::CopyTo(int64_t first, int64_t count, int32_t* out) const {
  WidenWords(words.data() + first * width, width, count, out);
}

absl::Status TakeSampleTokens(Sample* sample, int vocab_size, TokenDocument* document,
                              std::string_view tokenizer, const Tokenizer* text_tokenizer) {
  RETURN_IF_ERROR(CheckRecordedTokenizer(*sample, vocab_size, tokenizer));
  ASSIGN_OR_RETURN(const auto found, FindTokenField(*sample));
  const auto [index, width] = found;
  SampleField& field = sample->fields[index];
  if (text_tokenizer != nullptr && field.extension == "txt") {
    return EncodeText(*sample, field, *text_tokenizer, vocab_size, document);
  }
  if (width == 0) {
    std::vector<int32_t> ids;
    RETURN_IF_ERROR(DecodeJson(*sample, field, vocab_size, &ids));
    document->words.assign(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(int32_t));
    document->width = sizeof(int32_t);
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(CheckField(*sample, field, width, vocab_size));
  std::swap(document->words, field.data);
  document->width = width;
  return absl::OkStatus();
}

absl::Status DecodeSampleTokens(const Sample& sample, int vocab_size, std::vector<int32_t>* tokens,
                                std::string_view tokenizer) {
  RETURN_IF_ERROR(CheckRecordedTokenizer(sample, vocab_size, tokenizer));
  ASSIGN_OR_RETURN(const auto found, FindTokenField(sample));
  const auto [index, width] = found;
  const SampleField& field = sample.fields[index];
  if (width == 0) return DecodeJson(sample, field, vocab_size, tokens);
  RETURN_IF_ERROR(CheckField(sample, field, width, vocab_size));
  tokens->resize(field.data.size() / static_cast<size_t>(width));
  WidenWords(field.data.data(), width, static_cast<int64_t>(tokens->size()), tokens->data());
  return absl::OkStatus();
}

}  // namespace dtrain
