// Where shard bytes come from: one streaming interface over local files, `pipe:CMD` and
// http(s) URLs (the last in http_source.h). Sources read forward only, never seek, and hold a
// bounded buffer. One thread uses a source at a time; errors name the URL and the fix.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace dtrain {

class ByteSource {
 public:
  virtual ~ByteSource() = default;

  // Reads up to `n` bytes into `buffer` and returns how many: 0 only at the end of the data.
  virtual absl::StatusOr<size_t> Read(char* buffer, size_t n) = 0;
  // Reads up to `n` + `tail_n` bytes: into `buffer` first, then any more into `tail`. Returns
  // how many in all; 0 only at the end. Files and pipes fill both in one readv(2), so a reader
  // can take a member's data and the next headers in one system call; this default only
  // fills `buffer`.
  virtual absl::StatusOr<size_t> ReadWithTail(char* buffer, size_t n, char* tail, size_t tail_n) {
    (void)tail;
    (void)tail_n;
    return Read(buffer, n);
  }
  // Reports what only shows at the end (a pipe command's exit status); call after the last
  // Read. Sources release their resources on destruction whether or not Close was called.
  virtual absl::Status Close() = 0;
  // Whether a Read returned 0: the data ended, so Close reports at once (a command that closed
  // its output has ended, or is ending).
  virtual bool ended() const { return false; }
  // The URL as the user wrote it, for messages.
  virtual const std::string& url() const = 0;
};

struct ShardSourceOptions {
  double http_timeout_s = 30;       // connect timeout, and longest wait for the next byte
  int http_retries = 3;             // further attempts after a failed one, each resuming (Range)
  int http_retry_backoff_ms = 500;  // wait before retry k is backoff * 2^k, at most 30 s
  size_t http_buffer_bytes = size_t{1} << 20;  // received but not yet read, per connection
  double pipe_timeout_s = 120;                 // pipe: longest wait for the command's next byte
  // Set by whoever stops the reading thread: once true, a Read waiting on a pipe or a server (or
  // between HTTP retries) gives up within about 100 ms with a Cancelled status, so the stop does
  // not wait out a stalled command.
  const std::atomic<bool>* stop = nullptr;
};

// The file a shard URL names when it is local (a plain path, or "file:PATH"); nullopt for
// "pipe:", "http://" and "https://".
std::optional<std::string> LocalShardPath(const std::string& url);

// Opens "pipe:CMD" (CMD's stdout, run by /bin/sh), "http://" / "https://", "file:PATH" or a
// plain path. Errors: a file that cannot be opened, a command that cannot start; HTTP errors
// show on the first Read.
absl::StatusOr<std::unique_ptr<ByteSource>> OpenShard(const std::string& url,
                                                      const ShardSourceOptions& options);

// `error`, from reading `source`'s archive, with the cause where the source knows a better one: a
// shard command that failed cut its archive short, and its exit status says why. (A source
// still being written is not closed to ask: that would end a healthy command by SIGPIPE.)
absl::Status WithSourceCause(ByteSource& source, const absl::Status& error);

// How often a source waiting on a pipe or a server looks at ShardSourceOptions::stop.
inline constexpr int kStopCheckMs = 100;

// Cancelled once options.stop is set; OK otherwise.
absl::Status CheckNotStopped(const ShardSourceOptions& options, const std::string& url);

// Bytes held in memory, named `name`: for tests and the fuzzer.
std::unique_ptr<ByteSource> MemorySource(std::string data, std::string name);

}  // namespace dtrain
