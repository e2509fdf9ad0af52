#include "core/metrics/metrics_server.h"

#include <sys/socket.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "httplib.h"

namespace dtrain {

MetricsServer::MetricsServer(std::unique_ptr<httplib::Server> server)
    : server_(std::move(server)), thread_([this] { server_->listen_after_bind(); }) {
  // httplib's stop() does nothing before the loop runs, so a server destroyed at once would
  // never end its thread; the loop starts on a bound socket without waiting for anything.
  while (!server_->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

MetricsServer::~MetricsServer() {
  server_->stop();
  thread_.join();
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const MetricsRegistry& registry,
                                                                    const std::string& address,
                                                                    int port) {
  // Past 65535 the socket would take the port's low 16 bits: 65536 is 0, any free port.
  if (port < 1 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("port ", port, " is outside 1-65535 (the port plus the worker's local rank)"));
  }
  auto server = std::make_unique<httplib::Server>();
  // httplib's default sets SO_REUSEPORT, which would let a second job bind the same port and
  // answer half of the scrapes; SO_REUSEADDR alone still rebinds a port a restarted worker left
  // in TIME_WAIT.
  server->set_socket_options([](int socket) {
    const int yes = 1;
    setsockopt(socket, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  // Each of httplib's threads serves one connection at a time and waits its read timeout for a
  // request that does not come: with 8 threads and httplib's 5 s, 50 idle connections (a port
  // scanner, a stuck client) held a scrape 23 s, past Prometheus' 10 s timeout; at 1 s, 200 held
  // it 22 s. A scrape asks at once: 32 threads that wait 250 ms serve 200 idle connections in
  // under 2 s.
  server->new_task_queue = [] { return new httplib::ThreadPool(32); };
  server->set_read_timeout(0, 250000);
  server->set_keep_alive_timeout(1);
  server->Get("/metrics", [&registry](const httplib::Request&, httplib::Response& response) {
    response.set_content(registry.Render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  if (!server->bind_to_port(address, port)) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address, " port ", port,
                                               " for /metrics (is another process on the port, "
                                               "or the address none of this host's?)"));
  }
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(server)));
}

}  // namespace dtrain
