#include "parallel/pipeline/sampling.h"

#include <utility>

#include "core/util/status.h"
#include "parallel/comm/host_values.h"
#include "parallel/pipeline/forward_pass.h"

namespace dtrain {

absl::StatusOr<std::vector<int32_t>> GeneratePipelined(Transformer& stage, Communicator& pp,
                                                       std::vector<int32_t> prompt, int max_time,
                                                       const SamplingOptions& options) {
  const int vocab = stage.config().vocab_size;
  const int last = pp.size() - 1;
  const int chunks = static_cast<int>(stage.chunks().size());
  const NextTokenLogits through_stages = [&](const int32_t* context, int t,
                                             float* logits) -> absl::Status {
    RETURN_IF_ERROR(ForwardThroughStages(
        pp, stage.backend(), chunks, stage.StageActivationCount(1, t), stage.activation_type(),
        [&](int chunk, ConstValues input, Values output) {
          stage.StageForwardLogits(
              {.chunk = chunk, .b = 1, .t = t, .tokens = context, .input = input, .output = output},
              /*last_only=*/true, logits);
        }));
    return BroadcastHost(pp, stage.backend(), logits, vocab, last);
  };
  return Generate(through_stages, vocab, std::move(prompt), max_time, options);
}

}  // namespace dtrain
