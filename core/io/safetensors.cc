#include "core/io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/backend/cuda/bf16.h"
#include "core/util/files.h"
#include "core/util/status.h"
#include "nlohmann/json.hpp"

namespace dtrain {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host needs byte swaps here");

// The reference implementation refuses larger headers; so do we, before allocating.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr char kMetadataKey[] = "__metadata__";

struct DTypeInfo {
  DType dtype;
  const char* name;
  size_t bytes;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::kF64, "F64", 8},   {DType::kF32, "F32", 4}, {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2}, {DType::kI64, "I64", 8}, {DType::kI32, "I32", 4},
    {DType::kI16, "I16", 2},   {DType::kI8, "I8", 1},   {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1},
};

const DTypeInfo* FindDType(const std::string& name) {
  for (const DTypeInfo& info : kDTypes) {
    if (name == info.name) return &info;
  }
  return nullptr;
}

// Reads exactly `bytes` at `offset`; a short read means the file shrank under us.
absl::Status ReadAt(int fd, void* out, size_t bytes, uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(out);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::ErrnoToStatus(errno, absl::StrCat("reading ", path));
    if (n == 0) {
      return absl::DataLossError(
          absl::StrCat(path, ": unexpected end of file at byte ", offset, "; was it truncated?"));
    }
    p += n;
    bytes -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

std::string HeaderJson(const std::vector<TensorSpec>& tensors,
                       const SafetensorsMetadata& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  uint64_t offset = 0;
  for (const TensorSpec& t : tensors) {
    const uint64_t bytes = static_cast<uint64_t>(NumElements(t.shape)) * DTypeBytes(t.dtype);
    header[t.name] = {{"dtype", DTypeName(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  // Pad with spaces (valid JSON whitespace) so the data section starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

absl::StatusOr<TensorSpec> ParseSpec(const std::string& path, const std::string& name,
                                     const nlohmann::json& value, uint64_t* begin, uint64_t* end) {
  const std::string where = absl::StrCat(path, ": tensor '", name, "'");
  if (!value.is_object()) return absl::InvalidArgumentError(where + ": entry is not an object");
  const auto dtype_it = value.find("dtype");
  const auto shape_it = value.find("shape");
  const auto offsets_it = value.find("data_offsets");
  if (dtype_it == value.end() || shape_it == value.end() || offsets_it == value.end()) {
    return absl::InvalidArgumentError(where + ": needs \"dtype\", \"shape\" and \"data_offsets\"");
  }
  if (!dtype_it->is_string()) return absl::InvalidArgumentError(where + ": dtype is not a string");
  const DTypeInfo* info = FindDType(dtype_it->get<std::string>());
  if (info == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": unknown dtype '", dtype_it->get<std::string>(), "'"));
  }
  TensorSpec spec{name, info->dtype, {}};
  if (!shape_it->is_array()) return absl::InvalidArgumentError(where + ": shape is not an array");
  int64_t numel = 1;
  for (const nlohmann::json& dim : *shape_it) {
    if (!dim.is_number_unsigned() ||
        dim.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        __builtin_mul_overflow(numel, dim.get<int64_t>(), &numel)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": shape ", shape_it->dump(), " is not a list of sizes"));
    }
    spec.shape.push_back(dim.get<int64_t>());
  }
  if (!offsets_it->is_array() || offsets_it->size() != 2 ||
      !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": data_offsets ", offsets_it->dump(), " is not [begin, end]"));
  }
  *begin = (*offsets_it)[0].get<uint64_t>();
  *end = (*offsets_it)[1].get<uint64_t>();
  uint64_t expected_bytes = 0;
  if (*end < *begin ||
      __builtin_mul_overflow(static_cast<uint64_t>(numel), info->bytes, &expected_bytes) ||
      *end - *begin != expected_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": data_offsets ", offsets_it->dump(), " hold ",
                     *end >= *begin ? *end - *begin : 0, " bytes but ", info->name, " ",
                     ShapeString(spec.shape), " needs ", numel, " * ", info->bytes, " bytes"));
  }
  return spec;
}

