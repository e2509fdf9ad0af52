#include "parallel/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/backend/cpu/cpu_backend.h"
#include "core/backend/make_backend.h"
#include "core/checkpoint/format.h"
#include "core/checkpoint/reader.h"
#include "core/checkpoint/tools.h"
#include "core/data/datasets.h"
#include "core/data/shard_stream.h"
#include "core/data/token_decode.h"
#include "core/data/tokenizers/load_tokenizer.h"
#include "core/data/webdataset_loader.h"
#include "core/metrics/step_exporter.h"
#include "core/metrics/step_metrics.h"
#include "core/metrics/stragglers.h"
#include "core/model/hf_folder.h"
#include "core/model/hf_names.h"
#include "core/model/sampler.h"
#include "core/model/transformer.h"
#include "core/util/allocate.h"
#include "core/util/exit_codes.h"
#include "core/util/files.h"
#include "core/util/folder_lock.h"
#include "core/util/log.h"
#include "core/util/status.h"
#include "core/util/utf8.h"
#include "nlohmann/json.hpp"
#include "parallel/checkpointing.h"
#include "parallel/comm/faulty_ranks.h"
#include "parallel/comm/flight_recorder.h"
#include "parallel/comm/host_values.h"
#include "parallel/data_parallel.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/forward_pass.h"
#include "parallel/pipeline/sampling.h"
#include "parallel/pipeline/stage_assignment.h"
#include "parallel/pipeline_train_step.h"
#include "parallel/planner/auto_layout.h"
#include "parallel/planner/cost_model.h"
#include "parallel/process_group.h"
#include "parallel/rank_memory.h"
#include "parallel/tensor_parallel.h"
#include "parallel/train_step.h"
#include "parallel/whole_model.h"

namespace dtrain {
namespace {

// Test-only: DTRAIN_TEST_SLOW_RANK=<rank>:<ms> (unset in every real run) makes that world rank
// sleep that long at the start of every step, a straggler for the tests to find.
absl::Duration TestSlowdown(int rank) {
  const char* text = std::getenv("DTRAIN_TEST_SLOW_RANK");
  if (text == nullptr) return absl::ZeroDuration();
  const std::pair<std::string, std::string> parts = absl::StrSplit(text, ':');
  int slow_rank = -1, ms = 0;
  if (!absl::SimpleAtoi(parts.first, &slow_rank) || !absl::SimpleAtoi(parts.second, &ms) ||
      slow_rank != rank) {
    return absl::ZeroDuration();
  }
  return absl::Milliseconds(ms);
}

// Token ids as text through the data's tokenizer. Ids the tokenizer lacks (a model's vocabulary
// is often padded past it) show as <id N>; invalid UTF-8 (a character cut at the end) as \xNN.
absl::StatusOr<std::string> TokensToText(const Tokenizer& tokenizer,
                                         const std::vector<int32_t>& tokens) {
  std::string text;
  size_t run = 0;  // start of the ids not yet decoded
  const auto flush = [&](size_t end) -> absl::Status {
    ASSIGN_OR_RETURN(const std::string decoded,
                     tokenizer.Decode(absl::MakeConstSpan(tokens).subspan(run, end - run)));
    text += decoded;
    return absl::OkStatus();
  };
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < tokenizer.vocab_size()) continue;
    RETURN_IF_ERROR(flush(i));
    absl::StrAppend(&text, "<id ", tokens[i], ">");
    run = i + 1;
  }
  RETURN_IF_ERROR(flush(tokens.size()));
  return EscapeInvalidUtf8(text);
}

// data.tokenizer, checked against the model's vocabulary and against the data: text is bytes,
// and shards record the tokenizer they were packed with (`recorded`, the first shard's:
// ShardsTokenizerName), which must be data.tokenizer's, or the samples would decode, and
// train.export_to ship, a tokenizer the ids do not belong to. Without it: bytes for data.format
// text and for shards that record bytes (`data pack` without --tokenizer), else null (the
// samples print as ids, and the leader says how to see text).
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSampleTokenizer(
    const Recipe& recipe, const absl::StatusOr<std::string>& recorded, bool leader) {
  if (recipe.data.format == "text" && !recipe.data.tokenizer.empty()) {
    return WithExitCode(
        absl::InvalidArgumentError(absl::StrCat(
            "data.tokenizer ", recipe.data.tokenizer,
            " is not the data's: data.format text trains on the files' bytes (ids 0-255); leave "
            "data.tokenizer empty, or pack the text with it (`dtrain data pack --tokenizer ",
            recipe.data.tokenizer, "`) and train on the shards (data.format: webdataset)")),
        kExitUsage);
  }
  if (recipe.data.tokenizer.empty()) {
    if (recipe.data.format == "text") return std::make_unique<ByteTokenizer>();
    if (recipe.logging.sample_tokens == 0) return nullptr;
    if (recorded.ok() && *recorded == ByteTokenizer().name()) {
      return std::make_unique<ByteTokenizer>();
    }
    if (leader && !recorded.ok()) {
      LogInfo(
          "samples print as token ids: the first shard, which records the data's tokenizer, did "
          "not read (%s)",
          recorded.status().message());
    } else if (leader) {
      LogInfo(
          "samples print as token ids: set data.tokenizer to the data's tokenizer (its file or "
          "folder) to read them as text%s",
          recorded->empty() ? "" : absl::StrCat(" (the shards record ", *recorded, ")"));
    }
    return nullptr;
  }
  // A tokenizer that is not there, that it may not read, of no kind dtrain reads or too large
  // for the model is the recipe's to fix: the same at every restart (exit 2).
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(recipe.data.tokenizer);
  if (!tokenizer.ok()) {
    const absl::Status& status = tokenizer.status();
    const absl::Status error(status.code(), absl::StrCat("data.tokenizer: ", status.message()));
    return absl::IsNotFound(status) || absl::IsInvalidArgument(status) ||
                   absl::IsUnimplemented(status) || absl::IsPermissionDenied(status)
               ? WithExitCode(error, kExitUsage)
               : error;
  }
  if ((*tokenizer)->vocab_size() > recipe.model.vocab_size) {
    return WithExitCode(
        absl::InvalidArgumentError(absl::StrCat(
            "data.tokenizer ", (*tokenizer)->name(), " has a vocabulary of ",
            (*tokenizer)->vocab_size(), ", more than model.vocab_size ", recipe.model.vocab_size,
            "; set model.vocab_size to at least ", (*tokenizer)->vocab_size())),
        kExitUsage);
  }
  if (recorded.ok() && !recorded->empty() && !SameTokenizer(*recorded, (*tokenizer)->name())) {
    return WithExitCode(
        absl::InvalidArgumentError(absl::StrCat(
            "data.tokenizer is ", (*tokenizer)->name(), ", but the first shard records ", *recorded,
            ", the tokenizer it was packed with; set data.tokenizer to that one (its "
            "file or folder), or pack the data again with this one")),
        kExitUsage);
  }
  return tokenizer;
}

// train.init_from's folder carries the tokenizer its model learned: data of another tokenizer's
// ids (`data_tokenizer`'s, else the shards' record) would train its embedding rows as another
// vocabulary's. A warning, not an error: new ids on old weights may be meant.
void WarnOfAnotherInitTokenizer(const Recipe& recipe, const Tokenizer* data_tokenizer,
                                const absl::StatusOr<std::string>& recorded) {
  const std::string& folder = recipe.train.init_from;
  std::error_code error;
  if (folder.empty() || !std::filesystem::is_directory(folder, error)) return;
  const std::string data_name =
      data_tokenizer != nullptr ? data_tokenizer->name() : recorded.value_or(std::string());
  if (data_name.empty()) return;
  // The folder's tokenizer as LoadTokenizer picks it, and a tokenizer.model beside a
  // tokenizer.json (Llama 2, Mistral), either of which the data may have been packed with. A
  // folder without one dtrain reads says nothing of its vocabulary.
  const absl::StatusOr<std::unique_ptr<Tokenizer>> model_tokenizer = LoadTokenizer(folder);
  if (!model_tokenizer.ok() || SameTokenizer(data_name, (*model_tokenizer)->name()) ||
      (data_name == ByteTokenizer().name() && EncodesBytesAsIds(**model_tokenizer))) {
    return;
  }
  const std::string model_file = (std::filesystem::path(folder) / "tokenizer.model").string();
  if (std::filesystem::exists(model_file, error)) {
    const absl::StatusOr<std::unique_ptr<Tokenizer>> pieces = LoadTokenizer(model_file);
    if (pieces.ok() && SameTokenizer(data_name, (*pieces)->name())) return;
  }
  LogWarn(
      "train.init_from %s carries tokenizer %s, but the data's ids are of %s: the model would "
      "learn them as another vocabulary; train on data of the folder's tokenizer (`dtrain data "
      "pack --tokenizer %s`)",
      folder, (*model_tokenizer)->name(), data_name, folder);
}

// Streamed documents are joined end to end unless data.eos_id separates them: with a tokenizer
// that has an end-of-text token (GPT-2's, Llama's), a run without one learns no document ends.
void WarnOfJoinedDocuments(const Recipe& recipe, const Tokenizer* data_tokenizer) {
  if (recipe.data.format != "webdataset" || recipe.data.eos_id >= 0 || data_tokenizer == nullptr) {
    return;
  }
  for (const char* marker : {"<|endoftext|>", "<|end_of_text|>", "</s>"}) {
    if (const absl::StatusOr<int32_t> id = data_tokenizer->SpecialToken(marker); id.ok()) {
      LogWarn(
          "data.eos_id is -1, so the streamed documents are joined with no separator, though "
          "data.tokenizer has %s: set data.eos_id: %d, as GPT-2's and Llama's pretraining "
          "separate documents (unless every document ends with it already)",
          marker, *id);
      return;
    }
  }
}

// Every rank generates (sharded parameters need all of them; under pp > 1 every stage, `model`
// being this rank's); rank 0 prints. With a tokenizer (LoadSampleTokenizer) the prompt is encoded
// and the sample decoded through it; otherwise the sample is its ids, after no prompt.
absl::StatusOr<std::string> SampleText(Transformer& model, Communicator* pp, const Recipe& recipe,
                                       const Tokenizer* tokenizer, int step) {
  std::vector<int32_t> prompt;
  if (tokenizer != nullptr) {
    RETURN_IF_ERROR(tokenizer->Encode(recipe.logging.sample_prompt, &prompt));
  }
  const bool no_prompt = prompt.empty();
  if (no_prompt) prompt.assign(1, 0);
  SamplingOptions options;
  options.max_new_tokens = recipe.logging.sample_tokens;
  options.temperature = static_cast<float>(recipe.logging.sample_temperature);
  options.top_k = recipe.logging.sample_top_k;
  options.seed = recipe.run.seed + static_cast<uint64_t>(step);
  std::vector<int32_t> tokens;
  if (pp != nullptr) {
    ASSIGN_OR_RETURN(tokens, GeneratePipelined(model, *pp, prompt, recipe.train.seq_len, options));
  } else {
    tokens = Generate(model, prompt, recipe.train.seq_len, options);
  }
  if (tokenizer != nullptr) {
    if (no_prompt) tokens.erase(tokens.begin());
    return TokensToText(*tokenizer, tokens);
  }
  std::string ids;
  for (size_t i = prompt.size(); i < tokens.size(); ++i) absl::StrAppend(&ids, tokens[i], " ");
  return ids;
}

