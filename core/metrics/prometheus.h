// A small thread-safe registry of Prometheus metrics (gauges, counters, histograms with fixed
// buckets, each family with label sets) rendered in the text exposition format 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/).
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace dtrain {

// Label names and values, in the order they render.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// Thread safety: every method may be called from any thread. Updates and Render take one mutex
// for the few microseconds they touch the series, so a scrape never holds up the training loop.
// Names are the caller's (Prometheus conventions: base units, counters end in _total); a family
// keeps the type and help of its first update.
class MetricsRegistry {
 public:
  // `common` labels (rank, node, job) come first on every series.
  explicit MetricsRegistry(MetricLabels common);

  void SetGauge(std::string_view name, std::string_view help, double value,
                const MetricLabels& labels = {});
  void AddCounter(std::string_view name, std::string_view help, double delta,
                  const MetricLabels& labels = {});
  // `upper_bounds` ascending, without +Inf (always added); the family's first call fixes them.
  void Observe(std::string_view name, std::string_view help,
               const std::vector<double>& upper_bounds, double value,
               const MetricLabels& labels = {});

  // Every family, sorted by name, as exposition text.
  std::string Render() const;

 private:
  enum class Type { kGauge, kCounter, kHistogram };
  struct Series {
    double value = 0;                     // gauge, counter
    std::vector<uint64_t> bucket_counts;  // histogram: per bucket (not cumulative), then +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  struct Family {
    Type type = Type::kGauge;
    std::string help;
    std::vector<double> upper_bounds;
    std::map<MetricLabels, Series> series;
  };

  Series& SeriesOf(std::string_view name, std::string_view help, Type type,
                   const MetricLabels& labels) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const MetricLabels common_;
  mutable absl::Mutex mu_;
  std::map<std::string, Family, std::less<>> families_ ABSL_GUARDED_BY(mu_);
};

// Upper bounds in seconds for the step-time histograms: 1 ms to 10 min.
const std::vector<double>& SecondsBuckets();

}  // namespace dtrain
