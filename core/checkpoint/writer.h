// Writing a checkpoint (format.h). Every rank writes its chunks into the stage folder
// <dir>/.step-<N>.<nonce>/ and then its index; rank 0 waits for all ranks' indexes (polling the
// shared folder, as PyTorch DCP relies on a shared filesystem too), writes the manifest, renames
// the folder to step-<N>, points `latest` at it and removes the complete checkpoints beyond
// keep_last. No collective runs here, so a save may run on a background thread next to the
// engine's communicator. A crash at any point leaves the earlier checkpoints untouched and no
// step-<N> folder, or a complete one.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/checkpoint/format.h"
#include "core/data/loader.h"

namespace dtrain {

// The elements of `box` of the global tensor `tensor`, held at `values` in the box's row-major
// order (AppendFlatRangeChunks makes the chunks of a flat element range).
struct ChunkSource {
  std::string tensor;
  Box box;
  const void* values = nullptr;
  DataType dtype = DataType::kF32;
};

// Appends the chunks of elements [begin, end) (row-major) of the tensor `tensor` of `shape`, held
// at `values`: the boxes of FlatRangeToBoxes, each pointing at its part of `values`.
void AppendFlatRangeChunks(const std::string& tensor, const std::vector<int64_t>& shape,
                           int64_t begin, int64_t end, const float* values,
                           std::vector<ChunkSource>& chunks);

struct SaveRequest {
  std::string dir;  // the checkpoint folder (checkpoint.dir)
  int64_t step = 0;
  int rank = 0;
  int world = 1;
  uint64_t nonce = 0;      // the same on every rank of one run attempt, new for each attempt
  double timeout_s = 300;  // rank 0's wait for the other ranks' indexes
  int keep_last = 0;       // 0 = keep all
  std::vector<ChunkSource> chunks;
  LoaderState data;
  Manifest manifest;  // rank 0: everything but chunks, files and data, which the indexes give
};

// Runs a whole save on the calling thread. Errors name the file and the rank.
absl::Status WriteCheckpoint(const SaveRequest& request);

// Creates `dir` if missing and writes and removes a file there, and checks that the paths of
// rank `rank`'s saves up to step `last_step` stay within PATH_MAX: a run checks its checkpoint
// folder at start, not at its first save, after its steps. FailedPrecondition naming the folder
// and the fix, asking for exit code kExitUsage where a restart would find it so again
// (read-only, not permitted, not a folder, too long a path) and kExitDiskFull where it is full.
absl::Status CheckCheckpointFolder(const std::string& dir, int rank, int64_t last_step);

// One save at a time, synchronous or on a background thread. Not thread-safe (the training
// thread calls it); the destructor waits for the save in flight.
class CheckpointWriter {
 public:
  explicit CheckpointWriter(bool async) : async_(async) {}
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  bool async() const { return async_; }
  // Waits for the save in flight, then returns a host buffer of `floats` that the next Save's
  // chunks may point into (kept between saves, so only the first save pays for its pages).
  absl::StatusOr<float*> Stage(size_t floats);
  // Synchronous: writes now and returns the outcome. Asynchronous: starts the write and returns;
  // the chunks' values must stay unchanged until it finishes (point them into Stage's buffer).
  absl::Status Save(SaveRequest request);
  // The outcome of the save in flight (OK when none).
  absl::Status Wait();
  // The outcome of a background save that has finished, OK while it runs or when none: a
  // failed save shows at the step it failed, not at the next save's Stage, checkpoint.interval
  // steps later.
  absl::Status Poll();

 private:
  bool async_;
  std::thread thread_;
  std::atomic<bool> finished_ = false;  // the background save has set result_
  absl::Status result_;
  std::vector<float> staging_;
};

}  // namespace dtrain
