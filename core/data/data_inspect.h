// `dtrain data inspect`: what a shard pattern holds, read exactly as training reads it.
// Prints one line per sample (key, extensions with bytes, token count) unless summary_only, then
// totals with the read rate; with a tokenizer, each listed sample's text follows its line as a
// JSON string, and a note where the shard records another tokenizer. Samples whose tokens training
// refuses (no token field, a cut id, an id past the tokenizer's vocabulary) and shards that do not
// read to their end (named with the byte offset, or a shard command's exit status) are listed with
// why, the other shards still read, and fail the inspection after the totals. Single-threaded.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "core/data/shard_source.h"
#include "core/data/tokenizer.h"

namespace dtrain {

struct InspectOptions {
  bool summary_only = false;
  int64_t max_samples = -1;   // per listing; -1 = all
  int64_t text_tokens = 200;  // tokens of a sample decoded to text; -1 = all
  ShardSourceOptions source;
  // Encodes .txt samples, as data.tokenizer does in training, and decodes the listed samples;
  // null = ids only (a .txt's bytes).
  const Tokenizer* tokenizer = nullptr;
};

absl::Status InspectShards(const std::string& pattern, const InspectOptions& options,
                           std::ostream& out);

}  // namespace dtrain
