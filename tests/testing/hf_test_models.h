// The tiny models and parameter values the Hugging Face naming and folder tests share.
#pragma once

#include <vector>

#include "core/model/model_config.h"
#include "core/model/param_table.h"

namespace dtrain::testing {

// Small enough to read a failing tensor by eye; Llama's grouped-query attention makes k and v
// narrower than q, and its norm epsilon and RoPE base differ from the defaults so that a config
// field that is not carried shows.
inline ModelConfig HfTestConfig(ModelFamily family) {
  ModelConfig c;
  c.family = family;
  c.n_layer = 2;
  c.vocab_size = 11;
  c.max_seq_len = 5;
  c.d_model = 8;
  if (family == ModelFamily::kGpt2) {
    c.n_head = 2;
    c.n_kv_head = 2;
    c.head_dim = 4;
    c.d_ff = 32;
  } else {
    c.n_head = 4;
    c.n_kv_head = 2;
    c.head_dim = 2;
    c.d_ff = 12;
    c.norm_eps = 1e-6f;
    c.rope_theta = 500000.0f;
  }
  return c;
}

// Distinct values, all >= 1 and exact in float32, so any misplaced or unwritten element shows.
inline std::vector<float> DistinctParams(const ParamTable& table) {
  std::vector<float> params(table.total_numel());
  for (size_t i = 0; i < params.size(); ++i) params[i] = static_cast<float>(i) * 0.5f + 1.0f;
  return params;
}

}  // namespace dtrain::testing
