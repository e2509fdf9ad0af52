// Reading a checkpoint (format.h): the manifest, then any element range or box of any saved tensor
// from the chunks that overlap it, each chunk's CRC32C checked as it is read. Finding the
// checkpoint to resume from is the caller's loop over CheckpointCandidates, since a corrupt chunk
// is only found by the ranks that read it (see parallel/checkpointing.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/checkpoint/format.h"

namespace dtrain {

// The step-<N> folders in `dir`, newest first, complete or not; empty when `dir` does not exist.
std::vector<std::string> CheckpointCandidates(const std::string& dir);
// What `<dir>/latest` names ("" when absent).
std::string LatestName(const std::string& dir);

class CheckpointReader {
 public:
  // Reads and checks the manifest: the format (version 1 or 2), its step the folder's (of a
  // step-<N> folder), every chunk a box inside its
  // tensor with the tensor's data type, every tensor covered by its chunks exactly once, every
  // chunk inside a rank file the manifest lists, every such file present with its size. DataLoss
  // naming the folder and the file or chunk when not; NotFound when the manifest is missing (an
  // incomplete save); a manifest that cannot be read, its errno.
  static absl::StatusOr<CheckpointReader> Open(const std::string& step_dir);
  CheckpointReader(CheckpointReader&&) = default;
  ~CheckpointReader();

  const std::string& path() const { return dir_; }
  const Manifest& manifest() const { return manifest_; }

  // Fills elements [begin, end) of `tensor` (row-major over its global shape) into `out`, reading
  // only overlapping chunks and checking each chunk's checksum (a partly needed chunk is read
  // whole to check it). Errors name the chunk (tensor, box), the file and the byte offset.
  absl::Status Read(const std::string& tensor, int64_t begin, int64_t end, float* out);
  // Fills `box` of `tensor` (a box of ChunkShape) into `out` in the box's row-major order.
  absl::Status ReadBox(const std::string& tensor, const Box& box, float* out);
  // Fills each of `boxes` of `tensor` into the matching `outs`, reading every chunk once (a
  // tensor-parallel shard is several boxes that one saved chunk may all overlap). The boxes
  // must come in flat order: each box's first element after the previous box's last.
  absl::Status ReadBoxes(const std::string& tensor, const std::vector<Box>& boxes,
                         const std::vector<float*>& outs);
  // Reads every chunk and checks its checksum; returns one line per bad chunk (empty: all good).
  std::vector<std::string> VerifyAll();

 private:
  CheckpointReader(std::string dir, Manifest manifest);
  // Fills each of `boxes` of `tensor` into the matching `outs`, reading every chunk once.
  absl::Status ReadBoxes(const TensorRecord& tensor, const std::vector<Box>& boxes,
                         const std::vector<float*>& outs);
  // Reads `chunk` into `out` (null: into one reused block, only to check it) a block at a time,
  // checksumming each block while it is still in cache, as the kernel reads ahead the next.
  absl::Status ReadChunk(const ChunkRecord& chunk, float* out);
  absl::StatusOr<int> FileFd(const std::string& name);

  std::string dir_;
  Manifest manifest_;
  // tensor -> chunk indexes, by the flat position of their first element
  std::map<std::string, std::vector<size_t>> chunks_of_;
  // per chunk: the flat positions of its first and last element
  std::vector<std::pair<int64_t, int64_t>> extents_;
  std::map<std::string, int> fds_;
  std::vector<float> scratch_;     // a partly needed chunk
  std::vector<char> check_block_;  // ReadChunk without a destination
};

}  // namespace dtrain
