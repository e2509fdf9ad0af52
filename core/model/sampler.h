// Text generation from a model, for the samples the step log shows at each evaluation.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/model/transformer.h"

namespace dtrain {

struct SamplingOptions {
  int max_new_tokens = 64;
  float temperature = 0.8f;  // 0 = greedy
  int top_k = 40;            // 0 = the whole vocabulary
  uint64_t seed = 0;
};

// Writes logits (vocabulary) for the token after `context` (t tokens).
using NextTokenLogits = std::function<absl::Status(const int32_t* context, int t, float* logits)>;

// Appends up to max_new_tokens tokens to `prompt` (which must not be empty), each sampled from
// next_logits over a vocabulary of `vocab` tokens. The context is the last `max_time` tokens;
// every token re-runs the forward pass (no KV cache: samples are short and rare). The tokens
// are a function of the logits and the options only, so ranks that see the same logits agree.
// Errors: next_logits's, as it returned it.
absl::StatusOr<std::vector<int32_t>> Generate(const NextTokenLogits& next_logits, int vocab,
                                              std::vector<int32_t> prompt, int max_time,
                                              const SamplingOptions& options);

// The same with the logits of a whole model (Transformer::ForwardLogits).
std::vector<int32_t> Generate(Transformer& model, std::vector<int32_t> prompt, int max_time,
                              const SamplingOptions& options);

}  // namespace dtrain
