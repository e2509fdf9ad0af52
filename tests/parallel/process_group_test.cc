#include "parallel/process_group.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "core/backend/cpu/cpu_backend.h"
#include "parallel/comm/faulty_ranks.h"
#include "parallel/mesh.h"
#include "parallel/store/tcp_store_client.h"
#include "parallel/store/tcp_store_server.h"
#include "tests/testing/multi_process.h"

namespace dtrain {
namespace {

// Runs `check(group, mesh, groups, backend)` for every rank of a `shape` mesh, ranks as threads,
// the mesh groups on a CPU backend's memory.
template <typename Check>
void ForEachRankOfMesh(const MeshShape& shape, const Check& check) {
  const int port = testing::FreeTcpPort();
  const int n = shape.dp * shape.pp * shape.tp;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      CpuBackend backend(1);
      const WorldMembership world{.rank = r, .world_size = n, .master_port = port};
      absl::StatusOr<std::unique_ptr<ProcessGroup>> group =
          ProcessGroup::Connect(world, absl::Seconds(30), "test/", "");
      ASSERT_TRUE(group.ok()) << group.status();
      absl::StatusOr<Mesh> mesh = Mesh::Create(shape, n, r);
      ASSERT_TRUE(mesh.ok()) << mesh.status();
      absl::StatusOr<ProcessGroup::MeshGroups> groups =
          (*group)->ConnectMesh(*mesh, backend, "cpu");
      ASSERT_TRUE(groups.ok()) << groups.status();
      check(**group, *mesh, *groups, backend);
    });
  }
  for (std::thread& thread : threads) thread.join();
}

// `count` int64 values in the backend's memory, where the mesh groups' collectives run (the CPU
// backend's is host memory, so the test reads and writes them directly).
struct Int64s {
  Int64s(Backend& backend, size_t count) : buffer(backend.Allocate(count, DataType::kI64)) {}
  int64_t& operator[](size_t i) { return static_cast<int64_t*>(buffer.data())[i]; }
  int64_t* data() { return &(*this)[0]; }
  DeviceBuffer buffer;
};

// Four ranks on a dp 2 x tp 2 mesh: each of a rank's groups reduces over exactly its own members
// (rank r contributes bit r), under the job's store namespace next to the world; the pp group of
// one rank has no communicator.
TEST(ProcessGroupTest, ConnectMeshJoinsEachGroupOfTheMesh) {
  ForEachRankOfMesh(
      {.dp = 2, .pp = 1, .tp = 2}, [](ProcessGroup& group, const Mesh& mesh,
                                      const ProcessGroup::MeshGroups& groups, Backend& backend) {
        const MeshCoords me = mesh.coords();
        int64_t expected_tp = 0;
        int64_t expected_dp = 0;
        for (int i = 0; i < 2; ++i) {
          expected_tp += int64_t{1} << mesh.RankAt({.dp = me.dp, .pp = me.pp, .tp = i});
          expected_dp += int64_t{1} << mesh.RankAt({.dp = i, .pp = me.pp, .tp = me.tp});
        }
        Int64s sums(backend, 2);  // tp, dp
        sums[0] = sums[1] = int64_t{1} << mesh.rank();
        ASSERT_TRUE(groups.tp->AllReduce(sums.data(), 1, ReduceOp::kSum)->Wait().ok());
        ASSERT_TRUE(groups.dp->AllReduce(sums.data() + 1, 1, ReduceOp::kSum)->Wait().ok());
        EXPECT_EQ(sums[0], expected_tp);
        EXPECT_EQ(sums[1], expected_dp);
        EXPECT_EQ(groups.pp, nullptr);
        EXPECT_EQ(groups.dp->name(), "dp");
        EXPECT_EQ(groups.dp->rank(), me.dp);
        EXPECT_EQ(group.world().size(), 4);
      });
}

