// A rendezvous store client whose host vanishes (a crash or a cut network: no FIN, no reset) is
// closed by the server within its dead-peer timeout, so ADD_ON_CLOSE still tells the others (the
// agents' liveness rests on it). The "host" is the second node of tests/testing/two_node_netns.h;
// it vanishes when its end of the link goes down. Needs root and `ip netns`; skipped otherwise.
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "parallel/store/tcp_store_client.h"
#include "parallel/store/tcp_store_server.h"
#include "tests/testing/two_node_netns.h"

namespace dtrain {
namespace {

using testing::kNamespace;
using testing::kNodeZeroAddress;

TEST(StoreLostHostTest, ClientWhoseHostVanishesIsCountedAsClosed) {
  if (!testing::CanMakeNamespaces()) GTEST_SKIP() << "needs root and ip netns";
  testing::MachineLock lock;  // before host: held until it is removed
  testing::SecondNode host;
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
        TcpStoreClient::Connect(kNodeZeroAddress, (*server)->port(), client_options);
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
  ASSERT_TRUE(host.CutOff());
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
