// The rendezvous key-value store that ranks and launcher agents use to find each other: a TCP
// server in one process, clients everywhere. Keys and values are byte strings. Every blocking call
// has a timeout; a timeout error names the keys that never appeared. Implementations are
// thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dtrain {

// How often a long wait for a store or at a rendezvous says what it waits for: a silent wait of
// minutes looks like a hang.
inline constexpr absl::Duration kWaitReportInterval = absl::Seconds(30);

class Store {
 public:
  virtual ~Store() = default;

  virtual absl::Status Set(std::string_view key, std::string_view value) = 0;
  // Blocks until `key` exists (DeadlineExceeded naming the key after `timeout`).
  virtual absl::StatusOr<std::string> Get(std::string_view key, absl::Duration timeout) = 0;
  // Adds `delta` to the integer counter at `key` (absent = 0) and returns the new value.
  virtual absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta) = 0;
  // Sets `key` to `desired` if its value equals `expected` (an absent key matches an empty
  // `expected`); returns the value the key holds afterwards.
  virtual absl::StatusOr<std::string> CompareSet(std::string_view key, std::string_view expected,
                                                 std::string_view desired) = 0;
  // Blocks until every key exists; DeadlineExceeded names the keys still missing.
  virtual absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) = 0;
  // Returns whether the key existed.
  virtual absl::StatusOr<bool> Delete(std::string_view key) = 0;
  virtual absl::StatusOr<int64_t> NumKeys() = 0;
  virtual absl::Status Ping() = 0;
};

}  // namespace dtrain
