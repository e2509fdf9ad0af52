#include "core/data/webdataset_loader.h"

#include <sys/resource.h>

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/util/status.h"

namespace dtrain {
namespace {

constexpr char kCursorTag[] = "wds1";  // bump when the line's fields change

// Windows stream k of K has emitted once `consumed` global sequences are consumed.
int64_t StreamWindows(int64_t consumed, int k, int num_streams) {
  return consumed > k ? (consumed - k + num_streams - 1) / num_streams : 0;
}

}  // namespace

// ---- cursor text ------------------------------------------------------------------------------

// One line per stream: "wds1 K k windows block block_slot block_sample next offset skipped
// carry...".
std::string EncodeStreamCursors(int num_streams, const std::vector<int>& streams,
                                const std::vector<StreamCursor>& cursors) {
  std::string text;
  for (size_t i = 0; i < streams.size(); ++i) {
    const StreamCursor& c = cursors[i];
    absl::StrAppend(&text, kCursorTag, " ", num_streams, " ", streams[i], " ", c.windows, " ",
                    c.block, " ", c.block_slot, " ", c.block_sample, " ", c.next, " ", c.offset,
                    " ", c.skipped_shards);
    for (const int32_t token : c.carry) absl::StrAppend(&text, " ", token);
    text += "\n";
  }
  return text;
}

absl::Status DecodeStreamCursors(const std::string& text, int* num_streams,
                                 std::vector<int>* streams, std::vector<StreamCursor>* cursors) {
  *num_streams = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const std::vector<absl::string_view> fields = absl::StrSplit(line, ' ');
    int64_t values[9] = {};
    bool ok = fields.size() >= 10 && fields[0] == kCursorTag;
    for (size_t i = 0; ok && i < 9; ++i) ok = absl::SimpleAtoi(fields[i + 1], &values[i]);
    StreamCursor cursor{.windows = values[2],
                        .block = values[3],
                        .block_slot = values[4],
                        .block_sample = values[5],
                        .next = values[6],
                        .offset = values[7],
                        .skipped_shards = values[8]};
    for (size_t i = 10; ok && i < fields.size(); ++i) {
      int32_t token = 0;
      ok = absl::SimpleAtoi(fields[i], &token);
      cursor.carry.push_back(token);
    }
    if (!ok || values[0] <= 0 || (*num_streams != 0 && values[0] != *num_streams)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data loader cursor line '", line, "' is not a ", kCursorTag,
          " stream cursor of one run; restore from a checkpoint written by this dtrain"));
    }
    *num_streams = static_cast<int>(values[0]);
    streams->push_back(static_cast<int>(values[1]));
    cursors->push_back(std::move(cursor));
  }
  return absl::OkStatus();
}

// ---- WebDatasetLoader -------------------------------------------------------------------------

WebDatasetLoader::WebDatasetLoader(WebDatasetOptions options) : options_(std::move(options)) {
  options_.stream.source.stop = &stop_;
  const int owned = options_.stream.num_streams / options_.world;
  for (int i = 0; i < owned; ++i) {
    streams_.push_back(std::make_unique<ShardStream>(
        &options_.stream, options_.rank + options_.world * i, &skip_warned_));
    StreamCursor initial;
    initial.block_slot = options_.rank + options_.world * i;
    consumed_.push_back(initial);
  }
  restore_pending_.assign(static_cast<size_t>(owned), false);
  const int64_t window_bytes = int64_t{2} * options_.stream.seq_len * sizeof(int32_t);
  queue_capacity_ =
      static_cast<size_t>(std::max<int64_t>(2, options_.read_ahead_bytes / window_bytes));
}

absl::Status CheckStreamsSplit(int num_streams, int world) {
  if (num_streams % world != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.streams = ", num_streams, " is not a multiple of the ", world,
        " data-parallel ranks; each rank owns whole streams, so make data.streams a multiple "
        "(it fixes the data order, so keep it when the world size changes)"));
  }
  // Each stream keeps a shard open; half the open-file limit leaves the rest to the sockets,
  // the checkpoint's files and the libraries. A soft limit below that is raised as far as the
  // hard one allows, as `ulimit -n` in the job script could (Debian's soft default is 1,024).
  const rlim_t needed = 2 * static_cast<rlim_t>(num_streams / world);
  struct rlimit files;
  if (::getrlimit(RLIMIT_NOFILE, &files) != 0 || files.rlim_cur == RLIM_INFINITY ||
      needed <= files.rlim_cur) {
    return absl::OkStatus();
  }
  struct rlimit raised = files;
  raised.rlim_cur = files.rlim_max == RLIM_INFINITY ? needed : std::min(needed, files.rlim_max);
  if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) files = raised;
  if (needed <= files.rlim_cur) return absl::OkStatus();
  // Under an unlimited hard limit, the kernel's fs.nr_open refused the raise.
  const bool unlimited = files.rlim_max == RLIM_INFINITY;
  return absl::InvalidArgumentError(absl::StrCat(
      "data.streams = ", num_streams, " gives each of the ", world, " data-parallel ranks ",
      num_streams / world, " streams, each with a shard open, and a process may open ",
      files.rlim_cur, " files (ulimit -n; ",
      unlimited ? "the kernel's fs.nr_open caps it"
                : absl::StrCat("its hard limit, ulimit -Hn, is ", files.rlim_max),
      "): lower data.streams, or raise ", unlimited ? "fs.nr_open" : "the hard limit",
      " to at least ", needed));
}