// Eight ranks on a dp 2 x pp 2 x tp 2 mesh: each rank's pp group is its own communicator of the
// two ranks dp * tp = 4 apart (the same dp and tp coordinates, pp 0 and 1), in stage order; an
// all-reduce sums exactly those two, and a send reaches the other stage's rank, which gets the
// sender's world rank.
TEST(ProcessGroupTest, ConnectMeshJoinsThePipelineGroupsOfA3DMesh) {
  ForEachRankOfMesh(
      {.dp = 2, .pp = 2, .tp = 2}, [](ProcessGroup& group, const Mesh& mesh,
                                      const ProcessGroup::MeshGroups& groups, Backend& backend) {
        const MeshCoords me = mesh.coords();
        ASSERT_NE(groups.pp, nullptr);
        EXPECT_NE(groups.pp, &group.world());
        EXPECT_EQ(groups.pp->name(), "pp");
        EXPECT_EQ(groups.pp->size(), 2);
        EXPECT_EQ(groups.pp->rank(), me.pp);
        const int peer_pp = 1 - me.pp;
        const int peer = mesh.RankAt({.dp = me.dp, .pp = peer_pp, .tp = me.tp});
        EXPECT_EQ(peer, mesh.rank() + (peer_pp - me.pp) * 4);
        Int64s values(backend, 3);  // the pp sum, then sent and received
        values[0] = int64_t{1} << mesh.rank();
        ASSERT_TRUE(groups.pp->AllReduce(values.data(), 1, ReduceOp::kSum)->Wait().ok());
        EXPECT_EQ(values[0], (int64_t{1} << mesh.rank()) + (int64_t{1} << peer));
        values[1] = mesh.rank();
        values[2] = -1;
        std::unique_ptr<Work> send = groups.pp->Send(values.data() + 1, 1, peer_pp);
        std::unique_ptr<Work> recv = groups.pp->Recv(values.data() + 2, 1, peer_pp);
        ASSERT_TRUE(send->Wait().ok());
        ASSERT_TRUE(recv->Wait().ok());
        EXPECT_EQ(values[2], peer);
        // The other groups are still right: tp of consecutive ranks, dp 2 apart within the stage.
        EXPECT_EQ(groups.tp->size(), 2);
        EXPECT_EQ(groups.dp->size(), 2);
        EXPECT_EQ(groups.dp->rank(), me.dp);
      });
}

// On the CPU a group of every rank (data parallelism alone) runs on the world communicator, not a
// second Gloo context over the same ranks; unlike the world, it takes only the backend's memory:
// a host buffer fails, named, before anything is sent (under NCCL it would fault the GPU).
TEST(ProcessGroupTest, AGroupOfEveryRankRunsOnTheWorldOverBackendMemory) {
  ForEachRankOfMesh({.dp = 2}, [](ProcessGroup& group, const Mesh&,
                                  const ProcessGroup::MeshGroups& groups, Backend& backend) {
    ASSERT_NE(groups.dp, nullptr);
    EXPECT_EQ(groups.tp, nullptr);
    EXPECT_EQ(groups.pp, nullptr);
    const int64_t world_calls = group.world().stats().all_reduce.calls;
    Int64s sum(backend, 1);
    sum[0] = 1;
    ASSERT_TRUE(groups.dp->AllReduce(sum.data(), 1, ReduceOp::kSum)->Wait().ok());
    EXPECT_EQ(sum[0], 2);
    EXPECT_EQ(group.world().stats().all_reduce.calls, world_calls + 1);
    int64_t host = 1;
    const absl::Status refused = groups.dp->AllReduce(&host, 1, ReduceOp::kSum)->Wait();
    EXPECT_EQ(refused.code(), absl::StatusCode::kInternal);
    EXPECT_THAT(refused.message(), ::testing::HasSubstr("all_reduce on the dp group"));
    EXPECT_EQ(group.world().stats().all_reduce.calls, world_calls + 1);
    EXPECT_EQ(host, 1);
  });
}

