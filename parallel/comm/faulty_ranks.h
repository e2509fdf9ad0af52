// The world ranks a failed collective blames (peers that never started it or never joined the
// group), carried by its Status as a payload: the rank that sees the error publishes them, and the
// launcher names a hung rank as the root cause rather than the peer that timed out waiting for it
// (launch/agent.h).
#pragma once

#include <vector>

#include "absl/status/status.h"

namespace dtrain {

// Replaces the blamed ranks of a non-OK `status`; an empty list blames no one.
void SetFaultyRanks(absl::Status& status, const std::vector<int>& world_ranks);
// The ranks SetFaultyRanks recorded, in its order; empty if none.
std::vector<int> FaultyRanks(const absl::Status& status);

}  // namespace dtrain
