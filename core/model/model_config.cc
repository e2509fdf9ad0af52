#include "core/model/model_config.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dtrain {

ModelConfig ModelConfigFromRecipe(const ModelSection& model, int d_ff) {
  ModelConfig config;
  config.family = model.family == "llama" ? ModelFamily::kLlama : ModelFamily::kGpt2;
  config.n_layer = model.n_layer;
  config.n_head = model.n_head;
  config.n_kv_head = model.n_kv_head > 0 ? model.n_kv_head : model.n_head;
  config.d_model = model.d_model;
  config.head_dim = model.d_model / model.n_head;
  config.d_ff = d_ff;
  config.vocab_size = model.vocab_size;
  config.max_seq_len = model.max_seq_len;
  config.norm_eps = static_cast<float>(model.norm_eps);
  config.rope_theta = static_cast<float>(model.rope_theta);
  config.init_std = static_cast<float>(model.init_std);
  return config;
}

absl::Status CheckTensorParallel(const ModelConfig& config, int tp) {
  if (tp < 1)
    return absl::InvalidArgumentError(absl::StrCat("parallel.tp = ", tp, " must be >= 1"));
  if (config.n_head % tp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.n_head = ", config.n_head, " does not divide by parallel.tp = ", tp,
                     ": tensor parallelism gives every rank the same number of heads, so make "
                     "model.n_head a multiple of it"));
  }
  if (config.d_ff % tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model.d_ff = ", config.d_ff,
                                                   " does not divide by parallel.tp = ", tp,
                                                   ": set model.d_ff to a multiple of it"));
  }
  if (config.n_kv_head % tp != 0 && tp % config.n_kv_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.n_kv_head = ", config.n_kv_head, " and parallel.tp = ", tp,
        " do not fit: the kv heads split over the ranks when n_kv_head % tp == 0 and are "
        "replicated when tp % n_kv_head == 0; change either key"));
  }
  return absl::OkStatus();
}

std::vector<BlockSpan> ChunksOf(const ModelConfig& config, const ModelSlice& slice) {
  if (!slice.chunks.empty()) return slice.chunks;
  return {{0, config.n_layer}};
}

const char* FamilyName(ModelFamily family) {
  return family == ModelFamily::kLlama ? "llama" : "gpt2";
}

std::string ModelShapeLine(const ModelConfig& config) {
  const double parameters = static_cast<double>(config.num_parameters());
  return absl::StrFormat("%s, %d layers, d_model %d, %d heads (%d kv), vocab %d: %s parameters",
                         FamilyName(config.family), config.n_layer, config.d_model, config.n_head,
                         config.n_kv_head, config.vocab_size,
                         parameters < 1e9 ? absl::StrFormat("%.2fM", parameters / 1e6)
                                          : absl::StrFormat("%.2fB", parameters / 1e9));
}

int64_t ModelConfig::num_parameters() const {
  const int64_t c = d_model, f = d_ff, v = vocab_size;
  const int64_t qkv = static_cast<int64_t>(n_head + 2 * n_kv_head) * head_dim;
  const int64_t attn_out = static_cast<int64_t>(n_head) * head_dim;
  int64_t block = qkv * c + attn_out * c;
  int64_t total = v * c;
  if (family == ModelFamily::kGpt2) {
    block += 4 * c + qkv + c + f * c + f + c * f + c;  // norms, biases, MLP
    total += static_cast<int64_t>(max_seq_len) * c + 2 * c;
  } else {
    block += 2 * c + 2 * f * c + c * f;
    total += c + v * c;  // final norm, untied head
  }
  return total + n_layer * block;
}

double ModelConfig::flops_per_token(int seq_len) const {
  // Position embeddings are a lookup, not a matmul; a tied embedding counts once (as the head).
  double matmul_params = static_cast<double>(num_parameters());
  if (has_position_embedding()) matmul_params -= static_cast<double>(max_seq_len) * d_model;
  if (!tied_head()) matmul_params -= static_cast<double>(vocab_size) * d_model;
  const double attention = 6.0 * n_layer * seq_len * static_cast<double>(n_head * head_dim);
  return 6.0 * matmul_params + attention;
}

}  // namespace dtrain