// The targets among the first n that the mean loss counts: the trained ones of document data,
// else all.
double CountedTargets(const std::vector<int32_t>& targets, int n, bool documents) {
  return static_cast<double>(documents ? TrainedTokens(targets.data(), n) : n);
}

// Mean token loss over the validation set's first train.eval_batches batches of
// train.batch_size sequences (fewer where the set ends first: the ranks stop together), each
// data-parallel rank reading its `micro_batches` micro-batches of them: the same sequences at every
// evaluation and for every layout and micro-batch size, so the numbers compare (Megatron's
// eval_iters counts global batches too). The ranks of a tensor-parallel group compute one loss
// together, so it is summed over `dp` only.
absl::StatusOr<double> Evaluate(Transformer& model, Communicator* dp, ValidationLoader& val,
                                const Recipe& recipe, int micro_batches) {
  const int b = recipe.train.micro_batch;
  const int t = recipe.train.seq_len;
  std::vector<int32_t> inputs(static_cast<size_t>(b) * t), targets(inputs.size());
  // Document data (SFT): positions, and the mean is over the trained (unmasked) targets.
  const bool documents = val.documents();
  std::vector<int32_t> positions(documents ? inputs.size() : 0);
  val.Reset();
  double loss_sum = 0;
  double tokens = 0;
  for (int64_t i = 0; i < int64_t{recipe.train.eval_batches} * micro_batches; ++i) {
    ASSIGN_OR_RETURN(const bool ended, val.Ended());
    if (ended) break;
    ASSIGN_OR_RETURN(const int rows, documents ? val.NextDocuments(b, inputs.data(), targets.data(),
                                                                   positions.data())
                                               : val.Next(b, inputs.data(), targets.data()));
    // Every rank runs the forward, on an empty batch too: sharded parameters are gathered
    // collectively.
    loss_sum += model.ForwardLoss(inputs.data(), targets.data(), rows, t,
                                  documents ? positions.data() : nullptr);
    tokens += CountedTargets(targets, rows * t, documents);
  }
  RETURN_IF_ERROR(SumOverGroup(dp, model.backend(), loss_sum, tokens));
  if (tokens == 0) return absl::FailedPreconditionError("the validation set is empty");
  return loss_sum / tokens;
}

// Evaluate's pipeline: each validation micro-batch forward through the stages in turn, the
// activations passed on over `pp`; the last stage's loss and token count summed to every stage,
// then over the data-parallel replicas `dp`.
absl::StatusOr<double> EvaluatePipeline(Transformer& model, Communicator& pp, Communicator* dp,
                                        ValidationLoader& val, const Recipe& recipe,
                                        int micro_batches) {
  const int b = recipe.train.micro_batch;
  const int t = recipe.train.seq_len;
  const bool last = pp.rank() + 1 == pp.size();
  std::vector<int32_t> inputs(static_cast<size_t>(b) * t), targets(inputs.size());
  const bool documents = val.documents();
  std::vector<int32_t> positions(documents ? inputs.size() : 0);
  val.Reset();
  double loss_sum = 0;
  double tokens = 0;
  for (int64_t i = 0; i < int64_t{recipe.train.eval_batches} * micro_batches; ++i) {
    ASSIGN_OR_RETURN(const bool ended, val.Ended());
    if (ended) break;
    // Every stage of a replica reads the same batch. Each runs the forward, on an empty batch
    // too: sharded parameters are gathered collectively over the replicas.
    ASSIGN_OR_RETURN(const int rows, documents ? val.NextDocuments(b, inputs.data(), targets.data(),
                                                                   positions.data())
                                               : val.Next(b, inputs.data(), targets.data()));
    RETURN_IF_ERROR(ForwardThroughStages(
        pp, model.backend(), static_cast<int>(model.chunks().size()),
        model.StageActivationCount(rows, t), model.activation_type(),
        [&](int chunk, ConstValues input, Values output) {
          loss_sum += model.StageForwardLoss({.chunk = chunk,
                                              .b = rows,
                                              .t = t,
                                              .tokens = inputs.data(),
                                              .input = input,
                                              .targets = targets.data(),
                                              .output = output,
                                              .positions = documents ? positions.data() : nullptr});
        }));
    if (!last) continue;
    tokens += CountedTargets(targets, rows * t, documents);
  }
  RETURN_IF_ERROR(SumOverGroup(&pp, model.backend(), loss_sum, tokens));
  RETURN_IF_ERROR(SumOverGroup(dp, model.backend(), loss_sum, tokens));
  if (tokens == 0) return absl::FailedPreconditionError("the validation set is empty");
  return loss_sum / tokens;
}

// parallel.strategy: auto -> the planner's layout for this world among those the trainer runs
// (TrainerLayouts). A better layout it cannot run is reported, never silently replaced.
absl::StatusOr<Recipe> ResolveStrategy(const Recipe& recipe, const WorldMembership& world) {
  if (recipe.parallel.strategy != "auto") return recipe;
  const int world_size = world.world_size;
  SearchOptions runnable = TrainerLayouts(world.local_world_size);
  // CPU ranks hold what they compute with in this machine's memory, not in cluster.gpu's. The
  // plan's times are GPUs' (cluster.gpu, cluster.network), which rank no layout of CPU ranks
  // sharing a machine: there auto takes the simplest layout that fits.
  const bool cpu = recipe.run.device == "cpu";
  const double bytes_per_rank =
      cpu ? CpuBackend::MachineMemory().bytes / std::max(world.local_world_size, 1) : 0;
  if (cpu) runnable.simpler_within = std::numeric_limits<double>::infinity();
  ASSIGN_OR_RETURN(const AutoLayout chosen,
                   ResolveAutoLayout(recipe, world_size, runnable, bytes_per_rank));
  Recipe resolved = recipe;
  RETURN_IF_ERROR(ApplyLayout(chosen.layout, resolved));
  // The keys auto chooses that the recipe gave other values.
  const auto replaced = [](const auto& chosen, const auto& recipes) {
    return chosen == recipes ? std::string()
                             : absl::StrCat(" (in place of the recipe's ", recipes, ")");
  };
  LogInfo(
      "parallel.strategy auto: %s, tp %d%s, pp %d%s, micro_batch %d%s, recompute %s%s (%s for %d "
      "rank%s of %s)",
      resolved.parallel.strategy, resolved.parallel.tp,
      resolved.parallel.sequence_parallel ? " with sequence parallelism" : "", resolved.parallel.pp,
      resolved.parallel.pp > 1 ? absl::StrCat(" ", resolved.parallel.pp_schedule) : "",
      resolved.train.micro_batch, replaced(resolved.train.micro_batch, recipe.train.micro_batch),
      resolved.parallel.recompute, replaced(resolved.parallel.recompute, recipe.parallel.recompute),
      cpu ? "the simplest layout that fits" : "the plan", world_size, world_size == 1 ? "" : "s",
      bytes_per_rank > 0 ? absl::StrCat(FormatBytes(bytes_per_rank), " of this machine's memory")
                         : absl::StrCat(recipe.cluster.gpu, " GPUs"));
  if (!chosen.note.empty()) LogInfo("%s", chosen.note);
  return resolved;
}

