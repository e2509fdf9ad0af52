// Token ids from a WebDataset sample, from the first field present among: "tokens" (uint16
// little-endian), "tokens32" (uint32 little-endian), "txt" (text: through the data's tokenizer
// where one is given, else one token per byte) and "json" (a JSON list of ids). A
// "tokenizer.json" field records the tokenizer that wrote the ids. Pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "core/data/sample_grouper.h"
#include "core/data/tokenizer.h"
#include "nlohmann/json.hpp"

namespace dtrain {

// The field `dtrain data pack` adds to the first sample of each shard: {"name": the tokenizer's
// name(), "vocab_size": its vocabulary}.
inline constexpr char kTokenizerExtension[] = "tokenizer.json";

// A document's token ids as they were stored: little-endian words of `width` bytes (1, 2 or 4;
// JSON ids are stored as 4-byte words). Ids are widened to int32 only where they are copied
// out (into a training window), so streaming pays one pass over the bytes, not a decode pass
// and then a copy of twice as many bytes.
struct TokenDocument {
  std::string words;
  int width = 4;

  int64_t size() const { return static_cast<int64_t>(words.size()) / width; }
  // Writes ids [first, first + count) as int32 to `out`; the range must lie inside size().
  void CopyTo(int64_t first, int64_t count, int32_t* out) const;
};

// FailedPrecondition (exit 2) for an SFT sample (a .mask beside its tokens, from `data pack
// --sft`), which pretraining would train on whole, prompts included, ignoring its mask.
absl::Status CheckNotSftSample(const Sample& sample);

// Moves the sample's token field into *document (binary formats swap buffers, so the field
// gets the document's old bytes back for reuse; nothing is copied) after checking it. A .txt
// field is encoded through `text_tokenizer` (its ids stored in 2 bytes where they fit; null: the
// bytes are the ids); text it does not encode (invalid UTF-8 for SentencePiece)
// is DataLoss naming the sample. Errors are otherwise DecodeSampleTokens's; on an error
// *document is unspecified.
absl::Status TakeSampleTokens(Sample* sample, int vocab_size, TokenDocument* document,
                              std::string_view tokenizer = {},
                              const Tokenizer* text_tokenizer = nullptr);

// Replaces *tokens with the sample's ids. DataLoss naming the shard, the sample key and the fix
// for: no token field, a byte count that is not a whole number of tokens, malformed JSON, an id
// >= vocab_size (with its position); FailedPrecondition when the sample records a tokenizer
// whose vocabulary is larger than vocab_size, or one that is not `tokenizer` (SameTokenizer; the
// data's first shard's, which the run's other shards must share: ids of two tokenizers would
// train as one vocabulary; empty: any).
absl::Status DecodeSampleTokens(const Sample& sample, int vocab_size, std::vector<int32_t>* tokens,
                                std::string_view tokenizer = {});

// The record `dtrain data pack` writes in a shard's first sample (kTokenizerExtension: the
// tokenizer's "name" and "vocab_size", an SFT pack's "chat_template"): null when the sample has
// none, discarded when it is not JSON.
nlohmann::json TokenizerRecord(const Sample& sample);

// Whether two tokenizer names (Tokenizer::name(), or what a shard records) are the same
// tokenizer: the same kind and hash of load_tokenizer.h's "<kind>:<folder>/<file>#<hash>"
// wherever its files lie, or else the same name ("bytes").
bool SameTokenizer(std::string_view a, std::string_view b);

// The name of the tokenizer the sample records (kTokenizerExtension's "name"); empty when it
// records none, or not in that shape.
std::string RecordedTokenizerName(const Sample& sample);

}  // namespace dtrain
