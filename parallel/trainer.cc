#include "parallel/trainer.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/backend/cpu/cpu_backend.h"
#include "core/data/datasets.h"
#include "core/metrics/step_metrics.h"
#include "core/model/hf_names.h"
#include "core/model/sampler.h"
#include "core/model/transformer.h"
#include "core/optim/adamw.h"
#include "core/util/log.h"
#include "core/util/status.h"
#include "parallel/train_step.h"

namespace dtrain {
namespace {

// Byte tokens as readable text: printable ASCII and newlines kept, anything else as \xNN.
std::string BytesToText(const std::vector<int32_t>& tokens, size_t from) {
  std::string text;
  for (size_t i = from; i < tokens.size(); ++i) {
    const int32_t token = tokens[i];
    if (token == '\n' || (token >= 32 && token < 127)) {
      text.push_back(static_cast<char>(token));
    } else {
      absl::StrAppendFormat(&text, "\\x%02x", token);
    }
  }
  return text;
}

std::string SampleText(Transformer& model, const Recipe& recipe, int step) {
  std::vector<int32_t> prompt;
  for (const unsigned char ch : recipe.logging.sample_prompt) prompt.push_back(ch);
  if (prompt.empty() || recipe.data.format != "text") prompt.assign(1, 0);
  SamplingOptions options;
  options.max_new_tokens = recipe.logging.sample_tokens;
  options.temperature = static_cast<float>(recipe.logging.sample_temperature);
  options.top_k = recipe.logging.sample_top_k;
  options.seed = recipe.run.seed + static_cast<uint64_t>(step);
  const std::vector<int32_t> tokens =
      Generate(model, prompt, recipe.train.seq_len, options);
  if (recipe.data.format == "text") return BytesToText(tokens, 0);
  std::string ids;
  for (size_t i = prompt.size(); i < tokens.size(); ++i) absl::StrAppend(&ids, tokens[i], " ");
  return ids;
}

// Mean token loss over the validation set's first eval_batches micro-batches (the same ones at
// every evaluation, so the numbers compare).
absl::StatusOr<double> Evaluate(Transformer& model, ValidationLoader& val, const Recipe& recipe,
                                std::vector<int32_t>& inputs, std::vector<int32_t>& targets) {
  const int b = recipe.train.micro_batch;
  const int t = recipe.train.seq_len;
  val.Reset();
  double loss_sum = 0;
  int64_t tokens = 0;
  for (int i = 0; i < recipe.train.eval_batches; ++i) {
    ASSIGN_OR_RETURN(const int rows, val.Next(b, inputs.data(), targets.data()));
    if (rows == 0) break;
    loss_sum += model.ForwardLoss(inputs.data(), targets.data(), rows, t);
    tokens += static_cast<int64_t>(rows) * t;
  }
  if (tokens == 0) return absl::FailedPreconditionError("the validation set is empty");
  return loss_sum / static_cast<double>(tokens);
}

}  // namespace

absl::Status RunTraining(const Recipe& recipe) {
  const std::filesystem::path run_dir = recipe.run_dir();
  std::error_code error;
  std::filesystem::create_directories(run_dir, error);
  if (error) {
    return absl::FailedPreconditionError(absl::StrCat("cannot create the run folder ",
                                                      run_dir.string(), ": ", error.message(),
                                                      "; set run.out_dir to a writable folder"));
  }
  {
    std::ofstream resolved(run_dir / "recipe.yaml");
    resolved << ResolvedRecipeYaml(recipe);
  }

  CpuBackend backend(recipe.run.threads);
  const ModelConfig config = ModelConfigFromRecipe(recipe.model, recipe.d_ff());
  const TrainSection& train = recipe.train;
  Transformer model(config, backend, train.micro_batch, train.seq_len,
                    recipe.parallel.activation_checkpointing);
  if (train.init_from.empty()) {
    model.InitWeights(recipe.run.seed);
  } else {
    if (absl::Status status = ImportHfSafetensors(config, model.table(), train.init_from,
                                                  model.params().data());
        !status.ok()) {
      return absl::Status(status.code(),
                          absl::StrCat("train.init_from: ", status.message(),
                                       "; point it at weights of this model's shape"));
    }
    LogInfo("initialised from %s", train.init_from);
  }
  ASSIGN_OR_RETURN(Datasets data, OpenDatasets(recipe, /*rank=*/0, /*world=*/1));
  AdamW optimizer(model.table(), train);

  const double peak_flops = MeasureGemmFlops(backend);
  const double flops_per_token = config.flops_per_token(train.seq_len);
  const int accumulation = train.batch_size / train.micro_batch;
  const int64_t tokens_per_step = static_cast<int64_t>(train.batch_size) * train.seq_len;
  LogInfo("model: %s, %d layers, d_model %d, %d heads (%d kv), vocab %d: %.2fM parameters",
          FamilyName(config.family), config.n_layer, config.d_model, config.n_head,
          config.n_kv_head, config.vocab_size, config.num_parameters() / 1e6);
  LogInfo("data: %s tokens for training, %s for validation",
          absl::StrCat(data.train_tokens), absl::StrCat(data.val_tokens));
  LogInfo("batch: %d sequences x %d tokens = %d tokens/step (%d micro-batches of %d); "
          "activations %.1f MiB%s",
          train.batch_size, train.seq_len, tokens_per_step, accumulation, train.micro_batch,
          model.activation_bytes() / 1048576.0,
          recipe.parallel.activation_checkpointing ? " (checkpointed)" : "");
  LogInfo("MFU is stated against %.1f GFLOP/s, the measured float32 GEMM peak of this CPU "
          "backend (%d threads)",
          peak_flops / 1e9, backend.num_threads());

  std::ofstream metrics(run_dir / recipe.logging.metrics_file, std::ios::trunc);
  if (!metrics) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write ", (run_dir / recipe.logging.metrics_file).string()));
  }
  std::vector<int32_t> inputs(static_cast<size_t>(train.micro_batch) * train.seq_len);
  std::vector<int32_t> targets(inputs.size());
  const MicroBatchSource next_micro_batch = [&](int32_t* in, int32_t* out) {
    return data.train->Next(train.micro_batch, in, out);
  };
  double elapsed_s = 0;

