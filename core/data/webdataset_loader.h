// SequenceLoaders over WebDataset tar shards (data.format: webdataset).
//
// Order: the run is K = data.streams logical streams (shard_stream.h); global sequence g is
// window g / K of stream g % K. Rank r of a data-parallel world W (W must divide K) owns the
// streams k with k % W == r and reads g = i * W + r for its i-th sequence, so the ranks of a step
// together read the single-process step's sequences, each rank the same count, and shards and
// samples are disjoint across ranks. The order depends on (seed, K, shards) only, never on W.
//
// A background thread reads ahead into a queue bounded by read_ahead_bytes. state() carries a
// cursor per owned stream; merge all ranks' states (MergeLoaderStates) to restore into any W
// that divides K. Not thread-safe: one loader per rank, used from one thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "core/data/loader.h"
#include "core/data/shard_stream.h"

namespace dtrain {

struct WebDatasetOptions {
  StreamConfig stream;  // urls, num_streams (K), seed, shuffle, packing, errors, sources
  int64_t read_ahead_bytes = int64_t{64} << 20;
  int global_batch = 1;
  int rank = 0;
  int world = 1;
};

// Each of the `world` data-parallel ranks owns whole streams: an error unless world divides
// num_streams (data.streams), and unless a rank's streams, each with a shard open, fit in half
// the process's open-file limit, whose soft value it raises towards the hard one if need be.
absl::Status CheckStreamsSplit(int num_streams, int world);

class WebDatasetLoader final : public SequenceLoader {
 public:
  // Errors: no URLs, world not dividing num_streams or global_batch, a bad rank.
  static absl::StatusOr<std::unique_ptr<WebDatasetLoader>> Create(WebDatasetOptions options);
  ~WebDatasetLoader() override;

  absl::Status Next(int count, int32_t* inputs, int32_t* targets) override;
  bool WaitReady(int count, absl::Duration timeout) override;
  LoaderState state() const override;
  absl::Status Restore(const LoaderState& state) override;
  ShardCounts shard_counts() const override;

 private:
  struct Window {
    std::vector<int32_t> inputs_targets;  // seq_len inputs, then seq_len targets
    int owned_stream = 0;                 // index into streams_
    StreamCursor cursor;                  // of that stream after this window
    absl::Status status;                  // not OK: the reader failed here and stopped
  };

  explicit WebDatasetLoader(WebDatasetOptions options);
  void StartReader();
  void StopReader();
  void ReadLoop();

  WebDatasetOptions options_;
  std::set<std::string> skip_warned_;                  // the streams' ShardStream::skip_warned
  std::vector<std::unique_ptr<ShardStream>> streams_;  // owned streams: k = rank + world * index
  std::vector<StreamCursor> consumed_;  // each owned stream's cursor after its last consumed window
  std::vector<bool> restore_pending_;   // the reader must restore that stream first
  int64_t local_consumed_ = 0;
  absl::Status failed_;

  size_t queue_capacity_;  // windows
  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<Window> queue_;
  // Set under mu_; also options_.stream.source.stop, so a stop ends a read waiting on a shard.
  std::atomic<bool> stop_{false};
  std::thread reader_;
};

// Serialises and parses the per-stream cursors kept in LoaderState::cursor.
std::string EncodeStreamCursors(int num_streams, const std::vector<int>& streams,
                                const std::vector<StreamCursor>& cursors);
absl::Status DecodeStreamCursors(const std::string& text, int* num_streams,
                                 std::vector<int>* streams, std::vector<StreamCursor>* cursors);

// Validation data from shards: one stream over `config.urls` in order (no shuffle, one pass,
// config.num_streams must be 1), windows cached in memory as evaluation first reads them, so
// every evaluation sees the same batches. Each Next(count) covers the next count * world windows;
// rank r gets the r-th count of them.
class WebDatasetValidationLoader final : public ValidationLoader {
 public:
  WebDatasetValidationLoader(StreamConfig config, int rank, int world);

  void Reset() override { next_window_ = 0; }
  absl::StatusOr<int> Next(int count, int32_t* inputs, int32_t* targets) override;
  absl::StatusOr<bool> Ended() override;

 private:
  // Reads windows from the stream until `count` are cached or it ends.
  absl::Status Cache(int64_t count);

  StreamConfig config_;
  ShardStream stream_;
  int rank_;
  int world_;
  std::vector<std::vector<int32_t>> windows_;  // inputs then targets, in order
  bool ended_ = false;
  int64_t next_window_ = 0;
};

}  // namespace dtrain
