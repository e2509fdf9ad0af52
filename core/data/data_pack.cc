#include "core/data/data_pack.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/data/compressed_format.h"
#include "core/data/sft_data.h"
#include "core/data/shard_urls.h"
#include "core/data/tar_reader.h"
#include "core/data/tar_writer.h"
#include "core/data/token_decode.h"
#include "core/util/files.h"
#include "core/util/status.h"
#include "core/util/thread_pool.h"

namespace dtrain {
namespace {

constexpr char kShardPrefix[] = "shard-";

int64_t MemberBytes(size_t size) { return 512 + (static_cast<int64_t>(size) + 511) / 512 * 512; }

// Writes samples into shards of at most shard_bytes; the first sample of each shard also gets
// the `first_field` member (the tokenizer record), so every shard names its tokenizer.
class ShardWriter {
 public:
  ShardWriter(std::string out_dir, int64_t shard_bytes, std::string first_field)
      : out_dir_(std::move(out_dir)),
        shard_bytes_(shard_bytes),
        first_field_(std::move(first_field)) {}

  // One sample's members, (extension, data) each, under `key`, in one shard: a sample never
  // spans two.
  absl::Status AddSample(const std::string& key,
                         const std::vector<std::pair<std::string, std::string>>& members,
                         PackResult* result) {
    int64_t bytes = 0;
    for (const auto& member : members) bytes += MemberBytes(member.second.size());
    if (bytes + 1024 > shard_bytes_) ++result->oversized_documents;
    if (out_.is_open() && written_ + bytes + 1024 > shard_bytes_) RETURN_IF_ERROR(Finish());
    const bool first = !out_.is_open();
    if (first) {
      const std::string path = ShardPath(out_dir_, static_cast<int>(result->shards.size()));
      out_.open(path, std::ios::binary | std::ios::trunc);
      if (!out_) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
      result->shards.push_back(path);
      written_paths_.push_back(path);
      written_ = 0;
    }
    for (const auto& [extension, data] : members) Write(absl::StrCat(key, ".", extension), data);
    if (first) Write(absl::StrCat(key, ".", kTokenizerExtension), first_field_);
    return absl::OkStatus();
  }

  // Ends the last shard; the pack is then complete. A writer destroyed before (an input's error)
  // removes the shards it wrote: a partial pack is no dataset, and would block the next pack
  // into the folder.
  absl::Status Commit() {
    RETURN_IF_ERROR(Finish());
    written_paths_.clear();
    return absl::OkStatus();
  }

  ShardWriter(ShardWriter&&) = default;
  ~ShardWriter() {
    out_.close();
    std::error_code ignored;
    for (const std::string& path : written_paths_) std::filesystem::remove(path, ignored);
  }

 private:
  absl::Status Finish() {
    if (!out_.is_open()) return absl::OkStatus();
    out_ << TarEnd();
    out_.close();
    if (!out_) return absl::DataLossError("writing a shard failed (disk full?)");
    return absl::OkStatus();
  }

  void Write(const std::string& name, const std::string& data) {
    const int64_t size = static_cast<int64_t>(data.size());
    out_ << TarHeader(name, size) << data << TarPadding(size);
    written_ += MemberBytes(data.size());
  }

