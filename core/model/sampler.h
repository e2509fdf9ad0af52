// Text generation from a model, for the samples the step log shows at each evaluation.
#pragma once

#include <cstdint>
#include <vector>

#include "core/model/transformer.h"

namespace dtrain {

struct SamplingOptions {
  int max_new_tokens = 64;
  float temperature = 0.8f;  // 0 = greedy
  int top_k = 40;            // 0 = the whole vocabulary
  uint64_t seed = 0;
};

// Appends up to max_new_tokens tokens to `prompt` (which must not be empty). The context is
// the last `max_time` tokens; every token re-runs the forward pass (no KV cache: samples are
// short and rare).
std::vector<int32_t> Generate(Transformer& model, std::vector<int32_t> prompt, int max_time,
                              const SamplingOptions& options);

}  // namespace dtrain
