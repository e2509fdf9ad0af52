// Construction that allocates large buffers, with an allocation failure turned into a Status, so
// that a rank whose memory runs out says which phase failed and how much it asked for instead of
// aborting.
#pragma once

#include <memory>
#include <new>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace dtrain {

// The std::bad_alloc of a backend that knows more than "no memory": what() says how many bytes
// were asked and how many were free on which device.
class OutOfMemory : public std::bad_alloc {
 public:
  explicit OutOfMemory(std::string detail) : detail_(std::move(detail)) {}
  const char* what() const noexcept override { return detail_.c_str(); }

 private:
  std::string detail_;
};

// ResourceExhausted for `error`, thrown while `what` ("allocating activations (about 2 GiB in
// all)", "in step 12"): with OutOfMemory's detail of what the device had, and the fixes.
inline absl::Status OutOfMemoryError(absl::string_view what, const std::bad_alloc& error) {
  const bool detailed = dynamic_cast<const OutOfMemory*>(&error) != nullptr;
  return absl::ResourceExhaustedError(absl::StrFormat(
      "out of memory %s%s; make the model or train.micro_batch smaller, recompute "
      "(parallel.recompute), or shard the state over more ranks (parallel.strategy zero2, zero3 "
      "or fsdp); `dtrain plan` lists the layouts that fit",
      what, detailed ? absl::StrCat(": ", error.what()) : ""));
}

// make_unique<T>(args...), or OutOfMemoryError naming `phase` (e.g. "allocating activations")
// and `bytes`, the estimate of what it allocates.
template <typename T, typename... Args>
absl::StatusOr<std::unique_ptr<T>> AllocateOrError(absl::string_view phase, double bytes,
                                                   Args&&... args) {
  try {
    return std::make_unique<T>(std::forward<Args>(args)...);
  } catch (const std::bad_alloc& error) {
    return OutOfMemoryError(
        absl::StrFormat("%s (about %.3g GiB in all)", phase, bytes / (1024.0 * 1024.0 * 1024.0)),
        error);
  }
}

}  // namespace dtrain
