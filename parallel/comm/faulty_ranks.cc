#include "parallel/comm/faulty_ranks.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace dtrain {
namespace {

constexpr char kFaultyRanksUrl[] = "dtrain/faulty-ranks";

}  // namespace

void SetFaultyRanks(absl::Status& status, const std::vector<int>& world_ranks) {
  if (world_ranks.empty()) {
    status.ErasePayload(kFaultyRanksUrl);
  } else {
    status.SetPayload(kFaultyRanksUrl, absl::Cord(absl::StrJoin(world_ranks, ",")));
  }
}

std::vector<int> FaultyRanks(const absl::Status& status) {
  std::vector<int> ranks;
  const auto payload = status.GetPayload(kFaultyRanksUrl);
  if (!payload) return ranks;
  for (const absl::string_view field : absl::StrSplit(std::string(*payload), ',')) {
    if (int rank = 0; absl::SimpleAtoi(field, &rank)) ranks.push_back(rank);
  }
  return ranks;
}

}  // namespace dtrain