absl::Status CheckBatchSplit(const TrainSection& train, int ranks) {
  if (train.batch_size % (train.micro_batch * ranks) == 0) return absl::OkStatus();
  // The largest micro-batch below the recipe's that splits each rank's share, when there is one.
  std::string smaller;
  if (train.batch_size % ranks == 0) {
    const int share = train.batch_size / ranks;
    for (int micro = std::min(train.micro_batch - 1, share); micro >= 1 && smaller.empty();
         --micro) {
      if (share % micro == 0) smaller = absl::StrCat(", or train.micro_batch ", micro);
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("train.batch_size ", train.batch_size, " does not split into ", ranks,
                   " data-parallel ranks x micro-batches of train.micro_batch ", train.micro_batch,
                   "; make batch_size a multiple of ", train.micro_batch * ranks, smaller));
}

std::string MiB(size_t bytes) { return absl::StrFormat("%.1f MiB", bytes / 1048576.0); }

// Every stage's own line at the end of a pipelined run (rank 0's metrics show stage 0 only):
// its idle share, and the activations it held against what the start-up estimate sized
// (EstimateRankMemory, which does not count the executor's send and receive buffers).
void LogPipelineStage(const Recipe& recipe, const ModelConfig& config, const ModelSlice& slice,
                      Recompute recompute, DataType activation_type, int stage, int stages,
                      int activation_slots, double estimated_bytes, const PipelineStepTimes& times,
                      const PipelineExecutorStats& stats) {
  const double held_bytes = Transformer::ActivationBytes(
      config, recipe.train.micro_batch, recipe.train.seq_len, recompute, slice,
      recipe.parallel.sequence_parallel, stats.peak_live_activations, activation_type);
  // Under interleaving a slot holds one micro-batch's pass through one model chunk.
  const bool interleaved = slice.chunks.size() > 1;
  LogInfo(
      "pipeline stage %d of %d: %s; activations: at most %d %s in flight in %d slots, %s (the "
      "estimate: %s), plus %s of send and receive buffers",
      stage, stages, times.Format(), stats.peak_live_activations,
      interleaved ? "micro-batch chunks" : "micro-batches", activation_slots,
      MiB(static_cast<size_t>(held_bytes)), MiB(static_cast<size_t>(estimated_bytes)),
      MiB(stats.peak_buffer_bytes));
}

// SIGTERM (save, then stop) and SIGUSR1 (save, then go on), which a launcher forwards on
// preemption; in a run without an agent also SIGINT (Ctrl-C) and SIGHUP (a closed terminal or ssh
// session), which stop it as SIGTERM does, as `dtrain launch` stops its workers for them. The
// handlers only set flags; the ranks agree on them at a step boundary. A second Ctrl-C ends the
// process at once, unsaved, as a user pressing it again expects.
std::atomic<bool> sigterm_received{false};
std::atomic<bool> sigusr1_received{false};
std::atomic<int> stop_signal{0};       // the first of SIGTERM, SIGINT, SIGHUP this rank received
std::atomic<bool> steps_begun{false};  // past start-up: a stop saves the step that runs
static_assert(std::atomic<bool>::is_always_lock_free && std::atomic<int>::is_always_lock_free);

extern "C" void OnCheckpointSignal(int signal) {
  if (signal == SIGUSR1) {
    sigusr1_received.store(true);
    return;
  }
  if (signal == SIGINT && sigterm_received.load()) {
    ::signal(SIGINT, SIG_DFL);
    ::raise(SIGINT);
    return;
  }
  int none = 0;
  stop_signal.compare_exchange_strong(none, signal);
  sigterm_received.store(true);
  if (signal == SIGINT) {
    // At once, while the step runs on (write(2) is safe in a handler; a failed one costs nothing).
    constexpr char kStepNotice[] =
        "\nSIGINT: the run saves a checkpoint at the end of this step and stops "
        "(Ctrl-C again quits at once, unsaved)\n";
    constexpr char kStartNotice[] =
        "\nSIGINT: the run stops when its start-up ends, before its first step (Ctrl-C again "
        "quits at once)\n";
    [[maybe_unused]] const ssize_t written =
        steps_begun.load() ? ::write(STDERR_FILENO, kStepNotice, sizeof(kStepNotice) - 1)
                           : ::write(STDERR_FILENO, kStartNotice, sizeof(kStartNotice) - 1);
  }
}

// "SIGINT" for the signal that stopped this rank; "SIGTERM" when another rank's did (what
// launchers send).
const char* StopSignalName() {
  switch (stop_signal.load()) {
    case SIGINT:
      return "SIGINT";
    case SIGHUP:
      return "SIGHUP";
    default:
      return "SIGTERM";
  }
}

// Installed once a rank is past the rendezvous (at its start when it is alone): a stop forwarded
// while the ranks set up (allocating, loading data and checkpoints) reaches them all as a flag,
// and they stop together before their first step (ranks set up later were killed, the others
// ended with collective errors). Before the rendezvous SIGTERM still ends a rank at once: one
// that waited there would wait out parallel.timeout_s for peers the signal had ended.
class CheckpointSignals {
 public:
  CheckpointSignals() {
    sigterm_received = false;
    sigusr1_received = false;
    stop_signal = 0;
    steps_begun = false;
    struct sigaction action = {};
    action.sa_handler = OnCheckpointSignal;
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < std::size(kSignals); ++i) {
      sigaction(kSignals[i], nullptr, &old_[i]);
      // A SIGINT or SIGHUP ignored when the run started stays ignored: a job started in the
      // background of a script (`dtrain train &`) or under nohup asked to outlive them.
      if (kSignals[i] != SIGTERM && kSignals[i] != SIGUSR1 && old_[i].sa_handler == SIG_IGN) {
        continue;
      }
      sigaction(kSignals[i], &action, nullptr);
    }
  }
  // After a stop (a SIGTERM here or on another rank) the process is on its way out, its
  // checkpoint saved: the stop handlers stay, so that a SIGTERM cannot kill it in the ranks'
  // closing barrier (Slurm's scancel signals the workers as well as their agent, which forwards
  // its own; the agent of a rank that another rank's SIGTERM stopped signals it when it learns of
  // the stop).
  ~CheckpointSignals() {
    const bool keep_stop_handlers = sigterm_received || stopping_;
    for (size_t i = 0; i < std::size(kSignals); ++i) {
      if (kSignals[i] != SIGUSR1 && keep_stop_handlers) continue;
      sigaction(kSignals[i], &old_[i], nullptr);
    }
  }
  // The ranks agreed to stop.
  void Stopping() { stopping_ = true; }
  // Start-up is over: the steps begin.
  void StepsBegin() { steps_begun = true; }

 private:
  static constexpr int kSignals[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1};
  struct sigaction old_[std::size(kSignals)] = {};
  bool stopping_ = false;
};

// The step of a metrics.jsonl line; none for a line that is not a step's.
std::optional<int64_t> StepOfMetricsLine(std::string_view line) {
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) return std::nullopt;
  return j["step"].get<int64_t>();
}

// metrics.jsonl, a line a step. A resumed run's file keeps the earlier run's lines up to the
// resumed step and drops later ones (steps redone after the resume), so it reads as one
// uninterrupted run; the resumed step's own line comes from the checkpoint when the file lacks it
// (a run killed between its save and writing the line). Lines that are not a step's (edited, cut
// off by a crash) are dropped. With `keep_dropped` (a run started over, or resumed from an older
// checkpoint than the newest, on purpose) the file as it was stays beside it, as
// "<path>.replaced-<unix time>", when any step's line is dropped: it was the only record of those
// steps. A line that cannot be written fails the run: its metrics are part of what it keeps.
class MetricsFile {
 public:
  absl::Status Open(const std::string& path, int64_t resumed_step, const std::string& resumed_line,
                    bool keep_dropped) {
    path_ = path;
    std::error_code error;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path(), error);
    if (error) {
      return FileError(error.value(), absl::StrCat("cannot create the folder of ", path), kFix);
    }
    // A second name for the file as it was, dropped below unless a step's line is left out.
    const absl::StatusOr<std::string> aside =
        keep_dropped ? LinkAside(path) : absl::NotFoundError("not kept");
    const bool kept_aside = aside.ok();
    int64_t dropped = 0;
    // Whole or not at all: a crash while the kept lines are written must not lose them. Written
    // in pieces: a run of a million steps has hundreds of MB of them.
    const absl::Status written = WriteFileDurably(path, [&](int fd, const std::string& tmp) {
      constexpr size_t kPiece = size_t{1} << 20;
      std::ifstream in(path);
      std::string kept;
      int64_t last_kept = 0;
      for (std::string line; std::getline(in, line);) {
        const std::optional<int64_t> step = StepOfMetricsLine(line);
        dropped += step && *step > resumed_step;
        if (!step || *step > resumed_step) continue;
        absl::StrAppend(&kept, line, "\n");
        last_kept = *step;
        if (kept.size() >= kPiece) {
          RETURN_IF_ERROR(WriteAll(fd, kept.data(), kept.size(), tmp));
          kept.clear();
        }
      }
      if (last_kept > 0 && last_kept < resumed_step && !resumed_line.empty()) {
        absl::StrAppend(&kept, resumed_line, "\n");
      }
      return WriteAll(fd, kept.data(), kept.size(), tmp);
    });
    if (!written.ok() || (kept_aside && dropped == 0)) {
      if (kept_aside) ::unlink(aside->c_str());
      RETURN_IF_ERROR(written);
    } else if (kept_aside) {
      LogWarn(
          "%s: the lines of %d step(s) past step %d, where this run starts, are left out; the "
          "file as it was is kept as %s",
          path, dropped, resumed_step, *aside);
    } else if (keep_dropped && dropped > 0) {
      LogWarn(
          "%s: the lines of %d step(s) past step %d, where this run starts, are left out, and the "
          "file as it was could not be kept beside it (%s)",
          path, dropped, resumed_step, aside.status().message());
    }
    file_.open(path, std::ios::app);
    if (!file_) return FileError(errno, absl::StrCat("cannot write ", path), kFix);
    return absl::OkStatus();
  }

  absl::Status Append(const std::string& line) {
    file_ << line << '\n' << std::flush;
    if (!file_) return FileError(errno, absl::StrCat("write ", path_));
    return absl::OkStatus();
  }

 private:
  static constexpr char kFix[] = "set logging.metrics_file to a path in a writable folder";

  std::string path_;
  std::ofstream file_;
};

// Rank 0 creates the run folder (the resolved recipe goes in once the run is known to start: a
// refused resume, or a second run of the folder, leaves the first one's). Returns the folders it
// made, the run folder first, for RemoveEmptyFolders.
absl::StatusOr<std::vector<std::filesystem::path>> CreateRunFolder(const Recipe& recipe) {
  const std::filesystem::path run_dir = recipe.run_dir();
  std::vector<std::filesystem::path> made = MissingFolders(run_dir.string());
  std::error_code error;
  std::filesystem::create_directories(run_dir, error);
  if (error) {
    return FileError(error.value(), absl::StrCat("cannot create the run folder ", run_dir.string()),
                     "set run.out_dir to a writable folder");
  }
  return made;
}

// Removes the empty folders inside `folder`, deepest first (a folder that holds a file stays).
void RemoveEmptyFoldersInside(const std::filesystem::path& folder) {
  namespace fs = std::filesystem;
  std::error_code error;
  std::vector<fs::path> inside;  // parents before what they hold
  for (fs::recursive_directory_iterator entry(folder, error), end; !error && entry != end;
       entry.increment(error)) {
    if (entry->symlink_status().type() == fs::file_type::directory) inside.push_back(entry->path());
  }
  for (auto it = inside.rbegin(); it != inside.rend(); ++it) fs::remove(*it, error);
}

// Where train.export_to writes at the end, checked before the first step: a .safetensors file or
// a model folder that can be made there (the export creates the folders on the way), so that a
// path in the way fails the run now (exit 2), not after its last step.
absl::Status CheckExportDestination(const Recipe& recipe) {
  namespace fs = std::filesystem;
  if (recipe.train.export_to.empty()) return absl::OkStatus();
  const fs::path path = fs::path(recipe.run_dir()) / recipe.train.export_to;
  const bool file = absl::EndsWith(path.string(), ".safetensors");
  const auto refused = [&](const std::string& why) {
    return WithExitCode(
        absl::FailedPreconditionError(absl::StrCat(
            "train.export_to ", recipe.train.export_to, ": ", why, "; give a path where ",
            file ? "a .safetensors file" : "a model folder", " can be written")),
        kExitUsage);
  };
  std::error_code error;
  // A file goes where its symbolic links lead.
  fs::path target = path;
  if (file) {
    const absl::StatusOr<std::string> resolved = ResolveOutputFile(path.string());
    if (!resolved.ok()) {
      return Renamed(resolved.status(), absl::StrCat("train.export_to ", recipe.train.export_to,
                                                     ": ", resolved.status().message()));
    }
    target = *resolved;
  } else if (fs::exists(path, error) && !fs::is_directory(path, error)) {
    return refused(absl::StrCat(path.string(), " is a file"));
  }
  // What is there already is the export's to replace (an earlier one's), or another's.
  if (const absl::Status replaceable = file ? CheckReplaceableWeightsFile(target.string())
                                            : CheckReplaceableModelFolder(path.string());
      !replaceable.ok()) {
    return Renamed(replaceable, absl::StrCat("train.export_to ", recipe.train.export_to, ": ",
                                             replaceable.message()));
  }
  fs::path existing = target.parent_path();
  while (!existing.empty() && !fs::exists(existing, error)) existing = existing.parent_path();
  if (existing.empty()) existing = ".";
  if (!fs::is_directory(existing, error)) {
    return refused(absl::StrCat(existing.string(), " is a file, not a folder"));
  }
  if (const int failure = FileCreationError(existing.string()); failure != 0) {
    return refused(absl::StrCat("no file can be made in ", existing.string(),
                                " (making one there failed: ", std::strerror(failure), ")"));
  }
  return absl::OkStatus();
}

