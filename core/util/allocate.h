// Construction that allocates large buffers, with an allocation failure turned into a Status, so
// that a rank whose memory runs out says which phase failed and how much it asked for instead of
// aborting.
#pragma once

#include <memory>
#include <new>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
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

// make_unique<T>(args...), or ResourceExhausted naming `phase` (e.g. "allocating activations")
// and `bytes`, the estimate of what it allocates.
template <typename T, typename... Args>
absl::StatusOr<std::unique_ptr<T>> AllocateOrError(absl::string_view phase, double bytes,
                                                   Args&&... args) {
  try {
    return std::make_unique<T>(std::forward<Args>(args)...);
  } catch (const OutOfMemory& error) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "out of memory %s (about %.3g GiB in all): %s; make the model or train.micro_batch "
        "smaller, or shard the state over more ranks",
        phase, bytes / (1024.0 * 1024.0 * 1024.0), error.what()));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "out of memory %s (about %.3g GiB); make the model or train.micro_batch smaller, or "
        "shard the state over more ranks",
        phase, bytes / (1024.0 * 1024.0 * 1024.0)));
  }
}

}  // namespace dtrain
