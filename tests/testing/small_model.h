// A transformer small enough for tests that run it many times: 3 blocks, 4 heads of 8
// (grouped-query with 2 kv heads for llama), vocabulary 61, up to 16 positions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/model/model_config.h"
#include "core/model/transformer.h"

namespace dtrain::testing {

inline ModelConfig SmallModelConfig(ModelFamily family) {
  ModelConfig config;
  config.family = family;
  config.n_layer = 3;
  config.n_head = 4;
  config.n_kv_head = family == ModelFamily::kLlama ? 2 : 4;
  config.d_model = 32;
  config.head_dim = 8;
  config.d_ff = 48;
  config.vocab_size = 61;
  config.max_seq_len = 16;
  return config;
}

// `count` token ids below `vocab`, a fixed pattern that `salt` shifts (inputs and targets of one
// micro-batch use two salts).
inline std::vector<int32_t> PatternTokens(size_t count, int vocab, int salt) {
  std::vector<int32_t> tokens(count);
  for (size_t i = 0; i < count; ++i) {
    tokens[i] = static_cast<int32_t>((i * 5 + salt * 17) % vocab);
  }
  return tokens;
}

// model.ForwardBackward, then the loss sum it added (TakeLossSum).
inline double ForwardBackwardLoss(Transformer& model, const int32_t* inputs, const int32_t* targets,
                                  int b, int t, float grad_scale,
                                  const int32_t* positions = nullptr) {
  model.ForwardBackward(inputs, targets, b, t, grad_scale, positions);
  return model.TakeLossSum();
}

}  // namespace dtrain::testing