  std::string out_dir_;
  int64_t shard_bytes_;
  std::string first_field_;
  std::ofstream out_;
  int64_t written_ = 0;
  std::vector<std::string> written_paths_;  // until Commit
};

// The shard writer for `tokenizer`'s ids in out_dir, which it creates. A folder holding shards
// already is refused: the new ones would overwrite some and leave the rest beside them, which a
// pattern over the folder reads as one dataset (of another tokenizer, perhaps).
absl::StatusOr<ShardWriter> OpenShards(const std::string& out_dir, int64_t shard_bytes,
                                       const Tokenizer& tokenizer,
                                       const ChatTemplate* chat_template = nullptr) {
  std::error_code error;
  std::filesystem::create_directories(out_dir, error);
  if (error) {
    return FileError(error.value(), absl::StrCat("create the folder ", out_dir),
                     "point --out at a folder to create or an empty one");
  }
  int existing = 0;
  for (const auto& entry : std::filesystem::directory_iterator(out_dir, error)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with(kShardPrefix) && name.ends_with(".tar")) ++existing;
  }
  if (existing > 0) {
    return absl::AlreadyExistsError(absl::StrCat(
        "--out ", out_dir, " holds ", existing,
        " shard(s) of an earlier pack already: new shards would replace some and leave the "
        "others beside them; remove them, or pack into an empty folder"));
  }
  nlohmann::json record = {{"name", tokenizer.name()}, {"vocab_size", tokenizer.vocab_size()}};
  if (chat_template != nullptr) record["chat_template"] = TemplateJson(*chat_template);
  return ShardWriter(out_dir, shard_bytes, record.dump());
}

// The token member of a sample: ids as uint16 (extension "tokens") while the vocabulary fits,
// else uint32 ("tokens32"), little-endian.
std::pair<std::string, std::string> TokenMember(const std::vector<int32_t>& ids,
                                                const Tokenizer& tokenizer) {
  const bool wide = tokenizer.vocab_size() > 65536;
  const size_t width = wide ? 4 : 2;
  std::string bytes(ids.size() * width, '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint32_t id = static_cast<uint32_t>(ids[i]);
    std::memcpy(bytes.data() + i * width, &id, width);  // little-endian host
  }
  return {wide ? "tokens32" : "tokens", std::move(bytes)};
}

// A batch is encoded once it holds this much text or this many documents; a document this
// large is encoded on its own.
constexpr size_t kLargeDocumentBytes = 4 << 20;
constexpr size_t kBatchDocuments = 4096;

// Documents encoded a batch at a time on the pool's threads, one task each, and written in
// input order; a large one alone, so that the tokenizer's own threads split it. `Encoded` is
// what encoding gives; the first error in input order, which names the document's `where`, ends
// the pack.
template <typename Encoded>
class OrderedEncoder {
 public:
  using Encode =
      std::function<absl::StatusOr<Encoded>(const std::string& text, const std::string& where)>;
  using Write = std::function<absl::Status(Encoded& encoded)>;
  OrderedEncoder(int threads, Encode encode, Write write)
      : pool_(threads), encode_(std::move(encode)), write_(std::move(write)) {}

  // `where`: the file, or file:line, for messages.
  absl::Status Add(std::string text, std::string where) {
    if (text.size() >= kLargeDocumentBytes) RETURN_IF_ERROR(Flush());
    batch_bytes_ += text.size();
    batch_.push_back({std::move(text), std::move(where), absl::UnknownError("not encoded")});
    if (batch_bytes_ >= kLargeDocumentBytes || batch_.size() >= kBatchDocuments) return Flush();
    return absl::OkStatus();
  }

  absl::Status Flush() {
    pool_.ParallelFor(batch_.size(), 1, [&](size_t begin, size_t end, int) {
      for (size_t i = begin; i < end; ++i)
        batch_[i].encoded = encode_(batch_[i].text, batch_[i].where);
    });
    for (Document& document : batch_) {
      RETURN_IF_ERROR(document.encoded.status());
      RETURN_IF_ERROR(write_(*document.encoded));
    }
    batch_.clear();
    batch_bytes_ = 0;
    return absl::OkStatus();
  }

 private:
  struct Document {
    std::string text;
    std::string where;
    absl::StatusOr<Encoded> encoded;
  };

