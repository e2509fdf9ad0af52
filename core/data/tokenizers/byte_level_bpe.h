// Byte-level BPE (GPT-2, Llama 3 and other tiktoken-style vocabularies): text is cut at added
// tokens, then by the pre-tokenizer's split regexes, and each piece's bytes are merged by rank
// as Hugging Face tokenizers' BPE model does (lowest rank first, leftmost among equals). Every
// byte has a token, so any byte string encodes, invalid UTF-8 included, and decodes back exactly.
//
// Encode is thread-safe. With threads > 1 a large text is cut at line starts where the split
// regexes provably end a piece (GPT-2's and Llama 3's patterns; see SafeCuts in the .cc) and
// the pieces are encoded in parallel; the ids are the same as one thread's.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/data/tokenizer.h"
#include "core/data/tokenizers/added_tokens.h"

namespace dtrain {

// GPT-2's pre-tokenization regex: Hugging Face's ByteLevel(use_regex=true).
inline constexpr char kGpt2SplitPattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3's (tiktoken's cl100k) pre-tokenization regex.
inline constexpr char kLlama3SplitPattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct ByteLevelBpeSpec {
  std::string name;
  // Tokens as raw bytes (the byte-to-unicode mapping of the files already undone).
  std::vector<std::pair<std::string, int32_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;  // by rank, raw bytes
  std::vector<std::string> split_patterns;  // applied in turn; none = the text is one piece
  bool add_prefix_space = false;            // a space before text that starts without one
  bool ignore_merges = false;               // a piece that is a token stays whole (Llama 3)
  std::vector<AddedToken> special_added;    // matched first, in the raw text
  std::vector<AddedToken> normal_added;     // then in the stretches between them
};

// InvalidArgument naming the problem (a merge of unknown tokens, a byte without a token, a
// regex that does not compile); the caller adds the file.
absl::StatusOr<std::unique_ptr<Tokenizer>> MakeByteLevelBpe(ByteLevelBpeSpec spec, int threads);

// The byte that each character of a byte-level token stands for (GPT-2's bytes_to_unicode,
// inverted): false when `token` holds a character outside that alphabet.
bool ByteLevelToBytes(std::string_view token, std::string* bytes);

}  // namespace dtrain
