// Supervised fine-tuning samples: JSON lines to token ids with a loss mask, and packed into
// training sequences whose attention stays within each sample.
//
// A JSON line is {"prompt": "...", "completion": "..."} (a user message and the assistant's
// answer) or {"messages": [{"role": "...", "content": "..."}, ...]}; a chat template
// (chat_template.h) renders it, and only the assistant's tokens are trained.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/data/chat_template.h"
#include "core/data/tokenizer.h"

namespace dtrain {

// One sample: its token ids and, per token, whether it is trained (1: the loss counts it as the
// target predicted from the tokens before it; 0: prompt).
struct SftSample {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> trained;
};

// One JSON line into a sample. `where` ("file:line") starts every error: invalid JSON, neither
// shape above, a field or message content that is not a string, a role the template lacks, no
// trained token (no assistant message, or only empty ones).
absl::StatusOr<SftSample> EncodeSftLine(std::string_view line, const ChatTemplate& chat_template,
                                        const Tokenizer& tokenizer, const std::string& where);

// The samples of SFT token shards ("<key>.tokens" or ".tokens32" beside "<key>.mask", one byte
// per token, as `dtrain data pack --sft` writes them), in order. DataLoss naming the shard and
// the sample for a sample without a mask (not packed with --sft), a mask of the wrong length, an
// id >= vocab_size; FailedPrecondition for a shard that records another tokenizer than the first
// (DecodeSampleTokens).
absl::StatusOr<std::vector<SftSample>> ReadSftShards(const std::vector<std::string>& files,
                                                     int vocab_size);

// A sample longer than a sequence: cut to the sequence (its first seq_len + 1 tokens) or left
// out. Both are counted.
enum class LongSamplePolicy { kTruncate, kSkip };
absl::StatusOr<LongSamplePolicy> ParseLongSamplePolicy(const std::string& name);

// Samples laid out in rows of seq_len inputs, targets and positions (backend.h), each
// (rows, seq_len) row-major. A sample of n tokens takes n - 1 slots: inputs tokens[0, n - 1),
// targets tokens[1, n) where trained, else -1, positions 0 .. n - 2. With `packing`, samples in
// order fill a row while they fit whole (greedy); otherwise each has its own row. A row's unused
// tail is padding: token 0, target -1, positions of a document of its own.
struct SftRows {
  int seq_len = 0;
  int64_t rows = 0;
  std::vector<int32_t> inputs, targets, positions;
  int64_t samples = 0;         // samples placed (truncated ones included)
  int64_t truncated = 0;       // cut to seq_len + 1 tokens
  int64_t skipped = 0;         // left out: too long under kSkip, or under two tokens
  int64_t trained_tokens = 0;  // targets >= 0
  int64_t untrained = 0;       // samples placed without a trained target (cut off, or none)
  int64_t padding_tokens = 0;  // slots of no sample
};
SftRows PackSftRows(const std::vector<SftSample>& samples, int seq_len, bool packing,
                    LongSamplePolicy on_long_sample);

}  // namespace dtrain
