#include "core/checkpoint/tools.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <thread>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/checkpoint/reader.h"
#include "core/checkpoint/writer.h"
#include "core/data/datasets.h"
#include "core/data/shard_urls.h"
#include "core/model/hf_folder.h"
#include "core/model/hf_names.h"
#include "core/model/model_config.h"
#include "core/model/param_table.h"
#include "core/recipe/recipe.h"
#include "core/util/exit_codes.h"
#include "core/util/files.h"
#include "core/util/log.h"
#include "core/util/status.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;

std::string MiB(uint64_t bytes) { return absl::StrFormat("%.1f MiB", bytes / 1048576.0); }

// One line per tensor: its shape and type, then each chunk as a box of it (a version 1 chunk is a
// flat element range) with its file.
void AppendChunkLayout(const Manifest& m, std::string& text) {
  std::map<std::string, std::vector<const ChunkRecord*>> chunks_of;
  for (const ChunkRecord& c : m.chunks) chunks_of[c.tensor].push_back(&c);
  absl::StrAppend(
      &text, "  chunks per tensor (",
      m.format_version == 1 ? "flat element ranges, start:stop" : "boxes, start:stop per dimension",
      "):\n");
  for (const TensorRecord& t : m.tensors) {
    std::vector<std::string> boxes;
    for (const ChunkRecord* c : chunks_of[t.name]) {
      boxes.push_back(absl::StrCat(BoxToString(c->box), " ", c->file));
    }
    absl::StrAppendFormat(&text, "    %s (%s) %s: %s\n", t.name, absl::StrJoin(t.shape, ", "),
                          DataTypeName(t.dtype), absl::StrJoin(boxes, ", "));
  }
}

// The summary of one checkpoint and its validation; false when invalid.
bool InspectOne(const std::string& dir, std::string& text) {
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir);
  if (!reader.ok()) {
    absl::StrAppend(&text, dir, ": INVALID: ", reader.status().message(), "\n");
    return false;
  }
  const Manifest& m = reader->manifest();
  int64_t parameter_values = 0, moment_values = 0;
  for (const TensorRecord& t : m.tensors) {
    (t.name.rfind("optim.", 0) == 0 ? moment_values : parameter_values) += t.numel;
  }
  absl::StrAppendFormat(&text, "%s\n", dir);
  absl::StrAppendFormat(&text, "  step %d (AdamW step %d, lr %.3e), dtrain %s, format %d\n", m.step,
                        m.optimizer_step, m.lr, m.dtrain_version, m.format_version);
  absl::StrAppendFormat(&text, "  saved by %d rank(s): %s, dp %d x tp %d x pp %d\n",
                        m.world.world_size, m.world.strategy, m.world.dp, m.world.tp, m.world.pp);
  absl::StrAppendFormat(&text,
                        "  tensors: %d (%.3fM parameter values, %.3fM optimizer-moment values) "
                        "in %d chunks\n",
                        m.tensors.size(), parameter_values / 1e6, moment_values / 1e6,
                        m.chunks.size());
  std::vector<std::string> files;
  for (const Manifest::File& f : m.files) files.push_back(absl::StrCat(f.name, " ", MiB(f.bytes)));
  absl::StrAppendFormat(&text, "  files: %s; total %s\n", absl::StrJoin(files, ", "),
                        MiB(m.total_bytes()));
  if (!m.data.empty()) {
    absl::StrAppendFormat(&text, "  data: %d sequences consumed, %d rank cursor(s)\n",
                          m.data[0].consumed_sequences, m.data.size());
  }
  absl::StrAppendFormat(&text, "  seed %d, recipe hash %s\n", m.seed, m.recipe_hash);
  AppendChunkLayout(m, text);
  const std::vector<std::string> problems = reader->VerifyAll();
  if (problems.empty()) {
    absl::StrAppendFormat(&text, "  checksums: all %d chunks valid (CRC32C)\n", m.chunks.size());
    return true;
  }
  absl::StrAppendFormat(&text, "  INVALID: %d of %d chunks do not verify (read or checksum):\n",
                        problems.size(), m.chunks.size());
  for (const std::string& p : problems) absl::StrAppend(&text, "    ", p, "\n");
  return false;
}

