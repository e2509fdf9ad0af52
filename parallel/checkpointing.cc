#include "parallel/checkpointing.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <filesystem>
#include <optional>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/checkpoint/box.h"
#include "core/checkpoint/reader.h"
#include "core/util/exit_codes.h"
#include "core/util/files.h"
#include "core/util/fnv.h"
#include "core/util/log.h"
#include "core/util/status.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;

// Keys whose change makes a checkpoint unloadable: the state's shapes or the data position.
const std::set<std::string>& ShapeKeys() {
  static const auto* const keys = new std::set<std::string>{
      "model.family", "model.n_layer",    "model.n_head",      "model.n_kv_head", "model.d_model",
      "model.d_ff",   "model.vocab_size", "model.max_seq_len", "train.seq_len",   "data.format"};
  return *keys;
}

// Keys that say where a run is and what it resumes, not how it trains: a checkpoint resumed from
// another run's folder was saved with other values of them, and none of that is news.
const std::set<std::string>& PlaceKeys() {
  static const auto* const keys =
      new std::set<std::string>{"run.name", "run.out_dir", "checkpoint.dir", "checkpoint.resume"};
  return *keys;
}

// The run.name of a resolved recipe; empty when it does not parse.
std::string RunNameOf(const std::string& recipe_yaml) {
  try {
    const YAML::Node name = YAML::Load(recipe_yaml)["run"]["name"];
    return name && name.IsScalar() ? name.Scalar() : "";
  } catch (const YAML::Exception&) {
    return "";
  }
}

// Whether `dir` lies outside the run folder `run_dir` (a checkpoint.dir other runs may name too).
bool OutsideRunFolder(const std::string& dir, const std::string& run_dir) {
  const fs::path relative =
      fs::path(dir).lexically_normal().lexically_relative(fs::path(run_dir).lexically_normal());
  return relative.empty() || *relative.begin() == "..";
}

// A recipe key whose saved value differs from the current one, and both values.
struct ChangedKey {
  std::string path;
  std::string values;  // "(4, now 6)"
};

// A value on one line, as a recipe can write it: 4, [a.txt, b.txt].
std::string OneLine(const YAML::Node& node) {
  YAML::Emitter out;
  out.SetSeqFormat(YAML::Flow);
  out.SetMapFormat(YAML::Flow);
  out << node;
  return out.c_str();
}

// Keys that differ between two resolved recipes ("section.key").
std::vector<ChangedKey> DifferingKeys(const std::string& saved, const std::string& current) {
  std::vector<ChangedKey> keys;
  YAML::Node a, b;
  try {
    a = YAML::Load(saved);
    b = YAML::Load(current);
  } catch (const YAML::Exception&) {
    return {{"(the saved recipe does not parse)", ""}};
  }
  for (auto section = b.begin(); section != b.end(); ++section) {
    const std::string name = section->first.Scalar();
    const YAML::Node old_section = a[name];
    for (auto key = section->second.begin(); key != section->second.end(); ++key) {
      const std::string path = absl::StrCat(name, ".", key->first.Scalar());
      const YAML::Node old_value = old_section ? old_section[key->first.Scalar()] : YAML::Node();
      if (old_value && YAML::Dump(old_value) == YAML::Dump(key->second)) continue;
      keys.push_back({path, absl::StrCat(" (", old_value ? OneLine(old_value) : "none", ", now ",
                                         OneLine(key->second), ")")});
    }
  }
  return keys;
}

// Calls fn(entry, begin, end) for each piece [begin, end) (table positions) of the tensors that
// overlap [lo, hi).
template <typename Fn>
void ForEachTensorPiece(const ParamTable& table, size_t lo, size_t hi, Fn fn) {
  for (const TensorEntry& entry : table.entries()) {
    const size_t begin = std::max(lo, entry.offset);
    const size_t end = std::min(hi, entry.offset + entry.numel);
    if (begin < end) fn(entry, begin, end);
  }
}

// True when box `b` continues box `a` along the first dimension with the same extent in the
// others, so that the two are one box whose row-major order is a's elements, then b's.
bool Stacks(const Box& a, const Box& b) {
  if (a.offsets.empty() || a.offsets.size() != b.offsets.size() ||
      a.offsets[0] + a.lengths[0] != b.offsets[0]) {
    return false;
  }
  for (size_t d = 1; d < a.offsets.size(); ++d) {
    if (a.offsets[d] != b.offsets[d] || a.lengths[d] != b.lengths[d]) return false;
  }
  return true;
}

