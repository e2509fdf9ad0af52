// dtrain's side of the PyTorch parity test (test_torch_parity.py): loads a recipe, Hugging Face
// weights and a batch file, trains train.steps steps on it and writes every number the
// reference compares: step-0 logits, per-step loss and gradient norm, step-0 gradients and the
// final parameters (in Hugging Face names and layouts, prefixed "grad." and "final.").
//
//   parity_probe --recipe R.yaml --weights W.safetensors --batch B.safetensors --out O.safetensors
//
// B.safetensors holds `tokens` int32 (steps, batch, seq_len + 1); step s trains on tokens[s].
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "core/backend/cpu/cpu_backend.h"
#include "core/io/safetensors.h"
#include "core/model/hf_folder.h"
#include "core/model/hf_names.h"
#include "core/model/transformer.h"
#include "core/util/status.h"
#include "parallel/data_parallel.h"
#include "parallel/train_step.h"

namespace dtrain {
namespace {

struct Options {
  std::string recipe, weights, batch, out;
  std::vector<std::string> overrides;
};

// Adds the tensors of a Hugging Face file written by ExportHfSafetensors under `prefix`.
absl::Status AppendHfTensors(const ModelConfig& config, const ParamTable& table,
                             const float* values, const std::string& prefix,
                             const std::string& scratch_path, SafetensorsContents& out) {
  RETURN_IF_ERROR(ExportHfSafetensors(config, table, values, scratch_path));
  ASSIGN_OR_RETURN(SafetensorsContents hf, ReadSafetensors(scratch_path));
  for (auto& [name, data] : hf.floats) {
    out.shapes[prefix + name] = hf.shapes[name];
    out.floats[prefix + name] = std::move(data);
  }
  std::filesystem::remove(scratch_path);
  return absl::OkStatus();
}

absl::Status Run(const Options& options) {
  ASSIGN_OR_RETURN(const Recipe recipe, LoadRecipe(options.recipe, options.overrides));
  const TrainSection& train = recipe.train;
  ASSIGN_OR_RETURN(const SafetensorsContents batch, ReadSafetensors(options.batch));
  const auto tokens = batch.ints.find("tokens");
  if (tokens == batch.ints.end()) {
    return absl::InvalidArgumentError(options.batch + " has no int32 tensor 'tokens'");
  }
  const std::vector<int64_t>& shape = batch.shapes.at("tokens");
  if (shape.size() != 3 || shape[0] < train.steps || shape[1] != train.batch_size ||
      shape[2] != train.seq_len + 1) {
    return absl::InvalidArgumentError(
        "tokens must have shape (train.steps, train.batch_size, train.seq_len + 1)");
  }

  CpuBackend backend(recipe.run.threads);
  const ModelConfig config = ModelConfigFromRecipe(recipe.model, recipe.d_ff());
  const ParamTable table(config, ModelSlice{});
  ASSIGN_OR_RETURN(const ShardingStrategy strategy,
                   ShardingStrategyFromRecipe(recipe.parallel, recipe.bf16_params()));
  DataParallelEngine engine(table, strategy, train, backend, /*comm=*/nullptr);
  ASSIGN_OR_RETURN(const Recompute recompute, ParseRecompute(recipe.parallel.recompute));
  Transformer model(config, table, engine, backend, train.micro_batch, train.seq_len, recompute);
  {
    std::vector<float> weights(table.total_numel());
    RETURN_IF_ERROR(ImportHfWeights(config, table, options.weights, weights.data()));
    engine.LoadParameters(weights.data());
  }

  const int t = train.seq_len;
  const int v = config.vocab_size;
  const size_t row = static_cast<size_t>(t) + 1;
  SafetensorsContents out;
  std::vector<float>& logits = out.floats["logits"];
  logits.resize(static_cast<size_t>(train.batch_size) * t * v);
  out.shapes["logits"] = {train.batch_size, t, v};
  std::vector<int32_t> inputs(static_cast<size_t>(train.micro_batch) * t);
  for (int first = 0; first < train.batch_size; first += train.micro_batch) {
    for (int i = 0; i < train.micro_batch; ++i) {
      const int32_t* src = tokens->second.data() + (first + i) * row;
      std::copy(src, src + t, inputs.begin() + static_cast<size_t>(i) * t);
    }
    model.ForwardLogits(inputs.data(), train.micro_batch, t, /*last_only=*/false,
                        logits.data() + static_cast<size_t>(first) * t * v);
  }

  std::vector<float>& losses = out.floats["loss"];
  std::vector<float>& norms = out.floats["grad_norm"];
  const std::string scratch = options.out + ".part.safetensors";
  absl::Status gradient_status;
  for (int step = 0; step < train.steps; ++step) {
    int next_sequence = 0;
    const MicroBatchSource source = [&](int32_t* in, int32_t* target, int32_t*) {
      for (int i = 0; i < train.micro_batch; ++i, ++next_sequence) {
        const int32_t* src = tokens->second.data() +
                             (static_cast<size_t>(step) * train.batch_size + next_sequence) * row;
        std::copy(src, src + t, in + static_cast<size_t>(i) * t);
        std::copy(src + 1, src + t + 1, target + static_cast<size_t>(i) * t);
      }
      return absl::OkStatus();
    };
    const auto save_gradients = [&] {
      gradient_status =
          engine.full_gradients() == nullptr
              ? absl::InvalidArgumentError("the probe needs unsharded gradients: use ddp or zero1")
              : AppendHfTensors(config, table, engine.full_gradients(), "grad.", scratch, out);
    };
    ASSIGN_OR_RETURN(
        const StepResult result,
        TrainStep(model, engine, train, step, train.batch_size / train.micro_batch, source,
                  step == 0 ? std::function<void()>(save_gradients) : nullptr));
    RETURN_IF_ERROR(gradient_status);
    losses.push_back(static_cast<float>(result.loss));
    norms.push_back(static_cast<float>(result.grad_norm));
  }
  out.shapes["loss"] = out.shapes["grad_norm"] = {train.steps};
  ASSIGN_OR_RETURN(const std::vector<float> final_params, engine.GatherParameters());
  RETURN_IF_ERROR(AppendHfTensors(config, table, final_params.data(), "final.", scratch, out));

  std::vector<TensorData> tensors;
  for (const auto& [name, data] : out.floats) {
    tensors.push_back({TensorSpec{name, DType::kF32, out.shapes[name]}, data.data()});
  }
  return WriteSafetensors(options.out, tensors);
}

}  // namespace
}  // namespace dtrain

int main(int argc, char** argv) {
  dtrain::Options options;
  CLI::App app{"dtrain's side of the PyTorch parity test"};
  app.add_option("--recipe", options.recipe)->required();
  app.add_option("--weights", options.weights)->required();
  app.add_option("--batch", options.batch)->required();
  app.add_option("--out", options.out)->required();
  app.add_option("--set", options.overrides);
  CLI11_PARSE(app, argc, argv);
  const absl::Status status = dtrain::Run(options);
  if (!status.ok()) {
    std::fprintf(stderr, "parity_probe: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
