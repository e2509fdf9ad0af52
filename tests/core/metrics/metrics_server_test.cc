#include "core/metrics/metrics_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/testing/free_port.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;

// A server of a registry of one gauge on a free loopback port.
class MetricsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_.SetGauge("dtrain_step", "steps", 1);
    absl::StatusOr<std::unique_ptr<MetricsServer>> server =
        MetricsServer::Start(registry_, "127.0.0.1", port_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  MetricsRegistry registry_{MetricLabels{{"rank", "0"}}};
  const int port_ = testing::FreeTcpPort();
  std::unique_ptr<MetricsServer> server_;
};

TEST_F(MetricsServerTest, ServesTheRegistryAsExpositionText) {
  registry_.SetGauge("dtrain_step", "steps", 2);  // a scrape sees the registry as it is now

  httplib::Client client("127.0.0.1", port_);
  const httplib::Result response = client.Get("/metrics");
  ASSERT_TRUE(response) << httplib::to_string(response.error());
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_THAT(response->body, HasSubstr("dtrain_step{rank=\"0\"} 2\n"));
  EXPECT_EQ(client.Get("/")->status, 404);
}

// Connections that send nothing hold the server's threads for its read timeout each: 24 of them
// held a scrape about 15 s (past Prometheus' 10 s timeout) with httplib's 5 s default, 200 held it
// 22 s with 8 threads that waited 1 s.
TEST_F(MetricsServerTest, IdleConnectionsDoNotHoldAScrapePastPrometheusTimeout) {
  std::vector<int> idle;
  for (int i = 0; i < 200; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{.sin_family = AF_INET, .sin_port = htons(static_cast<uint16_t>(port_))};
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    idle.push_back(fd);
  }
  httplib::Client client("127.0.0.1", port_);
  client.set_read_timeout(30);
  const absl::Time start = absl::Now();
  const httplib::Result response = client.Get("/metrics");
  const absl::Duration waited = absl::Now() - start;
  for (const int fd : idle) ::close(fd);
  ASSERT_TRUE(response) << httplib::to_string(response.error());
  EXPECT_EQ(response->status, 200);
  EXPECT_LT(waited, absl::Seconds(10));
}

TEST(MetricsServerStartTest, ABusyPortIsAnErrorNamingIt) {
  const testing::HeldTcpPort held;
  ASSERT_TRUE(held.bound());
  MetricsRegistry registry(MetricLabels{});
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start(registry, "127.0.0.1", held.port());
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(server.status().message(), HasSubstr(absl::StrCat("port ", held.port())));
}

// logging.metrics_port 65535 with a second worker on the node asks for 65536: an error, where
// the socket took its low 16 bits (0: any free port) and served where nobody scrapes.
TEST(MetricsServerStartTest, APortPast65535IsAnError) {
  MetricsRegistry registry(MetricLabels{});
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start(registry, "127.0.0.1", 65536);
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(), HasSubstr("port 65536 is outside 1-65535"));
}

// logging.metrics_address: an address none of this host's (TEST-NET-1) cannot be listened on,
// and the error names it.
TEST(MetricsServerStartTest, AnAddressOfAnotherHostIsAnErrorNamingIt) {
  MetricsRegistry registry(MetricLabels{});
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start(registry, "192.0.2.1", testing::FreeTcpPort());
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(), HasSubstr("cannot listen on 192.0.2.1 port "));
}

// Two jobs on one port: the second must fail to bind, not share the port's scrapes (httplib's
// default socket options would let it, through SO_REUSEPORT).
TEST(MetricsServerStartTest, ASecondServerOnTheSamePortFails) {
  MetricsRegistry registry(MetricLabels{});
  const int port = testing::FreeTcpPort();
  absl::StatusOr<std::unique_ptr<MetricsServer>> first =
      MetricsServer::Start(registry, "127.0.0.1", port);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(MetricsServer::Start(registry, "127.0.0.1", port).ok());
}

}  // namespace
}  // namespace dtrain
