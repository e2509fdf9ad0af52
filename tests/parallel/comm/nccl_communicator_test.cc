// Runs only where the build has NCCL and the machine has a GPU; skips otherwise. One process
// drives one GPU, so the multi-rank cases need one thread per visible device.
#include <gtest/gtest.h>

#ifdef DTRAIN_HAVE_NCCL
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "parallel/comm/nccl/nccl_communicator.h"
#include "tests/parallel/comm/test_store.h"
#endif

namespace dtrain {
namespace {

#ifdef DTRAIN_HAVE_NCCL
int DeviceCount() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

// Runs `body(rank, its communicator)` for every visible GPU on a thread of its own, rank r on
// GPU r, the communicators of one group (`point_to_point` as given) meeting in one store.
void OnEveryGpu(bool point_to_point,
                const std::function<void(int rank, NcclCommunicator& comm)>& body) {
  const int n = DeviceCount();
  auto store = std::make_shared<testing::InMemoryStore>();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
      NcclCommunicatorOptions options;
      options.rank = rank;
      options.size = n;
      options.timeout = absl::Seconds(60);
      options.point_to_point = point_to_point;
      auto comm = NcclCommunicator::Create(store, options);
      ASSERT_TRUE(comm.ok()) << comm.status();
      body(rank, **comm);
    });
  }
  for (std::thread& thread : threads) thread.join();
}

// Every visible GPU is one rank: all-reduce, reduce-scatter and all-gather against the sums.
TEST(NcclCommunicatorTest, CollectivesMatchTheSequentialReference) {
  const int n = DeviceCount();
  if (n == 0) GTEST_SKIP() << "no CUDA device";
  const size_t count = 1001;
  OnEveryGpu(/*point_to_point=*/false, [&](int rank, NcclCommunicator& comm) {
    std::vector<float> host(n * count);
    for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>((rank + i) % 7);
    float* full = nullptr;
    float* shard = nullptr;
    ASSERT_EQ(cudaMalloc(&full, host.size() * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&shard, count * sizeof(float)), cudaSuccess);
    cudaMemcpy(full, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice);
    ASSERT_TRUE(comm.ReduceScatter(full, shard, count, ReduceOp::kSum)->Wait().ok());
    ASSERT_TRUE(comm.AllGather(shard, full, count)->Wait().ok());
    ASSERT_TRUE(comm.AllReduce(full, n * count, ReduceOp::kAvg)->Wait().ok());
    cudaMemcpy(host.data(), full, host.size() * sizeof(float), cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < host.size(); ++i) {
      float sum = 0;
      for (int r = 0; r < n; ++r) sum += static_cast<float>((r + i) % 7);
      ASSERT_FLOAT_EQ(host[i], sum) << i;  // the average of n equal sums is the sum
    }
    EXPECT_TRUE(comm.Barrier().ok());
    cudaFree(full);
    cudaFree(shard);
  });
}

// One rank on GPU 0 whose operations wait for a compute stream that holds a long queue of work
// (memsets of 1 GiB) and then the shard's write, 0x3f3f3f3f in each of kCount floats, to be
// gathered (one rank: a copy) on NCCL's stream into `full_` and copied to `host_`.
class GatherBehindTheComputeStream : public ::testing::Test {
 protected:
  static constexpr size_t kCount = 1 << 20, kBusyBytes = size_t{1} << 30;

  void SetUp() override {
    if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking), cudaSuccess);
    NcclCommunicatorOptions options;
    options.compute_stream = compute_;
    options.timeout = absl::Seconds(60);
    auto comm = NcclCommunicator::Create(std::make_shared<testing::InMemoryStore>(), options);
    ASSERT_TRUE(comm.ok()) << comm.status();
    comm_ = *std::move(comm);
    ASSERT_EQ(cudaMalloc(&busy_, kBusyBytes), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&shard_, kCount * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&full_, kCount * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMallocHost(&host_, kCount * sizeof(uint32_t)), cudaSuccess);
    ASSERT_EQ(cudaMemset(shard_, 0, kCount * sizeof(float)), cudaSuccess);
  }
  void TearDown() override {
    comm_.reset();
    cudaFree(busy_);
    cudaFree(shard_);
    cudaFree(full_);
    cudaFreeHost(host_);
    if (compute_ != nullptr) cudaStreamDestroy(compute_);
  }
  void QueueShardWrite(int busy_memsets) {
    for (int i = 0; i < busy_memsets; ++i) cudaMemsetAsync(busy_, i, kBusyBytes, compute_);
    cudaMemsetAsync(shard_, 0x3f, kCount * sizeof(float), compute_);
  }
  void ExpectGathered() const {
    for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(host_[i], 0x3f3f3f3fu) << i;
  }

  cudaStream_t compute_ = nullptr;
  std::unique_ptr<NcclCommunicator> comm_;
  void* busy_ = nullptr;
  float* shard_ = nullptr;
  float* full_ = nullptr;
  uint32_t* host_ = nullptr;
};