  ThreadPool pool_;
  Encode encode_;
  Write write_;
  std::vector<Document> batch_;
  size_t batch_bytes_ = 0;
};

// The file's extension in lower case (".jsonl" for a.JSONL).
std::string LowerExtension(const std::string& path) {
  return absl::AsciiStrToLower(std::filesystem::path(path).extension().string());
}

// " (its string keys: a, b; name the document's with --text-key KEY)" for a JSON object with
// string values, else nothing.
std::string StringKeysHint(const nlohmann::json& record) {
  std::vector<std::string> keys;
  if (record.is_object()) {
    for (const auto& [key, value] : record.items()) {
      if (value.is_string()) keys.push_back(key);
    }
  }
  if (keys.empty()) return "";
  return absl::StrCat(" (its string keys: ", absl::StrJoin(keys, ", "),
                      "; name the document's with --text-key KEY)");
}

// InvalidArgument when a file that would be packed as one plain-text document is no text that
// anyone means to train on as is: a compressed archive (its bytes would become the tokens), or
// JSON lines under a .json name (its braces and keys would be trained on): a first line that is
// an object with the documents' `text_key`, or two lines that are objects.
absl::Status CheckPlainText(const std::string& path, const std::string& text,
                            const std::string& text_key) {
  if (const std::optional<CompressedFormat> format = CompressedFormatOf(text)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is a ", format->name,
                     " archive, whose bytes would be packed as text: unpack it first",
                     *format->unpack == '\0' ? "" : absl::StrCat(" (", format->unpack, ")")));
  }
  if (IsTarHeader(text)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path,
        " is a tar archive, whose headers would be packed as text: unpack it and pack the "
        "files it holds (shards `dtrain data pack` wrote train as data.format: webdataset)"));
  }
  if (LowerExtension(path) == ".json") {
    // The first two lines that hold anything (the split is lazy: the rest is not read).
    std::vector<absl::string_view> lines;
    for (const absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
      lines.push_back(line);
      if (lines.size() == 2) break;
    }
    const auto object = [&](size_t line) {
      return line < lines.size() ? nlohmann::json::parse(lines[line], nullptr, false)
                                 : nlohmann::json();
    };
    const nlohmann::json first = object(0);
    if (first.is_object() && (first.contains(text_key) || object(1).is_object())) {
      return absl::InvalidArgumentError(absl::StrCat(
          path,
          " holds JSON lines (an object a line), but a .json file is packed as one plain-text "
          "document, braces and keys included: name it .jsonl to pack each line's \"",
          text_key, "\"", first.contains(text_key) ? "" : StringKeysHint(first)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool IsJsonLines(const std::string& path) { return LowerExtension(path) == ".jsonl"; }

std::string ShardPath(const std::string& out_dir, int index) {
  return (std::filesystem::path(out_dir) / absl::StrFormat("%s%06d.tar", kShardPrefix, index))
      .string();
}

std::string ShardPattern(const std::string& out_dir, int count) {
  return (std::filesystem::path(out_dir) /
          absl::StrFormat("%s{000000..%06d}.tar", kShardPrefix, std::max(count - 1, 0)))
      .string();
}

std::string ShardGlob(const std::string& out_dir) {
  return (std::filesystem::path(out_dir) / absl::StrCat(kShardPrefix, "*.tar")).string();
}

absl::Status CheckShardsCanBeNamed(const std::string& out_dir, bool sft) {
  if (sft) {
    if (out_dir.find_first_of("*?[") == std::string::npos) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("--out ", out_dir, ": data.train's glob ", ShardGlob(out_dir),
                     " would read '*', '?' or '[' in the folder's name as a pattern; choose a "
                     "folder without them"));
  }
  const absl::StatusOr<std::vector<std::string>> named = ExpandShardUrls(ShardPattern(out_dir, 2));
  if (named.ok() &&
      *named == std::vector<std::string>{ShardPath(out_dir, 0), ShardPath(out_dir, 1)}) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--out ", out_dir,
      ": data.shards could not name shards in this folder ('::' separates "
      "shard lists and braces are ranges, with no way to escape them); choose a folder without "
      "them"));
}

absl::StatusOr<PackResult> PackShards(const std::vector<std::string>& inputs,
                                      const std::string& out_dir, int64_t shard_bytes,
                                      const Tokenizer& tokenizer, int threads,
                                      const std::string& text_key) {
  ASSIGN_OR_RETURN(ShardWriter writer, OpenShards(out_dir, shard_bytes, tokenizer));
  PackResult result;
  OrderedEncoder<std::vector<int32_t>> encoder(
      threads,
      [&](const std::string& text,
          const std::string& where) -> absl::StatusOr<std::vector<int32_t>> {
        std::vector<int32_t> ids;
        if (absl::Status status = tokenizer.Encode(text, &ids); !status.ok()) {
          return absl::Status(status.code(), absl::StrCat(where, ": ", status.message()));
        }
        return ids;
      },
      [&](std::vector<int32_t>& ids) -> absl::Status {
        if (ids.empty()) {
          ++result.empty_documents;
          return absl::OkStatus();
        }
        RETURN_IF_ERROR(writer.AddSample(absl::StrFormat("%09d", result.documents),
                                         {TokenMember(ids, tokenizer)}, &result));
        ++result.documents;
        result.tokens += static_cast<int64_t>(ids.size());
        return absl::OkStatus();
      });
  for (const std::string& input : inputs) {
    if (IsJsonLines(input)) {
      ASSIGN_OR_RETURN(std::ifstream in, OpenInputFile(input));
      std::string line;
      for (int64_t number = 1; std::getline(in, line); ++number) {
        if (absl::StripAsciiWhitespace(line).empty()) continue;
        nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
        if (record.is_discarded()) {
          return absl::InvalidArgumentError(absl::StrCat(
              input, ":", number, ": not valid JSON (a syntax error, or text that is not UTF-8)"));
        }
        if (!record.is_object() || !record.contains(text_key) || !record[text_key].is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat(input, ":", number, ": expected a JSON object with a \"", text_key,
                           "\" string", StringKeysHint(record)));
        }
        RETURN_IF_ERROR(encoder.Add(std::move(record[text_key].get_ref<std::string&>()),
                                    absl::StrCat(input, ":", number)));
      }
    } else {
      ASSIGN_OR_RETURN(std::string text, ReadWholeFile(input));
      RETURN_IF_ERROR(CheckPlainText(input, text, text_key));
      RETURN_IF_ERROR(encoder.Add(std::move(text), input));
    }
  }
  RETURN_IF_ERROR(encoder.Flush());
  if (result.documents == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the inputs hold no text to pack (", result.empty_documents,
                     " empty documents): ", absl::StrJoin(inputs, ", ")));
  }
  RETURN_IF_ERROR(writer.Commit());
  return result;
}

