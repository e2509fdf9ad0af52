// The live allocations of a backend by address, from which Backend::Holds answers whether a
// buffer is the backend's memory. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>

namespace dtrain {

class Allocations {
 public:
  void Add(const void* data, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    bytes_[Address(data)] = bytes;
  }
  // The bytes of the allocation at `data` (0 when there is none).
  size_t Remove(const void* data) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = bytes_.find(Address(data));
    if (it == bytes_.end()) return 0;
    const size_t bytes = it->second;
    bytes_.erase(it);
    return bytes;
  }
  // Whether [data, data + bytes) lies within one allocation; always for 0 bytes.
  bool Holds(const void* data, size_t bytes) const {
    if (bytes == 0) return true;
    const uintptr_t begin = Address(data);
    std::lock_guard<std::mutex> lock(mu_);
    auto next = bytes_.upper_bound(begin);
    if (next == bytes_.begin()) return false;
    const auto& [start, size] = *std::prev(next);
    return begin - start <= size && bytes <= size - (begin - start);
  }

 private:
  static uintptr_t Address(const void* data) { return reinterpret_cast<uintptr_t>(data); }

  mutable std::mutex mu_;
  std::map<uintptr_t, size_t> bytes_;  // first address -> bytes
};

}  // namespace dtrain
