#include "core/data/token_decode.h"

#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dtrain {
namespace {

absl::Status SampleError(const Sample& sample, const std::string& what) {
  return absl::DataLossError(
      absl::StrCat("shard ", sample.url, ", sample '", sample.key, "': ", what));
}

// Little-endian `Word`s; this file assumes a little-endian host, as every
// machine dtrain targets is.
template <typename Word>
absl::Status DecodeWords(const Sample& sample, const SampleField& field, int vocab_size,
                         std::vector<int32_t>* tokens) {
  if (field.data.size() % sizeof(Word) != 0) {
    return SampleError(sample, absl::StrCat(".", field.extension, " holds ", field.data.size(),
                                            " bytes, not a whole number of ", sizeof(Word),
                                            "-byte tokens; write it again"));
  }
  const size_t count = field.data.size() / sizeof(Word);
  tokens->resize(count);
  const char* bytes = field.data.data();
  Word max_word = 0;
  for (size_t i = 0; i < count; ++i) {
    Word word;
    std::memcpy(&word, bytes + i * sizeof(Word), sizeof(Word));
    max_word = word > max_word ? word : max_word;
    (*tokens)[i] = static_cast<int32_t>(word);
  }
  // One branch-free pass above; only a bad sample pays for finding the culprit.
  if (count > 0 && static_cast<uint64_t>(max_word) >= static_cast<uint64_t>(vocab_size)) {
    for (size_t i = 0; i < count; ++i) {
      if (static_cast<uint32_t>((*tokens)[i]) >= static_cast<uint32_t>(vocab_size)) {
        return SampleError(sample, absl::StrCat(".", field.extension, " token ", i, " is ",
                                                static_cast<uint32_t>((*tokens)[i]),
                                                ", not below model.vocab_size ", vocab_size,
                                                "; raise vocab_size or fix the tokenizer"));
      }
    }
  }
  return absl::OkStatus();
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
      return SampleError(
          sample, absl::StrCat(".json item ", i, " is ", id.dump(),
                               ", not a token id in [0, model.vocab_size = ", vocab_size, ")"));
    }
    tokens->push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DecodeSampleTokens(const Sample& sample, int vocab_size,
                                std::vector<int32_t>* tokens) {
  if (const SampleField* field = sample.Find("tokens")) {
    return DecodeWords<uint16_t>(sample, *field, vocab_size, tokens);
  }
  if (const SampleField* field = sample.Find("tokens32")) {
    return DecodeWords<uint32_t>(sample, *field, vocab_size, tokens);
  }
  if (const SampleField* field = sample.Find("json")) {
    return DecodeJson(sample, *field, vocab_size, tokens);
  }
  if (const SampleField* field = sample.Find("txt")) {
    return DecodeWords<uint8_t>(sample, *field, vocab_size, tokens);
  }
  std::vector<std::string> extensions;
  for (const SampleField& field : sample.fields) extensions.push_back("." + field.extension);
  return SampleError(
      sample, absl::StrCat("no token field among its files (", absl::StrJoin(extensions, ", "),
                           "); give each sample a .tokens, .tokens32, .json or "
                           ".txt file, e.g. with 'dtrain data pack'"));
}

}  // namespace dtrain
