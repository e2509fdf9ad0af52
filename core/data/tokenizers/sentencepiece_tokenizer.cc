#include "core/data/tokenizers/sentencepiece_tokenizer.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/data/tokenizers/added_tokens.h"
#include "core/data/tokenizers/sentencepiece_library.h"
#include "core/util/utf8.h"

namespace dtrain {
namespace {

// Debian's Abseil has its own string_view class.
absl::string_view View(std::string_view text) { return {text.data(), text.size()}; }

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(std::unique_ptr<spm::Processor> processor, std::string name,
                         std::vector<AddedToken> specials)
      : processor_(std::move(processor)), name_(std::move(name)), specials_(specials) {
    for (const AddedToken& token : specials) special_ids_.emplace(token.content, token.id);
  }

  std::string name() const override { return name_; }
  int vocab_size() const override { return processor_->vocab_size(); }

  absl::Status Encode(std::string_view text, std::vector<int32_t>* ids) const override {
    if (const size_t bad = FirstInvalidUtf8Byte(View(text)); bad != std::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(DescribeInvalidUtf8(View(text)), " (byte offset ", bad, " of the text); ",
                       "SentencePiece tokenizer ", name_,
                       " encodes UTF-8 only: fix or drop that text, or use a byte-level BPE "
                       "tokenizer, which encodes any bytes"));
    }
    std::vector<TextPiece> pieces;
    specials_.Split(text, &pieces);
    std::vector<int> piece_ids;
    std::string error;
    for (const TextPiece& piece : pieces) {
      if (piece.id != TextPiece::kPlainText) {
        ids->push_back(piece.id);
        continue;
      }
      if (!processor_->Encode(piece.text, &piece_ids, &error)) {
        return absl::InternalError(
            absl::StrCat("SentencePiece tokenizer ", name_, " failed to encode: ", error));
      }
      ids->insert(ids->end(), piece_ids.begin(), piece_ids.end());
    }
    return absl::OkStatus();
  }

  absl::StatusOr<int32_t> SpecialToken(std::string_view text) const override {
    const auto it = special_ids_.find(View(text));
    if (it != special_ids_.end()) return it->second;
    std::string known;
    for (const auto& [content, id] : special_ids_) absl::StrAppend(&known, " ", content);
    return absl::NotFoundError(absl::StrCat("tokenizer ", name_, " has no special token '",
                                            absl::CHexEscape(View(text)), "' (it has", known, ")"));
  }

  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const override {
    for (const int32_t id : ids) {
      if (id < 0 || id >= vocab_size()) {
        return absl::InvalidArgumentError(absl::StrCat("token id ", id,
                                                       " is not in the vocabulary of tokenizer ",
                                                       name_, " (size ", vocab_size(), ")"));
      }
    }
    std::string text;
    std::string error;
    if (!processor_->Decode(std::vector<int>(ids.begin(), ids.end()), &text, &error)) {
      return absl::InternalError(
          absl::StrCat("SentencePiece tokenizer ", name_, " failed to decode: ", error));
    }
    return text;
  }

 private:
  std::unique_ptr<spm::Processor> processor_;
  std::string name_;
  AddedTokenMatcher specials_;
  absl::flat_hash_map<std::string, int32_t> special_ids_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> MakeSentencePiece(const std::string& serialized,
                                                             std::string name) {
  std::string error;
  std::unique_ptr<spm::Processor> processor = spm::Processor::Load(serialized, &error);
  if (processor == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a SentencePiece model (", error.empty() ? "unreadable" : error, ")"));
  }
  std::vector<AddedToken> specials;
  for (int id = 0; id < processor->vocab_size(); ++id) {
    if (processor->IsSpecial(id)) specials.push_back({processor->Piece(id), id});
  }
  return std::unique_ptr<Tokenizer>(
      new SentencePieceTokenizer(std::move(processor), std::move(name), std::move(specials)));
}

}  // namespace dtrain
