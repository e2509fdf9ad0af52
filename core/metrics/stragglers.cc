#include "core/metrics/stragglers.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dtrain {
namespace {

// Bins of log(1 + lag / 100), 1e-4 wide: a binned lag up to 100% is within 0.01 percentage
// points of the true one, finer than the summary prints.
constexpr double kLagBinsPerUnit = 1e4;

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
  if (found) {
    Lags& lags = lags_[found->rank];
    ++lags.steps;
    ++lags.counts[std::llround(std::log1p(found->lag_pct / 100) * kLagBinsPerUnit)];
  }
  return found;
}

double StragglerTracker::Lags::Median() const {
  // The middle lag, or the mean of the middle two, each its bin's centre.
  const auto lag_of = [](int64_t bin) {
    return 100 * std::expm1(static_cast<double>(bin) / kLagBinsPerUnit);
  };
  const int lower = (steps - 1) / 2;  // 0-based ranks of the middle two (equal when odd)
  const int upper = steps / 2;
  double sum = 0;
  int seen = 0;
  for (const auto& [bin, count] : counts) {
    if (seen <= lower && lower < seen + count) sum += lag_of(bin);
    if (seen <= upper && upper < seen + count) sum += lag_of(bin);
    seen += count;
  }
  return sum / 2;
}

std::string StragglerTracker::PersistentSummary() const {
  std::string summary;
  for (const auto& [rank, lags] : lags_) {
    if (2 * lags.steps <= steps_ || lags.steps < kPersistentSteps) continue;
    absl::StrAppendFormat(&summary,
                          "%srank %d was the straggler in %d of %d steps (median lag +%.1f%%)",
                          summary.empty() ? "" : "; ", rank, lags.steps, steps_, lags.Median());
  }
  return summary;
}

}  // namespace dtrain
