// Added tokens (special tokens such as <|endoftext|> and chat markers) found in text before the
// model sees it, as Hugging Face's AddedVocabulary does: leftmost-longest matches, with the
// lstrip/rstrip/single_word options of tokenizer.json. Immutable after construction, so
// thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool lstrip = false;       // the match takes the whitespace before it
  bool rstrip = false;       // ... and after it
  bool single_word = false;  // matches only between non-word characters
};

// A stretch of text: an added token's id, or kPlainText for text the model encodes.
struct TextPiece {
  static constexpr int32_t kPlainText = -1;
  std::string_view text;
  int32_t id = kPlainText;
};

class AddedTokenMatcher {
 public:
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);

  bool empty() const { return tokens_.empty(); }
  // Appends the pieces of `text` in order: plain stretches (never empty) and matched tokens.
  void Split(std::string_view text, std::vector<TextPiece>* pieces) const;

 private:
  std::vector<AddedToken> tokens_;  // longest first, so the first match is the longest
  std::array<std::vector<int>, 256> by_first_byte_;  // indices into tokens_
};

}  // namespace dtrain
