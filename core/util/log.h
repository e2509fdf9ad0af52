// The one logger: lines on stderr with a level, the UTC date and time and, once known, the rank.
// Thread-safe; a line is written with a single write so ranks and threads do not interleave.
#pragma once

#include <string_view>

#include "absl/strings/str_format.h"

namespace dtrain {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// Prefixes every later line with "[rank R]"; -1 (the default) prints no rank.
void SetLogRank(int rank);
void LogLine(LogLevel level, std::string_view message);

// Lets only errors through while it lives where `quiet`, then restores the level before: for
// warnings already given (a recipe's, read again by each rank, or from a run's own folder).
class QuietLogScope {
 public:
  explicit QuietLogScope(bool quiet = true) : previous_(GetLogLevel()) {
    if (quiet) SetLogLevel(LogLevel::kError);
  }
  ~QuietLogScope() { SetLogLevel(previous_); }
  QuietLogScope(const QuietLogScope&) = delete;
  QuietLogScope& operator=(const QuietLogScope&) = delete;

 private:
  LogLevel previous_;
};

template <typename... Args>
void LogInfo(const absl::FormatSpec<Args...>& format, const Args&... args) {
  LogLine(LogLevel::kInfo, absl::StrFormat(format, args...));
}
template <typename... Args>
void LogWarn(const absl::FormatSpec<Args...>& format, const Args&... args) {
  LogLine(LogLevel::kWarn, absl::StrFormat(format, args...));
}
template <typename... Args>
void LogError(const absl::FormatSpec<Args...>& format, const Args&... args) {
  LogLine(LogLevel::kError, absl::StrFormat(format, args...));
}
template <typename... Args>
void LogDebug(const absl::FormatSpec<Args...>& format, const Args&... args) {
  LogLine(LogLevel::kDebug, absl::StrFormat(format, args...));
}

}  // namespace dtrain
