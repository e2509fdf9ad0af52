#include "parallel/pipeline/sampling.h"

#include <utility>

#include "core/util/status.h"

namespace dtrain {

absl::StatusOr<std::vector<int32_t>> GeneratePipelined(Transformer& stage, Communicator& pp,
                                                       std::vector<int32_t> prompt, int max_time,
                                                       const SamplingOptions& options) {
  const int vocab = stage.config().vocab_size;
  const int last = pp.size() - 1;
  std::vector<float> input, output;
  const NextTokenLogits through_stages = [&](const int32_t* context, int t,
                                             float* logits) -> absl::Status {
    const size_t count = stage.StageActivationCount(1, t);
    input.resize(count);
    output.resize(count);
    if (pp.rank() > 0) RETURN_IF_ERROR(pp.Recv(input.data(), count, pp.rank() - 1)->Wait());
    stage.StageForwardLogits({.b = 1,
                              .t = t,
                              .tokens = pp.rank() == 0 ? context : nullptr,
                              .input = input.data(),
                              .output = output.data()},
                             /*last_only=*/true, logits);
    if (pp.rank() < last) RETURN_IF_ERROR(pp.Send(output.data(), count, pp.rank() + 1)->Wait());
    return pp.Broadcast(logits, vocab, last)->Wait();
  };
  return Generate(through_stages, vocab, std::move(prompt), max_time, options);
}

}  // namespace dtrain
