#include "core/model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "core/util/rng.h"
#include "core/util/status.h"

namespace dtrain {

absl::StatusOr<std::vector<int32_t>> Generate(const NextTokenLogits& next_logits, int vocab,
                                              std::vector<int32_t> prompt, int max_time,
                                              const SamplingOptions& options) {
  std::vector<float> logits(vocab);
  std::vector<int> order(vocab);
  CounterRng rng(options.seed, /*stream=*/0);
  for (int i = 0; i < options.max_new_tokens; ++i) {
    const int context = std::min<int>(static_cast<int>(prompt.size()), max_time);
    RETURN_IF_ERROR(next_logits(prompt.data() + prompt.size() - context, context, logits.data()));
    int next = 0;
    if (options.temperature <= 0.0f) {
      next = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    } else {
      std::iota(order.begin(), order.end(), 0);
      const int k = options.top_k > 0 ? std::min(options.top_k, vocab) : vocab;
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int a, int b) { return logits[a] > logits[b]; });
      const float top = logits[order[0]];
      double total = 0;
      std::vector<double> weights(k);
      for (int j = 0; j < k; ++j) {
        weights[j] = std::exp((logits[order[j]] - top) / options.temperature);
        total += weights[j];
      }
      double target = rng.uniform() * total;
      next = order[k - 1];
      for (int j = 0; j < k; ++j) {
        target -= weights[j];
        if (target <= 0) {
          next = order[j];
          break;
        }
      }
    }
    prompt.push_back(next);
  }
  return prompt;
}

std::vector<int32_t> Generate(Transformer& model, std::vector<int32_t> prompt, int max_time,
                              const SamplingOptions& options) {
  const NextTokenLogits whole_model = [&](const int32_t* context, int t, float* logits) {
    model.ForwardLogits(context, 1, t, /*last_only=*/true, logits);
    return absl::OkStatus();
  };
  // The whole model's logits never fail.
  return *Generate(whole_model, model.config().vocab_size, std::move(prompt), max_time, options);
}

}  // namespace dtrain
