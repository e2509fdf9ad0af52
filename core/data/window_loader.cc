#include "core/data/window_loader.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/util/exit_codes.h"
#include "core/util/rng.h"
#include "core/util/status.h"

namespace dtrain {
namespace {

// Data-order streams of the run seed start here, one per epoch, apart from other users' streams.
constexpr uint64_t kDataOrderStream = 0x64617461ULL << 32;  // "data"

absl::Status CheckHasWindow(size_t num_tokens, int seq_len, const std::string& source) {
  if (seq_len <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": seq_len ", seq_len, " must be positive"));
  }
  // Data a restart would read the same: exit 2.
  if (num_tokens < static_cast<size_t>(seq_len) + 1) {
    return WithExitCode(absl::InvalidArgumentError(absl::StrCat(
                            source, ": ", num_tokens,
                            " tokens is fewer than one window of train.seq_len + 1 = ", seq_len + 1,
                            "; add data or lower train.seq_len")),
                        kExitUsage);
  }
  return absl::OkStatus();
}

absl::Status CheckRankAndWorld(int rank, int world, const std::string& source) {
  if (world <= 0 || rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": rank ", rank, " is not in a world of ", world));
  }
  return absl::OkStatus();
}

absl::Status CheckCount(int count) {
  if (count < 0) return absl::InvalidArgumentError(absl::StrCat("Next(count = ", count, ")"));
  return absl::OkStatus();
}

absl::Status CheckRestore(const LoaderState& state) {
  if (state.consumed_sequences < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data loader state of ", state.consumed_sequences, " consumed sequences is negative"));
  }
  return absl::OkStatus();
}

// Row `row` of `rows` into the three (seq_len) outputs.
void CopyRow(const SftRows& rows, int64_t row, int32_t* inputs, int32_t* targets,
             int32_t* positions) {
  const size_t begin = static_cast<size_t>(row) * rows.seq_len;
  const size_t end = begin + rows.seq_len;
  std::copy(rows.inputs.begin() + begin, rows.inputs.begin() + end, inputs);
  std::copy(rows.targets.begin() + begin, rows.targets.begin() + end, targets);
  std::copy(rows.positions.begin() + begin, rows.positions.begin() + end, positions);
}

absl::Status CheckHasRow(const SftRows& rows, const std::string& source) {
  if (rows.rows == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": no SFT sample fits a sequence of train.seq_len = ", rows.seq_len, " (",
        rows.skipped, " skipped); raise train.seq_len or set data.on_long_sample: truncate"));
  }
  return absl::OkStatus();
}

absl::Status NeedsPositions() {
  return absl::FailedPreconditionError(
      "SFT rows pack documents: read them with NextDocuments, which gives their positions");
}

void CopyWindow(const std::vector<int32_t>& tokens, int seq_len, int64_t window, int32_t* inputs,
                int32_t* targets) {
  const int32_t* start = tokens.data() + window * seq_len;
  std::copy(start, start + seq_len, inputs);
  std::copy(start + 1, start + seq_len + 1, targets);
}

}  // namespace

// ---- ShuffledWindowLoader ---------------------------------------------------------------------

// ---- ShuffledOrder ----------------------------------------------------------------------------

ShuffledOrder::ShuffledOrder(int64_t rows, uint64_t seed, int global_batch, int rank, int world)
    : rows_(rows),
      seed_(seed),
      global_batch_(global_batch),
      rank_batch_(global_batch / world),
      rank_(rank) {}

int64_t ShuffledOrder::GlobalIndex(int64_t local_index) const {
  const int64_t step = local_index / rank_batch_;
  return start_ + step * global_batch_ + rank_ * rank_batch_ + local_index % rank_batch_;
}

int64_t ShuffledOrder::RowOf(int64_t global_index) {
  const int64_t epoch = global_index / rows_;
  if (epoch != perm_epoch_) {
    // Fisher-Yates from the end; the draws depend on (seed, epoch) only.
    perm_.resize(static_cast<size_t>(rows_));
    std::iota(perm_.begin(), perm_.end(), int64_t{0});
    CounterRng rng(seed_, kDataOrderStream + static_cast<uint64_t>(epoch));
    for (int64_t i = rows_ - 1; i > 0; --i) {
      std::swap(perm_[i], perm_[rng.below(static_cast<uint64_t>(i) + 1)]);
    }
    perm_epoch_ = epoch;
  }
  return perm_[global_index % rows_];
}

// ---- ShuffledWindowLoader ---------------------------------------------------------------------

ShuffledWindowLoader::ShuffledWindowLoader(std::vector<int32_t> tokens, int seq_len, uint64_t seed,
                                           int global_batch, int rank, int world)
    : tokens_(std::move(tokens)),
      seq_len_(seq_len),
      num_windows_(static_cast<int64_t>((tokens_.size() - 1) / seq_len)),
      order_(num_windows_, seed, global_batch, rank, world),
      world_(world) {}

absl::StatusOr<std::unique_ptr<ShuffledWindowLoader>> ShuffledWindowLoader::Create(
    std::vector<int32_t> tokens, int seq_len, uint64_t seed, int global_batch, int rank, int world,
    const std::string& source) {
  RETURN_IF_ERROR(CheckHasWindow(tokens.size(), seq_len, source));
  RETURN_IF_ERROR(CheckRankAndWorld(rank, world, source));
  RETURN_IF_ERROR(CheckBatchShares(global_batch, world));
  return std::unique_ptr<ShuffledWindowLoader>(
      new ShuffledWindowLoader(std::move(tokens), seq_len, seed, global_batch, rank, world));
}

