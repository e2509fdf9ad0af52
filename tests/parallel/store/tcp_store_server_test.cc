#include "parallel/store/tcp_store_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "parallel/store/auth.h"
#include "parallel/store/socket.h"
#include "parallel/store/tcp_store_client.h"
#include "parallel/store/wire.h"

namespace dtrain {
namespace {

std::unique_ptr<TcpStoreServer> StartServer(std::string token = "",
                                            std::string_view host = "127.0.0.1") {
  TcpStoreServerOptions options;
  options.token = std::move(token);
  absl::StatusOr<std::unique_ptr<TcpStoreServer>> server = TcpStoreServer::Start(host, 0, options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

absl::StatusOr<std::unique_ptr<TcpStoreClient>> Connect(std::string_view host, int port,
                                                        std::string token = "") {
  TcpStoreClientOptions options;
  options.token = std::move(token);
  options.connect_timeout = absl::Seconds(2);
  options.reply_timeout = absl::Seconds(5);
  return TcpStoreClient::Connect(host, port, options);
}

// A plain blocking loopback socket for speaking (broken) protocol by hand.
UniqueFd RawConnect(int port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  return fd;
}

void RawSend(const UniqueFd& fd, std::string_view bytes) {
  ASSERT_EQ(::send(fd.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(bytes.size()));
}

// Everything the server sends until it closes the connection; fails the test if it is still
// open after `timeout` (a generous cap: the server closes at once).
std::string ReadUntilClosed(const UniqueFd& fd, absl::Duration timeout = absl::Seconds(60)) {
  std::string received;
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    pollfd entry{.fd = fd.get(), .events = POLLIN, .revents = 0};
    if (::poll(&entry, 1, 50) <= 0) continue;
    char buffer[4096];
    const ssize_t got = ::recv(fd.get(), buffer, sizeof(buffer), 0);
    if (got <= 0) return received;
    received.append(buffer, static_cast<size_t>(got));
  }
  ADD_FAILURE() << "the server did not close the connection within " << timeout;
  return received;
}

std::string Hello(uint32_t magic = kStoreMagic, uint32_t version = kStoreProtocolVersion) {
  return FrameWriter(StoreMessage::kHello)
      .U32(magic)
      .U32(version)
      .Raw(std::string(kStoreNonceBytes, 'n'))
      .Finish();
}

// Completes the handshake with a server that has no token.
void RawHandshake(const UniqueFd& fd) {
  RawSend(fd, Hello());
  absl::StatusOr<std::string> challenge =
      RecvExact(fd.get(), kFrameHeaderBytes + 1 + 1 + 2 * kStoreNonceBytes, absl::InfiniteFuture());
  ASSERT_TRUE(challenge.ok()) << challenge.status();
  RawSend(fd, FrameWriter(StoreMessage::kAuth).Bytes("").Finish());
  absl::StatusOr<std::string> ok =
      RecvExact(fd.get(), kFrameHeaderBytes + 1, absl::InfiniteFuture());
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_EQ(ok->back(), static_cast<char>(StoreMessage::kOk));
}

// Each broken peer is cut off while a client already parked in GET, and a new client, carry on.
class MalformedFrameTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = StartServer();
    absl::StatusOr<std::unique_ptr<TcpStoreClient>> bystander = Connect("127.0.0.1", port());
    ASSERT_TRUE(bystander.ok()) << bystander.status();
    bystander_ = std::move(*bystander);
    parked_ = std::thread([this] { parked_result_ = bystander_->Get("go", absl::Seconds(10)); });
    absl::SleepFor(absl::Milliseconds(50));
  }

  void ExpectOthersUnaffected() {
    absl::StatusOr<std::unique_ptr<TcpStoreClient>> fresh = Connect("127.0.0.1", port());
    ASSERT_TRUE(fresh.ok()) << fresh.status();
    ASSERT_TRUE((*fresh)->Set("go", "yes").ok());
    parked_.join();
    ASSERT_TRUE(parked_result_.ok()) << parked_result_.status();
    EXPECT_EQ(*parked_result_, "yes");
    EXPECT_TRUE(bystander_->Ping().ok());
  }

  void TearDown() override {
    if (parked_.joinable()) {
      server_.reset();
      parked_.join();
    }
  }

  int port() const { return server_->port(); }

  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<TcpStoreClient> bystander_;
  std::thread parked_;
  absl::StatusOr<std::string> parked_result_;
};

TEST_F(MalformedFrameTest, GarbageBytes) {
  UniqueFd fd = RawConnect(port());
  RawSend(fd, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  ReadUntilClosed(fd);
  ExpectOthersUnaffected();
}

TEST_F(MalformedFrameTest, WrongMagic) {
  UniqueFd fd = RawConnect(port());
  RawSend(fd, Hello(0xdeadbeef));
  EXPECT_EQ(ReadUntilClosed(fd), "");
  ExpectOthersUnaffected();
}

TEST_F(MalformedFrameTest, WrongVersionGetsAnErrorFrame) {
  UniqueFd fd = RawConnect(port());
  RawSend(fd, Hello(kStoreMagic, kStoreProtocolVersion + 1));
  const std::string reply = ReadUntilClosed(fd);
  ASSERT_GT(reply.size(), kFrameHeaderBytes);
  EXPECT_EQ(reply[kFrameHeaderBytes], static_cast<char>(StoreMessage::kError));
  EXPECT_NE(reply.find("same dtrain version"), std::string::npos) << reply;
  ExpectOthersUnaffected();
}

TEST_F(MalformedFrameTest, OversizeLengthBeforeHandshake) {
  UniqueFd fd = RawConnect(port());
  RawSend(fd, std::string("\xff\xff\xff\x7f", 4));
  ReadUntilClosed(fd);
  ExpectOthersUnaffected();
}

TEST_F(MalformedFrameTest, OversizeLengthAfterHandshake) {
  UniqueFd fd = RawConnect(port());
  RawHandshake(fd);
  RawSend(fd, std::string("\xff\xff\xff\xff", 4));
  ReadUntilClosed(fd);
  ExpectOthersUnaffected();
}

TEST_F(MalformedFrameTest, TruncatedFrameThenClose) {
  UniqueFd fd = RawConnect(port());
  RawHandshake(fd);
  const std::string set = FrameWriter(StoreMessage::kSet).Bytes("go").Bytes("no").Finish();
  RawSend(fd, set.substr(0, set.size() - 3));
  fd.Reset();
  absl::SleepFor(absl::Milliseconds(50));
  ExpectOthersUnaffected();
}

TEST_F(MalformedFrameTest, RequestBeforeHandshake) {
  UniqueFd fd = RawConnect(port());
  RawSend(fd, FrameWriter(StoreMessage::kSet).Bytes("go").Bytes("no").Finish());
  EXPECT_EQ(ReadUntilClosed(fd), "");
  ExpectOthersUnaffected();
}

TEST_F(MalformedFrameTest, RequestBetweenHelloAndAuth) {
  UniqueFd fd = RawConnect(port());
  RawSend(fd, Hello());
  RawSend(fd, FrameWriter(StoreMessage::kSet).Bytes("go").Bytes("no").Finish());
  ReadUntilClosed(fd);
  ExpectOthersUnaffected();
}

TEST_F(MalformedFrameTest, UnknownTypeAndTrailingBytes) {
  UniqueFd unknown = RawConnect(port());
  RawHandshake(unknown);
  RawSend(unknown, FrameWriter(static_cast<StoreMessage>(99)).Finish());
  EXPECT_EQ(ReadUntilClosed(unknown), "");

  UniqueFd trailing = RawConnect(port());
  RawHandshake(trailing);
  RawSend(trailing, FrameWriter(StoreMessage::kPing).U8(1).Finish());
  EXPECT_EQ(ReadUntilClosed(trailing), "");
  ExpectOthersUnaffected();
}

TEST(TcpStoreServerTest, ValueOverTheServerLimitClosesThatConnection) {
  TcpStoreServerOptions options;
  options.token = std::string();
  options.limits.max_value_bytes = 1024;
  absl::StatusOr<std::unique_ptr<TcpStoreServer>> server =
      TcpStoreServer::Start("127.0.0.1", 0, options);
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<std::unique_ptr<TcpStoreClient>> big = Connect("127.0.0.1", (*server)->port());
  absl::StatusOr<std::unique_ptr<TcpStoreClient>> small = Connect("127.0.0.1", (*server)->port());
  ASSERT_TRUE(big.ok() && small.ok());
  const absl::Status status = (*big)->Set("k", std::string(2048, 'v'));
  EXPECT_TRUE(absl::IsUnavailable(status)) << status;
  EXPECT_TRUE((*small)->Set("k", std::string(1024, 'v')).ok());
}

TEST(TcpStoreServerTest, WrongProofIsRejectedWithAnErrorFrame) {
  auto server = StartServer("job-secret");
  UniqueFd fd = RawConnect(server->port());
  RawSend(fd, Hello());
  absl::StatusOr<std::string> challenge = RecvExact(
      fd.get(), kFrameHeaderBytes + 1 + 1 + 2 * kStoreNonceBytes, absl::Now() + absl::Seconds(60));
  ASSERT_TRUE(challenge.ok()) << challenge.status();
  EXPECT_EQ((*challenge)[kFrameHeaderBytes + 1], 1) << "auth required";
  RawSend(fd, FrameWriter(StoreMessage::kAuth).Bytes(std::string(kStoreProofBytes, 'x')).Finish());
  const std::string reply = ReadUntilClosed(fd);
  EXPECT_NE(reply.find("rejected the token: DTRAIN_RDZV_TOKEN differs from the job's"),
            std::string::npos)
      << reply;

  absl::StatusOr<std::unique_ptr<TcpStoreClient>> good =
      Connect("127.0.0.1", server->port(), "job-secret");
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_TRUE((*good)->Ping().ok());
}

TEST(TcpStoreServerTest, DestructionFailsBlockedClientsPromptly) {
  auto server = StartServer();
  constexpr int kClients = 4;
  std::vector<std::unique_ptr<TcpStoreClient>> clients;
  for (int i = 0; i < kClients; ++i) {
    absl::StatusOr<std::unique_ptr<TcpStoreClient>> client = Connect("127.0.0.1", server->port());
    ASSERT_TRUE(client.ok()) << client.status();
    clients.push_back(std::move(*client));
  }
  std::vector<absl::Status> results(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back(
        [&, i] { results[i] = clients[i]->Get("never", absl::Seconds(120)).status(); });
  }
  absl::SleepFor(absl::Milliseconds(100));
  const absl::Time stop = absl::Now();
  server.reset();
  for (std::thread& thread : threads) thread.join();
  EXPECT_LT(absl::Now() - stop, absl::Seconds(60));  // a generous cap; promptness is below
  for (const absl::Status& result : results) {
    // Unavailable: the closed connection ended the Get, not its 120 s timeout.
    EXPECT_TRUE(absl::IsUnavailable(result)) << result;
    EXPECT_NE(result.message().find("GET never"), std::string::npos) << result;
  }
}

TEST(TcpStoreServerTest, AddressInUseNamesThePortAndTheFix) {
  auto first = StartServer();
  TcpStoreServerOptions options;
  options.token = std::string();
  options.bind_retry = absl::Milliseconds(300);
  absl::StatusOr<std::unique_ptr<TcpStoreServer>> second =
      TcpStoreServer::Start("127.0.0.1", first->port(), options);
  ASSERT_FALSE(second.ok());
  const std::string message(second.status().message());
  EXPECT_NE(message.find(absl::StrFormat("127.0.0.1:%d", first->port())), std::string::npos)
      << message;
  EXPECT_NE(message.find("address already in use"), std::string::npos) << message;
  EXPECT_NE(message.find("MASTER_PORT"), std::string::npos) << message;
}

TEST(TcpStoreServerTest, PortFreedWhileRetryingIsTaken) {
  auto first = StartServer();
  const int port = first->port();
  std::thread release([&first] {
    absl::SleepFor(absl::Milliseconds(300));
    first.reset();
  });
  TcpStoreServerOptions options;
  options.token = std::string();
  options.bind_retry = absl::Seconds(10);
  absl::StatusOr<std::unique_ptr<TcpStoreServer>> second =
      TcpStoreServer::Start("127.0.0.1", port, options);
  release.join();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*second)->port(), port);
}

// Whether this machine has ::1 (a container's network may be IPv4 only).
bool HasIpv6Loopback() {
  UniqueFd probe(::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in6 loopback{};
  loopback.sin6_family = AF_INET6;
  loopback.sin6_addr = in6addr_loopback;
  return probe.valid() &&
         ::bind(probe.get(), reinterpret_cast<sockaddr*>(&loopback), sizeof(loopback)) == 0;
}

// An IPv4 address of this machine other than loopback, or "" when it has none.
std::string NonLoopbackAddress() {
  ifaddrs* interfaces = nullptr;
  if (::getifaddrs(&interfaces) != 0) return "";
  std::string found;
  for (ifaddrs* entry = interfaces; entry != nullptr && found.empty(); entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != AF_INET) continue;
    if ((entry->ifa_flags & IFF_UP) == 0 || (entry->ifa_flags & IFF_LOOPBACK) != 0) continue;
    sockaddr_storage address{};
    std::memcpy(&address, entry->ifa_addr, sizeof(sockaddr_in));
    if (IsLoopbackAddress(address)) continue;
    char text[INET_ADDRSTRLEN];
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(entry->ifa_addr)->sin_addr, text,
                sizeof(text));
    found = text;
  }
  ::freeifaddrs(interfaces);
  return found;
}