// Parses and validates the header text; `data_bytes` is the size of the data section.
absl::Status ParseHeader(const std::string& path, const std::string& text, uint64_t data_bytes,
                         std::vector<SafetensorsEntry>* tensors, SafetensorsMetadata* metadata) {
  const nlohmann::json header = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": the header is not a JSON object; the file is corrupt or not safetensors"));
  }
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      if (!value.is_object()) {
        return absl::InvalidArgumentError(path + ": __metadata__ is not an object");
      }
      for (const auto& [key, entry] : value.items()) {
        if (!entry.is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat(path, ": __metadata__ value of '", key, "' is not a string"));
        }
        (*metadata)[key] = entry.get<std::string>();
      }
      continue;
    }
    SafetensorsEntry entry;
    ASSIGN_OR_RETURN(entry.spec, ParseSpec(path, name, value, &entry.begin, &entry.end));
    if (entry.end > data_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", name, "' ends at data byte ", entry.end, " beyond the ",
                       data_bytes, " bytes of data in the file; the file is truncated or corrupt"));
    }
    tensors->push_back(std::move(entry));
  }
  std::sort(tensors->begin(), tensors->end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  uint64_t expected_begin = 0;
  for (size_t i = 0; i < tensors->size(); ++i) {
    const SafetensorsEntry& entry = (*tensors)[i];
    if (entry.begin != expected_begin) {
      const std::string previous = i == 0
                                       ? std::string("the start of the data")
                                       : absl::StrCat("tensor '", (*tensors)[i - 1].spec.name, "'");
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", entry.spec.name, "' starts at data byte ", entry.begin,
                       entry.begin < expected_begin ? ", overlapping " : ", leaving a gap after ",
                       previous, " (which ends at ", expected_begin, "); the file is corrupt"));
    }
    expected_begin = entry.end;
  }
  if (expected_begin != data_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": tensors cover ", expected_begin,
                                                   " bytes of data but the file holds ", data_bytes,
                                                   "; the file is corrupt"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

const char* DTypeName(DType dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) return info.name;
  }
  return "?";
}

size_t DTypeBytes(DType dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) return info.bytes;
  }
  return 0;
}

float HalfToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in float32.
    const float magnitude = static_cast<float>(mantissa) * 0x1.0p-24f;
    return sign ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t numel = 1;
  for (int64_t dim : shape) numel *= dim;
  return numel;
}

// ---- Writer ----------------------------------------------------------------------------------

SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<TensorSpec> tensors, int fd)
    : path_(std::move(path)), tensors_(std::move(tensors)), fd_(fd) {}

SafetensorsWriter::SafetensorsWriter(SafetensorsWriter&& other) noexcept
    : path_(std::move(other.path_)),
      tensors_(std::move(other.tensors_)),
      next_(other.next_),
      fd_(std::exchange(other.fd_, -1)) {}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink((path_ + ".tmp").c_str());
}

absl::StatusOr<SafetensorsWriter> SafetensorsWriter::Create(const std::string& path,
                                                            std::vector<TensorSpec> tensors,
                                                            const SafetensorsMetadata& metadata) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].name == kMetadataKey || tensors[i].name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": '", tensors[i].name, "' cannot name a tensor"));
    }
    for (int64_t dim : tensors[i].shape) {
      if (dim < 0) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", tensors[i].name,
                                                       "' has negative shape ",
                                                       ShapeString(tensors[i].shape)));
      }
    }
    for (size_t j = 0; j < i; ++j) {
      if (tensors[j].name == tensors[i].name) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": tensor '", tensors[i].name, "' is declared twice"));
      }
    }
  }
  std::string header;
  try {
    header = HeaderJson(tensors, metadata);
  } catch (const nlohmann::json::exception& e) {  // e.g. a name that is not valid UTF-8
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot encode header: ", e.what()));
  }
  ASSIGN_OR_RETURN(const std::string target, ResolveOutputFile(path));
  const std::string tmp_path = target + ".tmp";
  const int fd = ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return FileError(errno, absl::StrCat("create ", tmp_path));
  SafetensorsWriter writer(target, std::move(tensors), fd);
  const uint64_t header_bytes = header.size();
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(header_bytes >> (8 * i));
  RETURN_IF_ERROR(WriteAll(fd, length, sizeof(length), tmp_path));
  RETURN_IF_ERROR(WriteAll(fd, header.data(), header.size(), tmp_path));
  return writer;
}

