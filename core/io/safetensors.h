// The safetensors file format (https://github.com/huggingface/safetensors): an 8-byte
// little-endian header length N, N bytes of JSON naming each tensor's dtype, shape and byte
// range [begin, end) relative to the data that follows, and an optional "__metadata__" object of
// string values. dtrain uses it for Hugging Face weights and for the parity tool's tensors.
//
// Writing streams one tensor at a time (host memory stays near one tensor) into "<path>.tmp",
// then fsyncs and renames it, so no half-written file is ever visible under the final name.
// Reading validates the whole header on Open and converts on read. Every error is an
// absl::Status whose message names the file, the tensor and the problem.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dtrain {

enum class DType { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

const char* DTypeName(DType dtype);  // "F32", ...
size_t DTypeBytes(DType dtype);

// Converts IEEE half bit patterns to float32 (exact: every value is representable); bfloat16's
// are core/backend/cuda/bf16.h's Bf16BitsToFloat.
float HalfToFloat(uint16_t bits);

struct TensorSpec {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // {} is a scalar (one element)
};

int64_t NumElements(const std::vector<int64_t>& shape);

using SafetensorsMetadata = std::map<std::string, std::string>;

// Writes the tensors declared at Create, in that order, each with WriteTensor. Finish makes the
// file visible; a writer destroyed before Finish removes its temporary file. Move-only.
class SafetensorsWriter {
 public:
  static absl::StatusOr<SafetensorsWriter> Create(const std::string& path,
                                                  std::vector<TensorSpec> tensors,
                                                  const SafetensorsMetadata& metadata = {});
  SafetensorsWriter(SafetensorsWriter&& other) noexcept;
  SafetensorsWriter& operator=(SafetensorsWriter&& other) = delete;
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  ~SafetensorsWriter();

  // `name` must be the next declared tensor; `data` holds its numel * DTypeBytes bytes in the
  // declared dtype, little-endian. Not retained after the call.
  absl::Status WriteTensor(const std::string& name, const void* data);
  // Requires every declared tensor written; fsyncs, renames "<path>.tmp" to path.
  absl::Status Finish();

 private:
  SafetensorsWriter(std::string path, std::vector<TensorSpec> tensors, int fd);

  std::string path_;
  std::vector<TensorSpec> tensors_;
  size_t next_ = 0;
  int fd_ = -1;  // of "<path>.tmp"; -1 once finished or moved from
};

// "[2, 3]": a shape as the errors about tensors write it.
std::string ShapeString(const std::vector<int64_t>& shape);

// One tensor of a file in one call: the data of each entry is read, not retained.
struct TensorData {
  TensorSpec spec;
  const void* data = nullptr;
};
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorData>& tensors,
                              const SafetensorsMetadata& metadata = {});

struct SafetensorsEntry {
  TensorSpec spec;
  uint64_t begin = 0;  // byte range in the data section
  uint64_t end = 0;
};

// An open, validated file: tensors are contiguous, in-bounds, non-overlapping, cover the data
// section exactly and have end - begin == numel * dtype size. Move-only; reads use pread, so
// a const reader may be shared by threads.
class SafetensorsReader {
 public:
  static absl::StatusOr<SafetensorsReader> Open(const std::string& path);
  SafetensorsReader(SafetensorsReader&& other) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&& other) = delete;
  SafetensorsReader(const SafetensorsReader&) = delete;
  ~SafetensorsReader();

  const std::string& path() const { return path_; }
  // In file order.
  const std::vector<SafetensorsEntry>& tensors() const { return tensors_; }
  const SafetensorsEntry* Find(const std::string& name) const;
  const SafetensorsMetadata& metadata() const { return metadata_; }

  // Each reads the whole tensor into `out` (numel elements). ReadFloat32 accepts F32, F16,
  // BF16 and F64 (rounded); ReadInt32 accepts I32 and I64 (values must fit); ReadInt64 accepts
  // I32 and I64. Other dtypes, an unknown name or an I/O failure are errors.
  absl::Status ReadFloat32(const std::string& name, float* out) const;
  // Elements [begin, begin + count) of the tensor, converted as ReadFloat32 converts them: what
  // compares or copies a large tensor a slice at a time. A slice past the end is an error.
  absl::Status ReadFloat32Slice(const std::string& name, size_t begin, size_t count,
                                float* out) const;
  absl::Status ReadInt32(const std::string& name, int32_t* out) const;
  absl::Status ReadInt64(const std::string& name, int64_t* out) const;
  // The stored bytes, unconverted.
  absl::Status ReadBytes(const std::string& name, void* out) const;

 private:
  SafetensorsReader(std::string path, int fd, uint64_t data_start,
                    std::vector<SafetensorsEntry> tensors, SafetensorsMetadata metadata);
  absl::StatusOr<const SafetensorsEntry*> Lookup(const std::string& name) const;
  // Elements [begin, begin + count) of `entry`, stored as From, into `out` as convert(value),
  // through a buffer of at most kConvertedElements values.
  template <typename From, typename To, typename Convert>
  absl::Status ReadConverted(const SafetensorsEntry& entry, size_t begin, size_t count, To* out,
                             Convert convert) const;

  std::string path_;
  int fd_ = -1;
  uint64_t data_start_ = 0;  // 8 + header length
  std::vector<SafetensorsEntry> tensors_;
  SafetensorsMetadata metadata_;
};

// A whole file in memory, for small tensor sets (the parity tool): floating tensors as float32,
// integer tensors as int32; other dtypes are an error.
struct SafetensorsContents {
  std::map<std::string, std::vector<float>> floats;
  std::map<std::string, std::vector<int32_t>> ints;
  std::map<std::string, std::vector<int64_t>> shapes;  // of every tensor
  SafetensorsMetadata metadata;
};
absl::StatusOr<SafetensorsContents> ReadSafetensors(const std::string& path);

}  // namespace dtrain