// Calls fn(local, box) for boxes of the whole model's tensor, indexed as `shape` (its global
// shape, or the one dimension a version 1 checkpoint indexes), that together hold the entry's
// local elements [lo, hi), each box's elements being the local elements local, local + 1, ...
// Consecutive runs of a column block stack into one box, so a tensor-parallel shard is a few
// boxes rather than one per row.
template <typename Fn>
void ForEachGlobalBox(const TensorEntry& entry, const std::vector<int64_t>& shape, size_t lo,
                      size_t hi, Fn fn) {
  std::optional<Box> pending;
  size_t pending_local = 0;
  ForEachGlobalRun(entry, lo, hi, [&](size_t local, size_t global, size_t count) {
    for (Box& box : FlatRangeToBoxes(shape, static_cast<int64_t>(global),
                                     static_cast<int64_t>(global + count))) {
      const size_t numel = static_cast<size_t>(BoxNumel(box));
      // The runs cover [lo, hi) in order, so a box that stacks onto the pending one also
      // follows it locally.
      if (pending && Stacks(*pending, box)) {
        pending->lengths[0] += box.lengths[0];
      } else {
        if (pending) fn(pending_local, *pending);
        pending = std::move(box);
        pending_local = local;
      }
      local += numel;
    }
  });
  if (pending) fn(pending_local, *pending);
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t numel = 1;
  for (const int64_t n : shape) numel *= n;
  return numel;
}

absl::StatusOr<uint64_t> AgreeOnNonce(Communicator* comm) {
  std::random_device device;
  uint64_t nonce =
      (static_cast<uint64_t>(device()) << 32) ^ device() ^
      static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  if (comm == nullptr) return nonce;
  if (std::unique_ptr<Work> work = comm->Broadcast(&nonce, 1, 0); work) {
    RETURN_IF_ERROR(work->Wait());
  }
  return nonce;
}

// Every rank writes its part of a save into checkpoint.dir and rank 0 waits for them all, so the
// ranks of a run over several machines must see one folder: a folder on each machine's own disk
// was found at the first save, after parallel.timeout_s and the training before it. Rank 0 writes
// a file of a name no rank has looked up (a network file system asks its server about a new
// name, rather than a cache), and every rank looks for it; what each found (-1 on rank 0: it could
// not write the file) is gathered, so that every rank ends with an error, none in a collective.
absl::Status CheckFolderIsShared(const std::string& dir, Communicator* comm, uint64_t nonce) {
  if (comm == nullptr || comm->size() == 1) return absl::OkStatus();
  const std::string marker = absl::StrFormat("%s/.shared-%016x", dir, nonce);
  const absl::Status written =
      comm->rank() == 0
          ? WriteFileDurably(marker, "written by rank 0 to see that every rank sees it\n")
          : absl::OkStatus();
  RETURN_IF_ERROR(comm->Barrier());
  std::error_code error;
  double seen = !written.ok() ? -1 : fs::exists(marker, error) ? 1 : 0;
  std::vector<double> all(comm->size());
  RETURN_IF_ERROR(comm->AllGather(&seen, all.data(), 1)->Wait());
  if (comm->rank() == 0) fs::remove(marker, error);
  if (all[0] < 0) {
    return !written.ok() ? written
                         : absl::FailedPreconditionError(
                               absl::StrCat("rank 0 could not write a file into checkpoint.dir ",
                                            dir, " (its error says why)"));
  }
  std::vector<int> blind;
  for (int rank = 0; rank < comm->size(); ++rank) {
    if (all[rank] == 0) blind.push_back(rank);
  }
  if (blind.empty()) return absl::OkStatus();
  const size_t shown = std::min<size_t>(blind.size(), 8);
  return WithExitCode(
      absl::FailedPreconditionError(absl::StrCat(
          "checkpoint.dir ", dir, " is not one folder for every rank: rank",
          blind.size() == 1 ? " " : "s ", absl::StrJoin(blind.begin(), blind.begin() + shown, ", "),
          shown < blind.size() ? absl::StrCat(", ... (", blind.size(), " in all)") : "",
          blind.size() == 1 ? " does" : " do",
          " not see the file rank 0 wrote there, so their machines have folders of their own; "
          "every rank writes its part of a save there and rank 0 waits for them all: set "
          "checkpoint.dir (or run.out_dir) to a folder on a file system every machine mounts")),
      kExitUsage);
}

}  // namespace