// A run that starts at step 1 where an earlier run exported its weights (a run without a
// checkpoint to resume) would write its own over them at the end: the earlier file is kept beside
// it (LinkAside), a model folder's files in a folder beside it (LinkFolderAside), and a warning
// says so. Left alone: a link (the export writes through it), train.init_from's file or folder,
// which this run starts from, and a folder that is no export of dtrain's (the export refuses it).
void SetAsideEarlierExport(const Recipe& recipe) {
  namespace fs = std::filesystem;
  if (recipe.train.export_to.empty()) return;
  const fs::path path = fs::path(recipe.run_dir()) / recipe.train.export_to;
  const bool file = absl::EndsWith(recipe.train.export_to, ".safetensors");
  std::error_code error;
  const fs::file_status status = fs::symlink_status(path, error);
  const bool earlier = file ? fs::is_regular_file(status)
                            : fs::is_directory(status) && HoldsDtrainExport(path.string());
  if (!earlier ||
      (!recipe.train.init_from.empty() && fs::equivalent(recipe.train.init_from, path, error))) {
    return;
  }
  const std::string what = file ? "weights" : "model folder";
  const absl::StatusOr<std::string> aside =
      file ? LinkAside(path.string()) : LinkFolderAside(path.string(), IsHfFolderFile);
  if (aside.ok()) {
    LogWarn(
        "train.export_to %s holds an earlier run's %s, which this run (starting at step 1) "
        "writes over at its end: kept as %s",
        path.string(), what, *aside);
  } else {
    LogWarn(
        "train.export_to %s holds an earlier run's %s, which this run (starting at step 1) "
        "writes over at its end, and cannot keep them beside it (%s)",
        path.string(), what, aside.status().message());
  }
}

// Whether the file at `path` may become a run's metrics: absent, empty, or metrics already (its
// first line a step's, or cut off by a crash before its end), which a fresh run writes anew.
bool HoldsMetricsOrNothing(const std::filesystem::path& path) {
  constexpr size_t kLongestFirstLine = 4096;  // a step's line is a few hundred bytes
  const std::optional<std::string> head = RegularFileHead(path.string(), kLongestFirstLine);
  if (!head) return true;  // none, or no regular file, which CheckRunOutputs refused before
  const size_t end = head->find('\n');
  // A file of one line that a crash cut off is what remains of metrics.
  if (end == std::string::npos) return head->size() < kLongestFirstLine;
  return StepOfMetricsLine(std::string_view(*head).substr(0, end)).has_value();
}

// The files a run writes must not be one another's, nor a device or folder that a file written
// there would replace (logging.metrics_file: /dev/null became a file of metrics), nor a file of
// something else (logging.metrics_file: ../tiny.yaml became one too): an error naming the key,
// before anything is written.
absl::Status CheckRunOutputs(const Recipe& recipe) {
  namespace fs = std::filesystem;
  const fs::path run_dir = recipe.run_dir();
  const fs::path metrics = run_dir / recipe.logging.metrics_file;
  const std::string& metrics_file = recipe.logging.metrics_file;
  const auto same = [](const fs::path& a, const fs::path& b) {
    return IsSameOrInside(a.string(), b.string()) && IsSameOrInside(b.string(), a.string());
  };
  const auto refused = [](absl::string_view key, absl::string_view value, absl::string_view why) {
    return WithExitCode(absl::InvalidArgumentError(absl::StrCat(key, " '", value, "' ", why)),
                        kExitUsage);
  };
  if (metrics_file.empty() || IsSameOrInside(run_dir.string(), metrics.string())) {
    return refused("logging.metrics_file", metrics_file,
                   "is the run folder, or holds it: give a file name, such as metrics.jsonl");
  }
  // The files of the run folder that the run writes itself.
  const std::pair<fs::path, const char*> own_files[] = {
      {run_dir / "recipe.yaml", "the run's resolved recipe, recipe.yaml"},
      {run_dir / ".lock", "the run folder's lock, .lock"}};
  for (const auto& [path, what] : own_files) {
    if (same(metrics, path)) {
      return refused("logging.metrics_file", metrics_file,
                     absl::StrCat("is ", what, ": give another name, such as metrics.jsonl"));
    }
  }
  // The export writes a .safetensors file, or a model folder's own files (IsHfFolderFile),
  // leaving the folder's others: the run folder itself may hold the model.
  if (!recipe.train.export_to.empty()) {
    const fs::path exported = run_dir / recipe.train.export_to;
    for (const auto& [path, what] :
         {own_files[0], own_files[1],
          std::pair<fs::path, const char*>{metrics, "logging.metrics_file"}}) {
      if (same(exported, path)) {
        return refused("train.export_to", recipe.train.export_to,
                       absl::StrCat("is ", what, ": give the model a path of its own"));
      }
    }
    if (!absl::EndsWith(exported.string(), ".safetensors") &&
        same(exported, metrics.parent_path()) && IsHfFolderFile(metrics.filename().string())) {
      return refused("logging.metrics_file", metrics_file,
                     "is a file of train.export_to's model folder, which the export writes "
                     "over: give another name, such as metrics.jsonl");
    }
  }
  if (const absl::StatusOr<std::string> resolved = ResolveOutputFile(metrics.string());
      !resolved.ok()) {
    return Renamed(resolved.status(),
                   absl::StrCat("logging.metrics_file: ", resolved.status().message()));
  }
  if (!HoldsMetricsOrNothing(metrics)) {
    return refused("logging.metrics_file", metrics_file,
                   absl::StrCat("is ", metrics.string(),
                                ", a file of something else (its first line is no step's "
                                "metrics), which the run would write over: give the metrics a "
                                "file of their own, or move that one away"));
  }
  return absl::OkStatus();
}

// An error of train.init_from's weights, as the recipe key's (each says its fix).
absl::Status InitFromError(const absl::Status& status) {
  return Renamed(status, absl::StrCat("train.init_from: ", status.message()));
}

// A fresh run's parameters: seeded initialisation, or train.init_from's weights (the whole
// model's, read a tensor at a time, of which a rank keeps its slice: its stage's tensors, their
// tensor-parallel shards).
absl::Status InitialiseParameters(const Recipe& recipe, const ModelConfig& config,
                                  const ParamTable& table, DataParallelEngine& engine) {
  if (recipe.train.init_from.empty()) {
    engine.InitParameters(config, recipe.run.seed, recipe.run.threads);
    return absl::OkStatus();
  }
  std::vector<float> own(table.total_numel());
  const TensorSinkFn keep_own = [&](const TensorEntry& whole, const float* values) {
    if (const TensorEntry* mine = table.Find(whole.name); mine != nullptr) {
      ForEachGlobalRun(*mine, 0, mine->numel, [&](size_t local, size_t global, size_t count) {
        std::copy_n(values + global, count, own.begin() + mine->offset + local);
      });
    }
    return absl::OkStatus();
  };
  if (absl::Status status = ImportHfWeights(config, ParamTable(config, ModelSlice{}),
                                            recipe.train.init_from, keep_own);
      !status.ok()) {
    return InitFromError(status);
  }
  engine.LoadParameters(own.data());
  LogInfo("initialised from %s", recipe.train.init_from);
  if (HfLlamaTiesHead(config, recipe.train.init_from).value_or(false)) {
    LogInfo(
        "init_from: its config.json ties the head to the embedding (tie_word_embeddings); dtrain "
        "starts lm_head.weight as a copy of model.embed_tokens.weight, trains the two apart and "
        "exports them untied");
  }
  return absl::OkStatus();
}

void LogRunSetup(const Recipe& recipe, const ModelConfig& config, const LocalDims& dims,
                 const Datasets& data, const Transformer& model, int dp_size, int micro_batches,
                 double peak_flops, const std::string& backend_name) {
  const TrainSection& train = recipe.train;
  LogInfo("model: %s", ModelShapeLine(config));
  // Streamed data (WebDataset) has no count in advance: its note says what streams.
  if (data.train_tokens > 0) {
    LogInfo("data: %d tokens for training, %d for validation", data.train_tokens, data.val_tokens);
  }
  for (const std::string& note : data.notes) LogInfo("data: %s", note);
  for (const std::string& warning : data.warnings) LogWarn("data: %s", warning);
  LogInfo(
      "batch: %d sequences x %d tokens = %d tokens/step; %d data-parallel rank%s x %d "
      "micro-batches of %d; activations %s (recompute %s)",
      train.batch_size, train.seq_len, static_cast<int64_t>(train.batch_size) * train.seq_len,
      dp_size, dp_size == 1 ? "" : "s", micro_batches, train.micro_batch,
      MiB(model.activation_bytes()), recipe.parallel.recompute);
  if (recipe.parallel.tp > 1) {
    LogInfo(
        "tensor parallel: %d ranks share each block's heads and MLP width (%d query heads, %d kv "
        "heads, MLP width %d on each) and the vocabulary (%d padded to %d, %d rows a rank; "
        "padded rows are never stored)",
        recipe.parallel.tp, dims.heads, dims.kv_heads, dims.mlp_width, config.vocab_size,
        dims.vocab_slot * recipe.parallel.tp, dims.vocab_slot);
    if (recipe.parallel.sequence_parallel) {
      LogInfo(
          "sequence parallel: each rank's norms and residual adds run on %d of a micro-batch's "
          "%d tokens",
          train.micro_batch * train.seq_len / recipe.parallel.tp,
          train.micro_batch * train.seq_len);
    }
  }
  LogInfo("MFU is stated against %.1f GFLOP/s per rank, the best measured %s GEMM of this %s",
          peak_flops / 1e9, recipe.bf16_params() ? "bf16" : "float32", backend_name);
}

// The checkpoint signals, agreed by all ranks so that they save the same step: any rank
// signalled means all act.
struct CheckpointRequest {
  bool stop = false;  // SIGTERM: save, then stop
  bool save = false;  // SIGUSR1: save, then go on
};

