#include "core/data/tokenizers/added_tokens.h"

#include <algorithm>

namespace dtrain {
namespace {

// Hugging Face strips Unicode whitespace around lstrip/rstrip tokens; ASCII whitespace is what
// real vocabularies put there, and the only kind a byte can show.
bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v'; }
bool IsWordByte(char c) {
  const unsigned char u = static_cast<unsigned char>(c);
  return u >= 0x80 || u == '_' || (u >= '0' && u <= '9') ||
         ((u | 0x20) >= 'a' && (u | 0x20) <= 'z');
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  std::erase_if(tokens_, [](const AddedToken& token) { return token.content.empty(); });
  std::stable_sort(tokens_.begin(), tokens_.end(), [](const AddedToken& a, const AddedToken& b) {
    return a.content.size() > b.content.size();
  });
  for (int i = 0; i < static_cast<int>(tokens_.size()); ++i) {
    by_first_byte_[static_cast<unsigned char>(tokens_[i].content[0])].push_back(i);
  }
}

void AddedTokenMatcher::Split(std::string_view text, std::vector<TextPiece>* pieces) const {
  size_t plain_begin = 0;  // start of the plain text not yet emitted
  size_t pos = 0;
  while (pos < text.size()) {
    const std::vector<int>& candidates = by_first_byte_[static_cast<unsigned char>(text[pos])];
    const AddedToken* match = nullptr;
    for (const int index : candidates) {
      const AddedToken& token = tokens_[index];
      if (text.compare(pos, token.content.size(), token.content) != 0) continue;
      const size_t end = pos + token.content.size();
      if (token.single_word && ((pos > 0 && IsWordByte(text[pos - 1])) ||
                                (end < text.size() && IsWordByte(text[end])))) {
        continue;
      }
      match = &token;
      break;
    }
    if (match == nullptr) {
      ++pos;
      continue;
    }
    size_t begin = pos;
    size_t end = pos + match->content.size();
    if (match->lstrip) {
      while (begin > plain_begin && IsSpace(text[begin - 1])) --begin;
    }
    if (match->rstrip) {
      while (end < text.size() && IsSpace(text[end])) ++end;
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