// Without a token a client on this host is admitted by any of its addresses: a rank reaching
// its own host by MASTER_ADDR's network address was refused. (A client of another host is
// refused: tests/integration/two_node_train_test.cc.)
// Listening on every interface ("") too, where IPv4 clients arrive as IPv4-mapped IPv6 addresses.
TEST(TcpStoreServerTest, WithoutTokenAdmitsThisHostsClientsByAnyAddress) {
  const std::string address = NonLoopbackAddress();
  if (address.empty()) GTEST_SKIP() << "this machine has no non-loopback IPv4 address";
  for (const char* host : {"0.0.0.0", ""}) {
    SCOPED_TRACE(absl::StrCat("listening on '", host, "'"));
    auto open_server = StartServer("", host);
    absl::StatusOr<std::unique_ptr<TcpStoreClient>> own = Connect(address, open_server->port());
    ASSERT_TRUE(own.ok()) << own.status();
    EXPECT_TRUE((*own)->Ping().ok());
    EXPECT_TRUE(Connect("127.0.0.1", open_server->port()).ok());

    auto token_server = StartServer("job-secret", host);
    absl::StatusOr<std::unique_ptr<TcpStoreClient>> admitted =
        Connect(address, token_server->port(), "job-secret");
    ASSERT_TRUE(admitted.ok()) << admitted.status();
    EXPECT_TRUE((*admitted)->Ping().ok());
  }
}

// Every interface is IPv4's and IPv6's: a master address of either family reaches the store
// (the agent's store listened on 0.0.0.0, which a master at ::1 never reached).
TEST(TcpStoreServerTest, EveryInterfaceIsBothFamilies) {
  auto server = StartServer("job-secret", "");
  for (const char* address : {"127.0.0.1", "::1"}) {
    SCOPED_TRACE(address);
    if (std::string(address) == "::1" && !HasIpv6Loopback()) {
      GTEST_SKIP() << "this machine has no IPv6 loopback";
    }
    absl::StatusOr<std::unique_ptr<TcpStoreClient>> client =
        Connect(address, server->port(), "job-secret");
    ASSERT_TRUE(client.ok()) << client.status();
    EXPECT_TRUE((*client)->Ping().ok());
  }
}

}  // namespace
}  // namespace dtrain