// llm.c's train_gpt2.c model file, version 3: 256 int32 header, then float32 tensors grouped
// by kind over the layers (wte padded to Vp rows, wpe, ln1w, ln1b, qkvw, ...).
constexpr int32_t kLlmcModelMagic = 20240326;  // the first int32 of llm.c's GPT-2 model file

absl::Status ExportLlmc(const ModelConfig& config, const ParamTable& table,
                        CheckpointReader& reader, const std::string& out) {
  if (config.family != ModelFamily::kGpt2 || config.d_ff != 4 * config.d_model) {
    return absl::InvalidArgumentError(
        "--format llmc writes llm.c's GPT-2 file: the checkpoint must be model.family gpt2 with "
        "d_ff = 4 * d_model; use --format safetensors");
  }
  // What is there already is an earlier export's to replace, or another's (a recipe mistyped as
  // --out): refused, as the safetensors export refuses one.
  std::error_code error;
  if (fs::is_regular_file(out, error) && !IsLlmcModelFile(out)) {
    return WithExitCode(absl::FailedPreconditionError(absl::StrCat(
                            out,
                            " exists and is no llm.c model file, which the export would write "
                            "over: give the weights a path of their own")),
                        kExitUsage);
  }
  const int padded_vocab = (config.vocab_size + 127) / 128 * 128;
  int32_t header[256] = {};
  header[0] = kLlmcModelMagic;
  header[1] = 3;
  header[2] = config.max_seq_len;
  header[3] = config.vocab_size;
  header[4] = config.n_layer;
  header[5] = config.n_head;
  header[6] = config.d_model;
  header[7] = padded_vocab;
  return WriteFileDurably(out, [&](int fd, const std::string& tmp) {
    std::vector<float> values;
    const auto write_tensor = [&](const std::string& name, size_t pad_to) -> absl::Status {
      const TensorEntry* entry = table.Find(name);
      if (entry == nullptr) return absl::InternalError("no tensor " + name);
      values.assign(std::max(entry->numel, pad_to), 0.0f);
      RETURN_IF_ERROR(reader.Read(name, 0, static_cast<int64_t>(entry->numel), values.data()));
      return WriteAll(fd, values.data(), values.size() * sizeof(float), tmp);
    };
    RETURN_IF_ERROR(WriteAll(fd, header, sizeof(header), tmp));
    RETURN_IF_ERROR(
        write_tensor("embed.tokens", static_cast<size_t>(padded_vocab) * config.d_model));
    RETURN_IF_ERROR(write_tensor("embed.positions", 0));
    for (const char* kind : {"norm1.weight", "norm1.bias", "attn.qkv.weight", "attn.qkv.bias",
                             "attn.out.weight", "attn.out.bias", "norm2.weight", "norm2.bias",
                             "mlp.up.weight", "mlp.up.bias", "mlp.down.weight", "mlp.down.bias"}) {
      for (int layer = 0; layer < config.n_layer; ++layer) {
        RETURN_IF_ERROR(write_tensor(absl::StrCat("blocks.", layer, ".", kind), 0));
      }
    }
    RETURN_IF_ERROR(write_tensor("final_norm.weight", 0));
    return write_tensor("final_norm.bias", 0);
  });
}

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The recipe of a checkpoint's run, its relative data paths and train.init_from taken from
// `working_dir`, the folder they were relative to (the manifest's, where it still is): `ckpt
// export` run from another folder reads the tokenizer, the shards' tokenizer record and chat
// template, and the starting folder's context (ExportedModelConfig) that the run read.
Recipe WithDataPathsFrom(Recipe recipe, const std::string& working_dir) {
  std::error_code error;
  if (working_dir.empty() || !fs::is_directory(working_dir, error)) return recipe;
  const auto from = [&](std::string& path) {
    if (!path.empty() && fs::path(path).is_relative())
      path = (working_dir / fs::path(path)).string();
  };
  from(recipe.data.tokenizer);
  from(recipe.train.init_from);
  for (std::string& path : recipe.data.train) from(path);
  for (std::string& path : recipe.data.val) from(path);
  if (!recipe.data.shards.empty())
    recipe.data.shards = ShardPatternFrom(working_dir, recipe.data.shards);
  if (!recipe.data.val_shards.empty()) {
    recipe.data.val_shards = ShardPatternFrom(working_dir, recipe.data.val_shards);
  }
  return recipe;
}

}  // namespace

