// Ranks as separate processes over the TCP rendezvous store: the `dtrain bench comm` command
// end to end, a rank whose process exits in the middle of a run, and writes to a dead peer.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <memory>
#include <vector>

#include "parallel/comm/gloo_communicator.h"
#include "parallel/store/tcp_store_client.h"
#include "parallel/store/tcp_store_server.h"
#include "tests/testing/multi_process.h"

namespace dtrain {
namespace {

TEST(GlooMultiProcessTest, BenchCommandPrintsTheTableOnRankZero) {
  const std::vector<testing::RankResult> results = testing::RunLocalProcesses(
      {DTRAIN_BINARY, "bench", "comm", "--min-bytes", "4K", "--max-bytes", "8K", "--iters", "2"}, 3,
      testing::FreeTcpPort(), absl::Seconds(60));
  for (const testing::RankResult& result : results) {
    ASSERT_EQ(result.exit_code, 0) << result;
  }
  EXPECT_NE(results[0].output.find("# dtrain bench comm: backend gloo, 3 ranks"), std::string::npos)
      << results[0].output;
  for (const char* op : {"all_reduce", "all_gather", "reduce_scatter", "broadcast"}) {
    EXPECT_NE(results[0].output.find(std::string(op) + " "), std::string::npos) << op;
  }
  EXPECT_EQ(results[1].output.find("all_reduce"), std::string::npos) << results[1].output;
}

// Rank 2 exits after the first all-reduce; the others must fail fast, naming it: its closed
// sockets end the operation (Unavailable), not the timeout (DeadlineExceeded), which is long
// enough that no load on the machine reaches it. Rank 0 hosts the store in the parent, so that
// it outlives every rank.
TEST(GlooMultiProcessTest, RankThatExitsIsNamedPromptly) {
  absl::StatusOr<std::unique_ptr<TcpStoreServer>> server = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  const std::vector<testing::RankResult> results =
      testing::RunRanksAsProcesses(3, port, absl::Seconds(120), [port](int rank) {
        absl::StatusOr<std::unique_ptr<TcpStoreClient>> client =
            TcpStoreClient::Connect("127.0.0.1", port);
        if (!client.ok()) return 3;
        GlooCommunicatorOptions options;
        options.rank = rank;
        options.size = 3;
        options.timeout = absl::Seconds(60);
        auto comm = GlooCommunicator::Create(std::move(*client), options);
        if (!comm.ok()) return 4;
        std::vector<float> data(100000, 1.0f);
        if (!(*comm)->AllReduce(data.data(), data.size(), ReduceOp::kSum)->Wait().ok()) return 5;
        if (rank == 2) _exit(0);  // dies without closing anything
        absl::Status status = (*comm)->AllReduce(data.data(), data.size(), ReduceOp::kSum)->Wait();
        fprintf(stderr, "%s\n", status.ToString().c_str());
        return absl::IsUnavailable(status) ? 0 : 6;
      });
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(results[rank].exit_code, 0) << "rank " << rank << ": " << results[rank].output;
  }
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_NE(results[rank].output.find("never started by rank 2 (last started #1)"),
              std::string::npos)
        << results[rank].output;
  }
}

// Gloo writes with writev, which raises SIGPIPE when the peer's socket is gone: a rank whose peer
// died must get an error Status, not be killed by the signal (a launcher would then blame it for
// the peer's death; seen as "rank 0 ... signal 13 (SIGPIPE)" when rank 1 was SIGKILLed). Once a
// communicator exists, a write to a closed socket is EPIPE.
TEST(GlooMultiProcessTest, AWriteToADeadPeerIsAnErrorNotSigpipe) {
  absl::StatusOr<std::unique_ptr<TcpStoreServer>> server = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  const std::vector<testing::RankResult> results =
      testing::RunRanksAsProcesses(1, port, absl::Seconds(30), [port](int) {
        signal(SIGPIPE, SIG_DFL);  // whatever the test runner set
        absl::StatusOr<std::unique_ptr<TcpStoreClient>> client =
            TcpStoreClient::Connect("127.0.0.1", port);
        if (!client.ok()) return 3;
        auto comm = GlooCommunicator::Create(std::move(*client), GlooCommunicatorOptions{});
        if (!comm.ok()) return 4;
        int fds[2];
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return 5;
        close(fds[1]);  // the dead peer
        const char byte = 0;
        const ssize_t written = write(fds[0], &byte, 1);
        return written < 0 && errno == EPIPE ? 0 : 6;
      });
  EXPECT_EQ(results[0].exit_code, 0) << "128 + 13 = killed by SIGPIPE: " << results[0].output;
}

}  // namespace
}  // namespace dtrain
