// The checkpoint format. A checkpoint of step N is the folder <dir>/step-<N>/ holding
//   rank-<r>.bin   the values rank r wrote: little-endian chunks, back to back
//   rank-<r>.json  rank r's index of its chunks (what it reported; kept for inspection)
//   manifest.json  written last, by rank 0, once every rank's files are durable
// and <dir>/latest names the newest complete one ("step-<N>\n"). A folder appears under its
// final name only complete: ranks write into <dir>/.step-<N>.<nonce>/ and rank 0 renames it.
//
// The state is a set of named global tensors: the model's parameters under their table names
// ("blocks.0.attn.qkv.weight"), AdamW's moments as "optim.m/<name>" and "optim.v/<name>", each
// with its global shape and data type. A chunk is a box of a tensor (core/checkpoint/box.h: an
// offset and a length per dimension of the global shape, whatever the layout that wrote it) whose
// elements are stored in the box's row-major order at (file, offset) with its CRC32C. A
// tensor-parallel shard sliced by rows or columns fits one chunk; a flat element range of a
// data-parallel shard is a few (box.h). The chunks of a tensor cover it exactly once, so a
// checkpoint loads into any world size or layout by reading the chunks that overlap what a rank
// holds. Replicated state is split among the ranks that hold it, so the bytes written are the
// model state's size, never a multiple of it; padding is never written.
//
// Version 1 (before tensor parallelism) stored a chunk as a flat element range [begin, end); it
// still loads: its chunks read as boxes of the tensor viewed as one dimension (ChunkShape).
//
// The manifest also holds the step (and so the LR schedule position, a function of the step),
// AdamW's step count, the seed (data order and sampling are functions of seed and step; there is
// no other RNG state), each saved rank's data-loader state, the world layout, the resolved recipe
// and its hash, and the dtrain version.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/checkpoint/box.h"
#include "core/data/loader.h"
#include "core/util/data_type.h"

namespace dtrain {

inline constexpr int kCheckpointFormatVersion = 2;

enum class StateKind { kParameters, kMomentM, kMomentV };

// The checkpoint's name for `kind` of the model tensor `tensor`.
std::string StateTensorName(StateKind kind, const std::string& tensor);

struct ChunkRecord {
  std::string tensor;
  Box box;  // of the global tensor (of ChunkShape)
  DataType dtype = DataType::kF32;
  std::string file;     // in the step folder
  uint64_t offset = 0;  // bytes
  uint64_t bytes = 0;   // BoxNumel(box) * DataTypeBytes(dtype)
  uint32_t crc32c = 0;
};

struct TensorRecord {
  std::string name;
  std::vector<int64_t> shape;  // global
  int64_t numel = 0;
  DataType dtype = DataType::kF32;
};

// The layout that wrote the checkpoint (for inspection: any layout loads any checkpoint).
struct WorldRecord {
  int world_size = 1;
  std::string strategy;  // the data-parallel engine that wrote it: ddp, zero1, ...
  int dp = 1, tp = 1, pp = 1;
};

// What one rank reports once its file is durable (rank-<r>.json).
struct RankIndex {
  uint64_t nonce = 0;  // of the run attempt; an index of another attempt is ignored
  int64_t step = 0;
  int rank = 0;
  std::string file;
  uint64_t file_bytes = 0;
  std::vector<ChunkRecord> chunks;
  LoaderState data;
};

struct Manifest {
  int format_version = kCheckpointFormatVersion;
  std::string dtrain_version;
  int64_t step = 0;            // optimizer steps done; training continues at this 0-based step
  int64_t optimizer_step = 0;  // AdamW's bias-correction count
  uint64_t seed = 0;
  double lr = 0;  // of the last step done, for information (the schedule is a function of step)
  std::string recipe_yaml;  // the resolved recipe of the run that wrote it
  std::string recipe_hash;  // FNV-1a 64 of recipe_yaml, hex
  // Rank 0's working folder, which the recipe's relative paths are from; empty in manifests
  // written before it was recorded.
  std::string working_dir;
  WorldRecord world;
  std::vector<TensorRecord> tensors;
  std::vector<ChunkRecord> chunks;
  struct File {
    std::string name;
    uint64_t bytes = 0;
  };
  std::vector<File> files;
  std::vector<LoaderState> data;  // indexed by the saving rank
  // The metrics.jsonl line of the step saved, so a run killed between the save and writing that
  // line still has it after resuming.
  std::string metrics_line;

  const TensorRecord* FindTensor(const std::string& name) const;
  uint64_t total_bytes() const;
};

// The shape a chunk's box of `tensor` indexes: the tensor's shape, or {numel} in a version 1
// manifest, whose chunks were flat element ranges.
std::vector<int64_t> ChunkShape(const Manifest& manifest, const TensorRecord& tensor);

std::string ManifestToJson(const Manifest& manifest);
// `path` names the file in messages.
absl::StatusOr<Manifest> ManifestFromJson(const std::string& text, const std::string& path);
std::string RankIndexToJson(const RankIndex& index);
absl::StatusOr<RankIndex> RankIndexFromJson(const std::string& text, const std::string& path);

// Names inside a checkpoint folder.
std::string StepDirName(int64_t step);  // "step-<N>"
// Where a step-<N> folder that must give way moves, kept for inspection: "<path>.replaced-<nonce
// in 16 hex digits>" (never a step-<N> name, so resume and pruning leave it alone).
std::string AsideName(const std::string& step_dir, uint64_t nonce);
// The folders set aside in a checkpoint folder (AsideName's), by name, and the bytes they hold.
struct SetAside {
  std::vector<std::string> names;
  uint64_t bytes = 0;
};
SetAside SetAsideFolders(const std::string& dir);
// N of a "step-<N>" name; nullopt for any other name, N past int64 included.
std::optional<int64_t> StepOfDirName(const std::string& name);
// The step-<N> folders in `dir` as (N, path), oldest first; empty when `dir` cannot be read.
std::vector<std::pair<int64_t, std::string>> StepFolders(const std::string& dir);
// Whether `path` names one checkpoint (it holds a manifest, or is named step-...) rather than a
// folder of them.
bool IsStepFolder(const std::string& path);
std::string RankFileName(int rank);   // "rank-<r>.bin"
std::string RankIndexName(int rank);  // "rank-<r>.json"
inline constexpr char kManifestName[] = "manifest.json";
inline constexpr char kLatestName[] = "latest";

}  // namespace dtrain
