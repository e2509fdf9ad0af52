// `dtrain data pack`: writes WebDataset token shards from text and JSON-lines files.
//
// Each .jsonl line is one document (its `text_key` string, "text" by default); any other file is
// one document. The Tokenizer turns text into ids; samples are "<index>.tokens" (uint16 LE, for
// vocabularies up to 65536) or ".tokens32", in ustar shards "<out>/shard-000000.tar", ... each
// at most shard_bytes unless one sample is larger. The first sample of each shard also holds
// "<index>.tokenizer.json" ({"name", "vocab_size"}, token_decode.h), which the trainer checks
// against model.vocab_size. Documents are encoded on `threads` threads and written in input
// order; errors name the file and line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/data/chat_template.h"
#include "core/data/tokenizer.h"

namespace dtrain {

struct PackResult {
  std::vector<std::string> shards;  // written paths
  int64_t documents = 0;
  int64_t empty_documents = 0;  // no tokens (an empty file or "text"): not written
  int64_t tokens = 0;
  int64_t trained_tokens = 0;  // SFT: tokens the loss counts
  // Samples larger than the shard size alone, each in a shard of its own (never split).
  int64_t oversized_documents = 0;
};

// A pack's shard `index` in out_dir: "<out_dir>/shard-000000.tar", ...
std::string ShardPath(const std::string& out_dir, int index);
// Its first `count` shards as one brace pattern, "<out_dir>/shard-{000000..000003}.tar": what
// data.shards and `data inspect` read.
std::string ShardPattern(const std::string& out_dir, int count);
// Every shard of the pack as a glob, "<out_dir>/shard-*.tar": what data.train reads (sft).
std::string ShardGlob(const std::string& out_dir);

// OK when the shards of a pack into `out_dir` can be named by what the pack prints to train on
// them: ShardPattern (data.shards, where '::' lists and braces range) or, for SFT, ShardGlob
// (data.train, a glob). Otherwise an error naming --out and the characters.
absl::Status CheckShardsCanBeNamed(const std::string& out_dir, bool sft);

// Whether `data pack` reads `path` as JSON lines (a document or SFT sample a line) rather than as
// one plain-text document: by its extension, in any case (.jsonl, .JSONL).
bool IsJsonLines(const std::string& path);

absl::StatusOr<PackResult> PackShards(const std::vector<std::string>& inputs,
                                      const std::string& out_dir, int64_t shard_bytes,
                                      const Tokenizer& tokenizer, int threads = 1,
                                      const std::string& text_key = "text");

// `dtrain data pack --sft`: each line of the .jsonl inputs is one SFT sample (sft_data.h)
// rendered with `chat_template`; a sample is its tokens as PackShards writes them plus
// "<index>.mask", one byte per token (1: trained). Errors name the file and line; blank lines
// are not samples; nothing else is left out. Lines are encoded on `threads` threads.
absl::StatusOr<PackResult> PackSftShards(const std::vector<std::string>& inputs,
                                         const std::string& out_dir, int64_t shard_bytes,
                                         const Tokenizer& tokenizer,
                                         const ChatTemplate& chat_template, int threads = 1);

}  // namespace dtrain
