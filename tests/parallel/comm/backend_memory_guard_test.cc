#include "parallel/comm/backend_memory_guard.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/backend/cpu/cpu_backend.h"
#include "parallel/comm/host_values.h"
#include "tests/parallel/comm/test_store.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;

// A backend holds [begin, end) of each live allocation, and nothing once it is freed.
TEST(BackendMemoryGuardTest, TheBackendHoldsExactlyItsLiveAllocations) {
  CpuBackend backend(1);
  DeviceBuffer buffer = backend.Allocate(10, DataType::kF32);
  const float* data = buffer.floats();
  EXPECT_TRUE(backend.Holds(data, 40));
  EXPECT_TRUE(backend.Holds(data + 9, 4));
  EXPECT_FALSE(backend.Holds(data + 9, 8));  // runs past the end
  EXPECT_FALSE(backend.Holds(data, 41));
  EXPECT_TRUE(backend.Holds(nullptr, 0));  // nothing to read
  const std::vector<float> host(10);
  EXPECT_FALSE(backend.Holds(host.data(), 4));
  buffer.Reset();
  EXPECT_FALSE(backend.Holds(data, 4));
}

// Every operation checks each of its buffers, at its full size (size() * count for a
// reduce-scatter's input and an all-gather's output), and fails on a host one without sending
// anything; on backend memory the operations run as the inner communicator's.
TEST(BackendMemoryGuardTest, EveryOperationTakesOnlyBackendMemory) {
  testing::RunRanksInThreads(2, absl::Seconds(30), [](Communicator& comm) {
    CpuBackend backend(1);
    BackendMemoryGuard guard(comm, "pp", backend, /*point_to_point=*/true);
    DeviceBuffer full = backend.Allocate(4, DataType::kF32);
    DeviceBuffer shard = backend.Allocate(2, DataType::kF32);
    std::vector<float> host(4);
    const auto refused = [](std::unique_ptr<Work> work, const char* op) {
      const absl::Status status = work->Wait();
      EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << op;
      EXPECT_THAT(status.message(), HasSubstr(absl::StrCat(op, " on the pp group")));
    };
    refused(guard.AllReduce(host.data(), 4, ReduceOp::kSum), "all_reduce");
    refused(guard.Broadcast(host.data(), 4, 0), "broadcast");
    refused(guard.ReduceScatter(host.data(), shard.floats(), 2, ReduceOp::kSum), "reduce_scatter");
    refused(guard.ReduceScatter(full.floats(), host.data(), 2, ReduceOp::kSum), "reduce_scatter");
    // A shard's worth of input is too short: the input is size() shards.
    refused(guard.ReduceScatter(shard.floats(), shard.floats(), 2, ReduceOp::kSum),
            "reduce_scatter");
    refused(guard.AllGather(host.data(), full.floats(), 2), "all_gather");
    refused(guard.AllGather(shard.floats(), shard.floats(), 2), "all_gather");
    const int peer = 1 - comm.rank();
    refused(guard.Send(host.data(), 4, peer), "send");
    refused(guard.Recv(host.data(), 4, peer), "recv");
    EXPECT_EQ(comm.stats().all_reduce.calls + comm.stats().send.calls, 0);

    float* values = full.floats();
    for (int i = 0; i < 4; ++i) values[i] = static_cast<float>(comm.rank() * 4 + i);
    ASSERT_TRUE(guard.ReduceScatter(full.floats(), shard.floats(), 2, ReduceOp::kSum)->Wait().ok());
    for (int i = 0; i < 2; ++i) {
      const int index = comm.rank() * 2 + i;
      EXPECT_EQ(shard.floats()[i], static_cast<float>(index + 4 + index)) << i;
    }
    EXPECT_EQ(guard.name(), "pp");
    EXPECT_EQ(guard.size(), 2);
  });
}

// Host values cross a guarded group through the backend: sums, gathers and a broadcast, each
// against what the ranks put in.
TEST(BackendMemoryGuardTest, HostValuesCrossThroughTheBackend) {
  testing::RunRanksInThreads(2, absl::Seconds(30), [](Communicator& comm) {
    CpuBackend backend(1);
    BackendMemoryGuard guard(comm, "pp", backend, /*point_to_point=*/true);
    const int rank = comm.rank();
    double loss = 1.5 + rank, tokens = 10.0 * (rank + 1);
    ASSERT_TRUE(SumOverGroup(&guard, backend, loss, tokens).ok());
    EXPECT_EQ(loss, 4.0);
    EXPECT_EQ(tokens, 30.0);
    const int64_t own[2] = {rank, 100 + rank};
    int64_t all[4] = {};
    ASSERT_TRUE(AllGatherHost(guard, backend, own, all, 2).ok());
    EXPECT_THAT(all, ::testing::ElementsAre(0, 100, 1, 101));
    float logits[3] = {rank + 0.5f, rank + 1.5f, rank + 2.5f};
    ASSERT_TRUE(BroadcastHost(guard, backend, logits, 3, /*root=*/1).ok());
    EXPECT_THAT(logits, ::testing::ElementsAre(1.5f, 2.5f, 3.5f));
    EXPECT_TRUE(SumOverGroup(nullptr, backend, loss, tokens).ok());  // no group: unchanged
    EXPECT_EQ(loss, 4.0);
  });
}

