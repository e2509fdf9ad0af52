#include "core/metrics/stragglers.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dtrain {
namespace {

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

}  // namespace

std::optional<Straggler> FindStraggler(const std::vector<double>& compute_ms, double threshold_pct,
                                       const std::vector<int>& peers) {
  std::map<int, std::vector<int>> groups;  // group number -> its ranks
  for (size_t rank = 0; rank < compute_ms.size(); ++rank) {
    groups[peers.empty() ? 0 : peers[rank]].push_back(static_cast<int>(rank));
  }
  std::optional<Straggler> found;
  for (const auto& [group, ranks] : groups) {
    if (ranks.size() < 2) continue;
    std::vector<double> times;
    for (const int rank : ranks) times.push_back(compute_ms[rank]);
    const double median = Median(times);
    if (median <= 0) continue;
    const auto slowest = std::max_element(times.begin(), times.end());
    const double lag_pct = 100 * (*slowest - median) / median;
    if (lag_pct <= threshold_pct || (found && lag_pct <= found->lag_pct)) continue;
    found = Straggler{ranks[slowest - times.begin()], lag_pct};
  }
  return found;
}

std::optional<Straggler> StragglerTracker::Add(const std::vector<double>& compute_ms) {
  ++steps_;
  const std::optional<Straggler> found = FindStraggler(compute_ms, threshold_pct_, peers_);
  if (found) lags_[found->rank].push_back(found->lag_pct);
  return found;
}

std::string StragglerTracker::PersistentSummary() const {
  std::string summary;
  for (const auto& [rank, lags] : lags_) {
    if (2 * lags.size() < static_cast<size_t>(steps_)) continue;
    absl::StrAppendFormat(&summary,
                          "%srank %d was the straggler in %d of %d steps (median lag +%.1f%%)",
                          summary.empty() ? "" : "; ", rank, lags.size(), steps_, Median(lags));
  }
  return summary;
}

}  // namespace dtrain
