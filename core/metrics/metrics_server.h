// Serves a MetricsRegistry at GET /metrics over HTTP (cpp-httplib) from a thread of its own, so
// a scrape, slow or stuck, never runs on the training thread.
#pragma once

#include <memory>
#include <thread>

#include "absl/status/statusor.h"
#include "core/metrics/prometheus.h"

namespace httplib {
class Server;
}

namespace dtrain {

class MetricsServer {
 public:
  // Listens at `address` ("0.0.0.0": every interface) and `port`; `registry` must outlive the
  // server. Unavailable, naming both, when they cannot be bound (another process holds the
  // port, or the address is none of this host's).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const MetricsRegistry& registry,
                                                              const std::string& address, int port);
  // Stops listening and waits for the serving thread.
  ~MetricsServer();

 private:
  explicit MetricsServer(std::unique_ptr<httplib::Server> server);

  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
};

}  // namespace dtrain
