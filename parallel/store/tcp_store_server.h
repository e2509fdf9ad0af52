// The rendezvous store's server: an in-memory key-value map served over TCP (protocol in
// wire.h) by one background thread running an epoll loop over non-blocking sockets. It runs
// inside rank 0, or in node 0's launcher agent; ranks and agents reach it through TcpStoreClient.
//
// Blocking GET and WAIT requests are parked and answered when their keys arrive or their
// deadline passes, so one waiting client never delays another. A malformed, oversize or
// unauthenticated frame closes only that connection. Destruction stops the thread and closes
// every connection, so clients blocked on it fail promptly. All store state lives on the server
// thread; port() may be called from any thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "parallel/store/wire.h"

namespace dtrain {

struct TcpStoreServerOptions {
  // The job's token (WorldMembership::rdzv_token). Without one (empty) only clients on this
  // host are admitted (IsThisHostsAddress).
  std::string token;
  StoreWireLimits limits;
  // A connection that has not finished the handshake by then is closed (a stuck or hostile
  // peer cannot hold a slot forever).
  absl::Duration handshake_timeout = absl::Seconds(30);
  // How long an occupied port is retried before Start fails.
  absl::Duration bind_retry = absl::Seconds(10);
  // A client whose host stops answering (it crashed, or the network to it is gone: nothing
  // closes the connection) is closed after about this long, by TCP keepalive probes on an idle
  // connection and TCP_USER_TIMEOUT on one with unacknowledged replies. A live client's kernel
  // answers the probes however idle the client is.
  absl::Duration dead_peer_timeout = absl::Seconds(20);
};

class TcpStoreServer {
 public:
  // Binds `host:port` ("" for every interface, IPv4 and IPv6; port 0 picks a free one, see
  // port()) and starts serving. An occupied port fails with the port named and the fix.
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Start(
      std::string_view host, int port, const TcpStoreServerOptions& options = {});

  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  // The bound port (the chosen one when Start was given 0).
  int port() const { return port_; }

 private:
  class Loop;
  TcpStoreServer(int port, std::unique_ptr<Loop> loop);

  const int port_;
  std::unique_ptr<Loop> loop_;
  std::thread thread_;
};

}  // namespace dtrain
