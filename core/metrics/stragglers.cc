#include "core/metrics/stragglers.h"

#include <algorithm>

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

std::optional<Straggler> FindStraggler(const std::vector<double>& compute_ms,
                                       double threshold_pct) {
  if (compute_ms.size() < 2) return std::nullopt;
  const double median = Median(compute_ms);
  if (median <= 0) return std::nullopt;
  const auto slowest = std::max_element(compute_ms.begin(), compute_ms.end());
  const double lag_pct = 100 * (*slowest - median) / median;
  if (lag_pct <= threshold_pct) return std::nullopt;
  return Straggler{static_cast<int>(slowest - compute_ms.begin()), lag_pct};
}

std::optional<Straggler> StragglerTracker::Add(const std::vector<double>& compute_ms) {
  ++steps_;
  const std::optional<Straggler> found = FindStraggler(compute_ms, threshold_pct_);
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