// A rank that took its rendezvous seat and stopped before checking in (a start-up hang) is named
// and blamed, where the error said "rank(s)  never joined" and blamed nobody.
TEST(ProcessGroupTest, ARankSeatedThatNeverChecksInIsNamed) {
  const int port = testing::FreeTcpPort();
  absl::Status failed;
  std::thread zero([&] {
    const WorldMembership world{.rank = 0, .world_size = 3, .master_port = port};
    failed = ProcessGroup::Connect(world, absl::Seconds(2), "test/", "").status();
  });
  // Rank 1 takes its seat and hangs; rank 2 never comes.
  absl::StatusOr<std::unique_ptr<TcpStoreClient>> one =
      TcpStoreClient::Connect("127.0.0.1", port, {.connect_timeout = absl::Seconds(10)});
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE((*one)->Add("rendezvous/attempt-0/rank-1", 1).ok());
  zero.join();
  EXPECT_THAT(failed.message(),
              ::testing::HasSubstr("rank(s) 2 never joined (exited, crashed or not started), "
                                   "and rank(s) 1 joined but never checked in (hung or stopped)"));
  EXPECT_THAT(FaultyRanks(failed), ::testing::ElementsAre(2, 1));
}

// Before rank 0 publishes the job, the other ranks wait for it to check in: with rank 0 absent,
// the ranks waiting (seated, unchecked) are not named as hung (each blamed the other).
TEST(ProcessGroupTest, RanksWaitingForAnAbsentRankZeroAreNotNamed) {
  const int port = testing::FreeTcpPort();
  absl::StatusOr<std::unique_ptr<TcpStoreServer>> server =
      TcpStoreServer::Start("127.0.0.1", port);  // the agent's, as under dtrain launch
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<absl::Status> failed(3);
  std::vector<std::thread> ranks;
  for (int rank = 1; rank < 3; ++rank) {
    ranks.emplace_back([&, rank] {
      const WorldMembership world{
          .rank = rank, .world_size = 3, .master_port = port, .agent_hosts_store = true};
      failed[rank] = ProcessGroup::Connect(world, absl::Seconds(2), "test/", "").status();
    });
  }
  for (std::thread& rank : ranks) rank.join();
  for (int rank = 1; rank < 3; ++rank) {
    EXPECT_THAT(failed[rank].message(),
                ::testing::HasSubstr("rank(s) 0 never joined (exited, crashed or not started) at"))
        << failed[rank];
    EXPECT_THAT(FaultyRanks(failed[rank]), ::testing::ElementsAre(0));
  }
}

// Without an agent, the first failure may blame no rank (rank 2: a peer's closed connection) or
// a rank only stuck behind the dead one (rank 3 blames rank 0), while a later one names the rank
// that never failed (rank 0's names the dead rank 1): ranks 2 and 3 add rank 0's error, and rank
// 0, whose own error already names rank 1, adds nothing. Every rank ends with the root cause: the
// rank blamed that never failed, and where it sits in the pipelined mesh.
TEST(ProcessGroupTest, AFailureThatBlamesNoRootCauseGetsTheErrorThatDoes) {
  const auto failing = [](const std::string& message, std::vector<int> blamed) {
    absl::Status status = absl::DeadlineExceededError(message);
    SetFaultyRanks(status, blamed);
    return status;
  };
  std::vector<absl::Status> left(4);
  ForEachRankOfMesh({.dp = 2, .pp = 2}, [&](ProcessGroup& group, const Mesh& mesh,
                                            const ProcessGroup::MeshGroups&, Backend&) {
    const int rank = mesh.rank();
    if (rank == 1) return;  // dead: never fails through the group
    if (rank == 2) {
      left[2] = group.Leave(failing("rank 3 closed the connection", {}));
      return;
    }
    ASSERT_TRUE(group.store().Get("test/attempt-0/failure", absl::Seconds(30)).ok());
    left[rank] = group.Leave(rank == 3 ? failing("rank 0 never started #7", {0})
                                       : failing("rank 1 never started #9", {1}));
  });
  const std::string root =
      "; root cause: rank 1 (pipeline stage 0 of 2, dp rank 1): blamed, and never reported a "
      "failure (dead or hung)";
  const std::string cause = "; rank 0's error blames rank(s) 1: rank 1 never started #9" + root;
  EXPECT_EQ(left[2].message(), "rank 3 closed the connection" + cause);
  EXPECT_EQ(left[3].message(),
            "rank 2 failed: rank 3 closed the connection; then rank 3 failed too: rank 0 never "
            "started #7" +
                cause);
  EXPECT_EQ(left[0].message(),
            "rank 2 failed: rank 3 closed the connection; then rank 0 failed too: rank 1 never "
            "started #9" +
                root);
}

}  // namespace
}  // namespace dtrain