absl::Status SafetensorsWriter::WriteTensor(const std::string& name, const void* data) {
  if (fd_ < 0) return absl::FailedPreconditionError(path_ + ": writer already finished");
  if (next_ >= tensors_.size() || tensors_[next_].name != name) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": tensor '", name, "' written out of order; expected '",
                     next_ < tensors_.size() ? tensors_[next_].name : "(none: all written)", "'"));
  }
  const TensorSpec& spec = tensors_[next_];
  RETURN_IF_ERROR(
      WriteAll(fd_, data, NumElements(spec.shape) * DTypeBytes(spec.dtype), path_ + ".tmp"));
  ++next_;
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Finish() {
  if (fd_ < 0) return absl::FailedPreconditionError(path_ + ": writer already finished");
  if (next_ != tensors_.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": Finish before tensor '", tensors_[next_].name, "' was written"));
  }
  const std::string tmp_path = path_ + ".tmp";
  if (::fsync(fd_) != 0) return FileError(errno, absl::StrCat("fsync ", tmp_path));
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) {
    const int error = errno;
    ::unlink(tmp_path.c_str());
    return FileError(error, absl::StrCat("close ", tmp_path));
  }
  if (std::rename(tmp_path.c_str(), path_.c_str()) != 0) {
    const int error = errno;
    ::unlink(tmp_path.c_str());
    return FileError(error, absl::StrCat("rename ", tmp_path, " to ", path_));
  }
  return FsyncParentDirectory(path_);
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorData>& tensors,
                              const SafetensorsMetadata& metadata) {
  std::vector<TensorSpec> specs;
  for (const TensorData& t : tensors) specs.push_back(t.spec);
  ASSIGN_OR_RETURN(SafetensorsWriter writer,
                   SafetensorsWriter::Create(path, std::move(specs), metadata));
  for (const TensorData& t : tensors) RETURN_IF_ERROR(writer.WriteTensor(t.spec.name, t.data));
  return writer.Finish();
}

// ---- Reader ----------------------------------------------------------------------------------

SafetensorsReader::SafetensorsReader(std::string path, int fd, uint64_t data_start,
                                     std::vector<SafetensorsEntry> tensors,
                                     SafetensorsMetadata metadata)
    : path_(std::move(path)),
      fd_(fd),
      data_start_(data_start),
      tensors_(std::move(tensors)),
      metadata_(std::move(metadata)) {}

SafetensorsReader::SafetensorsReader(SafetensorsReader&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      data_start_(other.data_start_),
      tensors_(std::move(other.tensors_)),
      metadata_(std::move(other.metadata_)) {}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<SafetensorsReader> SafetensorsReader::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("opening ", path));
  // The reader owns fd from here, so every early return closes it.
  SafetensorsReader reader(path, fd, 0, {}, {});
  struct stat st;
  if (::fstat(fd, &st) != 0) return absl::ErrnoToStatus(errno, absl::StrCat("stat ", path));
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", file_bytes, " bytes is too short for a safetensors header length"));
  }
  unsigned char length[8];
  RETURN_IF_ERROR(ReadAt(fd, length, sizeof(length), 0, path));
  uint64_t header_bytes = 0;
  for (int i = 0; i < 8; ++i) header_bytes |= static_cast<uint64_t>(length[i]) << (8 * i);
  if (header_bytes > kMaxHeaderBytes || header_bytes > file_bytes - 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header length ", header_bytes, " does not fit the file of ",
                     file_bytes, " bytes; the file is corrupt or not safetensors"));
  }
  std::string header(header_bytes, '\0');
  RETURN_IF_ERROR(ReadAt(fd, header.data(), header.size(), 8, path));
  reader.data_start_ = 8 + header_bytes;
  try {
    RETURN_IF_ERROR(ParseHeader(path, header, file_bytes - reader.data_start_, &reader.tensors_,
                                &reader.metadata_));
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": bad header: ", e.what()));
  }
  return reader;
}

const SafetensorsEntry* SafetensorsReader::Find(const std::string& name) const {
  for (const SafetensorsEntry& entry : tensors_) {
    if (entry.spec.name == name) return &entry;
  }
  return nullptr;
}

absl::StatusOr<const SafetensorsEntry*> SafetensorsReader::Lookup(const std::string& name) const {
  const SafetensorsEntry* entry = Find(name);
  if (entry == nullptr) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor named '", name, "'"));
  }
  return entry;
}

absl::Status SafetensorsReader::ReadBytes(const std::string& name, void* out) const {
  ASSIGN_OR_RETURN(const SafetensorsEntry* entry, Lookup(name));
  return ReadAt(fd_, out, entry->end - entry->begin, data_start_ + entry->begin, path_);
}

// A bf16 embedding of 1 GB converted whole held its 0.5 GB of raw values beside the 1 GB of floats.
constexpr size_t kConvertedElements = size_t{1} << 20;

template <typename From, typename To, typename Convert>
absl::Status SafetensorsReader::ReadConverted(const SafetensorsEntry& entry, size_t begin,
                                              size_t count, To* out, Convert convert) const {
  std::vector<From> raw(std::min(count, kConvertedElements));
  for (size_t done = 0; done < count; done += raw.size()) {
    const size_t n = std::min(raw.size(), count - done);
    RETURN_IF_ERROR(ReadAt(fd_, raw.data(), n * sizeof(From),
                           data_start_ + entry.begin + (begin + done) * sizeof(From), path_));
    std::transform(raw.begin(), raw.begin() + n, out + done, convert);
  }
  return absl::OkStatus();
}

