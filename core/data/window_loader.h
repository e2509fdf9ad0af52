// SequenceLoaders over a token array held in memory.
//
// Windows: the array is cut into windows of seq_len + 1 tokens with stride seq_len, so window w
// holds tokens [w * seq_len, (w + 1) * seq_len]; neighbours share one boundary token, every token
// after the first is a target exactly once per epoch, and the last (n - 1) % seq_len tokens are
// never targets. There are (n - 1) / seq_len windows; fewer than one is an error.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/data/loader.h"
#include "core/data/sft_data.h"

namespace dtrain {

// The training order of `rows` fixed sequences (windows of a token array, packed SFT rows) for
// rank `rank` of `world` data-parallel ranks, as described for ShuffledWindowLoader below.
class ShuffledOrder {
 public:
  // global_batch splits into world shares (CheckBatchShares).
  ShuffledOrder(int64_t rows, uint64_t seed, int global_batch, int rank, int world);

  // The global index of this rank's local_index-th sequence (counting from 0 at start()).
  int64_t GlobalIndex(int64_t local_index) const;
  // The row that global sequence `global_index` reads.
  int64_t RowOf(int64_t global_index);
  // Steps start at global sequence `consumed` (a resumed run's; 0 at first), whatever the batch
  // that consumed them: a run resumed with another train.batch_size or data-parallel width reads
  // on from the next unread sequence.
  void StartAt(int64_t consumed) { start_ = consumed; }
  int64_t start() const { return start_; }

 private:
  int64_t rows_;
  uint64_t seed_;
  int64_t global_batch_;
  int64_t rank_batch_;  // global_batch / world
  int rank_;
  int64_t start_ = 0;
  int64_t perm_epoch_ = -1;  // the epoch whose permutation perm_ holds
  std::vector<int64_t> perm_;
};

// Training order: the sequence with global index g is window perm(seed, epoch)[g % num_windows]
// with epoch = g / num_windows, perm a Fisher-Yates shuffle drawn from CounterRng(seed, epoch).
// Each optimizer step reads global_batch sequences: rank r of world W reads global indices
// [start + step * global_batch + r * global_batch / W, ... + global_batch / W), start being the
// sequences consumed before a resume (of any batch size), in calls to Next of any
// size; so the ranks of a step together read the single-process step's sequences, each rank the
// same count (no rank runs dry at an epoch end).
class ShuffledWindowLoader final : public SequenceLoader {
 public:
  // `source` names the data in error messages. Errors: too few tokens for one window, or
  // global_batch not a positive multiple of world.
  static absl::StatusOr<std::unique_ptr<ShuffledWindowLoader>> Create(std::vector<int32_t> tokens,
                                                                      int seq_len, uint64_t seed,
                                                                      int global_batch, int rank,
                                                                      int world,
                                                                      const std::string& source);

  absl::Status Next(int count, int32_t* inputs, int32_t* targets) override;
  LoaderState state() const override;
  absl::Status Restore(const LoaderState& state) override;

  int64_t num_windows() const { return num_windows_; }
  // The global index of this rank's local_index-th sequence since the start or the restore.
  int64_t GlobalIndex(int64_t local_index) const { return order_.GlobalIndex(local_index); }
  // The window that global sequence `global_index` reads.
  int64_t WindowOf(int64_t global_index) { return order_.RowOf(global_index); }

 private:
  ShuffledWindowLoader(std::vector<int32_t> tokens, int seq_len, uint64_t seed, int global_batch,
                       int rank, int world);

  std::vector<int32_t> tokens_;
  int seq_len_;
  int64_t num_windows_;
  ShuffledOrder order_;
  int world_;
  int64_t local_consumed_ = 0;
};

// Validation order: windows in sequence, no shuffle, each read once. Each Next(count) call
// covers the next count * world windows; rank r gets the r-th count of them (fewer or none past
// the last window).
class SequentialWindowLoader final : public ValidationLoader {
 public:
  static absl::StatusOr<std::unique_ptr<SequentialWindowLoader>> Create(std::vector<int32_t> tokens,
                                                                        int seq_len, int rank,
                                                                        int world,
                                                                        const std::string& source);

  void Reset() override { next_window_ = 0; }
  absl::StatusOr<int> Next(int count, int32_t* inputs, int32_t* targets) override;
  absl::StatusOr<bool> Ended() override { return next_window_ >= num_windows_; }

  int64_t num_windows() const { return num_windows_; }

 private:
  SequentialWindowLoader(std::vector<int32_t> tokens, int seq_len, int rank, int world);

  std::vector<int32_t> tokens_;
  int seq_len_;
  int64_t num_windows_;
  int rank_;
  int world_;
  int64_t next_window_ = 0;  // first window of the next call, all ranks together
};

// Document data: SFT rows (sft_data.h) in ShuffledWindowLoader's order, rows in place of windows.
// Next is an error: the rows need their positions (NextDocuments).
class ShuffledRowLoader final : public SequenceLoader {
 public:
  // Errors: no rows, or global_batch not a positive multiple of world.
  static absl::StatusOr<std::unique_ptr<ShuffledRowLoader>> Create(SftRows rows, uint64_t seed,
                                                                   int global_batch, int rank,
                                                                   int world,
                                                                   const std::string& source);

  absl::Status Next(int count, int32_t* inputs, int32_t* targets) override;
  bool documents() const override { return true; }
  absl::Status NextDocuments(int count, int32_t* inputs, int32_t* targets,
                             int32_t* positions) override;
  LoaderState state() const override { return {order_.start() + local_consumed_ * world_}; }
  absl::Status Restore(const LoaderState& state) override;

 private:
  ShuffledRowLoader(SftRows rows, uint64_t seed, int global_batch, int rank, int world);

  SftRows rows_;
  ShuffledOrder order_;
  int world_;
  int64_t local_consumed_ = 0;
};

// Validation over SFT rows, in SequentialWindowLoader's order.
class SequentialRowLoader final : public ValidationLoader {
 public:
  static absl::StatusOr<std::unique_ptr<SequentialRowLoader>> Create(SftRows rows, int rank,
                                                                     int world,
                                                                     const std::string& source);

  void Reset() override { next_row_ = 0; }
  absl::StatusOr<int> Next(int count, int32_t* inputs, int32_t* targets) override;
  absl::StatusOr<bool> Ended() override { return next_row_ >= rows_.rows; }
  bool documents() const override { return true; }
  absl::StatusOr<int> NextDocuments(int count, int32_t* inputs, int32_t* targets,
                                    int32_t* positions) override;

 private:
  SequentialRowLoader(SftRows rows, int rank, int world)
      : rows_(std::move(rows)), rank_(rank), world_(world) {}

  SftRows rows_;
  int rank_;
  int world_;
  int64_t next_row_ = 0;
};

}  // namespace dtrain
