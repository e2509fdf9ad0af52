#include "core/checkpoint/format.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/checkpoint/crc32c.h"
#include "core/util/status.h"
#include "nlohmann/json.hpp"

namespace dtrain {
namespace {

using Json = nlohmann::json;

Json ChunkToJson(const ChunkRecord& c) {
  return Json{{"tensor", c.tensor},       {"offsets", c.box.offsets},
              {"lengths", c.box.lengths}, {"dtype", DataTypeName(c.dtype)},
              {"file", c.file},           {"offset", c.offset},
              {"bytes", c.bytes},         {"crc32c", absl::StrFormat("%08x", c.crc32c)}};
}

// Training saves float32 state only; a chunk of another type is from a newer dtrain.
DataType DataTypeFromJson(const Json& j) {
  const std::string name = j.get<std::string>();
  if (name != DataTypeName(DataType::kF32)) {
    throw std::runtime_error(
        absl::StrCat("data type \"", name, "\" is not one this dtrain loads (it reads f32)"));
  }
  return DataType::kF32;
}

// A version 1 chunk is the flat element range [begin, end): a box of the tensor viewed as one
// dimension (ChunkShape).
ChunkRecord ChunkFromJson(const Json& j, int format_version) {
  ChunkRecord c;
  c.tensor = j.at("tensor").get<std::string>();
  if (format_version == 1) {
    const int64_t begin = j.at("begin").get<int64_t>();
    c.box = Box{{begin}, {j.at("end").get<int64_t>() - begin}};
  } else {
    c.box = Box{j.at("offsets").get<std::vector<int64_t>>(),
                j.at("lengths").get<std::vector<int64_t>>()};
    c.dtype = DataTypeFromJson(j.at("dtype"));
  }
  c.file = j.at("file").get<std::string>();
  c.offset = j.at("offset").get<uint64_t>();
  c.bytes = j.at("bytes").get<uint64_t>();
  c.crc32c = static_cast<uint32_t>(std::stoul(j.at("crc32c").get<std::string>(), nullptr, 16));
  return c;
}

Json DataToJson(const LoaderState& state) {
  return Json{{"consumed_sequences", state.consumed_sequences}, {"cursor", state.cursor}};
}

LoaderState DataFromJson(const Json& j) {
  return LoaderState{j.at("consumed_sequences").get<int64_t>(), j.at("cursor").get<std::string>()};
}

template <typename T, typename Parse>
absl::StatusOr<T> ParseJson(const std::string& text, const std::string& path, Parse parse) {
  try {
    return parse(Json::parse(text));
  } catch (const Json::exception& e) {
    return absl::DataLossError(
        absl::StrCat(path, " is not a valid checkpoint file (", e.what(),
                     "); it is damaged or from another program, so this checkpoint cannot load"));
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat(path, " has an invalid value (", e.what(), ")"));
  }
}

// The manifest and the rank index are written in a save, which must not throw: a byte that is
// not UTF-8 (recipe values are checked when read, but the recipe's source path is not) is
// written as U+FFFD instead.
std::string DumpForSave(const Json& j) {
  return j.dump(1, ' ', false, Json::error_handler_t::replace) + "\n";
}

// The manifest's own checksum: CRC32C of its compact dump without the "crc32c" field (keys in
// nlohmann's sorted order, numbers in their shortest round-trip form, so that a manifest read
// back dumps to the same bytes). The chunks carry theirs; this covers the step, learning rate,
// data cursors and chunk table, where a flipped digit would resume at another data position.
uint32_t ManifestCrc(Json j) {
  j.erase("crc32c");
  const std::string compact = j.dump(-1, ' ', false, Json::error_handler_t::replace);
  return Crc32c(0, compact.data(), compact.size());
}

}  // namespace

std::vector<int64_t> ChunkShape(const Manifest& manifest, const TensorRecord& tensor) {
  if (manifest.format_version == 1) return {tensor.numel};
  return tensor.shape;
}