absl::StatusOr<std::unique_ptr<WebDatasetLoader>> WebDatasetLoader::Create(
    WebDatasetOptions options) {
  const StreamConfig& config = options.stream;
  if (config.urls.empty()) {
    return absl::InvalidArgumentError("data.shards names no shards; give a URL pattern");
  }
  if (options.world <= 0 || options.rank < 0 || options.rank >= options.world) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " is not in a world of ", options.world));
  }
  RETURN_IF_ERROR(CheckStreamsSplit(config.num_streams, options.world));
  RETURN_IF_ERROR(CheckBatchShares(options.global_batch, options.world));
  if (config.seq_len <= 0 || config.block_samples <= 0) {
    return absl::InvalidArgumentError("seq_len and the shuffle block must be positive");
  }
  return std::unique_ptr<WebDatasetLoader>(new WebDatasetLoader(std::move(options)));
}

WebDatasetLoader::~WebDatasetLoader() { StopReader(); }

void WebDatasetLoader::StartReader() {
  stop_ = false;
  reader_ = std::thread([this] { ReadLoop(); });
}

void WebDatasetLoader::StopReader() {
  if (!reader_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  changed_.notify_all();
  reader_.join();
  queue_.clear();
}

void WebDatasetLoader::ReadLoop() {
  const int world = options_.world;
  const int num_streams = options_.stream.num_streams;
  const int seq_len = options_.stream.seq_len;
  for (int64_t local = local_consumed_;; ++local) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      changed_.wait(lock, [&] { return stop_ || queue_.size() < queue_capacity_; });
      if (stop_) return;
    }
    const int64_t global = local * world + options_.rank;
    const int owned = static_cast<int>(global % num_streams) / world;
    ShardStream& stream = *streams_[static_cast<size_t>(owned)];
    Window window;
    window.owned_stream = owned;
    if (restore_pending_[static_cast<size_t>(owned)]) {
      window.status = stream.Restore(consumed_[static_cast<size_t>(owned)]);
      restore_pending_[static_cast<size_t>(owned)] = false;
    }
    if (window.status.ok()) {
      window.inputs_targets.resize(2 * static_cast<size_t>(seq_len));
      window.status =
          stream.Next(window.inputs_targets.data(), window.inputs_targets.data() + seq_len);
      if (absl::IsOutOfRange(window.status)) {
        window.status = absl::InternalError("an endless data stream ended");
      }
    }
    window.cursor = stream.cursor();
    const bool failed = !window.status.ok();
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(window));
    }
    changed_.notify_all();
    if (failed) return;
  }
}

absl::Status WebDatasetLoader::Next(int count, int32_t* inputs, int32_t* targets) {
  if (count < 0) return absl::InvalidArgumentError(absl::StrCat("Next(count = ", count, ")"));
  RETURN_IF_ERROR(failed_);
  if (!reader_.joinable()) StartReader();
  const size_t seq_len = static_cast<size_t>(options_.stream.seq_len);
  for (int i = 0; i < count; ++i) {
    Window window;
    {
      std::unique_lock<std::mutex> lock(mu_);
      changed_.wait(lock, [&] { return !queue_.empty(); });
      // The reader failed ahead (it stops there): the run fails now, not after training on the
      // windows read before, up to data.read_ahead_mb (minutes of steps that no checkpoint
      // keeps). The cursor stays at the windows consumed.
      if (!queue_.back().status.ok()) {
        failed_ = queue_.back().status;
        return failed_;
      }
      window = std::move(queue_.front());
      queue_.pop_front();
    }
    changed_.notify_all();
    std::copy_n(window.inputs_targets.data(), seq_len, inputs + i * seq_len);
    std::copy_n(window.inputs_targets.data() + seq_len, seq_len, targets + i * seq_len);
    consumed_[static_cast<size_t>(window.owned_stream)] = std::move(window.cursor);
    ++local_consumed_;
  }
  return absl::OkStatus();
}

bool WebDatasetLoader::WaitReady(int count, absl::Duration timeout) {
  if (!failed_.ok()) return true;
  if (!reader_.joinable()) StartReader();
  const size_t ready = std::min(static_cast<size_t>(std::max(count, 0)), queue_capacity_);
  std::unique_lock<std::mutex> lock(mu_);
  return changed_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] {
    return queue_.size() >= ready || (!queue_.empty() && !queue_.back().status.ok());
  });
}

LoaderState WebDatasetLoader::state() const {
  std::vector<int> streams;
  for (size_t i = 0; i < streams_.size(); ++i) {
    streams.push_back(options_.rank + options_.world * static_cast<int>(i));
  }
  return {local_consumed_ * options_.world,
          EncodeStreamCursors(options_.stream.num_streams, streams, consumed_)};
}

