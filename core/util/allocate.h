// Construction that allocates large buffers, with an allocation failure turned into a Status:
// the one place std::bad_alloc is caught, so that a rank whose memory runs out says which phase
// failed and how much it asked for instead of aborting.
#pragma once

#include <memory>
#include <new>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace dtrain {

// make_unique<T>(args...), or ResourceExhausted naming `phase` (e.g. "allocating activations")
// and `bytes`, the estimate of what it allocates.
template <typename T, typename... Args>
absl::StatusOr<std::unique_ptr<T>> AllocateOrError(absl::string_view phase, double bytes,
                                                   Args&&... args) {
  try {
    return std::make_unique<T>(std::forward<Args>(args)...);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "out of memory %s (about %.3g GiB); make the model or train.micro_batch smaller, or "
        "shard the state over more ranks",
        phase, bytes / (1024.0 * 1024.0 * 1024.0)));
  }
}

}  // namespace dtrain
