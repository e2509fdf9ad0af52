// A bound on the model a recipe asks for, checked before anything is allocated: type-valid but
// absurd sizes (model.n_layer: 2000000000) are refused with the figures instead of ending in an
// allocation failure. The bound is dtrain's, not the machine's (a recipe is often checked on
// another machine than the one that trains it); the trainer compares each rank's share with its
// machine's memory (parallel/rank_memory.h).
#pragma once

#include "absl/status/status.h"
#include "core/recipe/recipe.h"

namespace dtrain {

// At most 10^13 parameters (160 TB of float32 training state: parameters, gradients, two AdamW
// moments), and one micro-batch's activations at most 10^14 bytes on a rank. Far above any
// machine, far below what overflows the 64-bit sizes of buffers and offsets.
inline constexpr double kMaxParameters = 1e13;
inline constexpr double kMaxActivationBytes = 1e14;

// InvalidArgument naming the model keys, the sizes they give and the bound; OK otherwise.
absl::Status CheckModelSize(const Recipe& recipe);
// The parameter bound alone: what `dtrain plan` checks, which picks the micro-batches itself.
absl::Status CheckParameterCount(const Recipe& recipe);

}  // namespace dtrain
