#include "core/model/recompute.h"

#include "absl/strings/str_cat.h"

namespace dtrain {

absl::string_view RecomputeName(Recompute recompute) {
  switch (recompute) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "?";
}

absl::StatusOr<Recompute> ParseRecompute(absl::string_view name) {
  for (Recompute recompute : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    if (RecomputeName(recompute) == name) return recompute;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("parallel.recompute: '", name, "' is not one of none, selective, full"));
}

}  // namespace dtrain
