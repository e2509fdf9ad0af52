// Memory a backend owns: host memory for the CPU backend, device memory for a GPU one. The
// model's activations, the parameters, gradients and optimizer moments live in such buffers;
// std::vector<float> is left to host staging (initialisation, checkpoint I/O, samples), which
// moves through Backend::CopyToHost / CopyFromHost.
#pragma once

#include <cstddef>

#include "core/backend/values.h"
#include "core/util/data_type.h"

namespace dtrain {

class Backend;

// `count` elements of `dtype` that `owner` allocated (Backend::Allocate) and frees when the buffer
// is destroyed. Move-only; a default-constructed buffer holds nothing.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend* owner, void* data, size_t count, DataType dtype)
      : owner_(owner), data_(data), count_(count), dtype_(dtype) {}
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = static_cast<DeviceBuffer&&>(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Reset(); }

  // The elements as float32 (null when empty or of another type, so a mix-up fails loudly).
  float* floats() const { return dtype_ == DataType::kF32 ? static_cast<float*>(data_) : nullptr; }
  // The elements as the kernels take them (float32 or bf16; others are no Values).
  Values values() const { return {data_, dtype_}; }
  void* data() const { return data_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * DataTypeBytes(dtype_); }
  DataType dtype() const { return dtype_; }
  Backend* owner() const { return owner_; }
  // Frees the memory now; the buffer is then empty.
  void Reset();

 private:
  Backend* owner_ = nullptr;
  void* data_ = nullptr;
  size_t count_ = 0;
  DataType dtype_ = DataType::kF32;
};

}  // namespace dtrain