absl::StatusOr<PackResult> PackSftShards(const std::vector<std::string>& inputs,
                                         const std::string& out_dir, int64_t shard_bytes,
                                         const Tokenizer& tokenizer,
                                         const ChatTemplate& chat_template, int threads) {
  for (const std::string& input : inputs) {
    if (!IsJsonLines(input)) {
      return absl::InvalidArgumentError(
          absl::StrCat(input,
                       ": SFT data is JSON lines (.jsonl), one {\"prompt\", \"completion\"} or "
                       "{\"messages\"} object a line"));
    }
  }
  ASSIGN_OR_RETURN(ShardWriter writer, OpenShards(out_dir, shard_bytes, tokenizer, &chat_template));
  PackResult result;
  OrderedEncoder<SftSample> encoder(
      threads,
      [&](const std::string& line, const std::string& where) {
        return EncodeSftLine(line, chat_template, tokenizer, where);
      },
      [&](SftSample& sample) -> absl::Status {
        RETURN_IF_ERROR(
            writer.AddSample(absl::StrFormat("%09d", result.documents),
                             {TokenMember(sample.tokens, tokenizer),
                              {"mask", std::string(sample.trained.begin(), sample.trained.end())}},
                             &result));
        ++result.documents;
        result.tokens += static_cast<int64_t>(sample.tokens.size());
        result.trained_tokens +=
            std::count(sample.trained.begin(), sample.trained.end(), uint8_t{1});
        return absl::OkStatus();
      });
  for (const std::string& input : inputs) {
    ASSIGN_OR_RETURN(std::ifstream in, OpenInputFile(input));
    std::string line;
    for (int64_t number = 1; std::getline(in, line); ++number) {
      if (absl::StripAsciiWhitespace(line).empty()) continue;
      RETURN_IF_ERROR(encoder.Add(std::move(line), absl::StrCat(input, ":", number)));
    }
  }
  RETURN_IF_ERROR(encoder.Flush());
  if (result.documents == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the inputs hold no SFT sample to pack: ", absl::StrJoin(inputs, ", ")));
  }
  RETURN_IF_ERROR(writer.Commit());
  return result;
}

}  // namespace dtrain