std::string StateTensorName(StateKind kind, const std::string& tensor) {
  switch (kind) {
    case StateKind::kParameters:
      return tensor;
    case StateKind::kMomentM:
      return "optim.m/" + tensor;
    case StateKind::kMomentV:
      return "optim.v/" + tensor;
  }
  return tensor;
}

const TensorRecord* Manifest::FindTensor(const std::string& name) const {
  for (const TensorRecord& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

uint64_t Manifest::total_bytes() const {
  uint64_t total = 0;
  for (const File& f : files) total += f.bytes;
  return total;
}

std::string ManifestToJson(const Manifest& m) {
  Json tensors = Json::array();
  for (const TensorRecord& t : m.tensors) {
    tensors.push_back(Json{{"name", t.name},
                           {"shape", t.shape},
                           {"numel", t.numel},
                           {"dtype", DataTypeName(t.dtype)}});
  }
  Json chunks = Json::array();
  for (const ChunkRecord& c : m.chunks) chunks.push_back(ChunkToJson(c));
  Json files = Json::array();
  for (const Manifest::File& f : m.files)
    files.push_back(Json{{"name", f.name}, {"bytes", f.bytes}});
  Json data = Json::array();
  for (const LoaderState& s : m.data) data.push_back(DataToJson(s));
  Json j{{"format", "dtrain-checkpoint"},
         {"format_version", m.format_version},
         {"dtrain_version", m.dtrain_version},
         {"step", m.step},
         {"optimizer_step", m.optimizer_step},
         {"seed", m.seed},
         {"lr", m.lr},
         {"recipe_hash", m.recipe_hash},
         {"working_dir", m.working_dir},
         {"world",
          {{"world_size", m.world.world_size},
           {"strategy", m.world.strategy},
           {"dp", m.world.dp},
           {"tp", m.world.tp},
           {"pp", m.world.pp}}},
         {"tensors", tensors},
         {"files", files},
         {"data", data},
         {"chunks", chunks},
         {"metrics_line", m.metrics_line},
         {"recipe", m.recipe_yaml}};
  j["crc32c"] = ManifestCrc(j);
  return DumpForSave(j);
}

absl::StatusOr<Manifest> ManifestFromJson(const std::string& text, const std::string& path) {
  return ParseJson<Manifest>(text, path, [&](const Json& j) {
    if (j.at("format").get<std::string>() != "dtrain-checkpoint") {
      throw std::runtime_error("\"format\" is not dtrain-checkpoint");
    }
    // Manifests written before the field have none to check.
    if (j.contains("crc32c") && j.at("crc32c").get<uint32_t>() != ManifestCrc(j)) {
      throw std::runtime_error(
          "its checksum does not match its contents: it was edited or damaged");
    }
    Manifest m;
    m.format_version = j.at("format_version").get<int>();
    if (m.format_version < 1 || m.format_version > kCheckpointFormatVersion) {
      throw std::runtime_error(absl::StrCat("format_version ", m.format_version,
                                            " is not one this dtrain reads (1 to ",
                                            kCheckpointFormatVersion, "); use a newer dtrain"));
    }
    m.dtrain_version = j.at("dtrain_version").get<std::string>();
    m.step = j.at("step").get<int64_t>();
    m.optimizer_step = j.at("optimizer_step").get<int64_t>();
    m.seed = j.at("seed").get<uint64_t>();
    m.lr = j.at("lr").get<double>();
    m.recipe_hash = j.at("recipe_hash").get<std::string>();
    m.recipe_yaml = j.at("recipe").get<std::string>();
    m.working_dir = j.value("working_dir", "");
    m.metrics_line = j.value("metrics_line", "");
    const Json& w = j.at("world");
    m.world = WorldRecord{w.at("world_size").get<int>(), w.at("strategy").get<std::string>(),
                          w.at("dp").get<int>(), w.at("tp").get<int>(), w.at("pp").get<int>()};
    for (const Json& t : j.at("tensors")) {
      m.tensors.push_back(
          TensorRecord{t.at("name").get<std::string>(), t.at("shape").get<std::vector<int64_t>>(),
                       t.at("numel").get<int64_t>(),
                       m.format_version == 1 ? DataType::kF32 : DataTypeFromJson(t.at("dtype"))});
    }
    for (const Json& f : j.at("files")) {
      m.files.push_back(
          Manifest::File{f.at("name").get<std::string>(), f.at("bytes").get<uint64_t>()});
    }
    for (const Json& d : j.at("data")) m.data.push_back(DataFromJson(d));
    for (const Json& c : j.at("chunks")) m.chunks.push_back(ChunkFromJson(c, m.format_version));
    return m;
  });
}

std::string RankIndexToJson(const RankIndex& index) {
  Json chunks = Json::array();
  for (const ChunkRecord& c : index.chunks) chunks.push_back(ChunkToJson(c));
  const Json j{{"nonce", absl::StrFormat("%016x", index.nonce)},
               {"step", index.step},
               {"rank", index.rank},
               {"file", index.file},
               {"file_bytes", index.file_bytes},
               {"data", DataToJson(index.data)},
               {"chunks", chunks}};
  return DumpForSave(j);
}

absl::StatusOr<RankIndex> RankIndexFromJson(const std::string& text, const std::string& path) {
  return ParseJson<RankIndex>(text, path, [&](const Json& j) {
    RankIndex index;
    index.nonce = std::stoull(j.at("nonce").get<std::string>(), nullptr, 16);
    index.step = j.at("step").get<int64_t>();
    index.rank = j.at("rank").get<int>();
    index.file = j.at("file").get<std::string>();
    index.file_bytes = j.at("file_bytes").get<uint64_t>();
    index.data = DataFromJson(j.at("data"));
    // Read only by the save that wrote it.
    for (const Json& c : j.at("chunks")) {
      index.chunks.push_back(ChunkFromJson(c, kCheckpointFormatVersion));
    }
    return index;
  });
}

std::string StepDirName(int64_t step) { return absl::StrCat("step-", step); }

std::string AsideName(const std::string& step_dir, uint64_t nonce) {
  return absl::StrFormat("%s.replaced-%016x", step_dir, nonce);
}

SetAside SetAsideFolders(const std::string& dir) {
  namespace fs = std::filesystem;
  SetAside found;
  std::error_code error;
  for (fs::directory_iterator it(dir, error); !error && it != fs::directory_iterator();
       it.increment(error)) {
    if (!it->is_directory(error) ||
        !absl::StrContains(it->path().filename().string(), ".replaced-")) {
      continue;
    }
    found.names.push_back(it->path().filename().string());
    for (fs::recursive_directory_iterator file(it->path(), error);
         !error && file != fs::recursive_directory_iterator(); file.increment(error)) {
      if (file->is_regular_file(error)) found.bytes += file->file_size(error);
    }
  }
  std::sort(found.names.begin(), found.names.end());
  return found;
}

std::string RankFileName(int rank) { return absl::StrCat("rank-", rank, ".bin"); }
std::string RankIndexName(int rank) { return absl::StrCat("rank-", rank, ".json"); }

std::optional<int64_t> StepOfDirName(const std::string& name) {
  const absl::string_view digits = absl::string_view(name).substr(std::min<size_t>(5, name.size()));
  int64_t step = 0;
  if (!absl::StartsWith(name, "step-") || digits.empty() ||
      digits.find_first_not_of("0123456789") != absl::string_view::npos ||
      !absl::SimpleAtoi(digits, &step)) {
    return std::nullopt;
  }
  return step;
}

std::vector<std::pair<int64_t, std::string>> StepFolders(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code error;
  for (fs::directory_iterator it(dir, error); !error && it != fs::directory_iterator();
       it.increment(error)) {
    const std::optional<int64_t> step = StepOfDirName(it->path().filename().string());
    if (step && it->is_directory(error)) found.emplace_back(*step, it->path().string());
  }
  std::sort(found.begin(), found.end());
  return found;
}

bool IsStepFolder(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  return fs::exists(fs::path(path) / kManifestName, error) ||
         absl::StartsWith(fs::path(path).filename().string(), "step-");
}

}  // namespace dtrain
