// Added tokens (special tokens such as <|endoftext|> and chat markers) found in text before the
// model sees it, as Hugging Face's AddedVocabulary does: leftmost-longest matches, with the
// lstrip/rstrip/single_word options of tokenizer.json (Unicode whitespace and word characters).
// A byte trie of the contents finds them: each position costs the bytes it shares with some
// token, not one comparison per token (Llama 3's 256 reserved tokens slowed encoding 7x).
// Immutable after construction, so thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"

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
  struct Node {
    int32_t token = -1;  // the index into tokens_ of the token whose content ends here
  };
  static uint64_t Edge(int32_t node, unsigned char byte) {
    return (static_cast<uint64_t>(node) << 8) | byte;
  }

  std::vector<AddedToken> tokens_;
  std::vector<Node> nodes_;                          // the trie's; node 0 is the root
  std::array<int32_t, 256> root_;                    // the root's child by byte; -1 for none
  absl::flat_hash_map<uint64_t, int32_t> children_;  // Edge(node, byte) -> child, below the root
};

}  // namespace dtrain