absl::StatusOr<CheckpointRequest> AgreeOnCheckpointSignals(Communicator* world) {
  double stop = sigterm_received.load() ? 1 : 0;
  double save = sigusr1_received.exchange(false) ? 1 : 0;
  RETURN_IF_ERROR(SumOverRanks(world, stop, save));
  return CheckpointRequest{stop > 0, save > 0};
}

// Waits until this rank's data for the next step is read, between the steps rather than inside
// the next one: a SIGTERM that comes while a shard stalls is then agreed on at once, and the run
// stops with the step's checkpoint (inside the step, the rank heard it only once the data came,
// after the launcher's grace period had killed it, and the other ranks waited in a collective).
// A wait of kDataStallWarning and more is logged, as the step's own line waits for it. Returns
// the time it waited.
constexpr absl::Duration kDataStallWarning = absl::Seconds(10);

std::chrono::duration<double> AwaitNextStepData(SequenceLoader& loader, int sequences,
                                                int next_step, bool first) {
  const auto start = std::chrono::steady_clock::now();
  const absl::Time since = absl::Now();
  absl::Duration warn_after = kDataStallWarning;
  while (!sigterm_received.load() && !loader.WaitReady(sequences, absl::Milliseconds(100))) {
    if (absl::Now() - since < warn_after) continue;
    LogWarn(
        "waited %.0f s for this rank's data of step %d: a shard's read stalls (data.http_timeout_s "
        "and data.pipe_timeout_s end it; a SIGTERM now %s)",
        absl::ToDoubleSeconds(absl::Now() - since), next_step,
        first ? "stops the run" : absl::StrCat("saves step ", next_step - 1));
    warn_after += absl::Minutes(1);
  }
  return std::chrono::steady_clock::now() - start;
}

