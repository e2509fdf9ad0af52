#include "core/model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/util/rng.h"

namespace dtrain {

std::vector<int32_t> Generate(Transformer& model, std::vector<int32_t> prompt, int max_time,
                              const SamplingOptions& options) {
  const int vocab = model.config().vocab_size;
  std::vector<float> logits(vocab);
  std::vector<int> order(vocab);
  CounterRng rng(options.seed, /*stream=*/0);
  for (int i = 0; i < options.max_new_tokens; ++i) {
    const int context = std::min<int>(static_cast<int>(prompt.size()), max_time);
    model.ForwardLogits(prompt.data() + prompt.size() - context, 1, context, true, logits.data());
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

}  // namespace dtrain
