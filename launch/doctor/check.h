// What `dtrain doctor` reports: one result per check, each with a verdict and the concrete fix,
// as text for a terminal or as JSON. Formatting only; the checks are in node_checks.h and
// network_checks.h.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace dtrain::doctor {

// kInfo is a fact that needs no action (no GPU on a CPU recipe); only kFail fails the command.
enum class Verdict { kOk, kInfo, kWarn, kFail };

// "ok", "info", "warn", "fail".
const char* VerdictName(Verdict verdict);

struct CheckResult {
  std::string name;  // e.g. "network.rdma", "nccl.NCCL_IB_GID_INDEX"
  Verdict verdict = Verdict::kOk;
  std::string detail;  // what was found, with units
  std::string fix;     // what to do; empty for ok and info
};

// One line per check ("ok    network.interfaces  eth0 up 100 Gb/s"), the fix indented below it,
// and a closing count of each verdict.
std::string ResultsText(const std::vector<CheckResult>& results);

// {"checks": [{"name", "verdict", "detail", "fix"}...], "ok": n, "info": n, "warn": n, "fail": n}.
nlohmann::ordered_json ResultsJson(const std::vector<CheckResult>& results);

bool AnyFailed(const std::vector<CheckResult>& results);

}  // namespace dtrain::doctor
