// Error plumbing shared by every layer: functions that can fail return absl::Status or
// absl::StatusOr<T>; these macros propagate them without exceptions.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#define DTRAIN_CONCAT_INNER(a, b) a##b
#define DTRAIN_CONCAT(a, b) DTRAIN_CONCAT_INNER(a, b)

// Returns from the current function if `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                 \
  do {                                        \
    if (absl::Status s_ = (expr); !s_.ok()) { \
      return s_;                              \
    }                                         \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, MakeX());` binds the value of an absl::StatusOr or returns its error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(DTRAIN_CONCAT(statusor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()

namespace dtrain {

// The status `cause` with `message` in place of its message: the code and the payloads (e.g. the
// ranks a failed collective blames, parallel/comm/faulty_ranks.h) survive.
inline absl::Status Renamed(const absl::Status& cause, absl::string_view message) {
  absl::Status status(cause.code(), message);
  cause.ForEachPayload([&](absl::string_view type_url, const absl::Cord& payload) {
    status.SetPayload(type_url, payload);
  });
  return status;
}

}  // namespace dtrain