// train.export_to: the whole model's parameters, gathered from the ranks of the first
// data-parallel replica onto rank 0, which writes them: a .safetensors file, or else a Hugging
// Face model folder with the data's tokenizer (DataTokenizer of `recorded`, the first shard's).
absl::Status ExportWeights(const Recipe& recipe, const ParamTable& table,
                           DataParallelEngine& engine, const ProcessGroup::MeshGroups& groups,
                           const absl::StatusOr<std::string>& recorded, bool leader) {
  ASSIGN_OR_RETURN(std::vector<float> own, engine.GatherParameters());
  // The first replica's tp and pp groups assemble the model on rank 0; the other replicas hold
  // copies of it.
  if (groups.dp != nullptr && groups.dp->rank() != 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(const std::vector<float> full,
                   GatherWholeModel(table, std::move(own), engine.backend(), groups.tp, groups.pp));
  if (!leader) return absl::OkStatus();
  const ModelConfig& config = table.config();
  const ParamTable whole(config, ModelSlice{});
  const std::string path =
      (std::filesystem::path(recipe.run_dir()) / recipe.train.export_to).string();
  if (absl::EndsWith(path, ".safetensors")) {
    RETURN_IF_ERROR(ExportHfSafetensors(config, whole, full.data(), path));
    LogInfo("weights written to %s (Hugging Face names)", path);
    return absl::OkStatus();
  }
  const std::string tokenizer = DataTokenizer(recipe, recorded);
  // An SFT run's folder renders chats as its shards were packed (apply_chat_template).
  ASSIGN_OR_RETURN(const std::optional<ChatTemplate> chat_template, ShardsChatTemplate(recipe));
  RETURN_IF_ERROR(ExportHfFolder(
      ExportedModelConfig(config, recipe.train.init_from), whole,
      [&](const TensorEntry& entry) -> absl::StatusOr<const float*> {
        return full.data() + entry.offset;
      },
      path, tokenizer, {}, chat_template ? &*chat_template : nullptr));
  LogInfo("model folder written to %s (config.json, model.safetensors%s%s; transformers loads it)",
          path,
          tokenizer.empty()                     ? ""
          : tokenizer == ByteTokenizer().name() ? ", a tokenizer of one token per byte"
                                                : ", the tokenizer's files",
          chat_template && !tokenizer.empty()
              ? absl::StrCat(", the chat template ", chat_template->name)
              : "");
  if (tokenizer.empty()) {
    LogWarn(
        "the model folder %s has no tokenizer: %s; add the one they were packed with (`dtrain "
        "ckpt export --format hf --tokenizer PATH`)",
        path, NoDataTokenizerReason(recorded));
  }
  return absl::OkStatus();
}

// The tensor-parallel hooks' collectives settled (CommTensorParallel::Settle): the first failure,
// named (OK without them). Its payload stays: the ranks it blames (parallel/comm/faulty_ranks.h).
absl::Status TensorParallelStatus(CommTensorParallel* ops) {
  if (!ops) return absl::OkStatus();
  const absl::Status status = ops->Settle();
  if (status.ok()) return status;
  return Renamed(status, absl::StrCat("tensor-parallel collective: ", status.message()));
}

// `error` naming where each rank it blames sits in a pipelined mesh (faulty_ranks.h), which a
// tp or dp peer's collective does not say: "... (rank 5: pipeline stage 1 of 2, tp rank 1, dp
// rank 0)". Without pipeline stages the rank says it all.
absl::Status NameBlamedStages(const Mesh& mesh, const absl::Status& error) {
  const std::vector<int> blamed = FaultyRanks(error);
  if (mesh.shape().pp == 1 || blamed.empty()) return error;
  std::vector<std::string> where;
  for (const int rank : blamed) {
    if (rank >= 0 && rank < mesh.world_size()) {
      where.push_back(absl::StrCat("rank ", rank, ": ", mesh.Describe(rank)));
    }
  }
  if (where.empty()) return error;
  return Renamed(error, absl::StrCat(error.message(), " (", absl::StrJoin(where, "; "), ")"));
}

// Bytes this rank has sent over `comms`, every kind of operation. Null ones are skipped, and a
// communicator given twice counts once (a group spanning the world is the world's communicator).
int64_t SentBytes(std::initializer_list<const Communicator*> comms) {
  int64_t sent = 0;
  std::vector<const Communicator*> counted;  // each communicator's totals once
  for (const Communicator* comm : comms) {
    if (comm == nullptr || absl::c_linear_search(counted, &comm->counted())) continue;
    counted.push_back(&comm->counted());
    const CommStats stats = comm->stats();
    for (const OpStats& op :
         {stats.all_reduce, stats.reduce_scatter, stats.all_gather, stats.broadcast, stats.send}) {
      sent += op.bytes_sent;
    }
  }
  return sent;
}

// The planner's estimate of this rank's layout, in what the trainer holds and sends (float32
// values; bf16 parameters gathered at 2 bytes), for comparing its traffic with what the step
// sent.
Estimate PlannedLayout(const Recipe& recipe, const Mesh& mesh, Recompute recompute) {
  const Workload workload = WorkloadFromRecipe(recipe, Precision::Trainer(recipe.bf16_params()));
  Layout layout{
      .tp = mesh.shape().tp,
      .pp = mesh.shape().pp,
      .dp = mesh.shape().dp,
      .micro_batch = recipe.train.micro_batch,
      .schedule =
          ParsePipelineSchedule(recipe.parallel.pp_schedule).value_or(PipelineSchedule::kOneFOneB),
      .virtual_stages = recipe.parallel.pp_virtual_stages,
      .recompute = recompute,
      .sequence_parallel = recipe.parallel.sequence_parallel && mesh.shape().tp > 1};
  for (Strategy strategy :
       {Strategy::kDdp, Strategy::kZero1, Strategy::kZero2, Strategy::kZero3, Strategy::kFsdp}) {
    if (StrategyName(strategy) == recipe.parallel.strategy) layout.strategy = strategy;
  }
  // The cluster's links set the estimated times only, not the bytes compared here.
  return EstimateLayout(workload, ResolveCluster(recipe.cluster).value_or(ClusterSpec{}), layout);
}

// This rank's part of the training on `backend`, from the run folder to the exported weights.
// What every rank must agree on (checkpoint signals, resume) goes through `world_comm` (host
// memory); gradients, the step's loss and evaluation reduce over the dp group, the model's
// activations over the tp group (and `kv_replicas`, the ranks holding the same replicated kv
// head), on the backend's memory. All are null in a world of one.
// `phase` names what the rank is doing as it goes ("step 12"), for an error out of memory.
absl::StatusOr<TrainingEnd> TrainRank(const Recipe& recipe, const WorldMembership& world,
                                      const Mesh& mesh, Backend& backend, Communicator* world_comm,
                                      const ProcessGroup::MeshGroups& groups,
                                      Communicator* kv_replicas, CheckpointSignals& signals,
                                      std::string& phase) {
  const TrainSection& train = recipe.train;
  // The ranks of one tp group read the same samples: the data-parallel rank picks the data and
  // the data-parallel size splits the batch.
  const int dp_size = mesh.shape().dp;
  const int dp_rank = mesh.coords().dp;
  ASSIGN_OR_RETURN(const ShardingStrategy strategy,
                   ShardingStrategyFromRecipe(recipe.parallel, recipe.bf16_params()));
  const ModelConfig config = ModelConfigFromRecipe(recipe.model, recipe.d_ff());
  ASSIGN_OR_RETURN(const Recompute recompute, ParseRecompute(recipe.parallel.recompute));
  ModelSlice slice{.tp_rank = mesh.coords().tp, .tp_size = mesh.shape().tp};
  const int pp = mesh.shape().pp;
  const int stage = mesh.coords().pp;
  const int micro_batches = train.batch_size / (train.micro_batch * dp_size);
  StageAssignment assignment;
  PipelineShape shape{.stages = pp, .micro_batches = micro_batches};
  if (pp > 1) {
    ASSIGN_OR_RETURN(shape.schedule, ParsePipelineSchedule(recipe.parallel.pp_schedule));
    shape.virtual_stages = recipe.parallel.pp_virtual_stages;
    ASSIGN_OR_RETURN(assignment,
                     AssignStages(PipelineFlopsPerToken(config, train.seq_len, recompute), pp,
                                  shape.virtual_stages));
    slice.chunks = StageChunks(assignment, stage);
  }
  const int activation_slots = pp > 1 ? PipelineActivationSlots(shape, stage) : 1;
  const RankMemory memory =
      EstimateRankMemory(recipe, config, strategy, recompute, dp_size, slice, activation_slots);
  RETURN_IF_ERROR(CheckRankMemory(recipe, memory, backend.AvailableMemory(), strategy, dp_size,
                                  world.world_size, world.local_world_size));
  // export_to assembles the model on rank 0 (this machine's ranks are consecutive, as the agent
  // and srun's block distribution number them).
  RETURN_IF_ERROR(CheckExportFitsMachine(recipe, config, world.rank - world.local_rank == 0,
                                         CpuBackend::MachineMemory().bytes));
  const bool leader = world.rank == 0;
  // A machine's ranks are consecutive, and so are a tp group's: unless each machine holds whole
  // groups, a tp group spans machines, and its all-reduces (two a block, on the critical path)
  // cross the network. Megatron-LM keeps tp within a node.
  const int tp = recipe.parallel.tp;
  if (leader && tp > 1 && world.world_size > world.local_world_size &&
      world.local_world_size % tp != 0) {
    LogWarn(
        "parallel.tp %d spans machines of %d rank(s) each: its all-reduces, two a block, cross "
        "the network; keep tp within a machine (a divisor of %d) and run pipeline stages or "
        "data-parallel replicas across machines",
        tp, world.local_world_size, world.local_world_size);
  }
  // The tokenizer the data's first shard records, read once: data.tokenizer must be it, and
  // every other shard must record it. A first shard that does not read fails training too,
  // unless data.on_error skips it: fail now rather than read it again (a silent pipe: command
  // would cost its timeout twice).
  const absl::StatusOr<std::string> recorded = ShardsTokenizerName(recipe, &sigterm_received);
  if (absl::IsCancelled(recorded.status())) {
    signals.Stopping();
    if (leader) {
      LogInfo("stopped by %s while the first shard was read, with nothing trained to save",
              StopSignalName());
    }
    return TrainingEnd::kStopped;
  }
  if (!recorded.ok() && recipe.data.on_error == "fail") {
    return recipe.data.format == "webdataset" ? WithSkipShardHint(recorded.status())
                                              : recorded.status();
  }
  ASSIGN_OR_RETURN(const std::unique_ptr<Tokenizer> sample_tokenizer,
                   LoadSampleTokenizer(recipe, recorded, leader));
  // A run that fails before it writes into the run folder it made (before its first step) removes
  // the folders it made: where it took the run folder's lock, those inside (its checkpoint
  // folder) while it holds it, then the lock's file with the lock; then the run folder and those
  // on the way, where empty. A run refused the lock touches nothing inside: another run has it.
  std::vector<std::filesystem::path> made_folders;
  std::optional<FolderLock> run_folder_lock;
  bool run_folder_written = false;
  const absl::Cleanup remove_unused_folders = [&] {
    if (run_folder_written || made_folders.empty()) return;
    if (run_folder_lock && run_folder_lock->held()) {
      RemoveEmptyFoldersInside(made_folders.front());
      run_folder_lock->Abandon();
    }
    RemoveEmptyFolders(made_folders);
  };
  if (leader) {
    WarnOfAnotherInitTokenizer(recipe, sample_tokenizer.get(), recorded);
    WarnOfJoinedDocuments(recipe, sample_tokenizer.get());
    ASSIGN_OR_RETURN(made_folders, CreateRunFolder(recipe));
    RETURN_IF_ERROR(CheckExportDestination(recipe));
  }
  // Each worker serves its own /metrics (no hop through the agent, so it works the same under
  // `dtrain launch`, srun and torchrun); the workers of a node take consecutive ports.
  std::unique_ptr<StepExporter> exporter;
  if (recipe.logging.metrics_port > 0) {
    exporter = StepExporter::Start(recipe.logging.metrics_address,
                                   recipe.logging.metrics_port + world.local_rank,
                                   {{"rank", absl::StrCat(world.rank)},
                                    {"node", absl::StrCat(world.node_rank)},
                                    {"job", world.run_id.empty() ? recipe.run.name : world.run_id}},
                                   world.restart_count);
    // Where to scrape, once: each node's workers serve on ports from metrics_port up.
    if (exporter != nullptr && leader) {
      LogInfo(
          "Prometheus /metrics on %s port %d%s", recipe.logging.metrics_address,
          recipe.logging.metrics_port,
          world.local_world_size > 1
              ? absl::StrCat(" (each node's workers: ports ", recipe.logging.metrics_port, " to ",
                             recipe.logging.metrics_port + world.local_world_size - 1, ")")
              : "");
    }
  }

  const auto* cpu_backend = dynamic_cast<const CpuBackend*>(&backend);
  const std::string backend_name = absl::StrCat(
      cpu_backend != nullptr
          ? absl::StrCat("CPU backend (", cpu_backend->num_threads(), " threads")
          : absl::StrCat("CUDA backend (", backend.AvailableMemory().name, ", cuBLASLt"),
      ", matmul precision ", recipe.matmul_precision(), ")");
  const ParamTable table(config, slice);
  std::unique_ptr<CommTensorParallel> tensor_parallel;
  if (groups.tp) tensor_parallel = std::make_unique<CommTensorParallel>(*groups.tp, kv_replicas);
  // The gradient norm sums over the ranks holding other parts of the model: the tp group and
  // the pipeline's stages.
  ASSIGN_OR_RETURN(
      const std::unique_ptr<DataParallelEngine> engine_owner,
      AllocateOrError<DataParallelEngine>("allocating parameters, gradients and optimizer state",
                                          memory.model_state_bytes(), table, strategy, train,
                                          backend, groups.dp, groups.tp, groups.pp));
  DataParallelEngine& engine = *engine_owner;
  std::unique_ptr<TransformerPipelineStage> pipeline_stage;
  std::unique_ptr<PipelineExecutor> executor;
  if (pp > 1) {
    pipeline_stage = std::make_unique<TransformerPipelineStage>(table, engine, shape, stage,
                                                                train.micro_batch, train.seq_len);
    ASSIGN_OR_RETURN(executor, PipelineExecutor::Create(shape, stage, groups.pp, backend));
  }
  BlockParameters& parameters =
      pipeline_stage ? static_cast<BlockParameters&>(*pipeline_stage) : engine;
  ASSIGN_OR_RETURN(const std::unique_ptr<Transformer> model_owner,
                   AllocateOrError<Transformer>(
                       "allocating activations", memory.activation_bytes, config, table, parameters,
                       backend, train.micro_batch, train.seq_len, recompute, tensor_parallel.get(),
                       recipe.parallel.sequence_parallel, activation_slots));
  Transformer& model = *model_owner;
  // data.tokenizer encodes the shards' text samples too.
  ASSIGN_OR_RETURN(Datasets data,
                   OpenDatasets(recipe, dp_rank, dp_size, recorded.value_or(std::string()),
                                recipe.data.tokenizer.empty() ? nullptr : sample_tokenizer.get()));
  const bool documents = data.train->documents();
  // Held until the run ends, before anything of the run folder is read: another run of the same
  // folder would interleave its metrics and checkpoints with this one's.
  if (leader) {
    ASSIGN_OR_RETURN(run_folder_lock,
                     FolderLock::Acquire(recipe.run_dir(), FolderLock::kRunFolder));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<TrainingCheckpoints> checkpoints,
                   TrainingCheckpoints::Create(recipe, table, engine, world_comm));
  const absl::Cleanup abandon_checkpoint_folder = [&] {
    if (!run_folder_written) checkpoints->AbandonFolder();
  };
  // A resumed run's parameters, moments, AdamW's count and data cursor come from the
  // checkpoint; the schedule follows from the step.
  ASSIGN_OR_RETURN(const int64_t resumed_step,
                   checkpoints->Resume(*data.train, world.restart_count));
  if (resumed_step == 0) RETURN_IF_ERROR(InitialiseParameters(recipe, config, table, engine));
  // What metrics.jsonl records at this process's first step, for the report's layouts.
  const std::string layout =
      absl::StrFormat("%s over %d rank%s: dp %d, tp %d, pp %d", strategy.name, world.world_size,
                      world.world_size == 1 ? "" : "s", dp_size, tp, pp);
  if (resumed_step >= train.steps && leader) {
    LogInfo(
        "the checkpoint is at step %d, train.steps is %d: nothing left to train (raise "
        "train.steps to go on, or --set checkpoint.resume=never to start over)",
        resumed_step, train.steps);
  }

  double peak_flops =
      MeasureGemmFlops(backend, recipe.bf16_params() ? DataType::kBF16 : DataType::kF32);
  const double flops_per_token = config.flops_per_token(train.seq_len);
  const int64_t tokens_per_step = static_cast<int64_t>(train.batch_size) * train.seq_len;
  MetricsFile metrics;
  if (leader) {
    LogRunSetup(recipe, config, table.dims(), data, model, dp_size, micro_batches, peak_flops,
                backend_name);
    if (pp > 1) {
      LogInfo("pipeline parallel: %d stages, schedule %s; %s", pp,
              PipelineScheduleName(shape.schedule), FormatStageAssignment(assignment));
    }
    const std::filesystem::path run_dir = recipe.run_dir();
    run_folder_written = true;
    RETURN_IF_ERROR(
        WriteFileDurably((run_dir / "recipe.yaml").string(), ResolvedRecipeYaml(recipe)));
    // What an earlier run of the folder left is kept aside where this one starts over (on
    // purpose, or finding no checkpoint) or resumes a chosen checkpoint: its dropped steps, and,
    // where this one starts over, the weights it exported, which this run's export would replace.
    // What a restart after a crash redoes is this run's own.
    const bool replaces_a_run =
        world.restart_count == 0 && (recipe.checkpoint.resume != "auto" || resumed_step == 0);
    RETURN_IF_ERROR(metrics.Open((run_dir / recipe.logging.metrics_file).string(), resumed_step,
                                 checkpoints->resumed_metrics_line(), replaces_a_run));
    if (replaces_a_run && resumed_step == 0) SetAsideEarlierExport(recipe);
  }
  const MicroBatchSource next_micro_batch = [&](int32_t* in, int32_t* out, int32_t* positions) {
    return documents ? data.train->NextDocuments(train.micro_batch, in, out, positions)
                     : data.train->Next(train.micro_batch, in, out);
  };
  // Steps after the first (which pays for first-touch allocations), or the only one.
  PipelineStepTimes pipeline_times;
  // Pipeline stages hold different blocks: each is compared with its own replicas only, so with
  // one rank a stage there is nothing to compare.
  std::vector<int> stage_of_rank(world.world_size);
  for (int r = 0; r < world.world_size; ++r) stage_of_rank[r] = mesh.CoordsOf(r).pp;
  StragglerTracker stragglers(recipe.logging.straggler_pct, stage_of_rank);
  const bool track_stragglers =
      recipe.logging.straggler_pct > 0 && world_comm != nullptr && pp < world.world_size;
  const absl::Duration slowed_by = TestSlowdown(world.rank);
  std::chrono::duration<double> waited_before_step{0};  // AwaitNextStepData's, for this step
  // The first step's data too: a SIGTERM while a shard stalls before it (filling a shuffle
  // buffer, say) stops the run, which has trained nothing to save.
  if (resumed_step < train.steps) {
    waited_before_step = AwaitNextStepData(*data.train, micro_batches * train.micro_batch,
                                           static_cast<int>(resumed_step) + 1, /*first=*/true);
    ASSIGN_OR_RETURN(const CheckpointRequest request, AgreeOnCheckpointSignals(world_comm));
    if (request.stop) {
      signals.Stopping();
      RETURN_IF_ERROR(checkpoints->Finish());
      if (leader) {
        LogInfo("stopped by %s before step %d, with nothing trained to save", StopSignalName(),
                resumed_step + 1);
      }
      return TrainingEnd::kStopped;
    }
  }
  signals.StepsBegin();
  // The ETA's clock: steps with what runs between them (evaluations, samples, checkpoint waits,
  // 30% of a small run's time), not the steps alone.
  const auto steps_began = std::chrono::steady_clock::now() - waited_before_step;
  for (int step = static_cast<int>(resumed_step); step < train.steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    phase = absl::StrCat("step ", step + 1);
    if (slowed_by > absl::ZeroDuration()) absl::SleepFor(slowed_by);
    if (tensor_parallel) tensor_parallel->TakeWaitedMs();  // an evaluation's, not this step's
    const int64_t dp_sent_before = SentBytes({groups.dp});
    const int64_t tp_sent_before = SentBytes({groups.tp, kv_replicas});
    const int64_t pp_sent_before = SentBytes({groups.pp});
    absl::StatusOr<StepResult> stepped =
        pp > 1
            ? PipelineTrainStep(model, *pipeline_stage, engine, *executor, table, *groups.pp,
                                groups.dp, train, step, micro_batches, next_micro_batch, documents)
            : TrainStep(model, engine, train, step, micro_batches, next_micro_batch, nullptr,
                        documents);
    // A failed tp all-reduce left the step to run on garbage: its error is the one to report.
    RETURN_IF_ERROR(TensorParallelStatus(tensor_parallel.get()));
    // A device error (a CUDA kernel that failed) is reported with the step it happened in.
    if (const absl::Status device = DeviceStatus(recipe.run.device, backend); !device.ok()) {
      return Renamed(device, absl::StrCat("step ", step + 1, ": ", device.message()));
    }
    // Reported with the step it happened in, as a device error is.
    if (!stepped.ok()) {
      return Renamed(stepped.status(),
                     absl::StrCat("step ", step + 1, ": ", stepped.status().message()));
    }
    const StepResult result = *std::move(stepped);
    const std::chrono::duration<double> step_time =
        std::chrono::steady_clock::now() - start + waited_before_step;
    const int64_t dp_sent = SentBytes({groups.dp}) - dp_sent_before;
    const int64_t tp_sent = SentBytes({groups.tp, kv_replicas}) - tp_sent_before;
    const int64_t pp_sent = SentBytes({groups.pp}) - pp_sent_before;
    if (executor != nullptr && (step > resumed_step || step + 1 == train.steps)) {
      pipeline_times.Add(executor->stats());
    }
    if (recipe.parallel.check_replicas) {
      RETURN_IF_ERROR(engine.CheckReplicas());
      if (pipeline_stage) {
        RETURN_IF_ERROR(CheckTiedEmbeddingCopies(engine, *pipeline_stage, table, *groups.pp));
      }
    }
    if (step == resumed_step && leader) {
      const EngineMemory memory = engine.memory();
      LogInfo(
          "model state per rank (%s over %d rank%s, computing with %s parameters, gradients "
          "reduced in %s): parameters %s, gradients %s, optimizer %s; at most %s gathered and %s "
          "of gradient units in flight",
          strategy.name, dp_size, dp_size == 1 ? "" : "s", DataTypeName(strategy.param_type),
          DataTypeName(strategy.reduce_type), MiB(memory.parameter_bytes),
          MiB(memory.gradient_bytes), MiB(memory.optimizer_bytes), MiB(memory.gathered_peak_bytes),
          MiB(memory.gradient_buffer_peak_bytes));
    }
    if (step == resumed_step && leader && world_comm != nullptr) {
      const Estimate planned = PlannedLayout(recipe, mesh, recompute);
      LogInfo(
          "sent by this rank in step %d: tp group %d bytes (the plan: %.0f), dp group %d bytes "
          "(the plan: %.0f), pp group %d bytes (the plan: %.0f)",
          step + 1, tp_sent, planned.tp.sent_bytes, dp_sent, planned.dp.sent_bytes, pp_sent,
          planned.pp.sent_bytes);
    }

    StepMetrics m;
    m.step = step + 1;
    m.time = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
    m.total_steps = train.steps;
    m.loss = result.loss;
    m.lr = result.lr;
    m.grad_norm = result.grad_norm;
    m.step_ms = step_time.count() * 1e3;
    // SFT counts only the trained tokens (prompts and padding are not what a step learns).
    m.tokens_per_s = static_cast<double>(documents ? result.trained_tokens : tokens_per_step) /
                     step_time.count();
    // MFU counts the work done: every token of the batch, trained or not.
    const double rank_flops = flops_per_token * static_cast<double>(tokens_per_step) /
                              step_time.count() / world.world_size;
    const double measured_peak = peak_flops;
    bool raised = false;
    m.mfu_percent = MfuPercent(rank_flops, peak_flops, raised);
    if (raised && leader) {
      LogWarn(
          "step %d computed %.1f GFLOP/s per rank, more than the %.1f GFLOP/s GEMM measured at "
          "start-up (the machine was busy then): MFU is stated against %.1f from here on",
          step + 1, rank_flops / 1e9, measured_peak / 1e9, rank_flops / 1e9);
    }
    m.exposed_comm_ms =
        result.exposed_comm_ms + (tensor_parallel ? tensor_parallel->TakeWaitedMs() : 0);
    m.dp_sent_bytes = dp_sent;
    m.tp_sent_bytes = tp_sent;
    m.pp_sent_bytes = pp_sent;
    m.data_wait_ms =
        result.data_wait_ms + std::chrono::duration<double, std::milli>(waited_before_step).count();
    const ShardCounts shards = data.train->shard_counts();
    m.shards_read = shards.read;
    m.shards_skipped = shards.skipped;
    if (executor != nullptr) m.pp_wait_ms = executor->stats().wait_ms;
    m.peak_rss_mib = PeakRssMib();
    const std::chrono::duration<double> trained = std::chrono::steady_clock::now() - steps_began;
    m.eta_s = trained.count() / (m.step - resumed_step) * (train.steps - m.step);
    if (step == resumed_step) {
      if (resumed_step > 0) m.resumed_from_step = resumed_step;
      m.layout = layout;
      if (world.job_restarts > 0) m.restart = world.job_restarts;
    }
    if (step == resumed_step || raised) m.peak_gflops = peak_flops / 1e9;
    if (track_stragglers) {
      // This rank's own work in the step: what it did not spend waiting for data or for others.
      const double compute_ms =
          std::max(0.0, m.step_ms - m.exposed_comm_ms - m.data_wait_ms - m.pp_wait_ms);
      std::vector<double> all(world.world_size);
      RETURN_IF_ERROR(world_comm->AllGather(&compute_ms, all.data(), 1)->Wait());
      if (const std::optional<Straggler> slowest = stragglers.Add(all)) {
        m.straggler_rank = slowest->rank;
        m.straggler_lag_pct = slowest->lag_pct;
      }
    }
    const bool last = m.step == train.steps;
    if (train.eval_every > 0 && (m.step % train.eval_every == 0 || last)) {
      phase = absl::StrCat("the evaluation after step ", m.step);
      absl::StatusOr<double> val_loss =
          pp > 1 ? EvaluatePipeline(model, *groups.pp, groups.dp, *data.val, recipe, micro_batches)
                 : Evaluate(model, groups.dp, *data.val, recipe, micro_batches);
      RETURN_IF_ERROR(TensorParallelStatus(tensor_parallel.get()));
      ASSIGN_OR_RETURN(m.val_loss, std::move(val_loss));
    }
    std::string sample;
    if (m.val_loss && recipe.logging.sample_tokens > 0) {
      phase = absl::StrCat("the sample after step ", m.step);
      absl::StatusOr<std::string> sampled =
          SampleText(model, groups.pp, recipe, sample_tokenizer.get(), m.step);
      RETURN_IF_ERROR(TensorParallelStatus(tensor_parallel.get()));
      ASSIGN_OR_RETURN(sample, std::move(sampled));
    }

    if (!last) {
      waited_before_step = AwaitNextStepData(*data.train, micro_batches * train.micro_batch,
                                             m.step + 1, /*first=*/false);
    }
    RETURN_IF_ERROR(checkpoints->CheckBackgroundSave());
    ASSIGN_OR_RETURN(const CheckpointRequest request, AgreeOnCheckpointSignals(world_comm));
    const int interval = recipe.checkpoint.interval;
    if ((interval > 0 && m.step % interval == 0) || (last && recipe.checkpoint.save_at_end) ||
        request.stop || request.save) {
      phase = absl::StrCat("the checkpoint of step ", m.step);
      ASSIGN_OR_RETURN(m.ckpt_blocked_ms,
                       checkpoints->Save(m.step, m.lr, data.train->state(), StepMetricsJson(m)));
      if (leader && request.save && !request.stop) {
        LogInfo("SIGUSR1: saving step %d to %s/%s", m.step, checkpoints->dir(),
                StepDirName(m.step));
      }
    }
    if (exporter != nullptr) exporter->Record(m);
    if (leader) {
      // Periodic checkpoints follow logging.every (metrics.jsonl has every step's save time);
      // an evaluation, a SIGUSR1 save and a stop are logged whenever they come.
      if (m.step % recipe.logging.every == 0 || last || m.val_loss || request.save ||
          request.stop) {
        LogInfo("%s", FormatStepLine(m));
      }
      RETURN_IF_ERROR(metrics.Append(StepMetricsJson(m)));
      if (!sample.empty()) LogInfo("sample at step %d:\n%s", m.step, sample);
    }
    // The process ends soon after a stop: a SIGTERM must not kill it on the way. A stop at the
    // last step finishes the run instead: it exports and exits 0.
    if (request.stop) signals.Stopping();
    if (request.stop && !last) {
      RETURN_IF_ERROR(checkpoints->Finish());
      if (leader) {
        LogInfo("stopped by %s at step %d after saving %s/%s", StopSignalName(), m.step,
                checkpoints->dir(), StepDirName(m.step));
      }
      return TrainingEnd::kStopped;
    }
  }
  phase = "the end of the run";
  RETURN_IF_ERROR(checkpoints->Finish());
  if (const std::string slow = stragglers.PersistentSummary(); leader && !slow.empty()) {
    LogWarn("persistently slow: %s (logging.straggler_pct %g)", slow, recipe.logging.straggler_pct);
  }
  if (executor != nullptr && pipeline_times.steps > 0) {
    LogPipelineStage(recipe, config, slice, recompute, engine.compute_type(), stage, pp,
                     activation_slots, memory.activation_bytes, pipeline_times, executor->stats());
  }
  if (!train.export_to.empty()) {
    phase = absl::StrCat("the export to ", train.export_to);
    RETURN_IF_ERROR(ExportWeights(recipe, table, engine, groups, recorded, leader));
  }
  return TrainingEnd::kFinished;
}

}  // namespace

