#include "core/metrics/prometheus.h"

#include <charconv>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace {

// Go's (and so Prometheus's) spelling of a sample value: the shortest text that reads back as
// the same double, with NaN and +Inf / -Inf.
std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buffer[32];
  const auto [end, error] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, end);
}

// Label values escape backslash, double quote and newline; help text backslash and newline.
std::string Escape(std::string_view text, bool quote) {
  std::string escaped;
  for (const char c : text) {
    if (c == '\\') {
      escaped += "\\\\";
    } else if (c == '\n') {
      escaped += "\\n";
    } else if (c == '"' && quote) {
      escaped += "\\\"";
    } else {
      escaped += c;
    }
  }
  return escaped;
}

// `{a="1",b="2"}`, or nothing without labels.
std::string FormatLabels(const MetricLabels& labels) {
  if (labels.empty()) return "";
  std::string text = "{";
  for (const auto& [name, value] : labels) {
    if (text.size() > 1) text += ',';
    absl::StrAppend(&text, name, "=\"", Escape(value, /*quote=*/true), "\"");
  }
  return text + "}";
}

}  // namespace

MetricsRegistry::MetricsRegistry(MetricLabels common) : common_(std::move(common)) {}

MetricsRegistry::Series& MetricsRegistry::SeriesOf(std::string_view name, std::string_view help,
                                                   Type type, const MetricLabels& labels) {
  auto it = families_.find(name);
  if (it == families_.end()) {
    it =
        families_.emplace(std::string(name), Family{.type = type, .help = std::string(help)}).first;
  }
  MetricLabels all = common_;
  all.insert(all.end(), labels.begin(), labels.end());
  return it->second.series[all];
}

void MetricsRegistry::SetGauge(std::string_view name, std::string_view help, double value,
                               const MetricLabels& labels) {
  absl::MutexLock lock(&mu_);
  SeriesOf(name, help, Type::kGauge, labels).value = value;
}

void MetricsRegistry::AddCounter(std::string_view name, std::string_view help, double delta,
                                 const MetricLabels& labels) {
  absl::MutexLock lock(&mu_);
  SeriesOf(name, help, Type::kCounter, labels).value += delta;
}

void MetricsRegistry::Observe(std::string_view name, std::string_view help,
                              const std::vector<double>& upper_bounds, double value,
                              const MetricLabels& labels) {
  absl::MutexLock lock(&mu_);
  Series& series = SeriesOf(name, help, Type::kHistogram, labels);
  std::vector<double>& bounds = families_.find(name)->second.upper_bounds;
  if (bounds.empty()) bounds = upper_bounds;
  series.bucket_counts.resize(bounds.size() + 1);
  size_t bucket = 0;
  while (bucket < bounds.size() && value > bounds[bucket]) ++bucket;
  ++series.bucket_counts[bucket];
  series.sum += value;
  ++series.count;
}

std::string MetricsRegistry::Render() const {
  absl::MutexLock lock(&mu_);
  std::string text;
  for (const auto& [name, family] : families_) {
    const char* type = family.type == Type::kGauge     ? "gauge"
                       : family.type == Type::kCounter ? "counter"
                                                       : "histogram";
    absl::StrAppend(&text, "# HELP ", name, " ", Escape(family.help, /*quote=*/false), "\n",
                    "# TYPE ", name, " ", type, "\n");
    for (const auto& [labels, series] : family.series) {
      if (family.type != Type::kHistogram) {
        absl::StrAppend(&text, name, FormatLabels(labels), " ", FormatValue(series.value), "\n");
        continue;
      }
      uint64_t cumulative = 0;
      for (size_t i = 0; i <= family.upper_bounds.size(); ++i) {
        cumulative += series.bucket_counts[i];
        MetricLabels with_le = labels;
        with_le.emplace_back("le", i < family.upper_bounds.size()
                                       ? FormatValue(family.upper_bounds[i])
                                       : std::string("+Inf"));
        absl::StrAppend(&text, name, "_bucket", FormatLabels(with_le), " ", cumulative, "\n");
      }
      absl::StrAppend(&text, name, "_sum", FormatLabels(labels), " ", FormatValue(series.sum), "\n",
                      name, "_count", FormatLabels(labels), " ", series.count, "\n");
    }
  }
  return text;
}

const std::vector<double>& SecondsBuckets() {
  static const std::vector<double>* buckets = new std::vector<double>{
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 600};
  return *buckets;
}

}  // namespace dtrain
