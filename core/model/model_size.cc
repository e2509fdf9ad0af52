#include "core/model/model_size.h"

#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/model/model_config.h"
#include "core/model/transformer.h"
#include "core/util/status.h"

namespace dtrain {

absl::Status CheckParameterCount(const Recipe& recipe) {
  const ModelSection& m = recipe.model;
  const ModelConfig config = ModelConfigFromRecipe(m, recipe.d_ff());
  // The recipe's key ranges (n_layer <= 2^16, d_model <= 2^20, d_ff <= 2^22, vocabulary and
  // positions <= 2^30) keep this count below 2^61, so it fits int64.
  const double parameters = static_cast<double>(config.num_parameters());
  if (parameters > kMaxParameters) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "model.n_layer %d, model.d_model %d, d_ff %d and model.vocab_size %d give %.3g "
        "parameters (%.3g bytes to train in float32), above dtrain's bound of %.0e parameters; "
        "lower n_layer or d_model",
        m.n_layer, m.d_model, config.d_ff, m.vocab_size, parameters, 16 * parameters,
        kMaxParameters));
  }
  return absl::OkStatus();
}

absl::Status CheckModelSize(const Recipe& recipe) {
  RETURN_IF_ERROR(CheckParameterCount(recipe));
  const ModelConfig config = ModelConfigFromRecipe(recipe.model, recipe.d_ff());
  const TrainSection& t = recipe.train;
  const double tokens = static_cast<double>(t.micro_batch) * t.seq_len;
  if (tokens > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "train.micro_batch %d x train.seq_len %d = %.0f tokens per micro-batch, more than the "
        "2^31 - 1 that the kernels count; lower micro_batch",
        t.micro_batch, t.seq_len, tokens));
  }
  ASSIGN_OR_RETURN(const Recompute recompute, ParseRecompute(recipe.parallel.recompute));
  const double activations =
      Transformer::ActivationBytes(config, t.micro_batch, t.seq_len, recompute);
  if (activations > kMaxActivationBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "one micro-batch (train.micro_batch %d x train.seq_len %d tokens) of this model keeps "
        "%.3g bytes of activations, above dtrain's bound of %.0e bytes per rank; lower "
        "micro_batch or seq_len, or set parallel.recompute: full",
        t.micro_batch, t.seq_len, activations, kMaxActivationBytes));
  }
  return absl::OkStatus();
}

}  // namespace dtrain