// A collective reads what the compute stream's kernels wrote before it was issued, without the
// host waiting for them.
TEST_F(GatherBehindTheComputeStream, CollectivesWaitForTheComputeStream) {
  QueueShardWrite(20);
  ASSERT_TRUE(comm_->AllGather(shard_, full_, kCount)->Wait().ok());
  ASSERT_EQ(cudaMemcpy(host_, full_, kCount * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  ExpectGathered();
}

// Work::WaitOnDevice: the compute stream, not the host, waits for the gather: when it returns the
// stream is still busy with its queue, and a copy issued on it after reads the gathered values.
TEST_F(GatherBehindTheComputeStream, TheComputeStreamWaitsForAGatherOnTheDevice) {
  // ~500 GiB of memsets, about 150 ms on an H100: longer than the first NCCL call on a new
  // communicator takes, its watchdog's start included, even where system calls are slow.
  QueueShardWrite(500);
  std::unique_ptr<Work> gather = comm_->AllGather(shard_, full_, kCount);
  ASSERT_TRUE(gather->WaitOnDevice().ok());
  EXPECT_EQ(cudaStreamQuery(compute_), cudaErrorNotReady) << "the host waited for the stream";
  cudaMemcpyAsync(host_, full_, kCount * sizeof(float), cudaMemcpyDeviceToHost, compute_);
  ASSERT_EQ(cudaStreamSynchronize(compute_), cudaSuccess);
  ExpectGathered();
  EXPECT_TRUE(gather->Wait().ok());
  // The stream's wait, timed with events (the gather's copy: microseconds), is taken once.
  const double waited_ms = comm_->TakeDeviceWaitMs();
  EXPECT_GE(waited_ms, 0);
  EXPECT_LT(waited_ms, 1000);
  EXPECT_EQ(comm_->TakeDeviceWaitMs(), 0);
}

// A collective one rank never issues, which the other's compute stream waits for on the device:
// the watchdog aborts the communicator at the timeout, so the stream's wait ends and the host's
// synchronisation returns, and Wait reports the timeout. Needs two GPUs (one rank each).
TEST(NcclCommunicatorTest, TheWatchdogEndsADeviceWaitOnAHungCollective) {
  if (DeviceCount() < 2) GTEST_SKIP() << "needs 2 CUDA devices, has " << DeviceCount();
  auto store = std::make_shared<testing::InMemoryStore>();
  std::thread idle([&] {  // rank 1 joins and never issues the all-reduce
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    NcclCommunicatorOptions options;
    options.rank = 1;
    options.size = 2;
    options.timeout = absl::Seconds(60);
    auto comm = NcclCommunicator::Create(store, options);
    ASSERT_TRUE(comm.ok()) << comm.status();
    absl::SleepFor(absl::Seconds(8));
  });
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t compute = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), cudaSuccess);
  NcclCommunicatorOptions options;
  options.rank = 0;
  options.size = 2;
  options.compute_stream = compute;
  options.timeout = absl::Seconds(2);
  auto comm = NcclCommunicator::Create(store, options);
  ASSERT_TRUE(comm.ok()) << comm.status();
  float* data = nullptr;
  ASSERT_EQ(cudaMalloc(&data, 1024 * sizeof(float)), cudaSuccess);
  std::unique_ptr<Work> hung = (*comm)->AllReduce(data, 1024, ReduceOp::kSum);
  ASSERT_TRUE(hung->WaitOnDevice().ok());
  const absl::Time start = absl::Now();
  cudaStreamSynchronize(compute);  // ends once the watchdog aborts
  EXPECT_LT(absl::Now() - start, absl::Seconds(6));
  const absl::Status status = hung->Wait();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  cudaFree(data);
  cudaStreamDestroy(compute);
  idle.join();
}

