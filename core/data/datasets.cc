#include "core/data/datasets.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/data/sample_grouper.h"
#include "core/data/sft_data.h"
#include "core/data/shard_source.h"
#include "core/data/shard_urls.h"
#include "core/data/tar_reader.h"
#include "core/data/token_decode.h"
#include "core/data/token_file.h"
#include "core/data/tokenizer.h"
#include "core/data/webdataset_loader.h"
#include "core/data/window_loader.h"
#include "core/util/exit_codes.h"
#include "core/util/status.h"

namespace dtrain {
namespace {

absl::Status WithContext(const absl::Status& status, const std::string& context) {
  if (status.ok()) return status;
  return Renamed(status, absl::StrCat(context, ": ", status.message()));
}

absl::StatusOr<std::vector<int32_t>> LoadKey(const std::string& key,
                                             const std::vector<std::string>& patterns,
                                             TokenFormat format, int vocab_size) {
  if (patterns.empty()) {
    return absl::InvalidArgumentError(key + " is empty; list the data files (globs allowed)");
  }
  absl::StatusOr<std::vector<std::string>> files = ExpandFilePatterns(patterns);
  RETURN_IF_ERROR(WithContext(files.status(), key));
  return LoadTokenFiles(*files, format, vocab_size);
}

ShardSourceOptions SourceOptions(const DataSection& data) {
  ShardSourceOptions options;
  options.http_timeout_s = data.http_timeout_s;
  options.http_retries = data.http_retries;
  options.pipe_timeout_s = data.pipe_timeout_s;
  return options;
}

// A usage error (exit 2: a restart would find the same) naming the first of `urls`, the shards
// of `key`, that is a local file (a path, file:) which does not exist; OK when every one does.
// Found at start rather than when the stream reaches it, after hours of steps, or, for
// validation shards, at the first evaluation.
absl::Status CheckLocalShardsExist(const std::vector<std::string>& urls, const std::string& key) {
  for (const std::string& url : urls) {
    const std::optional<std::string> path = LocalShardPath(url);
    std::error_code error;
    if (path && !std::filesystem::exists(*path, error) && !error) {
      return WithExitCode(absl::InvalidArgumentError(absl::StrCat(
                              key, ": shard ", url, " does not exist; fix ", key,
                              " or write the shard (data.on_error: skip_shard skips missing "
                              "training shards as they are reached)")),
                          kExitUsage);
    }
  }
  return absl::OkStatus();
}

// data.format webdataset: streamed shards; the token counts stay 0 (unknown in advance).
absl::StatusOr<Datasets> OpenWebDatasets(const Recipe& recipe, int dp_rank, int dp_size,
                                         const std::string& shards_tokenizer,
                                         const Tokenizer* text_tokenizer) {
  const DataSection& data = recipe.data;
  StreamConfig config;
  RETURN_IF_ERROR(CheckDataFilesExist(recipe));
  ASSIGN_OR_RETURN(config.urls, ExpandShardUrls(data.shards));
  config.num_streams = data.streams;
  config.seed = recipe.run.seed;
  config.shard_shuffle = data.shard_shuffle;
  // data.shuffle_buffer is the whole run's; each stream shuffles its share.
  config.block_samples = std::max(1, data.shuffle_buffer / data.streams);
  config.block_bytes =
      std::max<int64_t>(1, static_cast<int64_t>(data.shuffle_buffer_mb) * (1 << 20) / data.streams);
  config.seq_len = recipe.train.seq_len;
  config.eos_id = data.eos_id;
  config.vocab_size = recipe.model.vocab_size;
  config.tokenizer = shards_tokenizer;
  config.text_tokenizer = text_tokenizer;
  config.epochs = data.epochs;
  config.skip_bad_shards = data.on_error == "skip_shard";
  config.source = SourceOptions(data);

  Datasets datasets;
  datasets.notes.push_back(absl::StrCat(
      "streaming ", config.urls.size(), " training shard(s) in ", data.streams, " stream(s)",
      data.val_shards.empty() ? "" : absl::StrCat(", validation from ", data.val_shards)));
  // Stream k reads shard slots k, k + K, ...: with fewer shards than streams, streams read the
  // same shards side by side (each a later pass), so one batch holds the same documents.
  if (config.urls.size() < static_cast<size_t>(data.streams)) {
    datasets.warnings.push_back(absl::StrCat(
        "data.shards has ", config.urls.size(), " shard(s) for data.streams = ", data.streams,
        ": the streams read the same shards side by side, so a batch repeats documents; write "
        "at least ",
        data.streams, " shards (dtrain data pack --shard-size) or lower data.streams"));
  }
  if (!data.val_shards.empty()) {
    StreamConfig val = config;
    ASSIGN_OR_RETURN(val.urls, ExpandShardUrls(data.val_shards));
    val.num_streams = 1;
    val.shard_shuffle = false;
    val.block_samples = 1;
    val.epochs = 1;
    val.finite = true;
    // Every rank reads the whole validation stream and evaluates its share of it: a shard skipped
    // on one rank only would give the ranks different sets, and different evaluation lengths.
    val.skip_bad_shards = false;
    datasets.val = std::make_unique<WebDatasetValidationLoader>(std::move(val), dp_rank, dp_size);
  } else if (recipe.train.eval_every > 0) {
    return absl::InvalidArgumentError(
        "no validation data: data.val_shards is empty; set it, or train.eval_every: 0");
  }
  ASSIGN_OR_RETURN(datasets.train, WebDatasetLoader::Create(WebDatasetOptions{
                                       .stream = std::move(config),
                                       .read_ahead_bytes = int64_t{data.read_ahead_mb} << 20,
                                       .global_batch = recipe.train.batch_size,
                                       .rank = dp_rank,
                                       .world = dp_size}));
  return datasets;
}

// The SFT rows of the shards `key` lists, a line saying how they were packed, and a warning
// when samples have no trained target.
absl::StatusOr<SftRows> LoadSftRows(const std::string& key,
                                    const std::vector<std::string>& patterns, const Recipe& recipe,
                                    Datasets& datasets) {
  if (patterns.empty()) {
    return absl::InvalidArgumentError(key + " is empty; list the SFT shards (globs allowed)");
  }
  absl::StatusOr<std::vector<std::string>> files = ExpandFilePatterns(patterns);
  RETURN_IF_ERROR(WithContext(files.status(), key));
  ASSIGN_OR_RETURN(const std::vector<SftSample> samples,
                   ReadSftShards(*files, recipe.model.vocab_size));
  ASSIGN_OR_RETURN(const LongSamplePolicy policy,
                   ParseLongSamplePolicy(recipe.data.on_long_sample));
  SftRows rows = PackSftRows(samples, recipe.train.seq_len, recipe.data.packing, policy);
  datasets.notes.push_back(absl::StrCat(
      key, ": ", rows.samples, " SFT samples in ", rows.rows, " sequences of ", rows.seq_len,
      recipe.data.packing ? " (packed, attention within each sample)" : " (one sample each)", "; ",
      rows.trained_tokens, " trained tokens, ", rows.padding_tokens, " padding; ", rows.truncated,
      " truncated and ", rows.skipped, " skipped (longer than seq_len + 1 with ",
      "data.on_long_sample: ", recipe.data.on_long_sample, ", or under 2 tokens)"));
  if (rows.untrained > 0) {
    datasets.warnings.push_back(absl::StrCat(
        key, ": ", rows.untrained, " of ", rows.samples,
        " SFT samples have no trained token within train.seq_len = ", recipe.train.seq_len,
        " (their assistant turns cut off by truncation, or none marked): they cost compute and "
        "teach nothing; raise train.seq_len, or set data.on_long_sample: skip"));
  }
  return rows;
}

// Refuses SFT rows of `source` without a trained target: a run on them would train nothing (a
// loss of 0 at every step) or evaluate nothing.
absl::Status CheckTrainedTargets(const SftRows& rows, const std::string& source) {
  if (std::any_of(rows.targets.begin(), rows.targets.end(),
                  [](int32_t target) { return target >= 0; })) {
    return absl::OkStatus();
  }
  // Data that a restart would read the same: exit 2.
  return WithExitCode(
      absl::InvalidArgumentError(absl::StrCat(
          source, " holds no trained token in ", rows.rows, " sequence(s) of ", rows.seq_len,
          ": every target is masked (prompt, padding, or assistant turns cut off by truncation); "
          "raise train.seq_len, set data.on_long_sample: skip, or check the shards' loss masks")),
      kExitUsage);
}

// data.format sft: samples read whole and packed into fixed sequences once.
absl::StatusOr<Datasets> OpenSftDatasets(const Recipe& recipe, int dp_rank, int dp_size) {
  const DataSection& data = recipe.data;
  Datasets datasets;
  ASSIGN_OR_RETURN(SftRows train, LoadSftRows("data.train", data.train, recipe, datasets));
  SftRows val;
  std::string val_source;
  if (!data.val.empty()) {
    ASSIGN_OR_RETURN(val, LoadSftRows("data.val", data.val, recipe, datasets));
    val_source = absl::StrCat("data.val (", absl::StrJoin(data.val, ", "), ")");
  } else if (data.val_fraction > 0) {
    // The last rows, as the token formats hold out the last tokens.
    const int64_t n = train.rows;
    const int64_t split = n - static_cast<int64_t>(static_cast<double>(n) * data.val_fraction);
    const size_t at = static_cast<size_t>(split) * train.seq_len;
    val.seq_len = train.seq_len;
    val.rows = n - split;
    for (auto [from, to] : {std::pair{&train.inputs, &val.inputs},
                            {&train.targets, &val.targets},
                            {&train.positions, &val.positions}}) {
      to->assign(from->begin() + static_cast<std::ptrdiff_t>(at), from->end());
      from->resize(at);
    }
    train.rows = split;
    val_source = absl::StrCat("the last data.val_fraction = ", data.val_fraction, " of the ", n,
                              " data.train sequences");
    if (val.rows == 0 && n > 0 && recipe.train.eval_every > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(val_source, " is no sequence; raise data.val_fraction to at least 1/", n,
                       ", give data.val, or set train.eval_every: 0 to train without evaluation"));
    }
  }
  if (val_source.empty() && recipe.train.eval_every > 0) {
    return absl::InvalidArgumentError(
        "no validation data: data.val is empty and data.val_fraction is 0; set one of them, or "
        "train.eval_every: 0 to train without evaluation");
  }
  const std::string train_source =
      absl::StrCat("data.train (", absl::StrJoin(data.train, ", "), ")");
  RETURN_IF_ERROR(CheckTrainedTargets(train, train_source));
  if (!val_source.empty() && recipe.train.eval_every > 0) {
    RETURN_IF_ERROR(CheckTrainedTargets(val, val_source));
  }
  datasets.train_tokens = static_cast<int64_t>(train.inputs.size());
  datasets.val_tokens = static_cast<int64_t>(val.inputs.size());
  ASSIGN_OR_RETURN(datasets.train, ShuffledRowLoader::Create(std::move(train), recipe.run.seed,
                                                             recipe.train.batch_size, dp_rank,
                                                             dp_size, train_source));
  // The split is made either way, so that the training data does not depend on evaluation.
  if (!val_source.empty() && recipe.train.eval_every > 0) {
    ASSIGN_OR_RETURN(datasets.val,
                     SequentialRowLoader::Create(std::move(val), dp_rank, dp_size, val_source));
  }
  return datasets;
}

}  // namespace

