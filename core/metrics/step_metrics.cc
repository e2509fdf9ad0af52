#include "core/metrics/step_metrics.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <new>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/backend/cuda/bf16.h"
#include "core/util/status.h"
#include "nlohmann/json.hpp"

namespace dtrain {
namespace {

std::string FormatDuration(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, (s / 60) % 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%ds", s);
}

// The number at `key` into `field`. A missing key leaves `field` as it is: lines written by an
// older dtrain lack the newer keys.
template <typename T>
absl::Status ReadNumber(const nlohmann::json& j, const char* key, T& field) {
  const auto it = j.find(key);
  if (it == j.end()) return absl::OkStatus();
  // JSON has no NaN or infinity: the writer prints them as null (a diverged run's loss).
  if constexpr (std::is_floating_point_v<T>) {
    if (it->is_null()) {
      field = std::numeric_limits<T>::quiet_NaN();
      return absl::OkStatus();
    }
  }
  if (!it->is_number()) {
    return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" is not a number"));
  }
  field = it->get<T>();
  return absl::OkStatus();
}

template <typename T>
absl::Status ReadNumber(const nlohmann::json& j, const char* key, std::optional<T>& field) {
  if (!j.contains(key)) return absl::OkStatus();
  T value{};
  RETURN_IF_ERROR(ReadNumber(j, key, value));
  field = value;
  return absl::OkStatus();
}

}  // namespace

std::string FormatStepLine(const StepMetrics& m) {
  std::string line = absl::StrFormat(
      "step %d/%d | loss %.4f | lr %.2e | norm %.3f | %.1f ms | %.0f tok/s | MFU %.1f%% | "
      "rss %.0f MiB | eta %s | data %.1f ms",
      m.step, m.total_steps, m.loss, m.lr, m.grad_norm, m.step_ms, m.tokens_per_s, m.mfu_percent,
      m.peak_rss_mib, FormatDuration(m.eta_s), m.data_wait_ms);
  if (m.exposed_comm_ms > 0) absl::StrAppendFormat(&line, " | comm %.1f ms", m.exposed_comm_ms);
  if (m.pp_wait_ms > 0) absl::StrAppendFormat(&line, " | pp wait %.1f ms", m.pp_wait_ms);
  if (m.val_loss) absl::StrAppendFormat(&line, " | val %.4f", *m.val_loss);
  if (m.ckpt_blocked_ms) absl::StrAppendFormat(&line, " | ckpt %.1f ms", *m.ckpt_blocked_ms);
  if (m.straggler_rank && m.straggler_lag_pct) {
    absl::StrAppendFormat(&line, " | straggler rank %d +%.0f%%", *m.straggler_rank,
                          *m.straggler_lag_pct);
  }
  return line;
}

std::string StepMetricsJson(const StepMetrics& m) {
  nlohmann::json j = {{"step", m.step},
                      {"time", m.time},
                      {"loss", m.loss},
                      {"lr", m.lr},
                      {"grad_norm", m.grad_norm},
                      {"step_ms", m.step_ms},
                      {"tokens_per_s", m.tokens_per_s},
                      {"mfu_percent", m.mfu_percent},
                      {"exposed_comm_ms", m.exposed_comm_ms},
                      {"data_wait_ms", m.data_wait_ms},
                      {"pp_wait_ms", m.pp_wait_ms},
                      {"dp_sent_bytes", m.dp_sent_bytes},
                      {"tp_sent_bytes", m.tp_sent_bytes},
                      {"pp_sent_bytes", m.pp_sent_bytes},
                      {"peak_rss_mib", m.peak_rss_mib},
                      {"eta_s", m.eta_s}};
  if (m.val_loss) j["val_loss"] = *m.val_loss;
  if (m.ckpt_blocked_ms) j["ckpt_blocked_ms"] = *m.ckpt_blocked_ms;
  if (m.resumed_from_step) j["resumed_from_step"] = *m.resumed_from_step;
  if (!m.layout.empty()) j["layout"] = m.layout;
  if (m.restart) j["restart"] = *m.restart;
  if (m.peak_gflops) j["peak_gflops"] = *m.peak_gflops;
  if (m.straggler_rank) j["straggler_rank"] = *m.straggler_rank;
  if (m.straggler_lag_pct) j["straggler_lag_pct"] = *m.straggler_lag_pct;
  return j.dump();
}

