// Stragglers: the rank whose compute time in a step lies furthest above the median of the ranks
// doing the same work (its peers), when by more than logging.straggler_pct, and over a run the
// ranks that were that rank persistently (one slow node slows every synchronous step of the job).
// Pipeline stages hold different blocks, so a stage is compared with its own replicas only.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dtrain {

struct Straggler {
  int rank = 0;
  double lag_pct = 0;  // its compute time above the median of its peers', in percent
};

// `compute_ms` has one time per rank, in rank order; `peers` one group number per rank (ranks of
// one number do the same work), or is empty when all do. The rank furthest above its group's
// median when by more than `threshold_pct`; none in groups of one rank, of a median of 0, or
// within the threshold.
std::optional<Straggler> FindStraggler(const std::vector<double>& compute_ms, double threshold_pct,
                                       const std::vector<int>& peers = {});

// A run's stragglers, step by step, among `peers` (as FindStraggler's).
class StragglerTracker {
 public:
  explicit StragglerTracker(double threshold_pct, std::vector<int> peers = {})
      : threshold_pct_(threshold_pct), peers_(std::move(peers)) {}

  // One step's compute times (one per rank); returns its straggler, if any.
  std::optional<Straggler> Add(const std::vector<double>& compute_ms);
  // "rank 3 was the straggler in 18 of 20 steps (median lag +25.1%)" for the rank that was in
  // more than half of the steps, and in kPersistentSteps at least; empty when none (two ranks
  // that each lag in half the steps, of a run of 2 ranks, say, are noise).
  std::string PersistentSummary() const;
  static constexpr int kPersistentSteps = 5;

 private:
  double threshold_pct_;
  std::vector<int> peers_;
  // A straggling rank's lags, as counts of lags rounded to 0.01% of 1 + lag (kLagBinsPerUnit):
  // memory bounded by the lags' range, not by the run's steps.
  struct Lags {
    int steps = 0;
    std::map<int64_t, int> counts;  // bin -> lags in it
    double Median() const;
  };
  int steps_ = 0;
  std::map<int, Lags> lags_;  // per straggling rank
};

}  // namespace dtrain