absl::Status ShuffledWindowLoader::Next(int count, int32_t* inputs, int32_t* targets) {
  RETURN_IF_ERROR(CheckCount(count));
  for (int i = 0; i < count; ++i) {
    const int64_t window = WindowOf(GlobalIndex(local_consumed_ + i));
    CopyWindow(tokens_, seq_len_, window, inputs + int64_t{i} * seq_len_,
               targets + int64_t{i} * seq_len_);
  }
  local_consumed_ += count;
  return absl::OkStatus();
}

LoaderState ShuffledWindowLoader::state() const {
  // Ranks advance in lockstep, so all of them together consumed world times this rank's count.
  return {order_.start() + local_consumed_ * world_};
}

absl::Status ShuffledWindowLoader::Restore(const LoaderState& state) {
  RETURN_IF_ERROR(CheckRestore(state));
  order_.StartAt(state.consumed_sequences);
  local_consumed_ = 0;
  return absl::OkStatus();
}

// ---- SequentialWindowLoader -------------------------------------------------------------------

SequentialWindowLoader::SequentialWindowLoader(std::vector<int32_t> tokens, int seq_len, int rank,
                                               int world)
    : tokens_(std::move(tokens)),
      seq_len_(seq_len),
      num_windows_(static_cast<int64_t>((tokens_.size() - 1) / seq_len)),
      rank_(rank),
      world_(world) {}

absl::StatusOr<std::unique_ptr<SequentialWindowLoader>> SequentialWindowLoader::Create(
    std::vector<int32_t> tokens, int seq_len, int rank, int world, const std::string& source) {
  RETURN_IF_ERROR(CheckHasWindow(tokens.size(), seq_len, source));
  RETURN_IF_ERROR(CheckRankAndWorld(rank, world, source));
  return std::unique_ptr<SequentialWindowLoader>(
      new SequentialWindowLoader(std::move(tokens), seq_len, rank, world));
}

absl::StatusOr<int> SequentialWindowLoader::Next(int count, int32_t* inputs, int32_t* targets) {
  RETURN_IF_ERROR(CheckCount(count));
  const int64_t first = next_window_ + int64_t{rank_} * count;
  const int rows = static_cast<int>(std::clamp<int64_t>(num_windows_ - first, 0, count));
  for (int i = 0; i < rows; ++i) {
    CopyWindow(tokens_, seq_len_, first + i, inputs + int64_t{i} * seq_len_,
               targets + int64_t{i} * seq_len_);
  }
  next_window_ += int64_t{count} * world_;
  return rows;
}

// ---- ShuffledRowLoader ------------------------------------------------------------------------

ShuffledRowLoader::ShuffledRowLoader(SftRows rows, uint64_t seed, int global_batch, int rank,
                                     int world)
    : rows_(std::move(rows)), order_(rows_.rows, seed, global_batch, rank, world), world_(world) {}

absl::StatusOr<std::unique_ptr<ShuffledRowLoader>> ShuffledRowLoader::Create(
    SftRows rows, uint64_t seed, int global_batch, int rank, int world, const std::string& source) {
  RETURN_IF_ERROR(CheckHasRow(rows, source));
  RETURN_IF_ERROR(CheckRankAndWorld(rank, world, source));
  RETURN_IF_ERROR(CheckBatchShares(global_batch, world));
  return std::unique_ptr<ShuffledRowLoader>(
      new ShuffledRowLoader(std::move(rows), seed, global_batch, rank, world));
}

absl::Status ShuffledRowLoader::Next(int, int32_t*, int32_t*) { return NeedsPositions(); }

absl::Status ShuffledRowLoader::NextDocuments(int count, int32_t* inputs, int32_t* targets,
                                              int32_t* positions) {
  RETURN_IF_ERROR(CheckCount(count));
  const int64_t t = rows_.seq_len;
  for (int i = 0; i < count; ++i) {
    const int64_t row = order_.RowOf(order_.GlobalIndex(local_consumed_ + i));
    CopyRow(rows_, row, inputs + i * t, targets + i * t, positions + i * t);
  }
  local_consumed_ += count;
  return absl::OkStatus();
}

absl::Status ShuffledRowLoader::Restore(const LoaderState& state) {
  RETURN_IF_ERROR(CheckRestore(state));
  order_.StartAt(state.consumed_sequences);
  local_consumed_ = 0;
  return absl::OkStatus();
}

// ---- SequentialRowLoader ----------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<SequentialRowLoader>> SequentialRowLoader::Create(
    SftRows rows, int rank, int world, const std::string& source) {
  RETURN_IF_ERROR(CheckHasRow(rows, source));
  RETURN_IF_ERROR(CheckRankAndWorld(rank, world, source));
  return std::unique_ptr<SequentialRowLoader>(
      new SequentialRowLoader(std::move(rows), rank, world));
}

absl::StatusOr<int> SequentialRowLoader::Next(int, int32_t*, int32_t*) { return NeedsPositions(); }

absl::StatusOr<int> SequentialRowLoader::NextDocuments(int count, int32_t* inputs, int32_t* targets,
                                                       int32_t* positions) {
  RETURN_IF_ERROR(CheckCount(count));
  const int64_t first = next_row_ + int64_t{rank_} * count;
  const int rows = static_cast<int>(std::clamp<int64_t>(rows_.rows - first, 0, count));
  const int64_t t = rows_.seq_len;
  for (int i = 0; i < rows; ++i) {
    CopyRow(rows_, first + i, inputs + i * t, targets + i * t, positions + i * t);
  }
  next_row_ += int64_t{count} * world_;
  return rows;
}

}  // namespace dtrain
