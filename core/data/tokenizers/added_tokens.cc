#include "core/data/tokenizers/added_tokens.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>

namespace dtrain {
namespace {

// A character class with Unicode properties, as Hugging Face's regex crate reads \w and \s
// around added tokens (a word character next to 。 or an emoji is none; U+3000 and NBSP are
// whitespace): where the character that ends or begins at a byte offset of UTF-8 text is in it.
// Bytes that are not UTF-8 are in no class.
class CharacterClass {
 public:
  explicit CharacterClass(const char* pattern) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED | PCRE2_MATCH_INVALID_UTF, &error,
                          &offset, nullptr);
  }

  // The length of the class's character at `begin`; 0 where there is none. PCRE2 sees the
  // character's at most 4 bytes alone: under MATCH_INVALID_UTF it checks the UTF-8 of the whole
  // subject from the offset on, which made every check cost the rest of the text.
  size_t LengthAt(std::string_view text, size_t begin) const {
    thread_local pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
    if (code_ == nullptr || begin >= text.size() ||
        pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data() + begin),
                    std::min<size_t>(4, text.size() - begin), 0, 0, data, nullptr) < 0) {
      return 0;
    }
    return pcre2_get_ovector_pointer(data)[1];
  }

  // The length of the class's character that ends at `end`; 0 where there is none.
  size_t LengthBefore(std::string_view text, size_t end) const {
    size_t begin = end;  // back over UTF-8 continuation bytes to the character's first byte
    while (begin > 0 && end - begin < 4) {
      --begin;
      if ((static_cast<unsigned char>(text[begin]) & 0xC0) != 0x80) break;
    }
    return begin < end && LengthAt(text, begin) == end - begin ? end - begin : 0;
  }

 private:
  pcre2_code* code_ = nullptr;  // lives as long as the program
};

// Rust's \w (Alphabetic, marks, decimal digits, connector punctuation, joiners), which PCRE2's
// \w (letters and numbers) is not quite: "²" is none, a combining mark is one.
const CharacterClass& WordCharacters() {
  static const CharacterClass* const word =
      new CharacterClass("[\\p{L}\\p{M}\\p{Nd}\\p{Nl}\\p{Pc}\\x{200C}\\x{200D}]");
  return *word;
}

const CharacterClass& Whitespace() {
  static const CharacterClass* const space = new CharacterClass("\\s");
  return *space;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  std::erase_if(tokens_, [](const AddedToken& token) { return token.content.empty(); });
  root_.fill(-1);
  nodes_.emplace_back();  // the root's, which no token ends at
  for (int32_t index = 0; index < static_cast<int32_t>(tokens_.size()); ++index) {
    int32_t node = 0;
    for (const char byte : tokens_[index].content) {
      const unsigned char b = static_cast<unsigned char>(byte);
      int32_t* child = nullptr;
      if (node == 0) {
        child = &root_[b];
      } else {
        child = &children_.try_emplace(Edge(node, b), -1).first->second;
      }
      if (*child < 0) {
        *child = static_cast<int32_t>(nodes_.size());
        nodes_.emplace_back();
      }
      node = *child;
    }
    if (nodes_[node].token < 0) nodes_[node].token = index;  // a repeated content: the first
  }
}

void AddedTokenMatcher::Split(std::string_view text, std::vector<TextPiece>* pieces) const {
  size_t plain_begin = 0;  // start of the plain text not yet emitted
  size_t pos = 0;
  while (pos < text.size()) {
    int32_t longest = -1;  // the longest token that matches at pos
    int32_t node = root_[static_cast<unsigned char>(text[pos])];
    for (size_t at = pos + 1; node >= 0; ++at) {
      if (nodes_[node].token >= 0) longest = nodes_[node].token;
      if (at == text.size()) break;
      const auto child = children_.find(Edge(node, static_cast<unsigned char>(text[at])));
      node = child == children_.end() ? -1 : child->second;
    }
    if (longest < 0) {
      ++pos;
      continue;
    }
    // The longest; a single_word one inside a word is dropped, and the search goes on after it
    // (Hugging Face's leftmost-longest matches do not overlap).
    const AddedToken* match = &tokens_[longest];
    size_t begin = pos;
    size_t end = pos + match->content.size();
    if (match->single_word && (WordCharacters().LengthBefore(text, pos) > 0 ||
                               WordCharacters().LengthAt(text, end) > 0)) {
      pos = end;
      continue;
    }
    if (match->lstrip) {
      while (begin > plain_begin) {
        const size_t space = Whitespace().LengthBefore(text, begin);
        if (space == 0 || begin - space < plain_begin) break;
        begin -= space;
      }
    }
    if (match->rstrip) {
      while (const size_t space = Whitespace().LengthAt(text, end)) end += space;
    }
    if (begin > plain_begin) {
      pieces->push_back({text.substr(plain_begin, begin - plain_begin), TextPiece::kPlainText});
    }
    pieces->push_back({text.substr(begin, end - begin), match->id});
    plain_begin = pos = end;
  }
  if (plain_begin < text.size()) {
    pieces->push_back({text.substr(plain_begin), TextPiece::kPlainText});
  }
}

}  // namespace dtrain