// Point to point, one rank per visible GPU: every rank first Sends 64 MiB to each neighbour on
// the ring (NCCL's eager buffers hold far less), then Recvs from both; on one communicator each
// rank's first Send would wait for a Recv its peer queues behind its own Send, forever. Each
// pair's communicators let them meet within the timeout, in order: the n-th Send to a peer is its
// n-th Recv from this rank.
TEST(NcclCommunicatorTest, RanksThatAllSendFirstMeetTheirPeersReceives) {
  const int n = DeviceCount();
  if (n < 2) GTEST_SKIP() << "needs 2 CUDA devices, has " << n;
  constexpr size_t kCount = size_t{16} << 20;
  OnEveryGpu(/*point_to_point=*/true, [&](int rank, NcclCommunicator& comm) {
    const int next = (rank + 1) % n, previous = (rank + n - 1) % n;
    // Two messages to each neighbour (the same one twice when n = 2), each filled with
    // 1000 * sender + message number.
    std::vector<int> peers = {next, previous};
    float* sent = nullptr;
    float* received = nullptr;
    ASSERT_EQ(cudaMalloc(&sent, 2 * kCount * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&received, 2 * kCount * sizeof(float)), cudaSuccess);
    std::vector<float> host(kCount);
    for (int m = 0; m < 2; ++m) {
      std::fill(host.begin(), host.end(), static_cast<float>(1000 * rank + m));
      cudaMemcpy(sent + m * kCount, host.data(), kCount * sizeof(float), cudaMemcpyHostToDevice);
    }
    std::vector<std::unique_ptr<Work>> works;
    for (int m = 0; m < 2; ++m) works.push_back(comm.Send(sent + m * kCount, kCount, peers[m]));
    // The previous rank's message 0 (to its next) and the next rank's message 1 (to its
    // previous); of 2 ranks, the peer's two messages in order.
    works.push_back(comm.Recv(received, kCount, previous));
    works.push_back(comm.Recv(received + kCount, kCount, next));
    for (auto& work : works) ASSERT_TRUE(work->Wait().ok()) << work->Wait();
    const float expected[2] = {1000.0f * previous, 1000.0f * next + 1};
    for (int m = 0; m < 2; ++m) {
      cudaMemcpy(host.data(), received + m * kCount, kCount * sizeof(float),
                 cudaMemcpyDeviceToHost);
      EXPECT_EQ(std::count(host.begin(), host.end(), expected[m]), kCount) << "message " << m;
    }
    cudaFree(sent);
    cudaFree(received);
  });
}

// Send and Recv name what is wrong with them before NCCL sees them: a group created for
// collectives only, or a peer that is this rank or outside the group.
TEST(NcclCommunicatorTest, PointToPointNeedsAPairGroupAndAnotherMember) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  auto store = std::make_shared<testing::InMemoryStore>();
  auto collectives = NcclCommunicator::Create(store, NcclCommunicatorOptions{.name = "tp"});
  ASSERT_TRUE(collectives.ok()) << collectives.status();
  float* data = nullptr;
  ASSERT_EQ(cudaMalloc(&data, sizeof(float)), cudaSuccess);
  const absl::Status refused = (*collectives)->Send(data, 1, 0)->Wait();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(refused.message(), ::testing::HasSubstr("group 'tp': the group was created for "
                                                      "collectives only"));
  auto pairs = NcclCommunicator::Create(
      store,
      NcclCommunicatorOptions{.name = "pp", .key_prefix = "comm/pp/", .point_to_point = true});
  ASSERT_TRUE(pairs.ok()) << pairs.status();
  for (const int peer : {0, 1, -1}) {
    const absl::Status status = (*pairs)->Recv(data, 1, peer)->Wait();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(), ::testing::HasSubstr("is not another member of a group of 1"));
  }
  cudaFree(data);
}
#else
TEST(NcclCommunicatorTest, CollectivesMatchTheSequentialReference) {
  GTEST_SKIP() << "built without the CUDA toolkit (DTRAIN_HAVE_NCCL undefined)";
}
#endif

}  // namespace
}  // namespace dtrain
