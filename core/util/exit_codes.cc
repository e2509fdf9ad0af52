#include "core/util/exit_codes.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"

namespace dtrain {
namespace {

constexpr char kExitCodeUrl[] = "dtrain/exit-code";

}  // namespace

void SetExitCode(absl::Status& status, int exit_code) {
  status.SetPayload(kExitCodeUrl, absl::Cord(std::to_string(exit_code)));
}

absl::Status WithExitCode(absl::Status status, int exit_code) {
  SetExitCode(status, exit_code);
  return status;
}

std::optional<int> ExitCodeOf(const absl::Status& status) {
  const auto payload = status.GetPayload(kExitCodeUrl);
  int exit_code = 0;
  if (!payload || !absl::SimpleAtoi(std::string(*payload), &exit_code)) return std::nullopt;
  return exit_code;
}

}  // namespace dtrain
