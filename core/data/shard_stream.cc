#include "core/data/shard_stream.h"

#include <numeric>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/data/token_decode.h"
#include "core/util/exit_codes.h"
#include "core/util/log.h"
#include "core/util/rng.h"
#include "core/util/status.h"

namespace dtrain {
namespace {

// CounterRng streams of the run seed, apart from the window loader's "data" streams.
constexpr uint64_t kShardOrderTag = 0x73687264ULL << 32;  // "shrd" + pass
constexpr uint64_t kBlockOrderTag = 0x626c636bULL << 32;  // "blck", hashed with stream and block

// How long a shard that failed before its first token is skipped unread (data.on_error
// skip_shard) before it is tried again.
constexpr absl::Duration kDeadShardRetry = absl::Minutes(10);

absl::Status WithShard(const absl::Status& status, const std::string& url) {
  if (status.ok() || absl::StrContains(status.message(), url)) return status;
  return Renamed(status, absl::StrCat("shard ", url, ": ", status.message()));
}

}  // namespace

absl::Status WithSkipShardHint(const absl::Status& error) {
  if (ExitCodeOf(error) == kExitUsage) return error;
  return Renamed(
      error, absl::StrCat(error.message(), " (data.on_error: skip_shard would skip this shard)"));
}

ShardStream::ShardStream(const StreamConfig* config, int stream, std::set<std::string>* skip_warned)
    : config_(config),
      stream_(stream),
      packer_(config->seq_len, config->eos_id),
      slot_(stream),
      skip_warned_(skip_warned) {
  cursor_.block_slot = stream;
}

const std::string& ShardStream::UrlOfSlot(int64_t slot) {
  const int64_t n = static_cast<int64_t>(config_->urls.size());
  int64_t pass = slot / n;
  if (config_->epochs > 0) pass %= config_->epochs;  // repeat the passes, same orders
  if (!config_->shard_shuffle) return config_->urls[static_cast<size_t>(slot % n)];
  if (pass != perm_pass_) {
    perm_.resize(static_cast<size_t>(n));
    std::iota(perm_.begin(), perm_.end(), int64_t{0});
    CounterRng rng(config_->seed, kShardOrderTag + static_cast<uint64_t>(pass));
    for (int64_t i = n - 1; i > 0; --i) {
      std::swap(perm_[i], perm_[rng.below(static_cast<uint64_t>(i) + 1)]);
    }
    perm_pass_ = pass;
  }
  return config_->urls[static_cast<size_t>(perm_[slot % n])];
}

absl::Status ShardStream::OpenSlot() {
  const int64_t n = static_cast<int64_t>(config_->urls.size());
  if (config_->epochs > 0 && slot_ >= config_->epochs * n) {
    if (config_->finite) return absl::OutOfRangeError("end of data");
    if (!wrap_logged_ && cursor_.windows == 0) {
      LogInfo(
          "data stream %d has no shard of its own in data.epochs = %d passes over %d shards; it "
          "reads the passes' shards again, as other streams do, so every rank keeps the same "
          "number of batches",
          stream_, config_->epochs, n);
    } else if (!wrap_logged_) {
      LogInfo(
          "data stream %d finished data.epochs = %d passes after %d windows; repeating them "
          "so every rank keeps the same number of batches",
          stream_, config_->epochs, cursor_.windows);
    }
    wrap_logged_ = true;
  }
  const std::string& url = UrlOfSlot(slot_);
  if (const auto dead = dead_shards_.find(url);
      dead != dead_shards_.end() && absl::Now() < dead->second.until) {
    skipped_unread_ = true;
    return Renamed(dead->second.error,
                   absl::StrCat(dead->second.error.message(), " (not read again for ",
                                absl::FormatDuration(kDeadShardRetry), " after that failure)"));
  }
  ASSIGN_OR_RETURN(source_, OpenShard(url, config_->source));
  reader_ = std::make_unique<TarReader>(source_.get());
  grouper_ = std::make_unique<SampleGrouper>(reader_.get());
  return absl::OkStatus();
}

void ShardStream::CloseSlot() {
  grouper_.reset();
  reader_.reset();
  source_.reset();
  slot_ += config_->num_streams;
  slot_samples_ = slot_decoded_ = slot_tokens_ = 0;
}

absl::Status ShardStream::ShardFailed(const absl::Status& status) {
  if (absl::IsCancelled(status)) return status;  // the loader stopped reading: no shard failed
  const std::string& url = UrlOfSlot(slot_);
  const absl::Status error = WithShard(status, url);
  // The recipe's or the data's mistake (SFT shards, a malformed URL, another tokenizer's ids),
  // which skipping would hide: no shard of it is bad on its own.
  if (!config_->skip_bad_shards || ExitCodeOf(error) == kExitUsage) {
    return WithSkipShardHint(error);
  }
  ++cursor_.skipped_shards;
  ++shards_skipped_;
  if (skip_warned_->insert(url).second) {
    LogWarn(
        "data.on_error skip_shard: skipping shard %s (data stream %d, pass %d) after %d "
        "samples: %s; %d shards skipped by this stream so far (later reads of it, by any "
        "stream of this rank, skip it without a warning if it fails again%s)",
        url, stream_, slot_ / static_cast<int64_t>(config_->urls.size()), slot_samples_,
        error.message(), cursor_.skipped_shards,
        GaveProgress()
            ? ""
            : absl::StrCat(", and without reading it for ", absl::FormatDuration(kDeadShardRetry)));
  }
  // A shard that gave tokens before it failed is progress: a single partly readable shard trains
  // on what it holds. Samples without tokens are none (shards of them, each cut off, looped
  // forever).
  const bool unread = std::exchange(skipped_unread_, false);
  if (!GaveProgress()) {
    if (unread) {
      unread_since_progress_.insert(url);
    } else {
      dead_shards_[url] = {.until = absl::Now() + kDeadShardRetry, .error = error};
      failed_since_progress_.insert(url);
      unread_since_progress_.erase(url);
    }
    if (reachable_shards_ < 0) reachable_shards_ = ReachableShards();
    if (static_cast<int64_t>(failed_since_progress_.size() + unread_since_progress_.size()) >=
        reachable_shards_) {
      if (unread_since_progress_.empty()) {
        return Renamed(
            error,
            absl::StrCat("data stream ", stream_, ": every shard it reads (", reachable_shards_,
                         ") failed before its first token; last: ", error.message()));
      }
      // Shards skipped unread may have come back since they failed: read before giving up.
      for (const std::string& again : unread_since_progress_) dead_shards_.erase(again);
      unread_since_progress_.clear();
    }
  }
  CloseSlot();
  return absl::OkStatus();
}

absl::Status ShardStream::ReadSample(bool decode, TokenDocument* tokens) {
  while (true) {
    if (grouper_ == nullptr) {
      const absl::Status opened = OpenSlot();
      if (absl::IsOutOfRange(opened)) return opened;
      if (!opened.ok()) {
        RETURN_IF_ERROR(ShardFailed(opened));
        continue;
      }
    }
    absl::StatusOr<bool> more = grouper_->Next(&sample_);
    if (more.ok() && !*more) {
      const absl::Status closed = source_->Close();
      if (!closed.ok()) {
        RETURN_IF_ERROR(ShardFailed(closed));
        continue;
      }
      ++shards_read_;
      if (slot_tokens_ > 0) {
        empty_in_a_row_ = 0;
      } else if (slot_decoded_ == slot_samples_ &&
                 ++empty_in_a_row_ >= static_cast<int64_t>(config_->urls.size())) {
        return absl::FailedPreconditionError(
            absl::StrCat("data stream ", stream_, ": ", empty_in_a_row_,
                         " shards in a row held no tokens, as many as there are shards (last: ",
                         UrlOfSlot(slot_), "); data.shards holds no text to train on"));
      }
      CloseSlot();
      continue;
    }
    absl::Status status = more.status();
    if (!status.ok()) {
      status = WithSourceCause(*source_, status);
    } else if (decode) {
      status = CheckNotSftSample(sample_);
      if (status.ok()) {
        status = TakeSampleTokens(&sample_, config_->vocab_size, tokens, config_->tokenizer,
                                  config_->text_tokenizer);
      }
    }
    if (!status.ok()) {
      RETURN_IF_ERROR(ShardFailed(status));
      continue;
    }
    if (decode) {
      ++slot_decoded_;
      slot_tokens_ += tokens->size();
    }
    ++slot_samples_;
    if (GaveProgress()) {
      failed_since_progress_.clear();
      unread_since_progress_.clear();
    }
    return absl::OkStatus();
  }
}

int64_t ShardStream::ReachableShards() {
  const int64_t n = static_cast<int64_t>(config_->urls.size());
  const size_t distinct = std::set<std::string>(config_->urls.begin(), config_->urls.end()).size();
  const int64_t period =
      !config_->shard_shuffle ? n : (config_->epochs > 0 ? config_->epochs * n : 0);
  if (period == 0) return static_cast<int64_t>(distinct);
  // Slot s names the shard slot s + period names; stream k's slots k + jK reach, modulo the
  // period, every slot congruent to k modulo gcd(period, K).
  const int64_t step = std::gcd(period, static_cast<int64_t>(config_->num_streams));
  std::set<std::string> reached;
  for (int64_t slot = stream_ % step; slot < period && reached.size() < distinct; slot += step) {
    reached.insert(UrlOfSlot(slot));
  }
  return static_cast<int64_t>(reached.size());
}

void ShardStream::WarnIfBlockRepeats(size_t samples, int64_t bytes) {
  const int64_t n = static_cast<int64_t>(config_->urls.size());
  // Stream 0, on rank 0, speaks for all. An endless stream whose last sample lies a pass (n
  // slots) or more past where the block began holds the `samples` and `bytes` before it, at
  // least a whole pass of its share.
  const int64_t ahead = slot_ - cursor_.block_slot;
  if (stream_ != 0 || repeat_warned_ || config_->finite || ahead < n ||
      (ahead == n && slot_samples_ <= cursor_.block_sample)) {
    return;
  }
  repeat_warned_ = true;
  LogWarn(
      "data stream 0's shuffle block holds a whole pass of its share of data.shards (%d "
      "samples, %.1f MiB of tokens) with room to spare, so it reads on into the next pass: a "
      "block spans more than the data, and may hold a document twice, each copy in memory (a "
      "block ends at data.shuffle_buffer / data.streams = %d samples or data.shuffle_buffer_mb "
      "/ data.streams = %.0f MiB); to shuffle within one pass, lower data.shuffle_buffer to %d "
      "or less",
      samples, static_cast<double>(bytes) / (1 << 20), config_->block_samples,
      static_cast<double>(config_->block_bytes) / (1 << 20),
      static_cast<int64_t>(samples) * config_->num_streams);
}

absl::Status ShardStream::LoadBlock() {
  ++cursor_.block;
  cursor_.block_slot = slot_;
  cursor_.block_sample = slot_samples_;
  cursor_.next = 0;
  cursor_.offset = 0;
  size_t count = 0;
  for (int64_t bytes = 0; count < static_cast<size_t>(config_->block_samples) &&
                          (config_->block_bytes <= 0 || bytes < config_->block_bytes);
       ++count) {
    if (docs_.size() <= count) docs_.emplace_back();
    const absl::Status read = ReadSample(/*decode=*/true, &docs_[count]);
    if (absl::IsOutOfRange(read) && count > 0) break;  // a finite stream's last, short block
    RETURN_IF_ERROR(read);
    WarnIfBlockRepeats(count, bytes);
    bytes += static_cast<int64_t>(docs_[count].words.size());
  }
  docs_.resize(count);
  order_.resize(count);
  std::iota(order_.begin(), order_.end(), int64_t{0});
  CounterRng rng(config_->seed, SplitMix64(kBlockOrderTag + static_cast<uint64_t>(stream_)) +
                                    static_cast<uint64_t>(cursor_.block));
  for (int64_t i = static_cast<int64_t>(count) - 1; i > 0; --i) {
    std::swap(order_[i], order_[rng.below(static_cast<uint64_t>(i) + 1)]);
  }
  return absl::OkStatus();
}

absl::Status ShardStream::Next(int32_t* inputs, int32_t* targets) {
  while (true) {
    if (cursor_.block >= 0 && cursor_.next < static_cast<int64_t>(order_.size())) {
      const TokenDocument& doc = docs_[static_cast<size_t>(order_[cursor_.next])];
      if (packer_.Fill(doc, &cursor_.offset)) {
        packer_.Emit(inputs, targets);
        ++cursor_.windows;
        return absl::OkStatus();
      }
      ++cursor_.next;
      cursor_.offset = 0;
      continue;
    }
    RETURN_IF_ERROR(LoadBlock());
  }
}

StreamCursor ShardStream::cursor() const {
  StreamCursor cursor = cursor_;
  cursor.carry = packer_.carry();
  return cursor;
}

absl::Status ShardStream::Restore(const StreamCursor& cursor) {
  grouper_.reset();
  reader_.reset();
  source_.reset();
  cursor_ = cursor;
  packer_.set_carry(cursor.carry);
  slot_ = cursor.block_slot;
  slot_samples_ = slot_decoded_ = slot_tokens_ = 0;
  if (cursor.block < 0) {
    order_.clear();
    return absl::OkStatus();
  }
  TokenDocument unused;
  for (int64_t i = 0; i < cursor.block_sample; ++i) {
    RETURN_IF_ERROR(ReadSample(/*decode=*/false, &unused));
  }
  --cursor_.block;  // LoadBlock counts it again
  RETURN_IF_ERROR(LoadBlock());
  cursor_.next = cursor.next;
  cursor_.offset = cursor.offset;
  return absl::OkStatus();
}

}  // namespace dtrain
