#include "core/data/tokenizer.h"

#include "absl/strings/str_cat.h"

namespace dtrain {

absl::Status ByteTokenizer::Encode(std::string_view text, std::vector<int32_t>* ids) const {
  ids->reserve(ids->size() + text.size());
  for (const char c : text) ids->push_back(static_cast<unsigned char>(c));
  return absl::OkStatus();
}

absl::StatusOr<int32_t> ByteTokenizer::SpecialToken(std::string_view text) const {
  return absl::NotFoundError(absl::StrCat("the byte-level tokenizer has no special token '",
                                          std::string(text),
                                          "'; set data.tokenizer to a model's tokenizer file"));
}

absl::StatusOr<std::string> ByteTokenizer::Decode(absl::Span<const int32_t> ids) const {
  std::string text;
  text.reserve(ids.size());
  for (const int32_t id : ids) {
    if (id < 0 || id > 255) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is outside the byte-level vocabulary [0, 256)"));
    }
    text.push_back(static_cast<char>(id));
  }
  return text;
}

bool EncodesBytesAsIds(const Tokenizer& tokenizer) {
  if (tokenizer.vocab_size() != 256) return false;
  std::vector<int32_t> ids;
  for (int byte = 0; byte < 256; ++byte) {
    ids.clear();
    if (!tokenizer.Encode(std::string(1, static_cast<char>(byte)), &ids).ok() ||
        ids != std::vector<int32_t>{byte}) {
      return false;
    }
  }
  return true;
}

}  // namespace dtrain
