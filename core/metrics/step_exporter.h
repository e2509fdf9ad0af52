// The training loop's numbers for Prometheus: each step's StepMetrics into a registry that a
// MetricsServer serves at /metrics. Metric names (dtrain_ prefix, base units, _total counters)
// are listed in the README; scripts/prometheus/ holds a scrape config and a Grafana dashboard.
#pragma once

#include <memory>

#include "core/metrics/metrics_server.h"
#include "core/metrics/prometheus.h"
#include "core/metrics/step_metrics.h"

namespace dtrain {

class StepExporter {
 public:
  // Serves this worker's metrics at `address` and `port`, every series labelled with `labels`
  // (rank, node, job); `restarts` is the job's restart count, which this process starts at.
  // nullptr after one warning naming the port when it cannot be bound: training goes on without
  // /metrics.
  static std::unique_ptr<StepExporter> Start(const std::string& address, int port,
                                             MetricLabels labels, int restarts);

  // Called by the training thread after each step; takes the registry's lock only.
  void Record(const StepMetrics& m);

  const MetricsRegistry& registry() const { return registry_; }

 private:
  StepExporter(MetricLabels labels, int restarts);

  MetricsRegistry registry_;
  // The loader's shard counts at the last Record: counters grow by the difference.
  int64_t shards_read_ = 0;
  int64_t shards_skipped_ = 0;
  std::unique_ptr<MetricsServer> server_;  // after registry_: stops before it goes
};

}  // namespace dtrain