absl::Status CheckShardPatterns(const Recipe& recipe) {
  if (recipe.data.format != "webdataset") return absl::OkStatus();
  for (const auto& [key, pattern] : {std::pair{"data.shards", &recipe.data.shards},
                                     std::pair{"data.val_shards", &recipe.data.val_shards}}) {
    if (pattern->empty()) continue;
    if (const absl::Status status = ExpandShardUrls(*pattern).status(); !status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(key, ": ", status.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckDataFilesExist(const Recipe& recipe) {
  if (recipe.data.format == "webdataset") {
    // The local ones, as a rank checks them when it opens its data.
    if (recipe.data.on_error == "fail") {
      ASSIGN_OR_RETURN(const std::vector<std::string> urls, ExpandShardUrls(recipe.data.shards));
      RETURN_IF_ERROR(CheckLocalShardsExist(urls, "data.shards"));
    }
    if (recipe.data.val_shards.empty()) return absl::OkStatus();
    ASSIGN_OR_RETURN(const std::vector<std::string> urls, ExpandShardUrls(recipe.data.val_shards));
    return CheckLocalShardsExist(urls, "data.val_shards");
  }
  for (const auto& [key, patterns] :
       {std::pair{"data.train", &recipe.data.train}, std::pair{"data.val", &recipe.data.val}}) {
    if (patterns->empty()) continue;
    if (const absl::StatusOr<std::vector<std::string>> files = ExpandFilePatterns(*patterns);
        !files.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(key, ": ", files.status().message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Datasets> OpenDatasets(const Recipe& recipe, int dp_rank, int dp_size,
                                      const std::string& shards_tokenizer,
                                      const Tokenizer* text_tokenizer) {
  const DataSection& data = recipe.data;
  if (data.format == "webdataset") {
    return OpenWebDatasets(recipe, dp_rank, dp_size, shards_tokenizer, text_tokenizer);
  }
  if (data.format == "sft") return OpenSftDatasets(recipe, dp_rank, dp_size);
  const int seq_len = recipe.train.seq_len;
  ASSIGN_OR_RETURN(const TokenFormat format, ParseTokenFormat(data.format));
  ASSIGN_OR_RETURN(std::vector<int32_t> train_tokens,
                   LoadKey("data.train", data.train, format, recipe.model.vocab_size));
  std::vector<int32_t> val_tokens;
  std::string val_source;
  if (!data.val.empty()) {
    ASSIGN_OR_RETURN(val_tokens, LoadKey("data.val", data.val, format, recipe.model.vocab_size));
    val_source = absl::StrCat("data.val (", absl::StrJoin(data.val, ", "), ")");
  } else if (data.val_fraction > 0) {
    const size_t n = train_tokens.size();
    const size_t split = n - static_cast<size_t>(static_cast<double>(n) * data.val_fraction);
    val_tokens.assign(train_tokens.begin() + static_cast<std::ptrdiff_t>(split),
                      train_tokens.end());
    train_tokens.resize(split);
    val_source = absl::StrCat("the last data.val_fraction = ", data.val_fraction, " of the ", n,
                              " data.train tokens");
  }
  if (val_source.empty() && recipe.train.eval_every > 0) {
    return absl::InvalidArgumentError(
        "no validation data: data.val is empty and data.val_fraction is 0; set one of them, or "
        "train.eval_every: 0 to train without evaluation");
  }

  Datasets datasets;
  datasets.train_tokens = static_cast<int64_t>(train_tokens.size());
  datasets.val_tokens = static_cast<int64_t>(val_tokens.size());
  ASSIGN_OR_RETURN(
      datasets.train,
      ShuffledWindowLoader::Create(
          std::move(train_tokens), seq_len, recipe.run.seed, recipe.train.batch_size, dp_rank,
          dp_size, absl::StrCat("data.train (", absl::StrJoin(data.train, ", "), ")")));
  // The split is made either way, so that the training data does not depend on evaluation.
  if (!val_source.empty() && recipe.train.eval_every > 0) {
    ASSIGN_OR_RETURN(datasets.val, SequentialWindowLoader::Create(std::move(val_tokens), seq_len,
                                                                  dp_rank, dp_size, val_source));
  }
  return datasets;
}

namespace {

// The first sample of the first shard of data.format webdataset (data.shards) or sft
// (data.train), where `dtrain data pack` writes its record; nullopt for other formats. A read
// that waits gives up, Cancelled, once `*stop` is set.
absl::StatusOr<std::optional<Sample>> ShardsFirstSample(const Recipe& recipe,
                                                        const std::atomic<bool>* stop = nullptr) {
  std::vector<std::string> shards;
  if (recipe.data.format == "webdataset") {
    ASSIGN_OR_RETURN(shards, ExpandShardUrls(recipe.data.shards));
    if (!shards.empty()) RETURN_IF_ERROR(CheckLocalShardsExist({shards.front()}, "data.shards"));
  } else if (recipe.data.format == "sft") {
    ASSIGN_OR_RETURN(shards, ExpandFilePatterns(recipe.data.train));
  }
  if (shards.empty()) return std::nullopt;
  ShardSourceOptions options = SourceOptions(recipe.data);
  options.stop = stop;
  ASSIGN_OR_RETURN(const std::unique_ptr<ByteSource> source, OpenShard(shards.front(), options));
  TarReader reader(source.get());
  SampleGrouper grouper(&reader);
  Sample sample;
  const absl::StatusOr<bool> any = grouper.Next(&sample);
  if (!any.ok()) return WithSourceCause(*source, any.status());
  if (!*any) return std::nullopt;
  return sample;
}

}  // namespace

absl::StatusOr<std::string> ShardsTokenizerName(const Recipe& recipe,
                                                const std::atomic<bool>* stop) {
  ASSIGN_OR_RETURN(const std::optional<Sample> sample, ShardsFirstSample(recipe, stop));
  return sample ? RecordedTokenizerName(*sample) : "";
}

std::string DataTokenizer(const Recipe& recipe, const absl::StatusOr<std::string>& recorded) {
  if (!recipe.data.tokenizer.empty()) return recipe.data.tokenizer;
  const std::string bytes = ByteTokenizer().name();
  if (recipe.data.format == "text" || (recorded.ok() && *recorded == bytes)) return bytes;
  return "";
}

std::string NoDataTokenizerReason(const absl::StatusOr<std::string>& recorded) {
  return absl::StrCat(
      "data.tokenizer is empty and the data's first shard ",
      !recorded.ok() ? absl::StrCat("does not read from here (", recorded.status().message(), ")")
      : recorded->empty() ? std::string("names none")
                          : absl::StrCat("names ", *recorded, " but holds none of its files"));
}

absl::StatusOr<std::optional<ChatTemplate>> ShardsChatTemplate(const Recipe& recipe) {
  if (recipe.data.format != "sft") return std::nullopt;
  ASSIGN_OR_RETURN(const std::optional<Sample> sample, ShardsFirstSample(recipe));
  if (!sample) return std::nullopt;
  const nlohmann::json record = TokenizerRecord(*sample);
  if (!record.is_object() || !record.contains("chat_template")) return std::nullopt;
  const auto found = record.find("chat_template");
  ASSIGN_OR_RETURN(ChatTemplate chat_template,
                   ParseTemplateJson(*found, "the chat template data.train records"));
  if (const auto name = found->find("name"); name != found->end() && name->is_string()) {
    chat_template.name = name->get<std::string>();
  }
  return chat_template;
}

}  // namespace dtrain