TrainingCheckpoints::TrainingCheckpoints(const Recipe& recipe, const ParamTable& table,
                                         DataParallelEngine& engine, Communicator* comm,
                                         uint64_t nonce)
    : recipe_(recipe),
      table_(table),
      engine_(engine),
      comm_(comm),
      rank_(comm ? comm->rank() : 0),
      world_(comm ? comm->size() : 1),
      nonce_(nonce),
      dir_(recipe.checkpoint_dir()),
      recipe_yaml_(ResolvedRecipeYaml(recipe)),
      // Only periodic saves run behind training. Without them the saves end the run (the last
      // step, SIGTERM) or are rare (SIGUSR1): staging would gain nothing and would hold a second
      // copy of the model state in host memory for the whole run (+1.5 GiB for GPT-2 124M).
      writer_(recipe.checkpoint.async && recipe.checkpoint.interval > 0) {}

absl::StatusOr<std::unique_ptr<TrainingCheckpoints>> TrainingCheckpoints::Create(
    const Recipe& recipe, const ParamTable& table, DataParallelEngine& engine, Communicator* comm) {
  ASSIGN_OR_RETURN(const uint64_t nonce, AgreeOnNonce(comm));
  std::unique_ptr<TrainingCheckpoints> checkpoints(
      new TrainingCheckpoints(recipe, table, engine, comm, nonce));
  RETURN_IF_ERROR(CheckCheckpointFolder(checkpoints->dir_, checkpoints->rank_, recipe.train.steps));
  RETURN_IF_ERROR(CheckFolderIsShared(checkpoints->dir_, comm, nonce));
  if (checkpoints->writer_.async()) {
    // The staging memory is allocated (and its pages touched) now, so that no save pays for it.
    size_t total = 0;
    for (const StateRange& range : engine.SavedState()) total += range.end - range.begin;
    RETURN_IF_ERROR(checkpoints->writer_.Stage(total).status());
  }
  // Another run may name this folder as its checkpoint.dir, even this run's default one, and its
  // saves would set aside or remove this run's: held for the run, before a checkpoint in it is
  // read or written (the check above only probes it). The run folder itself is held already.
  // Taken last: a failure after it would leave the lock file, which only AbandonFolder removes.
  std::error_code error;
  if (checkpoints->rank_ == 0 && !fs::equivalent(checkpoints->dir_, recipe.run_dir(), error)) {
    ASSIGN_OR_RETURN(checkpoints->folder_lock_,
                     FolderLock::Acquire(checkpoints->dir_, FolderLock::kCheckpointFolder));
  }
  return checkpoints;
}