absl::StatusOr<std::string> ResolveCheckpoint(const std::string& path) {
  std::error_code error;
  if (!fs::exists(path, error)) {
    return absl::NotFoundError(absl::StrCat(path, " does not exist"));
  }
  if (IsStepFolder(path)) return path;
  for (const std::string& candidate : CheckpointCandidates(path)) {
    const absl::StatusOr<CheckpointReader> opened = CheckpointReader::Open(candidate);
    if (opened.ok()) return candidate;
    LogWarn("skipping checkpoint %s: %s", candidate, opened.status().message());
  }
  return absl::NotFoundError(
      absl::StrCat(path, " holds no complete checkpoint (no step-<N> folder with a manifest)"));
}

bool IsLlmcModelFile(const std::string& path) {
  const std::optional<std::string> head = RegularFileHead(path, sizeof(kLlmcModelMagic));
  return head && head->size() == sizeof(kLlmcModelMagic) &&
         std::memcmp(head->data(), &kLlmcModelMagic, sizeof(kLlmcModelMagic)) == 0;
}

InspectReport InspectCheckpoints(const std::string& path) {
  InspectReport report;
  std::error_code error;
  if (!fs::exists(path, error)) {
    report.text = absl::StrCat(path, " does not exist\n");
    report.found = false;
    return report;
  }
  if (IsStepFolder(path)) {
    report.valid = InspectOne(path, report.text);
    return report;
  }
  if (!fs::is_directory(path, error)) {
    report.text = absl::StrCat(path,
                               " is a file: give its step-<N> folder, or the checkpoint folder "
                               "that holds them\n");
    report.found = false;
    return report;
  }
  const std::vector<std::string> candidates = CheckpointCandidates(path);
  if (candidates.empty()) {
    report.text = absl::StrCat(path, " holds no step-<N> checkpoint folders\n");
    report.found = false;
    return report;
  }
  const std::string latest = LatestName(path);
  const bool stale = !latest.empty() && absl::c_none_of(candidates, [&](const std::string& step) {
    return fs::path(step).filename() == latest;
  });
  absl::StrAppendFormat(&report.text, "%s: %d checkpoint(s); latest names %s%s\n", path,
                        candidates.size(), latest.empty() ? "nothing" : latest,
                        stale ? absl::StrCat(", which is not here: latest is stale (a resume "
                                             "takes the newest checkpoint that loads)")
                              : "");
  report.valid = true;
  for (const std::string& candidate : candidates) {
    report.valid = InspectOne(candidate, report.text) && report.valid;
  }
  if (const SetAside aside = SetAsideFolders(path); !aside.names.empty()) {
    absl::StrAppendFormat(&report.text,
                          "also %d set-aside folder(s), %.1f MiB in all: %s (checkpoints a run "
                          "started over from or replaced, kept for inspection; a resume never "
                          "loads them: remove them when no longer needed)\n",
                          aside.names.size(), aside.bytes / 1048576.0,
                          absl::StrJoin(aside.names, ", "));
  }
  return report;
}