  for (int step = 0; step < train.steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(const StepResult result,
                     TrainStep(model, optimizer, backend, train, step, next_micro_batch));
    const std::chrono::duration<double> step_time = std::chrono::steady_clock::now() - start;
    elapsed_s += step_time.count();

    StepMetrics m;
    m.step = step + 1;
    m.total_steps = train.steps;
    m.loss = result.loss;
    m.lr = result.lr;
    m.grad_norm = result.grad_norm;
    m.step_ms = step_time.count() * 1e3;
    m.tokens_per_s = static_cast<double>(tokens_per_step) / step_time.count();
    m.mfu_percent = 100.0 * flops_per_token * m.tokens_per_s / peak_flops;
    m.peak_rss_mib = PeakRssMib();
    m.eta_s = elapsed_s / m.step * (train.steps - m.step);
    const bool last = m.step == train.steps;
    if (train.eval_every > 0 && (m.step % train.eval_every == 0 || last)) {
      ASSIGN_OR_RETURN(m.val_loss, Evaluate(model, *data.val, recipe, inputs, targets));
    }
    if (m.step % recipe.logging.every == 0 || last || m.val_loss) {
      LogInfo("%s", FormatStepLine(m));
    }
    metrics << StepMetricsJson(m) << '\n' << std::flush;
    if (m.val_loss && recipe.logging.sample_tokens > 0) {
      LogInfo("sample at step %d:\n%s", m.step, SampleText(model, recipe, m.step));
    }
  }

  if (!train.export_to.empty()) {
    const std::string path = (run_dir / train.export_to).string();
    RETURN_IF_ERROR(ExportHfSafetensors(config, model.table(), model.params().data(), path));
    LogInfo("weights written to %s (Hugging Face names)", path);
  }
  return absl::OkStatus();
}

}  // namespace dtrain