absl::StatusOr<double> TrainingCheckpoints::Save(int64_t step, double lr, const LoaderState& data,
                                                 const std::string& metrics_line) {
  const auto start = std::chrono::steady_clock::now();
  SaveRequest request;
  request.dir = dir_;
  request.step = step;
  request.rank = rank_;
  request.world = world_;
  request.nonce = nonce_;
  request.timeout_s = recipe_.parallel.timeout_s;
  request.keep_last = recipe_.checkpoint.keep_last;
  request.data = data;
  if (rank_ == 0) {
    Manifest& m = request.manifest;
    m.dtrain_version = DTRAIN_VERSION;
    m.step = step;
    m.optimizer_step = engine_.optimizer_step();
    m.seed = recipe_.run.seed;
    m.lr = lr;
    m.recipe_yaml = recipe_yaml_;
    m.metrics_line = metrics_line;
    m.recipe_hash = absl::StrFormat("%016x", Fnv1a(recipe_yaml_));
    std::error_code error;
    m.working_dir = std::filesystem::current_path(error).string();
    const int tp_pp = recipe_.parallel.tp * recipe_.parallel.pp;
    m.world = WorldRecord{world_, engine_.strategy().name, world_ / tp_pp, recipe_.parallel.tp,
                          recipe_.parallel.pp};
    // The whole model's tensors, whatever slice this rank holds, so that checkpoints of every
    // layout name and shape them alike.
    const ParamTable whole(table_.config(), ModelSlice{});
    for (const TensorEntry& entry : whole.entries()) {
      for (const StateKind kind :
           {StateKind::kParameters, StateKind::kMomentM, StateKind::kMomentV}) {
        m.tensors.push_back(TensorRecord{StateTensorName(kind, entry.name), entry.shape,
                                         static_cast<int64_t>(entry.numel)});
      }
    }
  }
  // What this rank writes: its data-parallel share of what its tensor-parallel slice counts, so
  // that a tensor replicated over tensor-parallel ranks (whole, or a kv head held by several)
  // is written once, and the chunks of all ranks cover each tensor exactly once.
  const std::vector<std::pair<size_t, size_t>> counted = table_.CountedRanges();
  const std::vector<StateRange> ranges = engine_.SavedState();
  // The state is the backend's memory: copied to the host, into the writer's staging when it
  // writes in the background, else into a buffer that lives until Save returns.
  size_t total = 0;
  for (const StateRange& range : ranges) total += range.end - range.begin;
  std::vector<float> host;
  float* staging = nullptr;
  if (writer_.async()) {
    ASSIGN_OR_RETURN(staging, writer_.Stage(total));
  } else {
    host.resize(total);
    staging = host.data();
  }
  for (const StateRange& range : ranges) {
    const float* values = staging;
    engine_.backend().CopyToHost(staging, range.values, (range.end - range.begin) * sizeof(float));
    staging += range.end - range.begin;
    for (const auto& [counted_begin, counted_end] : counted) {
      const size_t lo = std::max(range.begin, counted_begin);
      const size_t hi = std::min(range.end, counted_end);
      if (lo >= hi) continue;
      ForEachTensorPiece(table_, lo, hi, [&](const TensorEntry& entry, size_t begin, size_t end) {
        ForEachGlobalBox(
            entry, entry.global_shape, begin - entry.offset, end - entry.offset,
            [&](size_t local, const Box& box) {
              request.chunks.push_back(ChunkSource{StateTensorName(range.kind, entry.name), box,
                                                   values + (entry.offset + local - range.begin)});
            });
      });
    }
  }
  RETURN_IF_ERROR(writer_.Save(std::move(request)));
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

absl::StatusOr<TrainingCheckpoints::Loaded> TrainingCheckpoints::TryLoad(
    const std::string& step_dir, bool& fatal) {
  fatal = false;
  ASSIGN_OR_RETURN(CheckpointReader reader, CheckpointReader::Open(step_dir));
  const Manifest& m = reader.manifest();
  Loaded loaded;
  loaded.run_name = RunNameOf(m.recipe_yaml);
  std::vector<std::string> blocking;
  for (const auto& [key, values] : DifferingKeys(m.recipe_yaml, recipe_yaml_)) {
    if (key == "train.init_from") {
      loaded.init_from_changed = true;
    } else if (!PlaceKeys().count(key)) {
      (ShapeKeys().count(key) ? blocking : loaded.changed_keys).push_back(key + values);
    }
  }
  if (!blocking.empty()) {
    fatal = true;
    // The model keys a recipe leaves unset come from train.init_from's config.json, which a
    // resume does not read otherwise: a folder gone since leaves them at their defaults.
    const std::string& init_from = recipe_.train.init_from;
    std::error_code error;
    const bool config_gone = !init_from.empty() && !absl::EndsWith(init_from, ".safetensors") &&
                             !fs::exists(fs::path(init_from) / "config.json", error);
    return absl::FailedPreconditionError(absl::StrCat(
        step_dir, " was saved with a different ", absl::StrJoin(blocking, ", "),
        ": the model or data shape changed, so it cannot load; restore those keys",
        config_gone ? absl::StrCat(" (train.init_from ", init_from,
                                   " has no config.json here to give those the recipe leaves "
                                   "unset: set them, or give the folder again)")
                    : "",
        ", or set checkpoint.resume: never (or another checkpoint.dir) to start fresh"));
  }
  for (const TensorEntry& entry : table_.entries()) {
    const TensorRecord* record = m.FindTensor(entry.name);
    if (record == nullptr || record->numel != Numel(entry.global_shape)) {
      fatal = true;
      return absl::FailedPreconditionError(
          absl::StrCat(step_dir, " holds no tensor ", entry.name, " of ", Numel(entry.global_shape),
                       " values; it was saved from a different model"));
    }
  }
  // Each held element from where the whole model's tensor has it, whatever layout saved it: read
  // on the host, then copied into the backend's memory.
  std::vector<float> host;
  for (const StateRange& range : engine_.HeldState()) {
    host.assign(range.end - range.begin, 0.0f);
    engine_.backend().CopyToHost(host.data(), range.values, host.size() * sizeof(float));
    absl::Status status;
    ForEachTensorPiece(
        table_, range.begin, range.end, [&](const TensorEntry& entry, size_t begin, size_t end) {
          const std::string name = StateTensorName(range.kind, entry.name);
          const TensorRecord* record = m.FindTensor(name);
          if (record == nullptr) {
            status.Update(absl::DataLossError(absl::StrCat(step_dir, " holds no tensor ", name)));
            return;
          }
          std::vector<Box> boxes;
          std::vector<float*> outs;
          ForEachGlobalBox(entry, ChunkShape(m, *record), begin - entry.offset, end - entry.offset,
                           [&](size_t local, const Box& box) {
                             boxes.push_back(box);
                             outs.push_back(host.data() + (entry.offset + local - range.begin));
                           });
          if (status.ok()) status = reader.ReadBoxes(name, boxes, outs);
        });
    RETURN_IF_ERROR(status);
    engine_.backend().CopyFromHost(range.values, host.data(), host.size() * sizeof(float));
  }
  engine_.LoadedState();
  engine_.SetOptimizerStep(m.optimizer_step);
  if (m.data.empty()) return absl::DataLossError(step_dir + " holds no data-loader state");
  const WorldRecord& saved = m.world;
  if (saved.world_size == world_ && saved.tp == recipe_.parallel.tp &&
      saved.pp == recipe_.parallel.pp && static_cast<int>(m.data.size()) == world_) {
    loaded.data = m.data[rank_];
  } else {
    // One loader state per data-parallel rank: the tensor- and pipeline-parallel ranks of a
    // data-parallel rank read the same data, so only the first of them (tp and pp index 0,
    // mesh.h) is merged (all of them when the record does not describe the saved ranks).
    const bool mesh = saved.dp * saved.tp * saved.pp == static_cast<int>(m.data.size());
    std::vector<LoaderState> loaders;
    for (size_t r = 0; r < m.data.size(); ++r) {
      if (!mesh || (r % saved.tp == 0 && r < static_cast<size_t>(saved.dp * saved.tp))) {
        loaders.push_back(m.data[r]);
      }
    }
    ASSIGN_OR_RETURN(loaded.data, MergeLoaderStates(loaders));
  }
  loaded.step = m.step;
  loaded.metrics_line = m.metrics_line;
  loaded.origin =
      absl::StrFormat("saved by %d rank(s): %s, dp %d x tp %d x pp %d", m.world.world_size,
                      m.world.strategy, m.world.dp, m.world.tp, m.world.pp);
  return loaded;
}

absl::StatusOr<int64_t> TrainingCheckpoints::Resume(SequenceLoader& loader, int restart_count) {
  std::string resume = recipe_.checkpoint.resume;
  // `never` or a given checkpoint would start every restart over, setting aside (and piling up)
  // what the earlier attempts saved; those saves are in checkpoint.dir (the first attempt set any
  // earlier run's past its start aside).
  if (restart_count > 0 && resume != "auto" && !CheckpointCandidates(dir_).empty()) {
    if (rank_ == 0) {
      LogInfo(
          "restart %d: resuming what the earlier attempts saved in %s (checkpoint.resume: %s "
          "applies to the first attempt)",
          restart_count, dir_, resume);
    }
    resume = "auto";
  }
  ASSIGN_OR_RETURN(const int64_t step, LoadResumeStep(loader, resume));
  if (rank_ == 0) {
    if (restart_count > 0 && step == 0) {
      LogWarn("restart %d: no checkpoint in %s, so training starts over from step 1%s",
              restart_count, dir_,
              recipe_.checkpoint.interval > 0
                  ? absl::StrCat(" (none completed; checkpoint.interval is ",
                                 recipe_.checkpoint.interval, ")")
                  : " (set checkpoint.interval to save on the way)");
    }
    SetAsideLaterCheckpoints(step);
  }
  return step;
}

absl::Status CheckResumePathExists(const std::string& resume) {
  std::error_code error;
  if (resume == "auto" || resume == "never" || fs::exists(resume, error)) return absl::OkStatus();
  return WithExitCode(
      absl::NotFoundError(
          absl::StrCat("checkpoint.resume: ", resume, " does not exist",
                       fs::path(resume).is_relative()
                           ? absl::StrCat(" (a relative path is from the folder dtrain runs in, ",
                                          fs::current_path(error).string(),
                                          ", not from the run folder as checkpoint.dir's)")
                           : "",
                       "; give a step-<N> folder, a checkpoint folder, auto or never")),
      kExitUsage);
}

void TrainingCheckpoints::SetAsideLaterCheckpoints(int64_t start_step) {
  bool moved = false;
  for (const auto& [step, path] : StepFolders(dir_)) {
    if (step <= start_step) continue;
    const std::string aside = AsideName(path, nonce_);
    std::error_code error;
    fs::rename(path, aside, error);
    if (error) {
      LogWarn(
          "checkpoint: %s is past step %d, where this run starts, and cannot move aside to %s "
          "(%s): a later checkpoint.resume: auto would take it",
          path, start_step, aside, error.message());
    } else {
      LogWarn("checkpoint: %s is past step %d, where this run starts: moved to %s", path,
              start_step, aside);
      moved = true;
    }
  }
  if (!moved) return;
  // Kept for inspection, never pruned: each start over adds to them.
  const SetAside aside = SetAsideFolders(dir_);
  LogWarn(
      "checkpoint: %s holds %d set-aside checkpoint folder(s), %.1f MiB in all, kept for "
      "inspection: remove them when they are no longer needed",
      dir_, aside.names.size(), aside.bytes / 1048576.0);
}

absl::StatusOr<int64_t> TrainingCheckpoints::LoadResumeStep(SequenceLoader& loader,
                                                            const std::string& resume) {
  if (resume == "never") return 0;
  std::vector<std::string> candidates;
  std::string folder = dir_;
  bool scanned = true;  // the candidates are a folder's step-<N> checkpoints, newest first
  if (resume != "auto") {
    RETURN_IF_ERROR(CheckResumePathExists(resume));
    if (IsStepFolder(resume)) {
      candidates.push_back(resume);
      folder = fs::path(resume).parent_path().string();
      scanned = false;
    } else {
      candidates = CheckpointCandidates(resume);
      folder = resume;
      if (candidates.empty()) {
        return WithExitCode(
            absl::NotFoundError(absl::StrCat("checkpoint.resume: ", resume,
                                             " holds no step-<N> checkpoint folder")),
            kExitUsage);
      }
    }
  } else {
    candidates = CheckpointCandidates(dir_);
  }
  for (const std::string& candidate : candidates) {
    bool fatal = false;
    absl::StatusOr<Loaded> loaded = TryLoad(candidate, fatal);
    if (fatal) return WithExitCode(loaded.status(), kExitUsage);
    // A read that failed (an I/O error, a file system's hiccup, permissions) is not damage:
    // falling back to an older checkpoint would drop its steps and set it aside. The run stops,
    // changing nothing: exit 1 where a restart may read it, 2 for permissions, which an agent's
    // restart would meet again. Damage (a checksum, size, manifest or layout the files
    // contradict; a save that did not complete) is met by every restart: the next older is tried.
    const absl::StatusCode code = loaded.status().code();
    double failed = loaded.ok() ? 0 : 1;
    double unread =
        code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kUnknown ||
                code == absl::StatusCode::kAborted || code == absl::StatusCode::kDeadlineExceeded ||
                code == absl::StatusCode::kResourceExhausted || code == absl::StatusCode::kInternal
            ? 1
            : 0;
    RETURN_IF_ERROR(SumOverRanks(comm_, failed, unread));
    double denied = code == absl::StatusCode::kPermissionDenied ? 1 : 0, unused = 0;
    if (failed > 0) RETURN_IF_ERROR(SumOverRanks(comm_, denied, unused));
    if (unread > 0 || denied > 0) {
      if (!loaded.ok()) {
        LogWarn("cannot read checkpoint %s: %s", candidate, loaded.status().message());
      }
      absl::Status stopped = absl::UnavailableError(absl::StrCat(
          "checkpoint.resume: ", resume, ": ", candidate,
          " could not be read (see the warnings); nothing was changed and no older checkpoint was "
          "taken in its place. ",
          unread > 0 ? "Fix the storage and start again"
                     : "Give the run read access to it (its files' owner and mode)",
          ", or give checkpoint.resume an older checkpoint"));
      return unread > 0 ? stopped : WithExitCode(std::move(stopped), kExitUsage);
    }
    if (failed == 0) {
      if (absl::Status restored = loader.Restore(loaded->data); !restored.ok()) {
        absl::Status refused(restored.code(),
                             absl::StrCat("resuming from ", candidate, ": ", restored.message()));
        // A data order this recipe or world cannot continue: a restart would find the same.
        return absl::IsInvalidArgument(restored) ? WithExitCode(std::move(refused), kExitUsage)
                                                 : refused;
      }
      resumed_metrics_line_ = loaded->metrics_line;
      if (rank_ == 0) {
        const int tp_pp = recipe_.parallel.tp * recipe_.parallel.pp;
        LogInfo("resumed from %s at step %d (%s; now %d rank(s): %s, dp %d x tp %d x pp %d)",
                candidate, loaded->step, loaded->origin, world_, engine_.strategy().name,
                world_ / tp_pp, recipe_.parallel.tp, recipe_.parallel.pp);
        if (!loaded->changed_keys.empty()) {
          LogWarn("%s was saved with other values of %s; the recipe's values apply from now on",
                  candidate, absl::StrJoin(loaded->changed_keys, ", "));
        }
        // A checkpoint.dir outside the run folder may be another run's: say whose this was.
        if (resume == "auto" && !loaded->run_name.empty() && loaded->run_name != recipe_.run.name &&
            OutsideRunFolder(dir_, recipe_.run_dir())) {
          LogWarn(
              "%s was saved by the run named %s, not %s: if checkpoint.dir %s is that run's, give "
              "this run a checkpoint.dir of its own (checkpoint.resume: never there would set that "
              "run's checkpoints aside)",
              candidate, loaded->run_name, recipe_.run.name, dir_);
        }
        // The weights a run starts from are read once, by its first step; after that its
        // checkpoints hold them.
        if (loaded->init_from_changed && !recipe_.train.init_from.empty()) {
          LogWarn(
              "train.init_from %s is not loaded: the run resumes %s, whose weights replace it; "
              "to start from %s, set checkpoint.resume: never or give the run another run.name",
              recipe_.train.init_from, candidate, recipe_.train.init_from);
        }
        // A folder's `latest` is judged only when the folder was searched.
        const std::string latest = scanned ? LatestName(folder) : "";
        const std::string name = fs::path(candidate).filename().string();
        if (!latest.empty() && latest != name) {
          LogWarn("%s/latest names %s, but %s is the newest checkpoint that loads; latest is stale",
                  folder, latest, name);
        }
      }
      return loaded->step;
    }
    if (!loaded.ok()) {
      LogWarn("skipping checkpoint %s: %s", candidate, loaded.status().message());
    } else if (rank_ == 0) {
      LogWarn(
          "skipping checkpoint %s: another rank found it damaged or incomplete (see its "
          "warning)",
          candidate);
    }
  }
  if (!candidates.empty()) {
    // A fresh start here would lose the run's history, and its saves would prune the
    // checkpoints that did not load.
    const std::string what = scanned ? absl::StrFormat("none of the %d checkpoint(s) in %s loads",
                                                       candidates.size(), folder)
                                     : absl::StrCat(candidates.front(), " does not load");
    // Damaged checkpoints end the run for good (exit 2: an agent does not restart it to find
    // them damaged again).
    return WithExitCode(
        absl::DataLossError(absl::StrCat(
            "checkpoint.resume: ", resume, ": ", what,
            " (see the warnings above); nothing was changed. Restore them, give checkpoint.resume "
            "another checkpoint, or set checkpoint.resume: never (or another checkpoint.dir) to "
            "start fresh")),
        kExitUsage);
  }
  return 0;
}

}  // namespace dtrain
