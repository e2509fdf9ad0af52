#include "core/data/data_pack.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/data/sft_data.h"
#include "core/data/tar_writer.h"
#include "core/util/status.h"

namespace dtrain {
namespace {

class ShardWriter {
 public:
  ShardWriter(std::string out_dir, int64_t shard_bytes)
      : out_dir_(std::move(out_dir)), shard_bytes_(shard_bytes) {}

  absl::Status Add(const std::string& name, const std::string& data, PackResult* result) {
    return AddSample({{name, data}}, result);
  }

  // The members of one sample, (name, data) each, in one shard: a sample never spans two.
  absl::Status AddSample(const std::vector<std::pair<std::string, std::string>>& members,
                         PackResult* result) {
    int64_t bytes = 0;
    for (const auto& [name, data] : members) {
      bytes += 512 + (static_cast<int64_t>(data.size()) + 511) / 512 * 512;
    }
    if (out_.is_open() && written_ + bytes + 1024 > shard_bytes_) RETURN_IF_ERROR(Finish());
    if (!out_.is_open()) {
      const std::string path =
          absl::StrFormat("%s/shard-%06d.tar", out_dir_, result->shards.size());
      out_.open(path, std::ios::binary | std::ios::trunc);
      if (!out_) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
      result->shards.push_back(path);
      written_ = 0;
    }
    for (const auto& [name, data] : members) {
      const int64_t size = static_cast<int64_t>(data.size());
      out_ << TarHeader(name, size) << data << TarPadding(size);
    }
    written_ += bytes;
    return absl::OkStatus();
  }

  absl::Status Finish() {
    if (!out_.is_open()) return absl::OkStatus();
    out_ << TarEnd();
    out_.close();
    if (!out_) return absl::DataLossError("writing a shard failed (disk full?)");
    return absl::OkStatus();
  }

 private:
  std::string out_dir_;
  int64_t shard_bytes_;
  std::ofstream out_;
  int64_t written_ = 0;
};

}  // namespace

absl::StatusOr<int64_t> ParseByteSize(const std::string& text) {
  static constexpr std::pair<const char*, double> kUnits[] = {
      {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0}, {"kb", 1e3}, {"mb", 1e6},
      {"gb", 1e9},     {"b", 1.0}};
  const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  double scale = 1;
  std::string number = lower;
  for (const auto& [unit, factor] : kUnits) {
    if (absl::EndsWith(lower, unit)) {
      scale = factor;
      number = lower.substr(0, lower.size() - strlen(unit));
      break;
    }
  }
  double value = 0;
  if (!absl::SimpleAtod(number, &value) || value * scale < 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard size '", text, "' is not a size of at least 4096 bytes like 64MB or 1GiB"));
  }
  return static_cast<int64_t>(value * scale);
}

absl::StatusOr<PackResult> PackShards(const std::vector<std::string>& inputs,
                                      const std::string& out_dir, int64_t shard_bytes,
                                      const Tokenizer& tokenizer) {
  std::error_code error;
  std::filesystem::create_directories(out_dir, error);
  if (error) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", out_dir, ": ", error.message()));
  }
  const bool wide = tokenizer.vocab_size() > 65536;
  const size_t width = wide ? 4 : 2;
  ShardWriter writer(out_dir, shard_bytes);
  PackResult result;
  std::vector<int32_t> ids;
  std::string bytes;
  const auto add_document = [&](std::string_view text) -> absl::Status {
    ids.clear();
    RETURN_IF_ERROR(tokenizer.Encode(text, &ids));
    bytes.resize(ids.size() * width);
    for (size_t i = 0; i < ids.size(); ++i) {
      const uint32_t id = static_cast<uint32_t>(ids[i]);
      std::memcpy(bytes.data() + i * width, &id, width);  // little-endian host
    }
    const std::string name =
        absl::StrFormat("%09d.%s", result.documents, wide ? "tokens32" : "tokens");
    RETURN_IF_ERROR(writer.Add(name, bytes, &result));
    ++result.documents;
    result.tokens += static_cast<int64_t>(ids.size());
    return absl::OkStatus();
  };
  for (const std::string& input : inputs) {
    std::ifstream in(input, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot open input ", input));
    if (absl::EndsWith(input, ".jsonl")) {
      std::string line;
      for (int64_t number = 1; std::getline(in, line); ++number) {
        if (absl::StripAsciiWhitespace(line).empty()) continue;
        const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
        if (!record.is_object() || !record.contains("text") || !record["text"].is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat(input, ":", number, ": expected a JSON object with a \"text\" string"));
        }
        RETURN_IF_ERROR(add_document(record["text"].get_ref<const std::string&>()));
      }
    } else {
      const std::string text((std::istreambuf_iterator<char>(in)), {});
      RETURN_IF_ERROR(add_document(text));
    }
  }
  RETURN_IF_ERROR(writer.Finish());
  return result;
}

absl::StatusOr<PackResult> PackSftShards(const std::vector<std::string>& inputs,
                                         const std::string& out_dir, int64_t shard_bytes,
                                         const Tokenizer& tokenizer,
                                         const ChatTemplate& chat_template) {
  std::error_code error;
  std::filesystem::create_directories(out_dir, error);
  if (error) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", out_dir, ": ", error.message()));
  }
  const bool wide = tokenizer.vocab_size() > 65536;
  const size_t width = wide ? 4 : 2;
  ShardWriter writer(out_dir, shard_bytes);
  PackResult result;
  std::string bytes;
  for (const std::string& input : inputs) {
    if (!absl::EndsWith(input, ".jsonl")) {
      return absl::InvalidArgumentError(
          absl::StrCat(input,
                       ": SFT data is JSON lines (.jsonl), one {\"prompt\", \"completion\"} or "
                       "{\"messages\"} object a line"));
    }
    std::ifstream in(input, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot open input ", input));
    std::string line;
    for (int64_t number = 1; std::getline(in, line); ++number) {
      if (absl::StripAsciiWhitespace(line).empty()) continue;
      ASSIGN_OR_RETURN(const SftSample sample, EncodeSftLine(line, chat_template, tokenizer,
                                                             absl::StrCat(input, ":", number)));
      bytes.resize(sample.tokens.size() * width);
      for (size_t i = 0; i < sample.tokens.size(); ++i) {
        const uint32_t id = static_cast<uint32_t>(sample.tokens[i]);
        std::memcpy(bytes.data() + i * width, &id, width);  // little-endian host
      }
      const std::string key = absl::StrFormat("%09d", result.documents);
      RETURN_IF_ERROR(writer.AddSample(
          {{key + (wide ? ".tokens32" : ".tokens"), bytes},
           {key + ".mask", std::string(sample.trained.begin(), sample.trained.end())}},
          &result));
      ++result.documents;
      result.tokens += static_cast<int64_t>(sample.tokens.size());
      result.trained_tokens += std::count(sample.trained.begin(), sample.trained.end(), uint8_t{1});
    }
  }
  RETURN_IF_ERROR(writer.Finish());
  return result;
}

}  // namespace dtrain
