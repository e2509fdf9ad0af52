// A test tokenizer with chat special tokens: one token per byte (ids 0..255) plus the Llama 3
// and ChatML markers after them, each one id, as real BPE vocabularies hold them. The SFT tests
// need a tokenizer whose special tokens are single ids (so that a template's markers and the
// loss mask line up token by token) without depending on the BPE tokenizer built in parallel
// (core/data/tokenizer.h's interface is all they use); the lead's end-to-end check runs the real
// one.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/data/tokenizer.h"

namespace dtrain::testing {

class SpecialTokensTokenizer final : public Tokenizer {
 public:
  static constexpr const char* kSpecials[] = {"<|begin_of_text|>", "<|start_header_id|>",
                                              "<|end_header_id|>", "<|eot_id|>",
                                              "<|im_start|>",      "<|im_end|>"};
  static constexpr int kFirstSpecial = 256;

  std::string name() const override { return "test-bytes+specials"; }
  int vocab_size() const override { return kFirstSpecial + std::size(kSpecials); }
  absl::Status Encode(std::string_view text, std::vector<int32_t>* ids) const override {
    for (size_t i = 0; i < text.size();) {
      int special = -1;
      for (size_t s = 0; s < std::size(kSpecials); ++s) {
        if (text.substr(i).starts_with(kSpecials[s])) special = static_cast<int>(s);
      }
      if (special >= 0) {
        ids->push_back(kFirstSpecial + special);
        i += std::string_view(kSpecials[special]).size();
      } else {
        ids->push_back(static_cast<unsigned char>(text[i]));
        ++i;
      }
    }
    return absl::OkStatus();
  }
  absl::StatusOr<int32_t> SpecialToken(std::string_view text) const override {
    for (size_t s = 0; s < std::size(kSpecials); ++s) {
      if (text == kSpecials[s]) return kFirstSpecial + static_cast<int32_t>(s);
    }
    return absl::NotFoundError(
        absl::StrCat(std::string(text), " is not a special token of ", name()));
  }
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const override {
    std::string text;
    for (const int32_t id : ids) {
      if (id < 0 || id >= vocab_size()) return absl::InvalidArgumentError("id out of range");
      if (id < kFirstSpecial) {
        text += static_cast<char>(id);
      } else {
        text += kSpecials[id - kFirstSpecial];
      }
    }
    return text;
  }
};

}  // namespace dtrain::testing
