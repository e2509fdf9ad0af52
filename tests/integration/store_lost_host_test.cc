// A rendezvous store client whose host vanishes (a crash or a cut network: no FIN, no reset) is
// closed by the server within its dead-peer timeout, so ADD_ON_CLOSE still tells the others (the
// agents' liveness rests on it). The "host" is a network namespace joined by a veth pair; it
// vanishes when its end of the link goes down. Needs root and `ip netns`; skipped otherwise.
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "parallel/store/tcp_store_client.h"
#include "parallel/store/tcp_store_server.h"

namespace dtrain {
namespace {

constexpr char kNamespace[] = "dtrain-store-test";
constexpr char kServerAddress[] = "10.213.7.1";

int Shell(const std::string& command) { return system(command.c_str()); }

// The namespace and its link, removed again however the test ends.
class VanishingHost {
 public:
  VanishingHost() {
    Remove();
    ok_ = Shell(absl::StrCat("ip netns add ", kNamespace,
                             " && ip link add dtrain-st0 type veth peer name dtrain-st1",
                             " && ip link set dtrain-st1 netns ", kNamespace, " && ip addr add ",
                             kServerAddress,
                             "/24 dev dtrain-st0 && ip link set dtrain-st0 up && ip -n ",
                             kNamespace, " addr add 10.213.7.2/24 dev dtrain-st1 && ip -n ",
                             kNamespace, " link set dtrain-st1 up")) == 0;
  }
  ~VanishingHost() { Remove(); }
  bool ok() const { return ok_; }
  bool Vanish() {
    return Shell(absl::StrCat("ip -n ", kNamespace, " link set dtrain-st1 down")) == 0;
  }

 private:
  static void Remove() {
    Shell(absl::StrCat("ip netns del ", kNamespace, " 2>/dev/null; ip link del dtrain-st0 ",
                       "2>/dev/null"));
  }
  bool ok_ = false;
};

TEST(StoreLostHostTest, ClientWhoseHostVanishesIsCountedAsClosed) {
  if (geteuid() != 0 || Shell("ip netns list >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "needs root and ip netns";
  }
  VanishingHost host;
  ASSERT_TRUE(host.ok()) << "could not set up the network namespace " << kNamespace;
  TcpStoreServerOptions server_options;
  server_options.token = "lost-host-test";
  server_options.dead_peer_timeout = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<TcpStoreServer>> server =
      TcpStoreServer::Start("", 0, server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  TcpStoreClientOptions client_options;
  client_options.token = server_options.token;
  client_options.connect_timeout = absl::Seconds(10);
  absl::StatusOr<std::unique_ptr<TcpStoreClient>> watcher =
      TcpStoreClient::Connect("127.0.0.1", (*server)->port(), client_options);
  ASSERT_TRUE(watcher.ok()) << watcher.status();

  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  if (child == 0) {
    // No gtest assertions in the child: exit codes say what went wrong.
    const int ns = open(absl::StrCat("/run/netns/", kNamespace).c_str(), O_RDONLY);
    if (ns < 0 || setns(ns, CLONE_NEWNET) != 0) _exit(1);
    absl::StatusOr<std::unique_ptr<TcpStoreClient>> client =
        TcpStoreClient::Connect(kServerAddress, (*server)->port(), client_options);
    if (!client.ok() || !(*client)->AddOnClose("vanished", 1).ok()) _exit(2);
    (void)!write(ready[1], "1", 1);
    pause();
    _exit(0);
  }
  close(ready[1]);
  // The child forked from a process with threads (the server's): bound the wait for it, so that a
  // child stuck before it registers fails the test instead of hanging it.
  pollfd waiting{.fd = ready[0], .events = POLLIN};
  char byte = 0;
  const bool registered = poll(&waiting, 1, 30000) == 1 && read(ready[0], &byte, 1) == 1;
  if (!registered) kill(child, SIGKILL);
  ASSERT_TRUE(registered) << "the client in the namespace could not register within 30 s";
  ASSERT_TRUE(host.Vanish());
  // Generous cap: the server gives up on the peer after about 2 s.
  const absl::Status closed = (*watcher)->Wait({"vanished"}, absl::Seconds(60));
  EXPECT_TRUE(closed.ok()) << "the vanished client's connection was never closed: " << closed;
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  close(ready[0]);
}

}  // namespace
}  // namespace dtrain