absl::Status CheckLayoutFitsWorld(const Recipe& recipe, int world_size) {
  const int tp = recipe.parallel.tp, pp = recipe.parallel.pp;
  if (world_size % (tp * pp) == 0) return absl::OkStatus();
  // The fixes offered: the tp sizes that fit this pp and the model's heads, else the pp sizes
  // that fit this tp and the model's blocks, and always a world of tp x pp x k ranks.
  const ModelConfig config = ModelConfigFromRecipe(recipe.model, recipe.d_ff());
  std::vector<int> tps, pps;
  for (int size = 1; size <= world_size; ++size) {
    if (world_size % (size * pp) == 0 && CheckTensorParallel(config, size).ok()) {
      tps.push_back(size);
    }
    if (world_size % (tp * size) == 0 && size <= recipe.model.n_layer) pps.push_back(size);
  }
  const auto set = [](const char* key, const std::vector<int>& sizes) {
    return sizes.size() == 1
               ? absl::StrCat("set ", key, ": ", sizes[0], ", or ")
               : absl::StrCat("set ", key, " to one of ", absl::StrJoin(sizes, ", "), ", or ");
  };
  const std::string fixes = !tps.empty()   ? set("parallel.tp", tps)
                            : !pps.empty() ? set("parallel.pp", pps)
                                           : "";
  return absl::InvalidArgumentError(absl::StrCat(
      "parallel.tp = ", tp, " x parallel.pp = ", pp, " does not divide the world of ", world_size,
      world_size == 1 ? " rank" : " ranks", ": every data-parallel replica needs tp x pp ranks; ",
      fixes, "run ", tp * pp, " x k ranks"));
}