// GatherHost brings every rank's values to the root, in rank order and chunk by chunk, over a
// group created for collectives only (a tp group on NCCL sends nothing point to point): rank 0's
// 5 values in 2 broadcasts of at most 3, rank 2's 7 in 3, rank 1's own at its turn; the others
// receive nothing.
TEST(BackendMemoryGuardTest, GatherHostBroadcastsEachRanksValuesInChunksToTheRoot) {
  testing::RunRanksInThreads(3, absl::Seconds(30), [](Communicator& comm) {
    CpuBackend backend(1);
    BackendMemoryGuard tp(comm, "tp", backend, /*point_to_point=*/false);
    const std::vector<size_t> counts = {5, 0, 7};
    const int rank = comm.rank();
    std::vector<float> own(counts[rank]);
    for (size_t i = 0; i < own.size(); ++i) own[i] = static_cast<float>(rank * 100 + i);
    std::vector<int> senders;
    std::vector<std::vector<float>> received;
    ASSERT_TRUE(GatherHost(
                    tp, backend, own.data(), counts, /*root=*/1,
                    [&](int sender, const float* values) {
                      senders.push_back(sender);
                      received.emplace_back(values, values + counts[sender]);
                    },
                    /*chunk=*/3)
                    .ok());
    EXPECT_EQ(comm.stats().broadcast.calls, 5);
    if (rank != 1) {
      EXPECT_TRUE(senders.empty());
      return;
    }
    EXPECT_THAT(senders, ::testing::ElementsAre(0, 1, 2));
    EXPECT_THAT(received[0], ::testing::ElementsAre(0, 1, 2, 3, 4));
    EXPECT_TRUE(received[1].empty());
    EXPECT_THAT(received[2], ::testing::ElementsAre(200, 201, 202, 203, 204, 205, 206));
  });
}

// Send and Recv hold to the pairs NCCL connects on every backend: a group created for collectives
// only refuses them, and a point-to-point group of 4 lets each member reach the members before
// and after it on its ring (0 and 3 included), not the one across.
TEST(BackendMemoryGuardTest, PointToPointOnlyBetweenRingNeighboursOfAPairGroup) {
  testing::RunRanksInThreads(4, absl::Seconds(30), [](Communicator& comm) {
    CpuBackend backend(1);
    DeviceBuffer buffer = backend.Allocate(1, DataType::kF32);
    const int rank = comm.rank();
    BackendMemoryGuard tp(comm, "tp", backend, /*point_to_point=*/false);
    const absl::Status collectives_only = tp.Send(buffer.floats(), 1, (rank + 1) % 4)->Wait();
    EXPECT_EQ(collectives_only.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(collectives_only.message(),
                HasSubstr("on group 'tp': the group was created for collectives only"));

    BackendMemoryGuard pp(comm, "pp", backend, /*point_to_point=*/true);
    const absl::Status across = pp.Recv(buffer.floats(), 1, (rank + 2) % 4)->Wait();
    EXPECT_EQ(across.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(across.message(), HasSubstr(absl::StrCat("member ", (rank + 2) % 4,
                                                         " is not next to member ", rank)));
    EXPECT_EQ(pp.Send(buffer.floats(), 1, rank)->Wait().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(comm.stats().send.calls, 0);
    // Around the ring: each sends its rank to the next and receives the previous one's.
    DeviceBuffer received = backend.Allocate(1, DataType::kF32);
    buffer.floats()[0] = static_cast<float>(rank);
    std::unique_ptr<Work> sent = pp.Send(buffer.floats(), 1, (rank + 1) % 4);
    ASSERT_TRUE(pp.Recv(received.floats(), 1, (rank + 3) % 4)->Wait().ok());
    ASSERT_TRUE(sent->Wait().ok());
    EXPECT_EQ(received.floats()[0], static_cast<float>((rank + 3) % 4));
  });
}

}  // namespace
}  // namespace dtrain
