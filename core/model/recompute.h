// What backward recomputes instead of keeping from forward (Korthikanti et al. 2022,
// "Reducing Activation Recomputation in Large Transformer Models"): the recipe's
// parallel.recompute, the model's memory plan and the planner's layouts share it.
#pragma once

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {

enum class Recompute {
  kNone,       // every activation of every block is kept
  kSelective,  // the attention core's outputs are dropped and re-run from the saved qkv
  kFull,       // only each block's input is kept; backward re-runs the block's forward
};

absl::string_view RecomputeName(Recompute recompute);  // "none" | "selective" | "full"
// The recipe spelling; an unknown name is InvalidArgument naming parallel.recompute.
absl::StatusOr<Recompute> ParseRecompute(absl::string_view name);

}  // namespace dtrain
