// The interfaces every data source implements (token windows in memory, streamed WebDataset
// shards): deterministic sequences of seq_len + 1 tokens for one data-parallel rank.
//
// Order is a function of (seed, epoch, global sequence index) only; the data-parallel ranks of
// one step together read exactly the sequences a single process would, so a run can resume on a
// different world size from a step boundary. Not thread-safe; one loader per rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dtrain {

struct LoaderState {
  // Sequences consumed by all data-parallel ranks together. It advances by count * world per
  // Next(count) on every rank, so at a step boundary it is steps * global batch.
  int64_t consumed_sequences = 0;
  // What a streaming loader needs beyond the count to continue exactly (packer carry, shuffle
  // block position, ...): versioned text lines, one per stream this rank owns; empty for loaders
  // whose order follows from the count alone. Opaque to the checkpoint, which stores it as is.
  std::string cursor;
};

// A global batch of `global_batch` sequences splits into `world` data-parallel ranks' equal
// shares: InvalidArgument naming train.batch_size otherwise.
absl::Status CheckBatchShares(int global_batch, int world);

// The run's state from every saved rank's state, to restore into any world size: the counts
// must agree (InvalidArgument naming the ranks otherwise) and the cursors are concatenated.
absl::StatusOr<LoaderState> MergeLoaderStates(const std::vector<LoaderState>& ranks);

// Shards a loader has read to their end, and given up on under data.on_error: skip_shard, since
// it was created (read ahead of training, so a little ahead of the steps). For metrics.
struct ShardCounts {
  int64_t read = 0;
  int64_t skipped = 0;
};

class SequenceLoader {
 public:
  virtual ~SequenceLoader() = default;

  // Fills inputs and targets, each (count, seq_len) row-major int32; targets are the inputs
  // shifted by one token. Every rank must call it with the same count.
  virtual absl::Status Next(int count, int32_t* inputs, int32_t* targets) = 0;
  // Document data (SFT samples packed whole into sequences, data.format sft): targets are -1
  // where a token is not trained, and NextDocuments replaces Next, also filling positions
  // (count, seq_len): each token's position in its own document (core/backend/backend.h).
  virtual bool documents() const { return false; }
  virtual absl::Status NextDocuments(int /*count*/, int32_t* /*inputs*/, int32_t* /*targets*/,
                                     int32_t* /*positions*/) {
    return absl::UnimplementedError("this loader's sequences are not documents");
  }

  // Waits up to `timeout` until the next `count` sequences (or as many as the loader reads
  // ahead) are in memory, so that Next will not wait on a shard: true once they are, or once
  // Next would fail at once. A loader that reads nothing ahead is always ready.
  virtual bool WaitReady(int /*count*/, absl::Duration /*timeout*/) { return true; }

  virtual LoaderState state() const = 0;
  // Continues exactly after `state` (this rank's own, or MergeLoaderStates of all saved ranks
  // when the world size changed). InvalidArgument if the state cannot be a state of this
  // loader's world size (consumed_sequences negative or not a multiple of the world) or lacks a
  // cursor this rank needs.
  virtual absl::Status Restore(const LoaderState& state) = 0;

  // Thread-safe. Zero for loaders that read no shards (a token file, a text file).
  virtual ShardCounts shard_counts() const { return {}; }
};

// Evaluation data: a finite, fixed sequence of batches, the same at every evaluation.
class ValidationLoader {
 public:
  virtual ~ValidationLoader() = default;

  // Back to the first batch.
  virtual void Reset() = 0;
  // Fills up to `count` rows of inputs and targets, each (count, seq_len) row-major int32, and
  // returns how many it filled: fewer at the end of this rank's share, then 0. Every rank must
  // call it with the same count.
  virtual absl::StatusOr<int> Next(int count, int32_t* inputs, int32_t* targets) = 0;
  // Whether the validation set ends before the next call's first row, so that it returns 0 on
  // every rank (the same answer on every rank: each call covers the same rows of the whole set
  // on all of them). May read ahead.
  virtual absl::StatusOr<bool> Ended() = 0;
  // As SequenceLoader's.
  virtual bool documents() const { return false; }
  virtual absl::StatusOr<int> NextDocuments(int /*count*/, int32_t* /*inputs*/,
                                            int32_t* /*targets*/, int32_t* /*positions*/) {
    return absl::UnimplementedError("this loader's sequences are not documents");
  }
};

}  // namespace dtrain