namespace {

absl::Status WrongDType(const std::string& path, const SafetensorsEntry& entry,
                        const char* wanted) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", entry.spec.name, "' is ",
                                                 DTypeName(entry.spec.dtype), "; expected ",
                                                 wanted));
}

}  // namespace

absl::Status SafetensorsReader::ReadFloat32(const std::string& name, float* out) const {
  ASSIGN_OR_RETURN(const SafetensorsEntry* entry, Lookup(name));
  return ReadFloat32Slice(name, 0, static_cast<size_t>(NumElements(entry->spec.shape)), out);
}

absl::Status SafetensorsReader::ReadFloat32Slice(const std::string& name, size_t begin,
                                                 size_t count, float* out) const {
  ASSIGN_OR_RETURN(const SafetensorsEntry* entry, Lookup(name));
  const size_t numel = static_cast<size_t>(NumElements(entry->spec.shape));
  if (begin > numel || count > numel - begin) {
    return absl::OutOfRangeError(absl::StrCat(path_, ": tensor '", name, "' has ", numel,
                                              " elements, not [", begin, ", ", begin + count, ")"));
  }
  switch (entry->spec.dtype) {
    case DType::kF32:
      return ReadAt(fd_, out, count * sizeof(float),
                    data_start_ + entry->begin + begin * sizeof(float), path_);
    case DType::kF16:
      return ReadConverted<uint16_t>(*entry, begin, count, out, HalfToFloat);
    case DType::kBF16:
      return ReadConverted<uint16_t>(*entry, begin, count, out, cuda::Bf16BitsToFloat);
    case DType::kF64:
      return ReadConverted<double>(*entry, begin, count, out,
                                   [](double v) { return static_cast<float>(v); });
    default:
      return WrongDType(path_, *entry, "F32, F16, BF16 or F64");
  }
}

absl::Status SafetensorsReader::ReadInt32(const std::string& name, int32_t* out) const {
  ASSIGN_OR_RETURN(const SafetensorsEntry* entry, Lookup(name));
  switch (entry->spec.dtype) {
    case DType::kI32:
      return ReadBytes(name, out);
    case DType::kI64: {
      std::vector<int64_t> raw(static_cast<size_t>(NumElements(entry->spec.shape)));
      RETURN_IF_ERROR(ReadBytes(name, raw.data()));
      for (size_t i = 0; i < raw.size(); ++i) {
        if (raw[i] < std::numeric_limits<int32_t>::min() ||
            raw[i] > std::numeric_limits<int32_t>::max()) {
          return absl::OutOfRangeError(absl::StrCat(path_, ": tensor '", name, "' element ", i,
                                                    " = ", raw[i], " does not fit int32"));
        }
        out[i] = static_cast<int32_t>(raw[i]);
      }
      return absl::OkStatus();
    }
    default:
      return WrongDType(path_, *entry, "I32 or I64");
  }
}

absl::Status SafetensorsReader::ReadInt64(const std::string& name, int64_t* out) const {
  ASSIGN_OR_RETURN(const SafetensorsEntry* entry, Lookup(name));
  switch (entry->spec.dtype) {
    case DType::kI64:
      return ReadBytes(name, out);
    case DType::kI32:
      return ReadConverted<int32_t>(*entry, 0, static_cast<size_t>(NumElements(entry->spec.shape)),
                                    out, [](int32_t v) { return int64_t{v}; });
    default:
      return WrongDType(path_, *entry, "I32 or I64");
  }
}

absl::StatusOr<SafetensorsContents> ReadSafetensors(const std::string& path) {
  ASSIGN_OR_RETURN(SafetensorsReader reader, SafetensorsReader::Open(path));
  SafetensorsContents contents;
  contents.metadata = reader.metadata();
  for (const SafetensorsEntry& entry : reader.tensors()) {
    const std::string& name = entry.spec.name;
    const size_t numel = static_cast<size_t>(NumElements(entry.spec.shape));
    contents.shapes[name] = entry.spec.shape;
    switch (entry.spec.dtype) {
      case DType::kF32:
      case DType::kF16:
      case DType::kBF16:
      case DType::kF64: {
        std::vector<float>& values = contents.floats[name];
        values.resize(numel);
        RETURN_IF_ERROR(reader.ReadFloat32(name, values.data()));
        break;
      }
      case DType::kI32:
      case DType::kI64: {
        std::vector<int32_t>& values = contents.ints[name];
        values.resize(numel);
        RETURN_IF_ERROR(reader.ReadInt32(name, values.data()));
        break;
      }
      default:
        return WrongDType(path, entry, "a float (F32, F16, BF16, F64) or int (I32, I64) dtype");
    }
  }
  return contents;
}

}  // namespace dtrain