absl::StatusOr<StepMetrics> ParseStepMetricsJson(std::string_view line) {
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::InvalidArgumentError("not a JSON object");
  for (const char* key : {"step", "loss"}) {
    if (!j.contains(key)) return absl::InvalidArgumentError(absl::StrCat("no \"", key, "\""));
  }
  StepMetrics m;
  RETURN_IF_ERROR(ReadNumber(j, "step", m.step));
  RETURN_IF_ERROR(ReadNumber(j, "time", m.time));
  RETURN_IF_ERROR(ReadNumber(j, "loss", m.loss));
  RETURN_IF_ERROR(ReadNumber(j, "lr", m.lr));
  RETURN_IF_ERROR(ReadNumber(j, "grad_norm", m.grad_norm));
  RETURN_IF_ERROR(ReadNumber(j, "step_ms", m.step_ms));
  RETURN_IF_ERROR(ReadNumber(j, "tokens_per_s", m.tokens_per_s));
  RETURN_IF_ERROR(ReadNumber(j, "mfu_percent", m.mfu_percent));
  RETURN_IF_ERROR(ReadNumber(j, "exposed_comm_ms", m.exposed_comm_ms));
  RETURN_IF_ERROR(ReadNumber(j, "data_wait_ms", m.data_wait_ms));
  RETURN_IF_ERROR(ReadNumber(j, "pp_wait_ms", m.pp_wait_ms));
  RETURN_IF_ERROR(ReadNumber(j, "dp_sent_bytes", m.dp_sent_bytes));
  RETURN_IF_ERROR(ReadNumber(j, "tp_sent_bytes", m.tp_sent_bytes));
  RETURN_IF_ERROR(ReadNumber(j, "pp_sent_bytes", m.pp_sent_bytes));
  RETURN_IF_ERROR(ReadNumber(j, "peak_rss_mib", m.peak_rss_mib));
  RETURN_IF_ERROR(ReadNumber(j, "eta_s", m.eta_s));
  RETURN_IF_ERROR(ReadNumber(j, "val_loss", m.val_loss));
  RETURN_IF_ERROR(ReadNumber(j, "ckpt_blocked_ms", m.ckpt_blocked_ms));
  RETURN_IF_ERROR(ReadNumber(j, "resumed_from_step", m.resumed_from_step));
  RETURN_IF_ERROR(ReadNumber(j, "restart", m.restart));
  RETURN_IF_ERROR(ReadNumber(j, "peak_gflops", m.peak_gflops));
  if (const auto layout = j.find("layout"); layout != j.end()) {
    if (!layout->is_string()) return absl::InvalidArgumentError("\"layout\" is not a string");
    m.layout = layout->get<std::string>();
  }
  RETURN_IF_ERROR(ReadNumber(j, "straggler_rank", m.straggler_rank));
  RETURN_IF_ERROR(ReadNumber(j, "straggler_lag_pct", m.straggler_lag_pct));
  return m;
}

double PeakRssMib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

namespace {

// The best of several timings of one `size` x `size` x `size` GEMM on `dtype` inputs (a linear
// layer's, with float32 sums), in seconds.
double BestGemmSeconds(Backend& backend, int size, DataType dtype) {
  constexpr int kRepeats = 8;  // the best of several: a busy machine only ever slows a run
  const size_t count = static_cast<size_t>(size) * size;
  const DeviceBuffer a = backend.Allocate(count, dtype), b = backend.Allocate(count, dtype),
                     c = backend.Allocate(count, dtype);
  // 0.5 in float32 and in bf16 (its upper half).
  const std::vector<float> halves(std::min<size_t>(count, size_t{1} << 20), 0.5f);
  const std::vector<Bf16> bf16_halves(halves.size(), cuda::FromFloat<Bf16>(0.5f));
  const size_t bytes = DataTypeBytes(dtype);
  const void* values = dtype == DataType::kBF16 ? static_cast<const void*>(bf16_halves.data())
                                                : static_cast<const void*>(halves.data());
  for (size_t at = 0; at < count; at += halves.size()) {
    const size_t n = std::min(halves.size(), count - at);
    backend.CopyFromHost((a.values() + at).data(), values, n * bytes);
    backend.CopyFromHost((b.values() + at).data(), values, n * bytes);
  }
  const auto gemm = [&] {
    backend.LinearForward(c.values(), a.values(), b.values(), nullptr, size, size, size);
    backend.Synchronize();
  };
  gemm();  // warm up
  double best_s = 1e30;
  for (int i = 0; i < kRepeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    gemm();
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    best_s = std::min(best_s, elapsed.count());
  }
  return best_s;
}

}  // namespace

double MeasureGemmFlops(Backend& backend, DataType dtype) {
  // From 1024 the size doubles until a GEMM takes 5 ms, so that on a GPU the launches and the
  // wait are a small part of the time (1024 takes microseconds there, milliseconds on a CPU).
  // A size whose three matrices no longer fit beside the model ends the search there.
  constexpr int kLargest = 8192;
  constexpr double kLongEnough_s = 5e-3;
  double flops = 0;
  for (int size = 1024; size <= kLargest; size *= 2) {
    double seconds = 0;
    try {
      seconds = BestGemmSeconds(backend, size, dtype);
    } catch (const std::bad_alloc&) {  // the CPU backend's too, not only OutOfMemory
      if (flops > 0) break;
      throw;
    }
    flops = 2.0 * size * static_cast<double>(size) * size / seconds;
    if (seconds >= kLongEnough_s) break;
  }
  return flops;
}

double MfuPercent(double rank_flops, double& peak_flops, bool& raised) {
  raised = rank_flops > peak_flops;
  if (raised) peak_flops = rank_flops;
  return 100.0 * rank_flops / peak_flops;
}

}  // namespace dtrain
