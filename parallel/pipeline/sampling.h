// Sampling (core/model/sampler.h) from a model split into pipeline stages, for the samples the
// trainer logs at evaluation under parallel.pp > 1.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/sampler.h"
#include "core/model/transformer.h"
#include "parallel/comm/communicator.h"

namespace dtrain {

// Generate through the stages: every rank of `pp` calls it with its stage (`stage` holds stage
// pp.rank()'s blocks, whole-model order) and the same prompt and options. For each token the
// context goes forward through the stages in turn, its activations sent over `pp`; the last
// stage's logits are broadcast to every stage (vocabulary floats a token, where sending the
// token would take one: samples are short and rare, and the sampling stays in Generate alone),
// and each stage samples from them with the same generator: every rank returns the same tokens,
// those of Generate on the model the stages split (the stage passes compute its logits bit for
// bit). Errors: a failed send, receive or broadcast, as the communicator names it.
absl::StatusOr<std::vector<int32_t>> GeneratePipelined(Transformer& stage, Communicator& pp,
                                                       std::vector<int32_t> prompt, int max_time,
                                                       const SamplingOptions& options);

}  // namespace dtrain
