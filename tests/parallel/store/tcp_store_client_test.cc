#include "parallel/store/tcp_store_client.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "parallel/store/tcp_store_server.h"
#include "tests/testing/free_port.h"

namespace dtrain {
namespace {

// Tests pass tokens explicitly so that a DTRAIN_RDZV_TOKEN in the environment cannot leak in.
TcpStoreServerOptions ServerOptions(std::string token = "") {
  TcpStoreServerOptions options;
  options.token = std::move(token);
  return options;
}

TcpStoreClientOptions ClientOptions(std::string token = "") {
  TcpStoreClientOptions options;
  options.token = std::move(token);
  options.connect_timeout = absl::Seconds(5);
  options.reply_timeout = absl::Seconds(5);
  return options;
}

std::unique_ptr<TcpStoreServer> StartServer(std::string token = "") {
  absl::StatusOr<std::unique_ptr<TcpStoreServer>> server =
      TcpStoreServer::Start("127.0.0.1", 0, ServerOptions(std::move(token)));
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

std::unique_ptr<TcpStoreClient> ConnectClient(int port, std::string token = "") {
  absl::StatusOr<std::unique_ptr<TcpStoreClient>> client =
      TcpStoreClient::Connect("127.0.0.1", port, ClientOptions(std::move(token)));
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? std::move(*client) : nullptr;
}

bool Contains(const absl::Status& status, std::string_view text) {
  return std::string(status.message()).find(text) != std::string::npos;
}

TEST(TcpStoreClientTest, OperationsFollowTheStoreContract) {
  auto server = StartServer();
  auto client = ConnectClient(server->port());
  ASSERT_NE(client, nullptr);

  EXPECT_TRUE(client->Ping().ok());
  EXPECT_EQ(*client->NumKeys(), 0);
  ASSERT_TRUE(client->Set("a", "1").ok());
  ASSERT_TRUE(client->Set("empty", "").ok());
  EXPECT_EQ(*client->Get("a", absl::Seconds(1)), "1");
  EXPECT_EQ(*client->Get("empty", absl::Seconds(1)), "");
  const std::string binary("\0\xff\n", 3);
  ASSERT_TRUE(client->Set(binary, binary).ok());
  EXPECT_EQ(*client->Get(binary, absl::Seconds(1)), binary);
  const std::string large(3 << 20, 'v');
  ASSERT_TRUE(client->Set("large", large).ok());
  EXPECT_EQ(*client->Get("large", absl::Seconds(1)), large);

  EXPECT_EQ(*client->Add("counter", 5), 5);
  EXPECT_EQ(*client->Add("counter", -7), -2);
  EXPECT_EQ(*client->Get("counter", absl::Seconds(1)), "-2");
  const absl::StatusOr<int64_t> not_a_number = client->Add("large", 1);
  EXPECT_TRUE(absl::IsInvalidArgument(not_a_number.status())) << not_a_number.status();
  EXPECT_TRUE(Contains(not_a_number.status(), "key large")) << not_a_number.status();
  EXPECT_TRUE(client->Ping().ok()) << "an error reply keeps the connection";

  EXPECT_EQ(*client->CompareSet("cas", "", "first"), "first");  // Absent matches "".
  EXPECT_EQ(*client->CompareSet("cas", "wrong", "second"), "first");
  EXPECT_EQ(*client->CompareSet("cas", "first", "second"), "second");
  EXPECT_EQ(*client->CompareSet("absent", "x", "y"), "");
  EXPECT_FALSE(*client->Delete("absent"));

  EXPECT_TRUE(client->Wait({"a", "counter", "cas"}, absl::Seconds(1)).ok());
  EXPECT_TRUE(client->Wait({}, absl::Seconds(1)).ok());
  EXPECT_EQ(*client->NumKeys(), 6);
  EXPECT_TRUE(*client->Delete("a"));
  EXPECT_FALSE(*client->Delete("a"));
  EXPECT_EQ(*client->NumKeys(), 5);
}

TEST(TcpStoreClientTest, RejectsOversizeKeysBeforeSending) {
  auto server = StartServer();
  auto client = ConnectClient(server->port());
  const absl::Status status = client->Set(std::string(5000, 'k'), "v");
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_TRUE(Contains(status, "4096")) << status;
  EXPECT_TRUE(client->Ping().ok());
}

TEST(TcpStoreClientTest, ConcurrentClientsCountExactly) {
  constexpr int kThreads = 32;
  constexpr int kOpsPerThread = 200;
  auto server = StartServer();
  std::vector<std::unique_ptr<TcpStoreClient>> clients;
  for (int i = 0; i < kThreads; ++i) clients.push_back(ConnectClient(server->port()));
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      for (int op = 0; op < kOpsPerThread; ++op) {
        if (!clients[i]->Add("total", 1).ok()) ++failures;
        if (!clients[i]->Add(absl::StrFormat("thread/%d", i), 2).ok()) ++failures;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(*clients[0]->Get("total", absl::Seconds(1)),
            absl::StrFormat("%d", kThreads * kOpsPerThread));
  for (int i = 0; i < kThreads; ++i) {
    EXPECT_EQ(*clients[0]->Add(absl::StrFormat("thread/%d", i), 0), 2 * kOpsPerThread);
  }
  EXPECT_EQ(*clients[0]->NumKeys(), kThreads + 1);
}

TEST(TcpStoreClientTest, OneClientIsSafeToShareAcrossThreads) {
  auto server = StartServer();
  auto client = ConnectClient(server->port());
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      for (int op = 0; op < 100; ++op) ASSERT_TRUE(client->Add("shared", 1).ok());
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(*client->Add("shared", 0), 800);
}

TEST(TcpStoreClientTest, BlockingGetReturnsWhenAnotherClientSets) {
  auto server = StartServer();
  auto waiter = ConnectClient(server->port());
  auto setter = ConnectClient(server->port());
  absl::StatusOr<std::string> got;
  std::thread blocked([&] { got = waiter->Get("late", absl::Seconds(10)); });
  absl::SleepFor(absl::Milliseconds(100));
  // The parked GET must not block other clients.
  EXPECT_TRUE(setter->Ping().ok());
  ASSERT_TRUE(setter->Set("late", "here").ok());
  blocked.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "here");
}

TEST(TcpStoreClientTest, WaitFollowsKeysThatComeAndGo) {
  auto server = StartServer();
  auto waiter = ConnectClient(server->port());
  auto setter = ConnectClient(server->port());
  std::atomic<bool> done{false};
  absl::Status waited;
  std::thread blocked([&] {
    waited = waiter->Wait({"x", "y", "z"}, absl::Seconds(10));
    done = true;
  });
  ASSERT_TRUE(setter->Set("x", "1").ok());
  ASSERT_TRUE(setter->Add("z", 1).ok());
  ASSERT_TRUE(*setter->Delete("x"));
  ASSERT_TRUE(setter->Set("y", "1").ok());
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(done.load()) << "x was deleted before y arrived";
  ASSERT_TRUE(setter->CompareSet("x", "", "again").ok());
  blocked.join();
  EXPECT_TRUE(waited.ok()) << waited;
}

TEST(TcpStoreClientTest, TimeoutsNameTheMissingKeys) {
  auto server = StartServer();
  auto client = ConnectClient(server->port());
  ASSERT_TRUE(client->Set("rank/4", "up").ok());
  const std::string store = absl::StrFormat("127.0.0.1:%d", server->port());

  const absl::Time start = absl::Now();
  const absl::StatusOr<std::string> got = client->Get("rank/3", absl::Milliseconds(200));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(190));  // waited; load only lengthens it
  ASSERT_TRUE(absl::IsDeadlineExceeded(got.status())) << got.status();
  EXPECT_EQ(got.status().message(),
            absl::StrFormat("timed out after 200ms waiting for key rank/3 in store %s", store));

  const absl::Status waited = client->Wait({"rank/3", "rank/4", "rank/5"}, absl::Milliseconds(50));
  ASSERT_TRUE(absl::IsDeadlineExceeded(waited)) << waited;
  EXPECT_EQ(
      waited.message(),
      absl::StrFormat("timed out after 50ms waiting for keys rank/3, rank/5 in store %s", store));
  // A zero timeout is a check.
  EXPECT_TRUE(absl::IsDeadlineExceeded(client->Get("rank/3", absl::ZeroDuration()).status()));
  EXPECT_TRUE(client->Wait({"rank/4"}, absl::ZeroDuration()).ok());
  EXPECT_TRUE(client->Ping().ok());
}

TEST(TcpStoreClientTest, ConnectRetriesUntilTheServerStarts) {
  const int port = testing::FreeTcpPort();
  std::unique_ptr<TcpStoreServer> server;
  std::thread late_start([&] {
    absl::SleepFor(absl::Milliseconds(300));
    absl::StatusOr<std::unique_ptr<TcpStoreServer>> started =
        TcpStoreServer::Start("127.0.0.1", port, ServerOptions());
    ASSERT_TRUE(started.ok()) << started.status();
    server = std::move(*started);
  });
  absl::StatusOr<std::unique_ptr<TcpStoreClient>> client =
      TcpStoreClient::Connect("127.0.0.1", port, ClientOptions());
  late_start.join();
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->Ping().ok());
}

TEST(TcpStoreClientTest, ConnectGivesUpWithTheLikelyCauses) {
  const int port = testing::FreeTcpPort();
  TcpStoreClientOptions options = ClientOptions();
  options.connect_timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<TcpStoreClient>> client =
      TcpStoreClient::Connect("127.0.0.1", port, options);
  EXPECT_LT(absl::Now() - start, absl::Seconds(60));  // a generous cap: it gives up, not hangs
  ASSERT_FALSE(client.ok());
  const absl::Status& status = client.status();
  EXPECT_TRUE(absl::IsUnavailable(status)) << status;
  for (const std::string& text :
       {absl::StrFormat("127.0.0.1:%d", port), std::string("Connection refused"),
        std::string("MASTER_ADDR"), std::string("MASTER_PORT"), std::string("firewall"),
        std::string("rank 0")}) {
    EXPECT_TRUE(Contains(status, text)) << text << " missing from: " << status;
  }
}

// A long wait for a store that is not there says so every kWaitReportInterval (30 s): minutes of
// silence looked like a hang.
TEST(TcpStoreClientTest, ALongWaitSaysWhatItWaitsFor) {
  const int port = testing::FreeTcpPort();
  TcpStoreClientOptions options = ClientOptions();
  options.connect_timeout = kWaitReportInterval + absl::Seconds(2);
  ::testing::internal::CaptureStderr();
  const absl::StatusOr<std::unique_ptr<TcpStoreClient>> client =
      TcpStoreClient::Connect("127.0.0.1", port, options);
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(client.ok());
  // 30 s, or 31 s where a retry's backoff ended past the report's time.
  EXPECT_NE(
      said.find(absl::StrFormat("still waiting for the rendezvous store at 127.0.0.1:%d (3", port)),
      std::string::npos)
      << said;
  EXPECT_NE(said.find("s of 32s): "), std::string::npos) << said;
}

TEST(TcpStoreClientTest, SilentServerFailsTheHandshakeInsteadOfHanging) {
  // A socket that listens but never answers: the kernel accepts the TCP connection for it.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  socklen_t size = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size);
  const int port = ntohs(address.sin_port);

  TcpStoreClientOptions options = ClientOptions();
  options.reply_timeout = absl::Milliseconds(200);
  absl::StatusOr<std::unique_ptr<TcpStoreClient>> client =
      TcpStoreClient::Connect("127.0.0.1", port, options);
  ASSERT_FALSE(client.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(client.status())) << client.status();
  EXPECT_TRUE(Contains(client.status(), absl::StrFormat("127.0.0.1:%d", port))) << client.status();

  // The handshake waits no longer than the connection's own timeout (an agent's
  // --rdzv-timeout-s), and a stop ends it within a poll.
  options.reply_timeout = absl::Seconds(60);
  options.connect_timeout = absl::Milliseconds(300);
  absl::Time start = absl::Now();
  client = TcpStoreClient::Connect("127.0.0.1", port, options);
  EXPECT_TRUE(absl::IsDeadlineExceeded(client.status())) << client.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  options.connect_timeout = absl::Seconds(60);
  std::atomic<bool> stop{false};
  options.cancelled = [&stop] { return stop.load(); };
  std::thread stopper([&stop] {
    absl::SleepFor(absl::Milliseconds(300));
    stop = true;
  });
  start = absl::Now();
  client = TcpStoreClient::Connect("127.0.0.1", port, options);
  stopper.join();
  ::close(fd);
  EXPECT_TRUE(absl::IsCancelled(client.status())) << client.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(TcpStoreClientTest, TokensMustMatch) {
  auto server = StartServer("job-secret");
  const std::string store = absl::StrFormat("127.0.0.1:%d", server->port());

  auto good = ConnectClient(server->port(), "job-secret");
  ASSERT_NE(good, nullptr);
  EXPECT_TRUE(good->Set("k", "v").ok());

  absl::StatusOr<std::unique_ptr<TcpStoreClient>> wrong =
      TcpStoreClient::Connect("127.0.0.1", server->port(), ClientOptions("other-secret"));
  ASSERT_FALSE(wrong.ok());
  EXPECT_TRUE(absl::IsPermissionDenied(wrong.status())) << wrong.status();
  EXPECT_EQ(wrong.status().message(),
            absl::StrFormat("rendezvous store at %s rejected the token: DTRAIN_RDZV_TOKEN differs "
                            "from the job's",
                            store));

  absl::StatusOr<std::unique_ptr<TcpStoreClient>> none =
      TcpStoreClient::Connect("127.0.0.1", server->port(), ClientOptions(""));
  ASSERT_FALSE(none.ok());
  EXPECT_TRUE(absl::IsPermissionDenied(none.status())) << none.status();
  EXPECT_TRUE(Contains(none.status(), "requires a token")) << none.status();

  EXPECT_EQ(*good->Get("k", absl::Seconds(1)), "v");
}

TEST(TcpStoreClientTest, ClientWithTokenRefusesAServerWithout) {
  auto server = StartServer("");
  absl::StatusOr<std::unique_ptr<TcpStoreClient>> client =
      TcpStoreClient::Connect("127.0.0.1", server->port(), ClientOptions("job-secret"));
  ASSERT_FALSE(client.ok());
  EXPECT_TRUE(absl::IsPermissionDenied(client.status())) << client.status();
  EXPECT_TRUE(Contains(client.status(), "does not check tokens")) << client.status();
}

TEST(TcpStoreClientTest, AddOnCloseCountsAClientThatIsGone) {
  auto server = StartServer();
  auto watcher = ConnectClient(server->port());
  auto leaver = ConnectClient(server->port());
  ASSERT_TRUE(leaver->AddOnClose("gone", 1).ok());
  ASSERT_TRUE(leaver->AddOnClose("gone/leaver", 5).ok());
  EXPECT_EQ(*watcher->Add("gone", 0), 0) << "nothing happens while the connection is open";
  absl::Status waited;
  std::thread blocked([&] { waited = watcher->Wait({"gone/leaver"}, absl::Seconds(30)); });
  leaver.reset();
  blocked.join();
  EXPECT_TRUE(waited.ok()) << "the close must wake a waiter on the key: " << waited;
  EXPECT_EQ(*watcher->Add("gone", 0), 1);
  EXPECT_EQ(*watcher->Add("gone/leaver", 0), 5);
}

TEST(TcpStoreClientTest, AddOnCloseCountsAKilledProcess) {
  auto server = StartServer();
  auto watcher = ConnectClient(server->port());
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  if (child == 0) {
    // No gtest assertions in the child: exit codes say what went wrong.
    absl::StatusOr<std::unique_ptr<TcpStoreClient>> client =
        TcpStoreClient::Connect("127.0.0.1", server->port(), ClientOptions());
    if (!client.ok() || !(*client)->AddOnClose("killed", 1).ok()) _exit(1);
    (void)!write(ready[1], "1", 1);
    pause();
    _exit(0);
  }
  char byte = 0;
  ASSERT_EQ(read(ready[0], &byte, 1), 1) << "the child could not register";
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(watcher->Wait({"killed"}, absl::Seconds(30)).ok());
  EXPECT_EQ(*watcher->Add("killed", 0), 1);
  close(ready[0]);
  close(ready[1]);
}

TEST(TcpStoreClientTest, FailsPromptlyAfterTheServerStops) {
  auto server = StartServer();
  auto client = ConnectClient(server->port());
  server.reset();
  const absl::Status first = client->Ping();
  EXPECT_TRUE(absl::IsUnavailable(first)) << first;
  EXPECT_TRUE(Contains(first, "127.0.0.1")) << first;
  EXPECT_EQ(client->Set("k", "v"), first) << "later calls repeat the first transport error";
}

}  // namespace
}  // namespace dtrain