namespace {

// ExportCheckpoint of the step-<N> folder `dir`.
absl::Status ExportStep(const std::string& dir, const std::string& out, const std::string& format,
                        const std::string& tokenizer_path) {
  // Written into the step folder it reads (or over the checkpoint folder's `latest`), the export
  // would overwrite the checkpoint: a rank file, once, gave the run nothing to resume from.
  const std::string checkpoints = std::filesystem::path(dir).parent_path().string();
  const auto same = [](const std::string& a, const std::string& b) {
    return IsSameOrInside(a, b) && IsSameOrInside(b, a);
  };
  if (IsSameOrInside(out, dir) || same(out, checkpoints) || same(out, checkpoints + "/latest")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--out ", out, " is inside the checkpoint it exports (", dir,
                     "), or its folder: the export would overwrite it; write it elsewhere"));
  }
  ASSIGN_OR_RETURN(CheckpointReader reader, CheckpointReader::Open(dir));
  // Its warnings are the run's, given when it started.
  const absl::StatusOr<Recipe> read = [&] {
    const QuietLogScope quiet;
    return ParseRecipe(reader.manifest().recipe_yaml, dir + "/manifest.json (recipe)");
  }();
  ASSIGN_OR_RETURN(const Recipe saved, read);
  const Recipe recipe = WithDataPathsFrom(saved, reader.manifest().working_dir);
  const ModelConfig config = ModelConfigFromRecipe(recipe.model, recipe.d_ff());
  const ParamTable table(config, ModelSlice{});
  if (format != "safetensors" && format != "hf" && format != "llmc") {
    return absl::InvalidArgumentError(
        absl::StrCat("--format ", format, " is not known; use safetensors, hf or llmc"));
  }
  if (!tokenizer_path.empty() && tokenizer_path != "none" && format != "hf") {
    return absl::InvalidArgumentError(
        "--tokenizer goes into a Hugging Face model folder: add --format hf");
  }
  // The folder ships the run's own tokenizer, as train.export_to's does, unless told otherwise;
  // one that is not here (the run trained on another machine) is left out, saying so.
  std::string tokenizer = tokenizer_path == "none" ? "" : tokenizer_path;
  const bool run_tokenizer = tokenizer_path.empty() && format == "hf";
  if (run_tokenizer && !recipe.data.tokenizer.empty()) {
    std::error_code error;
    if (std::filesystem::exists(recipe.data.tokenizer, error)) {
      tokenizer = recipe.data.tokenizer;
    } else {
      // Relative still where the run's working folder, which it was relative to, is not here:
      // looked for under this one.
      const std::string& working_dir = reader.manifest().working_dir;
      std::string where;
      if (fs::path(recipe.data.tokenizer).is_relative()) {
        where =
            absl::StrCat(" (looked for under ", fs::current_path(error).string(),
                         working_dir.empty() ? ""
                                             : absl::StrCat("; the run's working folder ",
                                                            working_dir, " is not on this machine"),
                         ")");
      }
      LogWarn(
          "the checkpoint's run trained with data.tokenizer %s, which is not here%s: the folder "
          "gets no tokenizer; give --tokenizer PATH to ship one",
          recipe.data.tokenizer, where);
    }
  } else if (run_tokenizer) {
    // Without data.tokenizer the data are bytes (data.format text), or their shards say whose.
    const absl::StatusOr<std::string> recorded = ShardsTokenizerName(recipe);
    tokenizer = DataTokenizer(recipe, recorded);
    if (tokenizer.empty()) {
      LogWarn("the folder gets no tokenizer: %s; give --tokenizer PATH to ship one",
              NoDataTokenizerReason(recorded));
    }
  }
  if (format == "llmc") {
    RETURN_IF_ERROR(ExportLlmc(config, table, reader, out));
    return absl::OkStatus();
  }
  std::vector<float> values;
  const TensorValuesFn read_tensor = [&](const TensorEntry& entry) -> absl::StatusOr<const float*> {
    values.resize(entry.numel);
    RETURN_IF_ERROR(reader.Read(entry.name, 0, static_cast<int64_t>(entry.numel), values.data()));
    return values.data();
  };
  const SafetensorsMetadata metadata = {{"dtrain_checkpoint", dir},
                                        {"step", std::to_string(reader.manifest().step)}};
  if (format == "hf") {
    // An SFT run's folder renders chats as its shards were packed, as train.export_to's does:
    // the template they record (the recipe's data.train, read from here).
    std::optional<ChatTemplate> chat_template;
    if (!tokenizer.empty()) {
      absl::StatusOr<std::optional<ChatTemplate>> recorded = ShardsChatTemplate(recipe);
      if (recorded.ok()) {
        chat_template = *std::move(recorded);
      } else {
        const std::string why = absl::StrCat(
            "the checkpoint's run trained on SFT shards (data.train: ",
            absl::StrJoin(recipe.data.train, ", "),
            "), whose chat template the folder's tokenizer needs, and they do not read from here: ",
            recorded.status().message());
        // Asked for by name, the tokenizer must come whole; the run's own comes without it.
        if (!run_tokenizer) {
          return absl::Status(
              recorded.status().code(),
              absl::StrCat(why, "; export where they do, or with --tokenizer none"));
        }
        LogWarn(
            "%s: the folder's tokenizer has no chat template (export where they read to "
            "have it)",
            why);
      }
    }
    RETURN_IF_ERROR(ExportHfFolder(ExportedModelConfig(config, recipe.train.init_from), table,
                                   read_tensor, out, tokenizer, metadata,
                                   chat_template ? &*chat_template : nullptr));
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(ExportHfSafetensorsStreamed(config, table, read_tensor, out, metadata));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> WithNewestCheckpoint(
    const std::string& path, const std::function<absl::Status(const std::string& dir)>& use) {
  constexpr int kAttempts = 3;
  for (int attempt = 1;; ++attempt) {
    ASSIGN_OR_RETURN(const std::string dir, ResolveCheckpoint(path));
    const absl::Status status = use(dir);
    std::error_code error;
    if (status.ok()) return dir;
    if (fs::exists(dir, error)) return status;
    // A prune renames the folder away at once (CheckpointWriter): gone, it was pruned.
    const std::string removed = absl::StrCat(
        dir,
        " was removed while it was read (a run still training pruned it: checkpoint.keep_last)");
    if (dir == path) {
      return absl::NotFoundError(absl::StrCat(removed, "; give the checkpoint folder, ",
                                              fs::path(dir).parent_path().string(),
                                              ", to take its newest"));
    }
    if (attempt == kAttempts) {
      return absl::NotFoundError(absl::StrCat(
          removed, ", as were the ", kAttempts - 1,
          " taken before it: the run prunes faster than this reads; copy a step-<N> folder "
          "aside and give it"));
    }
    LogWarn("%s; taking the newest again", removed);
  }
}

absl::StatusOr<std::string> ExportCheckpoint(const std::string& path, const std::string& out,
                                             const std::string& format,
                                             const std::string& tokenizer_path) {
  return WithNewestCheckpoint(
      path, [&](const std::string& dir) { return ExportStep(dir, out, format, tokenizer_path); });
}

namespace {

absl::StatusOr<std::string> BenchCheckpointIoIn(const std::string& dir, int64_t numel) {
  // Parameters and two moments as 64 MiB chunks of three tensors, like a model's big matrices.
  constexpr int64_t kChunk = int64_t{16} << 20;
  std::vector<float> state(static_cast<size_t>(3 * numel));
  for (size_t i = 0; i < state.size(); ++i) state[i] = static_cast<float>(i % 1000) * 1e-3f;
  const char* names[3] = {"params", "optim.m/params", "optim.v/params"};
  Manifest manifest;
  manifest.dtrain_version = DTRAIN_VERSION;
  for (const char* name : names) manifest.tensors.push_back({name, {numel}, numel});
  const auto request = [&](int64_t step, const float* base) {
    SaveRequest r;
    r.dir = dir;
    r.step = step;
    r.nonce = 0x5eed + static_cast<uint64_t>(step);
    r.keep_last = 1;
    r.manifest = manifest;
    for (int t = 0; t < 3; ++t) {
      for (int64_t begin = 0; begin < numel; begin += kChunk) {
        const int64_t end = std::min(numel, begin + kChunk);
        AppendFlatRangeChunks(names[t], {numel}, begin, end, base + t * numel + begin, r.chunks);
      }
    }
    return r;
  };
  const uint64_t bytes = state.size() * sizeof(float);

  // Synchronous save: what training would wait for without async.
  CheckpointWriter sync(false);
  auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(sync.Save(request(1, state.data())));
  const double save_s = Seconds(start);

  // Asynchronous saves: blocked = staging copy (and the wait for the previous save). The trainer
  // allocates the staging memory at start-up; so does this.
  CheckpointWriter async(true);
  start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(async.Stage(state.size()).status());
  const double staging_alloc_s = Seconds(start);
  double blocked_s[2] = {0, 0};
  double async_total_s = 0;
  for (int i = 0; i < 2; ++i) {
    // Saves are interval steps apart in training: let the previous write-back settle first.
    ::sync();
    std::this_thread::sleep_for(std::chrono::seconds(1));
    start = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(float* staging, async.Stage(state.size()));
    std::memcpy(staging, state.data(), bytes);
    RETURN_IF_ERROR(async.Save(request(2 + i, staging)));
    blocked_s[i] = Seconds(start);
    RETURN_IF_ERROR(async.Wait());
    async_total_s = Seconds(start);
  }

  // Load: the newest, every chunk read and checksummed.
  ::sync();
  std::vector<float> loaded(state.size());
  start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(CheckpointReader reader, CheckpointReader::Open(dir + "/step-3"));
  for (int t = 0; t < 3; ++t) {
    RETURN_IF_ERROR(reader.Read(names[t], 0, numel, loaded.data() + t * numel));
  }
  const double load_s = Seconds(start);
  if (std::memcmp(loaded.data(), state.data(), bytes) != 0) {
    return absl::InternalError("the loaded state differs from the saved one");
  }
  return absl::StrFormat(
      "bytes=%d save_s=%.3f load_s=%.3f async_blocked_first_s=%.4f async_blocked_s=%.4f "
      "async_total_s=%.3f staging_alloc_s=%.3f",
      bytes, save_s, load_s, blocked_s[0], blocked_s[1], async_total_s, staging_alloc_s);
}

}  // namespace

absl::StatusOr<std::string> BenchCheckpointIo(const std::string& parent, int64_t numel) {
  // The state (parameters and two moments) and the asynchronous saves' staging copy of it.
  const double needed = 2.0 * 3.0 * sizeof(float) * static_cast<double>(numel);
  const double memory =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  if (numel <= 0 || needed > memory) {
    return WithExitCode(
        absl::InvalidArgumentError(absl::StrFormat(
            "--values %d: the bench holds 6 floats a value (%.1f GiB) and this machine has "
            "%.1f GiB; give a positive count of at most %d",
            numel, needed / (1 << 30), memory / (1 << 30),
            static_cast<int64_t>(memory / (6.0 * sizeof(float))))),
        kExitUsage);
  }
  std::error_code error;
  fs::create_directories(parent, error);
  std::string dir = (fs::path(parent) / "dtrain-ckpt-bench-XXXXXX").string();
  if (::mkdtemp(dir.data()) == nullptr) {
    return FileError(errno, absl::StrCat("cannot create a scratch folder in ", parent));
  }
  absl::StatusOr<std::string> line = BenchCheckpointIoIn(dir, numel);
  fs::remove_all(dir, error);
  return line;
}

}  // namespace dtrain
