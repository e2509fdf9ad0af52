#include "core/backend/device_buffer.h"

#include "core/backend/backend.h"

namespace dtrain {

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this == &other) return *this;
  Reset();
  owner_ = other.owner_;
  data_ = other.data_;
  count_ = other.count_;
  dtype_ = other.dtype_;
  other.owner_ = nullptr;
  other.data_ = nullptr;
  other.count_ = 0;
  return *this;
}

void DeviceBuffer::Reset() {
  if (owner_ != nullptr && data_ != nullptr) owner_->Free(data_);
  owner_ = nullptr;
  data_ = nullptr;
  count_ = 0;
}

}  // namespace dtrain
