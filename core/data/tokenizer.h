// Text to token ids and back. ByteTokenizer (one token per byte) is built in; the tokenizers of
// real models are loaded from the files their users already have.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace dtrain {

// Encode and Decode are thread-safe: a rank's data loader encodes text samples on its reader
// thread while the main thread samples.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // What token shards record beside their ids, so a trainer can tell whose ids they hold.
  virtual std::string name() const = 0;
  virtual int vocab_size() const = 0;
  // Appends the ids of `text`, as Hugging Face's encode(text, add_special_tokens=False): no
  // BOS/EOS is added, and a special token's text inside `text` becomes its id.
  virtual absl::Status Encode(std::string_view text, std::vector<int32_t>* ids) const = 0;
  // The id of a special token by its text, e.g. "<|endoftext|>" or "<|eot_id|>"; NotFound
  // naming the token and this tokenizer otherwise.
  virtual absl::StatusOr<int32_t> SpecialToken(std::string_view text) const = 0;
  // The text of `ids`; an id outside the vocabulary is an error naming it.
  virtual absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const = 0;
};

// One token per byte (vocabulary 256, no special tokens): the tokenizer of data.format text.
class ByteTokenizer final : public Tokenizer {
 public:
  std::string name() const override { return "bytes"; }
  int vocab_size() const override { return 256; }
  absl::Status Encode(std::string_view text, std::vector<int32_t>* ids) const override;
  absl::StatusOr<int32_t> SpecialToken(std::string_view text) const override;
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const override;
};

// Whether `tokenizer` gives every byte alone its value as id in a vocabulary of 256, whatever its
// name: ByteTokenizer, and the byte-level tokenizer.json a run on bytes exports.
bool EncodesBytesAsIds(const Tokenizer& tokenizer);

}  // namespace dtrain
