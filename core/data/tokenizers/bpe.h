// BPE as Hugging Face tokenizers' BPE model runs it: text is cut at added tokens, each stretch
// is normalized and pre-tokenized into words, and each word's symbols are merged by rank
// (lowest rank first, leftmost among equals). Two alphabets:
//   - bytes (GPT-2, Llama 3 and other tiktoken-style vocabularies): after the normalizer, if any
//     (Qwen2's NFC), the pre-tokenizer's split regexes cut words; a word's symbols are its bytes,
//     every byte has a token, so any byte string encodes, invalid UTF-8 included, and decodes back
//     exactly;
//   - characters (SentencePiece-style files: Llama 2, Mistral, SentencePieceBPETokenizer;
//     sentencepiece_style.h): a normalizer and a Metaspace pre-tokenizer write spaces as "▁";
//     a word's symbols are its characters; a character without a token becomes its bytes'
//     <0xNN> tokens (byte_fallback), else the unknown token. Invalid UTF-8 takes the byte
//     fallback like such a character; without byte fallback it is an error naming its offset.
//
// Encode is thread-safe. With threads > 1 a large byte-level text is cut at line starts where
// the split regexes provably end a piece (GPT-2's and Llama 3's patterns; see SafeCuts in the
// .cc) and the pieces are encoded in parallel; the ids are the same as one thread's. A
// character-alphabet text is encoded on one thread (see EncodePlain in the .cc).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/data/tokenizer.h"
#include "core/data/tokenizers/added_tokens.h"
#include "core/data/tokenizers/sentencepiece_style.h"

namespace dtrain {

// GPT-2's pre-tokenization regex: Hugging Face's ByteLevel(use_regex=true).
inline constexpr char kGpt2SplitPattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3's (tiktoken's cl100k) pre-tokenization regex.
inline constexpr char kLlama3SplitPattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct BpeSpec {
  std::string name;
  // false: the character alphabet, and the fields of SentencePiece-style files below apply.
  bool byte_level = true;
  // Tokens as raw bytes (byte-level: the byte-to-unicode mapping of the files already undone).
  std::vector<std::pair<std::string, int32_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;  // by rank, raw bytes
  std::vector<std::string> split_patterns;  // applied in turn; none = the text is one piece
  bool add_prefix_space = false;            // a space before text that starts without one
  bool ignore_merges = false;               // a piece that is a token stays whole (Llama 3)
  std::vector<AddedToken> special_added;    // matched first, in the raw text
  std::vector<AddedToken> normal_added;     // then in the normalized stretches between them
  Normalizer normalizer;  // of either alphabet (Qwen2's byte-level NFC); empty steps do nothing

  // The character alphabet's (SentencePiece-style) stages.
  std::optional<MetaspaceSpec> metaspace;  // none: each normalized stretch is one word
  bool byte_fallback = false;              // unknown characters become <0xNN> tokens
  std::string unk_token;                   // empty: none
  bool fuse_unk = false;                   // consecutive unknown characters are one <unk>
  std::vector<DecoderStep> decoder;
};

// InvalidArgument naming the problem (a merge of unknown tokens, a byte without a token, a
// regex that does not compile, an unknown unk_token); the caller adds the file.
absl::StatusOr<std::unique_ptr<Tokenizer>> MakeBpe(BpeSpec spec, int threads);

// The character (UTF-8) that byte-level files write for `byte`: GPT-2's bytes_to_unicode.
std::string ByteLevelCharacter(unsigned char byte);

// The byte that each character of a byte-level token stands for (GPT-2's bytes_to_unicode,
// inverted): false when `token` holds a character outside that alphabet.
bool ByteLevelToBytes(std::string_view token, std::string* bytes);

}  // namespace dtrain
