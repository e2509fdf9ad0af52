#include "launch/doctor/check.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dtrain::doctor {

const char* VerdictName(Verdict verdict) {
  switch (verdict) {
    case Verdict::kOk:
      return "ok";
    case Verdict::kInfo:
      return "info";
    case Verdict::kWarn:
      return "warn";
    case Verdict::kFail:
      return "fail";
  }
  return "?";
}

namespace {

int Count(const std::vector<CheckResult>& results, Verdict verdict) {
  return static_cast<int>(std::count_if(
      results.begin(), results.end(), [&](const CheckResult& r) { return r.verdict == verdict; }));
}

}  // namespace

std::string ResultsText(const std::vector<CheckResult>& results) {
  size_t name_width = 0;
  for (const CheckResult& result : results) name_width = std::max(name_width, result.name.size());
  std::string text;
  for (const CheckResult& result : results) {
    absl::StrAppendFormat(&text, "%-5s %-*s  %s\n", VerdictName(result.verdict),
                          static_cast<int>(name_width), result.name, result.detail);
    if (!result.fix.empty()) absl::StrAppend(&text, "      fix: ", result.fix, "\n");
  }
  absl::StrAppendFormat(&text, "%d ok, %d info, %d warn, %d fail\n", Count(results, Verdict::kOk),
                        Count(results, Verdict::kInfo), Count(results, Verdict::kWarn),
                        Count(results, Verdict::kFail));
  return text;
}

nlohmann::ordered_json ResultsJson(const std::vector<CheckResult>& results) {
  nlohmann::ordered_json json;
  json["checks"] = nlohmann::ordered_json::array();
  for (const CheckResult& result : results) {
    json["checks"].push_back({{"name", result.name},
                              {"verdict", VerdictName(result.verdict)},
                              {"detail", result.detail},
                              {"fix", result.fix}});
  }
  for (Verdict verdict : {Verdict::kOk, Verdict::kInfo, Verdict::kWarn, Verdict::kFail}) {
    json[VerdictName(verdict)] = Count(results, verdict);
  }
  return json;
}

bool AnyFailed(const std::vector<CheckResult>& results) {
  return Count(results, Verdict::kFail) > 0;
}

}  // namespace dtrain::doctor
