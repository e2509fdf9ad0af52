// Stragglers: the rank whose compute time in a step lies furthest above the ranks' median, when
// by more than logging.straggler_pct, and over a run the ranks that were that rank persistently
// (one slow node slows every synchronous step of the job).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dtrain {

struct Straggler {
  int rank = 0;
  double lag_pct = 0;  // its compute time above the median of all ranks', in percent
};

// The slowest of `compute_ms` (one per rank, in rank order) when it lies more than `threshold_pct`
// above their median; none with fewer than two ranks, a median of 0, or within the threshold.
std::optional<Straggler> FindStraggler(const std::vector<double>& compute_ms, double threshold_pct);

// A run's stragglers, step by step.
class StragglerTracker {
 public:
  explicit StragglerTracker(double threshold_pct) : threshold_pct_(threshold_pct) {}

  // One step's compute times (one per rank); returns its straggler, if any.
  std::optional<Straggler> Add(const std::vector<double>& compute_ms);
  // "rank 3 was the straggler in 18 of 20 steps (median lag +25.1%)" for each rank that was in
  // at least half of the steps, joined by "; "; empty when none.
  std::string PersistentSummary() const;

 private:
  double threshold_pct_;
  int steps_ = 0;
  std::map<int, std::vector<double>> lags_;  // per straggling rank, its lags
};

}  // namespace dtrain
