// The data of a recipe: a training and a validation loader for one data-parallel rank.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/data/chat_template.h"
#include "core/data/loader.h"
#include "core/data/tokenizer.h"
#include "core/recipe/recipe.h"

namespace dtrain {

struct Datasets {
  std::unique_ptr<SequenceLoader> train;  // shuffled windows, run.seed, train.batch_size
  // Sequential windows; null when train.eval_every is 0 (data.val_fraction's split is made
  // either way), except for webdataset's data.val_shards, which are opened when given.
  std::unique_ptr<ValidationLoader> val;
  int64_t train_tokens = 0;  // 0 for data.format webdataset: streamed, unknown in advance
  int64_t val_tokens = 0;
  // Lines the leader logs about the data: for sft, how the samples were packed and counted.
  std::vector<std::string> notes;
  // The same, as warnings: a setting that makes the data worse than the user likely thinks.
  std::vector<std::string> warnings;
};

// data.format webdataset streams data.shards (and data.val_shards) instead; see
// webdataset_loader.h. Otherwise loads data.train (and data.val) in data.format, checked against
// model.vocab_size, in windows of train.seq_len + 1. When data.val is empty, the validation tokens
// are the last floor(n * data.val_fraction) of the n training tokens and training uses only the
// tokens before them: with split = n - floor(n * val_fraction), train = tokens [0, split), val =
// [split, n). dp_rank / dp_size: this rank's place among the data-parallel replicas (tensor- and
// pipeline- parallel peers of one replica read the same data). Errors name the recipe key or file
// and the fix. `shards_tokenizer`: the tokenizer the first shard records (ShardsTokenizerName),
// which every webdataset shard that records one must record too (empty: not checked).
// `text_tokenizer`: data.tokenizer, loaded, which encodes webdataset's .txt samples as they
// stream (null: their bytes are the ids); it must outlive the datasets.
absl::StatusOr<Datasets> OpenDatasets(const Recipe& recipe, int dp_rank, int dp_size,
                                      const std::string& shards_tokenizer = "",
                                      const Tokenizer* text_tokenizer = nullptr);

// InvalidArgument naming data.train or data.val when one of its file patterns matches no file
// (data.format text, llmc and sft), or data.shards or data.val_shards when one of its local
// shards does not exist (webdataset: of data.shards only at data.on_error fail; remote ones are
// read as the run streams them): what a one-node `dtrain launch` checks before its workers
// start, which would each fail on it after their rendezvous, and `recipe check` warns of. Ranks
// that may see other file systems check their own after it, where a failure reaches the others
// at once.
absl::Status CheckDataFilesExist(const Recipe& recipe);

// data.format webdataset's data.shards and data.val_shards expanded, no shard opened:
// InvalidArgument naming the key for a pattern that does not expand (a typo a restart would
// repeat, found before the run starts).
absl::Status CheckShardPatterns(const Recipe& recipe);

// The tokenizer that the first shard of data.format webdataset (data.shards) or sft (data.train)
// records in its first sample (`dtrain data pack`'s record: "bytes", "hf-bpe:...", ...); empty
// for other formats and shards that record none. Errors are the shard's; a read that waits (a
// stalled command or server) gives up, Cancelled, once `*stop` is set (a SIGTERM).
absl::StatusOr<std::string> ShardsTokenizerName(const Recipe& recipe,
                                                const std::atomic<bool>* stop = nullptr);

// The tokenizer whose ids the run's data hold, as ExportHfFolder takes it: data.tokenizer, else
// ByteTokenizer's name "bytes" for data.format text and for shards that record bytes (`recorded`,
// ShardsTokenizerName's answer), else empty: not known.
std::string DataTokenizer(const Recipe& recipe, const absl::StatusOr<std::string>& recorded);
// Why DataTokenizer found none, for a warning: "data.tokenizer is empty and the data's first
// shard names none", "... names <recorded> but holds none of its files" (a pack records its
// tokenizer's name, not the tokenizer), or "... does not read from here (<why>)".
std::string NoDataTokenizerReason(const absl::StatusOr<std::string>& recorded);

// The chat template that data.format sft's shards were packed with (`dtrain data pack --sft`
// records it beside the tokenizer); nullopt for other formats and shards of an older pack.
absl::StatusOr<std::optional<ChatTemplate>> ShardsChatTemplate(const Recipe& recipe);

}  // namespace dtrain