absl::Status CheckInitFromWeights(const Recipe& recipe) {
  std::error_code error;
  if (recipe.train.init_from.empty()) return absl::OkStatus();
  if (!std::filesystem::exists(recipe.train.init_from, error)) {
    if (error) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("train.init_from: ", recipe.train.init_from,
                     " does not exist; give a .safetensors file or a Hugging Face model folder"));
  }
  // dtrain's own files that are no weights to start from: what takes them instead.
  const std::string& path = recipe.train.init_from;
  // A step's folder holds its manifest; a checkpoint folder, step folders that do (a name alone,
  // step-5.safetensors, is none).
  if (std::filesystem::exists(std::filesystem::path(path) / "manifest.json", error) ||
      !CheckpointCandidates(path).empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train.init_from: ", path,
        " is a dtrain checkpoint, not model weights: resume it with checkpoint.resume: ", path,
        " (the same model, its optimizer state and data order too), or export its weights with "
        "`dtrain ckpt export ",
        path, " --format hf --out DIR` and start from DIR"));
  }
  if (IsLlmcModelFile(path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train.init_from: ", path,
        " is llm.c's GPT-2 model file, which dtrain writes (`ckpt export --format llmc`) but "
        "does not read: start from the run's .safetensors export or Hugging Face folder"));
  }
  const ModelConfig config = ModelConfigFromRecipe(recipe.model, recipe.d_ff());
  // Wrong weights, or a folder without them: a restart would find the same.
  if (absl::Status status = CheckHfWeights(config, recipe.train.init_from);
      absl::IsInvalidArgument(status) || absl::IsNotFound(status)) {
    return InitFromError(status);
  }
  return absl::OkStatus();
}

absl::Status CheckRecipeFitsWorld(const Recipe& recipe, int world_size) {
  RETURN_IF_ERROR(CheckLayoutFitsWorld(recipe, world_size));
  RETURN_IF_ERROR(CheckRunOutputs(recipe));
  // Weights that are missing, or of another model, would fail every rank at start, and every
  // restart after it. Only a fresh run reads them (a resume takes its checkpoint's), and a path
  // that cannot be read is left to the start, as other faults of files are.
  const bool resumes = recipe.checkpoint.resume != "never" &&
                       (recipe.checkpoint.resume != "auto" ||
                        !CheckpointCandidates(recipe.checkpoint_dir()).empty());
  if (!resumes) RETURN_IF_ERROR(CheckInitFromWeights(recipe));
  // auto picks its micro-batch for the world; RunTraining checks that one.
  if (recipe.parallel.strategy == "auto") return absl::OkStatus();
  const int dp = world_size / (recipe.parallel.tp * recipe.parallel.pp);
  RETURN_IF_ERROR(CheckBatchSplit(recipe.train, dp));
  if (recipe.data.format == "webdataset")
    RETURN_IF_ERROR(CheckStreamsSplit(recipe.data.streams, dp));
  return absl::OkStatus();
}

// What the ranks of one job must agree on: the resolved recipe, less what is each node's own
// (run.threads, which `dtrain launch` sets from the node's cores).
std::string JobSettings(const Recipe& recipe) {
  Recipe shared = recipe;
  shared.run.threads = 0;
  return RecipeSettings(shared);
}

// TrainRank, or ResourceExhausted naming the phase when host or device memory runs out on this
// thread past the checks before allocating: a buffer the engine or the model allocates as it goes
// (std::bad_alloc, or the backend's OutOfMemory with what the device had) ended the process with
// an abort. The threads of the data reader, the communicators and the checkpoint writer still do.
// An allocation that failed for a device fault (an earlier kernel's) reports the fault.
absl::StatusOr<TrainingEnd> TrainRankUnlessOutOfMemory(
    const Recipe& recipe, const WorldMembership& world, const Mesh& mesh, Backend& backend,
    Communicator* world_comm, const ProcessGroup::MeshGroups& groups, Communicator* kv_replicas,
    CheckpointSignals& signals) {
  std::string phase = "start-up";
  try {
    return TrainRank(recipe, world, mesh, backend, world_comm, groups, kv_replicas, signals, phase);
  } catch (const std::bad_alloc& error) {
    if (const absl::Status device = DeviceStatus(recipe.run.device, backend); !device.ok()) {
      return Renamed(device, absl::StrCat("in ", phase, ": ", device.message()));
    }
    return OutOfMemoryError(absl::StrCat("in ", phase), error);
  }
}

absl::StatusOr<TrainingEnd> RunTraining(const Recipe& requested, const WorldMembership& world) {
  // SIGUSR2 asks for the flight recorder's dump (`pkill -USR2 dtrain` on a job that hangs): never
  // fatal, in a world of one, which records nothing, nor while the ranks meet.
  FlightRecorder::InstallDumpSignal();
  std::optional<CheckpointSignals> signals;
  // Under `dtrain launch` the agent already prefixes every line with the rank (or writes one
  // file per rank).
  if (world.world_size > 1 && !world.agent_hosts_store) SetLogRank(world.rank);
  ASSIGN_OR_RETURN(const Recipe recipe, ResolveStrategy(requested, world));
  RETURN_IF_ERROR(CheckLayoutFitsWorld(recipe, world.world_size));
  // The dp x pp x tp mesh, tp innermost.
  const int tp_pp = recipe.parallel.tp * recipe.parallel.pp;
  ASSIGN_OR_RETURN(const Mesh mesh, Mesh::Create({.dp = world.world_size / tp_pp,
                                                  .pp = recipe.parallel.pp,
                                                  .tp = recipe.parallel.tp},
                                                 world.world_size, world.rank));
  RETURN_IF_ERROR(CheckBatchSplit(recipe.train, mesh.shape().dp));
  ASSIGN_OR_RETURN(const MatmulPrecision matmul_precision,
                   ParseMatmulPrecision(recipe.matmul_precision()));
  const auto make_backend = [&] {
    return MakeBackend(recipe.run.device, recipe.run.threads, world.local_rank, matmul_precision);
  };
  if (world.world_size == 1) {
    signals.emplace();
    ASSIGN_OR_RETURN(const std::unique_ptr<Backend> backend, make_backend());
    return TrainRankUnlessOutOfMemory(recipe, world, mesh, *backend, nullptr, {}, nullptr,
                                      *signals);
  }
  // Released after the process group, whose mesh groups run on its memory.
  std::unique_ptr<Backend> backend;
  // Every error after this point goes through Leave, which tells the other ranks at once.
  ASSIGN_OR_RETURN(
      std::unique_ptr<ProcessGroup> group,
      ProcessGroup::Connect(world, absl::Seconds(recipe.parallel.timeout_s),
                            absl::StrCat("dtrain/", recipe.run.name, "/"), JobSettings(recipe)));
  signals.emplace();
  const auto leave = [&](const absl::Status& outcome) {
    return group->Leave(NameBlamedStages(mesh, outcome));
  };
  group->EnableFlightRecorder(
      recipe.logging.flight_recorder_entries,
      (std::filesystem::path(recipe.run_dir()) / "flight_recorder").string());
  absl::StatusOr<std::unique_ptr<Backend>> made = make_backend();
  if (!made.ok()) return leave(made.status());
  backend = *std::move(made);
  absl::StatusOr<ProcessGroup::MeshGroups> groups =
      group->ConnectMesh(mesh, *backend, recipe.run.device);
  if (!groups.ok()) return leave(groups.status());
  // Grouped-query attention with more tp ranks than kv heads replicates each kv head on
  // kv_replicas ranks, whose gradients sum over them.
  const ModelConfig config = ModelConfigFromRecipe(recipe.model, recipe.d_ff());
  const int kv_replicas =
      LocalDimsOf(config, ModelSlice{.tp_rank = mesh.coords().tp, .tp_size = mesh.shape().tp})
          .kv_replicas;
  Communicator* kv_group = nullptr;
  if (kv_replicas > 1) {
    absl::StatusOr<Communicator*> connected = group->ConnectKvReplicas(mesh, kv_replicas);
    if (!connected.ok()) return leave(connected.status());
    kv_group = *connected;
  }
  absl::StatusOr<TrainingEnd> end = TrainRankUnlessOutOfMemory(
      recipe, world, mesh, *backend, &group->world(), *groups, kv_group, *signals);
  RETURN_IF_ERROR(leave(end.status()));
  return end;
}

}  // namespace dtrain
