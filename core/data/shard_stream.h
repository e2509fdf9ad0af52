// One logical stream of a WebDataset run: an endless (or finite) sequence of packed windows,
// a pure function of (seed, stream id) and the shards.
//
// Stream k of K reads shard slots k, k + K, k + 2K, ... of the run's shard sequence, where slot s
// is shard perm_e[s % N] of pass e = s / N (perm_e a seeded shuffle of the N URLs, or identity).
// Samples are shuffled in blocks of block_samples (fewer once a block holds block_bytes of
// tokens: whole books or files as samples would otherwise fill memory), each block permuted by its
// own seeded draw, then packed. A cursor at any window boundary restores the stream exactly by
// re-reading only the current block. Not thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/data/loader.h"
#include "core/data/packer.h"
#include "core/data/sample_grouper.h"
#include "core/data/shard_source.h"
#include "core/data/tar_reader.h"
#include "core/data/token_decode.h"

namespace dtrain {

struct StreamConfig {
  std::vector<std::string> urls;  // the N shards
  int num_streams = 1;            // K
  uint64_t seed = 0;
  bool shard_shuffle = true;
  int64_t block_samples = 1;  // samples per shuffle block; 1 = no sample shuffle
  int64_t block_bytes = 0;    // a block also ends with the sample that reaches these token bytes
  int seq_len = 0;
  int eos_id = -1;
  int vocab_size = 0;
  std::string tokenizer;  // what a shard that records its tokenizer must record; empty: any
  // Encodes .txt samples (data.tokenizer); null: their bytes are the ids. Outlives the streams.
  const Tokenizer* text_tokenizer = nullptr;
  int epochs = 0;                // passes over the shards; 0 = endless, each pass shuffled anew
  bool finite = false;           // true: end after `epochs` passes; false: then repeat the passes
  bool skip_bad_shards = false;  // data.on_error skip_shard
  ShardSourceOptions source;
};

// A stream's position at a window boundary.
struct StreamCursor {
  int64_t windows = 0;       // windows emitted
  int64_t block = -1;        // number of the current shuffle block; -1 = none read yet
  int64_t block_slot = 0;    // shard slot where that block starts
  int64_t block_sample = 0;  // samples of that slot before the block
  int64_t next = 0;          // the block's sample (in shuffled order) being packed
  int64_t offset = 0;        // tokens of that sample (with its EOS) already packed
  int64_t skipped_shards = 0;
  std::vector<int32_t> carry;  // the packer's carry
};

// The error of a shard that data.on_error: fail stops at, saying that skip_shard would skip it;
// one that does not fit the recipe (its tokenizer: exit 2) is no damaged shard to skip, as is.
absl::Status WithSkipShardHint(const absl::Status& error);

class ShardStream {
 public:
  // `skip_warned`: the shards skipped (skip_bad_shards) and warned about, each once for all the
  // streams that share it (a loader's, read from its one thread): a bad shard was warned about on
  // every pass, then by every stream. Null without skip_bad_shards.
  ShardStream(const StreamConfig* config, int stream, std::set<std::string>* skip_warned);

  // Writes the next window as inputs and targets (seq_len each). OutOfRange at the end of a
  // finite stream; shard errors are DataLoss / NotFound / Unavailable naming the shard unless
  // skip_bad_shards, which logs and skips them (failing once every shard the stream reads has
  // failed before its first token since its last).
  absl::Status Next(int32_t* inputs, int32_t* targets);

  // Continues after `cursor` (a cursor of this stream and config): re-opens the block's shard.
  absl::Status Restore(const StreamCursor& cursor);
  StreamCursor cursor() const;

  // The URL of shard slot `slot`.
  const std::string& UrlOfSlot(int64_t slot);

  // Shards this stream read to their end, and skipped (skip_bad_shards); thread-safe.
  ShardCounts counts() const { return {shards_read_.load(), shards_skipped_.load()}; }

 private:
  absl::Status LoadBlock();
  // Warns, once, when the block being loaded, `samples` holding `bytes` so far, has begun a second
  // pass over the stream's shards: its documents repeat in it.
  void WarnIfBlockRepeats(size_t samples, int64_t bytes);
  // Next sample's tokens; `decode` false skips decoding (for Restore). OutOfRange at the end.
  absl::Status ReadSample(bool decode, TokenDocument* tokens);
  absl::Status OpenSlot();
  void CloseSlot();
  absl::Status ShardFailed(const absl::Status& status);
  // The distinct shards this stream's slots ever name (its slots, k mod K, over the period in
  // which the shard orders repeat; every shard where each pass is shuffled anew).
  int64_t ReachableShards();

  const StreamConfig* config_;
  int stream_;
  Packer packer_;
  StreamCursor cursor_;
  std::vector<TokenDocument> docs_;  // the current block in reading order
  std::vector<int64_t> order_;       // shuffled order of docs_
  // Reading position.
  int64_t slot_;
  int64_t slot_samples_ = 0;  // samples read from slot_
  int64_t slot_decoded_ = 0;  // ... of which decoded
  int64_t slot_tokens_ = 0;   // ... holding these tokens
  // The shards that failed before their first token since this stream's last one, read and
  // skipped unread (dead_shards_): once they are every shard it reaches, skipping on would loop
  // without one window, an error, but only after the unread ones were read again. (Counted as
  // failures in a row, a bad shard that ended one shuffled pass and began the next took a good
  // one's place in the count, and failed the run.)
  std::set<std::string> failed_since_progress_;
  std::set<std::string> unread_since_progress_;
  int64_t reachable_shards_ = -1;  // ReachableShards(), once a shard failed
  // A shard that failed before its first token is skipped unread until `until`, with the error
  // it failed with: a dead server's shard cost its timeouts again on each of the hundreds of
  // passes over a small dataset that fill the shuffle blocks; one that recovers is read again.
  struct DeadShard {
    absl::Time until;
    absl::Status error;
  };
  std::map<std::string, DeadShard> dead_shards_;
  bool skipped_unread_ = false;  // OpenSlot's failure is a dead shard's, skipped unread
  // Whether the open shard has given a token, or samples not decoded (counted on a restore).
  bool GaveProgress() const { return slot_tokens_ > 0 || slot_decoded_ < slot_samples_; }
  // Shards read whole in a row whose decoded samples held no token: as many as there are
  // shards is an error (such data would be read forever without one window).
  int64_t empty_in_a_row_ = 0;
  bool wrap_logged_ = false;
  bool repeat_warned_ = false;  // a shuffle block held a whole pass (LoadBlock)
  std::set<std::string>* skip_warned_;
  std::unique_ptr<ByteSource> source_;
  std::unique_ptr<TarReader> reader_;
  std::unique_ptr<SampleGrouper> grouper_;
  Sample sample_;
  int64_t perm_pass_ = -1;  // the pass whose shard permutation perm_ holds
  std::vector<int64_t> perm_;
  std::atomic<int64_t> shards_read_{0};
  std::atomic<int64_t> shards_skipped_{0};
};

}  // namespace dtrain
