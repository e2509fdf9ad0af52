// The text stages around the BPE model of SentencePiece-style tokenizer.json files (Llama 2,
// Mistral, TinyLlama as transformers converts their SentencePiece models; tokenizers'
// SentencePieceBPETokenizer): normalizers that turn spaces into "▁" (Prepend, Replace) and
// Unicode normalization (NFKC and the other forms, through ICU), the Metaspace pre-tokenizer,
// and the decoders that undo them. Each follows Hugging Face tokenizers 0.20. Immutable after
// construction, so thread-safe.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace dtrain {

inline constexpr char kMetaspace[] = "\xe2\x96\x81";  // U+2581, SentencePiece's space

struct NormalizerStep {
  enum class Kind { kUnicode, kPrepend, kReplace };
  Kind kind = Kind::kReplace;
  std::string form;     // kUnicode: "NFC", "NFD", "NFKC" or "NFKD"
  std::string pattern;  // kReplace: the literal text replaced
  std::string content;  // kPrepend: what goes first; kReplace: what replaces the pattern
};

class Normalizer {
 public:
  // InvalidArgument naming a Unicode form that is none of the four.
  static absl::StatusOr<Normalizer> Make(std::vector<NormalizerStep> steps);
  Normalizer() = default;

  bool empty() const { return steps_.empty(); }
  // `text` through the steps in order. Bytes that are not UTF-8 pass through unchanged; a
  // Unicode form applies to the valid stretches between them.
  std::string Apply(std::string_view text) const;

 private:
  std::vector<NormalizerStep> steps_;
  std::vector<const void*> forms_;  // per step: the icu::Normalizer2 of a kUnicode step
};

enum class PrependScheme { kAlways, kFirst, kNever };

struct MetaspaceSpec {
  std::string replacement = kMetaspace;
  PrependScheme prepend_scheme = PrependScheme::kAlways;
  bool split = true;
};

// One stretch of normalized text (between added tokens) as Hugging Face's Metaspace
// pre-tokenizer cuts it: spaces become the replacement, which goes first where the stretch does
// not start with it (kFirst: only for the stretch at the start of the text); with split, each
// replacement starts a new word. Calls word(w) for each word, never empty, in order.
void MetaspaceWords(const MetaspaceSpec& spec, std::string_view text, bool at_text_start,
                    const std::function<void(std::string_view)>& word);

struct DecoderStep {
  enum class Kind { kReplace, kByteFallback, kFuse, kStrip, kMetaspace };
  Kind kind = Kind::kFuse;
  std::string pattern;  // kReplace
  std::string content;  // kReplace: the replacement; kStrip: the character stripped
  int strip_start = 0;  // kStrip: at most this many leading `content` characters per token
  int strip_stop = 0;   // ... and trailing ones
  MetaspaceSpec metaspace;
};

// The text of `tokens` (each token's vocabulary string, in order) through `steps`, as Hugging
// Face's decode_chain and then concatenation. One difference: ByteFallback keeps bytes that are
// not UTF-8 as they are where Hugging Face writes U+FFFD for each, so that text encoded with
// byte fallback, invalid UTF-8 included, decodes back exactly.
std::string DecodeTokens(const std::vector<DecoderStep>& steps, std::vector<std::string> tokens);

// "<0x41>" -> 0x41: a byte-fallback token's byte, or -1 for any other token.
int ByteFallbackByte(std::string_view token);

}  // namespace dtrain
