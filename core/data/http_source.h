// http(s) shards through libcurl: the body streams through a bounded buffer (the transfer
// pauses while the buffer is full); a failed or stalled transfer is retried, resuming with a
// Range request from the last byte received. One thread per source; errors name the URL.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/data/shard_source.h"

namespace dtrain {

// Connect timeout and the longest wait for the next byte are options.http_timeout_s; HTTP 408,
// 429 and 5xx, dropped connections and stalls are retried options.http_retries times; other
// HTTP errors (404, 403, ...) fail at once. Connects lazily: errors show on the first Read.
absl::StatusOr<std::unique_ptr<ByteSource>> OpenHttp(const std::string& url,
                                                     const ShardSourceOptions& options);

}  // namespace dtrain
