#include "core/metrics/step_exporter.h"

#include <algorithm>

#include "core/util/log.h"

namespace dtrain {
namespace {

constexpr char kSavesHelp[] = "checkpoints saved by this run";
constexpr char kShardsReadHelp[] = "data shards this rank's loader read to their end";
constexpr char kShardsSkippedHelp[] =
    "data shards this rank's loader skipped as unreadable (data.on_error: skip_shard)";
constexpr char kSentHelp[] =
    "bytes this rank sent over its data-, tensor- and pipeline-parallel group";

}  // namespace

StepExporter::StepExporter(MetricLabels labels, int restarts) : registry_(std::move(labels)) {
  registry_.AddCounter("dtrain_restarts_total", "restarts of the job before this worker started",
                       restarts);
  // Counters exist from the start, so a rate over them has a first sample.
  registry_.AddCounter("dtrain_checkpoint_saves_total", kSavesHelp, 0);
  registry_.AddCounter("dtrain_data_shards_read_total", kShardsReadHelp, 0);
  registry_.AddCounter("dtrain_data_shards_skipped_total", kShardsSkippedHelp, 0);
  for (const char* group : {"dp", "tp", "pp"}) {
    registry_.AddCounter("dtrain_sent_bytes_total", kSentHelp, 0, {{"group", group}});
  }
}

std::unique_ptr<StepExporter> StepExporter::Start(const std::string& address, int port,
                                                  MetricLabels labels, int restarts) {
  std::unique_ptr<StepExporter> exporter(new StepExporter(std::move(labels), restarts));
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start(exporter->registry_, address, port);
  if (!server.ok()) {
    LogWarn(
        "logging.metrics_port: %s; this worker serves no /metrics and training goes on (set "
        "logging.metrics_port to a port free on every node for as many ports as workers per "
        "node, or 0 to turn the metrics off)",
        server.status().message());
    return nullptr;
  }
  exporter->server_ = *std::move(server);
  return exporter;
}

void StepExporter::Record(const StepMetrics& m) {
  MetricsRegistry& r = registry_;
  r.SetGauge("dtrain_step", "training steps done", m.step);
  r.SetGauge("dtrain_steps", "training steps the run is set to (train.steps)", m.total_steps);
  r.SetGauge("dtrain_loss", "mean token cross-entropy of the last step's batch, nats", m.loss);
  if (m.val_loss) {
    r.SetGauge("dtrain_validation_loss", "mean token cross-entropy at the last evaluation, nats",
               *m.val_loss);
  }
  r.SetGauge("dtrain_learning_rate", "learning rate of the last step", m.lr);
  r.SetGauge("dtrain_grad_norm", "global gradient L2 norm of the last step, before clipping",
             m.grad_norm);
  r.SetGauge("dtrain_tokens_per_second", "tokens of the global batch per second of the last step",
             m.tokens_per_s);
  r.SetGauge("dtrain_mfu_ratio", "model FLOP/s over the stated peak, 0 to 1", m.mfu_percent / 100);
  r.SetGauge("dtrain_peak_rss_bytes", "peak resident memory of this process",
             m.peak_rss_mib * 1048576);
  const std::vector<double>& buckets = SecondsBuckets();
  const double waits_ms = m.exposed_comm_ms + m.data_wait_ms + m.pp_wait_ms;
  r.Observe("dtrain_step_seconds", "wall time of a training step", buckets, m.step_ms / 1e3);
  r.Observe("dtrain_compute_seconds",
            "time of a step not spent waiting on communication, data or pipeline neighbours",
            buckets, std::max(0.0, m.step_ms - waits_ms) / 1e3);
  r.Observe("dtrain_exposed_communication_seconds",
            "time a step waited on communication not hidden behind compute", buckets,
            m.exposed_comm_ms / 1e3);
  r.Observe("dtrain_data_wait_seconds", "time a step waited for its data", buckets,
            m.data_wait_ms / 1e3);
  r.Observe("dtrain_pipeline_wait_seconds",
            "time a step's pipeline stage waited on its neighbours (parallel.pp > 1)", buckets,
            m.pp_wait_ms / 1e3);
  if (m.ckpt_blocked_ms) {
    r.AddCounter("dtrain_checkpoint_saves_total", kSavesHelp, 1);
    r.Observe("dtrain_checkpoint_block_seconds", "time training waited for a checkpoint save",
              buckets, *m.ckpt_blocked_ms / 1e3);
  }
  r.AddCounter("dtrain_data_shards_read_total", kShardsReadHelp,
               static_cast<double>(m.shards_read - shards_read_));
  r.AddCounter("dtrain_data_shards_skipped_total", kShardsSkippedHelp,
               static_cast<double>(m.shards_skipped - shards_skipped_));
  shards_read_ = m.shards_read;
  shards_skipped_ = m.shards_skipped;
  const std::pair<const char*, int64_t> sent[] = {
      {"dp", m.dp_sent_bytes}, {"tp", m.tp_sent_bytes}, {"pp", m.pp_sent_bytes}};
  for (const auto& [group, bytes] : sent) {
    r.AddCounter("dtrain_sent_bytes_total", kSentHelp, static_cast<double>(bytes),
                 {{"group", group}});
  }
}

}  // namespace dtrain
