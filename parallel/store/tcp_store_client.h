// A Store backed by a TcpStoreServer over one TCP connection (protocol in wire.h).
// Thread-safe: a mutex serializes requests, so one slow GET/WAIT delays this client's other
// callers (use one client per thread that blocks for long). Every call is bounded: an operation
// timeout plus `reply_timeout` for the server's answer, so a dead or hung server fails the call
// with an error naming it instead of hanging. After a transport error the connection is closed
// and every later call fails with that first error.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "parallel/store/socket.h"
#include "parallel/store/store.h"
#include "parallel/store/wire.h"

namespace dtrain {

struct TcpStoreClientOptions {
  // The job's token (WorldMembership::rdzv_token; empty: none). It must match the server's: a
  // client with a token also refuses a server without one (it could be an impostor).
  std::string token;
  StoreWireLimits limits;
  // How long Connect retries a refused or unreachable server: ranks may start before rank 0.
  absl::Duration connect_timeout = absl::Seconds(300);
  // Asked between Connect's attempts: true ends it with Cancelled (an agent told to stop while
  // it waits for node 0's store). Null: never.
  std::function<bool()> cancelled;
  // How long the server may take to answer, beyond the request's own timeout for GET/WAIT.
  absl::Duration reply_timeout = absl::Seconds(60);
};

class TcpStoreClient final : public Store {
 public:
  // Connects to `host:port`, retrying with backoff until `connect_timeout`, then completes the
  // handshake (no retry: a rejected token or version is final).
  static absl::StatusOr<std::unique_ptr<TcpStoreClient>> Connect(
      std::string_view host, int port, const TcpStoreClientOptions& options = {});

  absl::Status Set(std::string_view key, std::string_view value) override;
  absl::StatusOr<std::string> Get(std::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta) override;
  // An absent key that does not match yields "".
  absl::StatusOr<std::string> CompareSet(std::string_view key, std::string_view expected,
                                         std::string_view desired) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<bool> Delete(std::string_view key) override;
  absl::StatusOr<int64_t> NumKeys() override;
  absl::Status Ping() override;
  // When this connection closes, however that happens (this client destroyed, its process
  // killed, its host gone and the connection reset), the server adds `delta` to `key`: how a
  // participant tells the others that it is gone.
  absl::Status AddOnClose(std::string_view key, int64_t delta);

  // "host:port" as given to Connect, for messages.
  const std::string& address() const { return address_; }

 private:
  struct Reply {
    StoreMessage type;
    std::string payload;
  };

  TcpStoreClient(std::string address, UniqueFd fd, const TcpStoreClientOptions& options);

  // Sends `request` and reads one reply by `deadline`; a kError reply becomes its status.
  // `what` names the request in errors ("GET rank/3").
  absl::StatusOr<Reply> Call(std::string_view request, absl::Time deadline, std::string_view what);
  absl::Status CheckKey(std::string_view key) const;
  absl::Status CheckValue(std::string_view key, std::string_view value) const;
  absl::Status Unexpected(const Reply& reply, std::string_view what) const;
  absl::Status TimedOut(const Reply& reply, absl::Duration timeout) const;

  const std::string address_;
  const TcpStoreClientOptions options_;
  absl::Mutex mu_;
  UniqueFd fd_ ABSL_GUARDED_BY(mu_);
  // The transport error that closed the connection; OK while it is usable.
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dtrain