ShardCounts WebDatasetLoader::shard_counts() const {
  ShardCounts total;
  for (const std::unique_ptr<ShardStream>& stream : streams_) {
    const ShardCounts counts = stream->counts();
    total.read += counts.read;
    total.skipped += counts.skipped;
  }
  return total;
}

absl::Status WebDatasetLoader::Restore(const LoaderState& state) {
  const int world = options_.world;
  const int num_streams = options_.stream.num_streams;
  if (state.consumed_sequences < 0 || state.consumed_sequences % world != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the checkpoint's data order consumed ", state.consumed_sequences, " sequences, which ",
        world,
        " data-parallel ranks cannot continue: the WebDataset streams go on only on a "
        "data-parallel width that divides the sequences consumed; resume on such a width, or "
        "from a checkpoint whose count this one divides"));
  }
  int saved_streams = 0;
  std::vector<int> streams;
  std::vector<StreamCursor> cursors;
  RETURN_IF_ERROR(DecodeStreamCursors(state.cursor, &saved_streams, &streams, &cursors));
  if (saved_streams != 0 && saved_streams != num_streams) {
    // The widths that continue it: each rank owns whole streams and the same share of the
    // sequences consumed.
    std::vector<int> widths;
    for (int width = 1; width <= saved_streams; ++width) {
      if (saved_streams % width == 0 && state.consumed_sequences % width == 0) {
        widths.push_back(width);
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat("the checkpoint's data order has data.streams = ", saved_streams,
                     ", this run ", num_streams, "; set data.streams: ", saved_streams,
                     " to continue the same order, on a data-parallel width of ",
                     absl::StrJoin(widths, ", "), " ranks"));
  }
  std::vector<StreamCursor> next(streams_.size());
  for (size_t i = 0; i < streams_.size(); ++i) {
    const int k = options_.rank + world * static_cast<int>(i);
    const int64_t expected = StreamWindows(state.consumed_sequences, k, num_streams);
    const auto found = std::find(streams.begin(), streams.end(), k);
    if (found == streams.end()) {
      if (expected != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the data loader state has no cursor for stream ", k, ", which rank ", options_.rank,
            " now reads; restore from MergeLoaderStates of every saved rank"));
      }
      next[i].block_slot = k;
      continue;
    }
    next[i] = cursors[static_cast<size_t>(found - streams.begin())];
    if (next[i].windows != expected) {
      return absl::InvalidArgumentError(
          absl::StrCat("data stream ", k, "'s cursor is at window ", next[i].windows, " but ",
                       state.consumed_sequences, " consumed sequences put it at ", expected,
                       "; the states come from different steps"));
    }
  }
  StopReader();
  failed_ = absl::OkStatus();
  consumed_ = std::move(next);
  restore_pending_.assign(streams_.size(), true);
  local_consumed_ = state.consumed_sequences / world;
  return absl::OkStatus();
}

// ---- WebDatasetValidationLoader ---------------------------------------------------------------

WebDatasetValidationLoader::WebDatasetValidationLoader(StreamConfig config, int rank, int world)
    : config_(std::move(config)),
      stream_(&config_, 0, /*skip_warned=*/nullptr),
      rank_(rank),
      world_(world) {}

absl::StatusOr<int> WebDatasetValidationLoader::Next(int count, int32_t* inputs, int32_t* targets) {
  if (count < 0) return absl::InvalidArgumentError(absl::StrCat("Next(count = ", count, ")"));
  const size_t seq_len = static_cast<size_t>(config_.seq_len);
  const int64_t first = next_window_ + int64_t{rank_} * count;
  RETURN_IF_ERROR(Cache(first + count));
  const int rows = static_cast<int>(
      std::clamp<int64_t>(static_cast<int64_t>(windows_.size()) - first, 0, count));
  for (int i = 0; i < rows; ++i) {
    const std::vector<int32_t>& window = windows_[static_cast<size_t>(first + i)];
    std::copy_n(window.data(), seq_len, inputs + i * seq_len);
    std::copy_n(window.data() + seq_len, seq_len, targets + i * seq_len);
  }
  next_window_ += int64_t{count} * world_;
  return rows;
}

absl::StatusOr<bool> WebDatasetValidationLoader::Ended() {
  RETURN_IF_ERROR(Cache(next_window_ + 1));
  return static_cast<int64_t>(windows_.size()) <= next_window_;
}

absl::Status WebDatasetValidationLoader::Cache(int64_t count) {
  const size_t seq_len = static_cast<size_t>(config_.seq_len);
  while (!ended_ && static_cast<int64_t>(windows_.size()) < count) {
    std::vector<int32_t> window(2 * seq_len);
    const absl::Status status = stream_.Next(window.data(), window.data() + seq_len);
    if (absl::IsOutOfRange(status)) {
      ended_ = true;
      break;
    }
    RETURN_IF_ERROR(status);
    windows_.push_back(std::move(window));
  }
  return absl::OkStatus();
}

}  // namespace dtrain
