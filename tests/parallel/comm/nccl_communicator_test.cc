// Runs only where the build has NCCL and the machine has a GPU; skips otherwise. One process
// drives one GPU, so the multi-rank cases need one thread per visible device.
#include <gtest/gtest.h>

#ifdef DTRAIN_HAVE_NCCL
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
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

// Every visible GPU is one rank: all-reduce, reduce-scatter and all-gather against the sums.
TEST(NcclCommunicatorTest, CollectivesMatchTheSequentialReference) {
  const int n = DeviceCount();
  if (n == 0) GTEST_SKIP() << "no CUDA device";
  auto store = std::make_shared<testing::InMemoryStore>();
  const size_t count = 1001;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
      NcclCommunicatorOptions options;
      options.rank = rank;
      options.size = n;
      options.timeout = absl::Seconds(60);
      auto comm = NcclCommunicator::Create(store, options);
      ASSERT_TRUE(comm.ok()) << comm.status();
      std::vector<float> host(n * count);
      for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>((rank + i) % 7);
      float* full = nullptr;
      float* shard = nullptr;
      ASSERT_EQ(cudaMalloc(&full, host.size() * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&shard, count * sizeof(float)), cudaSuccess);
      cudaMemcpy(full, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice);
      ASSERT_TRUE((*comm)->ReduceScatter(full, shard, count, ReduceOp::kSum)->Wait().ok());
      ASSERT_TRUE((*comm)->AllGather(shard, full, count)->Wait().ok());
      ASSERT_TRUE((*comm)->AllReduce(full, n * count, ReduceOp::kAvg)->Wait().ok());
      cudaMemcpy(host.data(), full, host.size() * sizeof(float), cudaMemcpyDeviceToHost);
      for (size_t i = 0; i < host.size(); ++i) {
        float sum = 0;
        for (int r = 0; r < n; ++r) sum += static_cast<float>((r + i) % 7);
        ASSERT_FLOAT_EQ(host[i], sum) << i;  // the average of n equal sums is the sum
      }
      EXPECT_TRUE((*comm)->Barrier().ok());
      cudaFree(full);
      cudaFree(shard);
    });
  }
  for (std::thread& thread : threads) thread.join();
}
// A collective reads what the compute stream's kernels wrote before it was issued, without the
// host waiting: the shard is written on the compute stream behind a long queue of work, then
// gathered (one rank: a copy) on NCCL's stream.
TEST(NcclCommunicatorTest, CollectivesWaitForTheComputeStream) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t compute = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), cudaSuccess);
  NcclCommunicatorOptions options;
  options.compute_stream = compute;
  options.timeout = absl::Seconds(60);
  auto comm = NcclCommunicator::Create(std::make_shared<testing::InMemoryStore>(), options);
  ASSERT_TRUE(comm.ok()) << comm.status();
  constexpr size_t kBusyBytes = size_t{1} << 30, kCount = 1 << 20;
  void* busy = nullptr;
  float* shard = nullptr;
  float* full = nullptr;
  ASSERT_EQ(cudaMalloc(&busy, kBusyBytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&shard, kCount * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&full, kCount * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemset(shard, 0, kCount * sizeof(float)), cudaSuccess);
  for (int i = 0; i < 20; ++i) cudaMemsetAsync(busy, i, kBusyBytes, compute);
  cudaMemsetAsync(shard, 0x3f, kCount * sizeof(float), compute);  // 0x3f3f3f3f each
  ASSERT_TRUE((*comm)->AllGather(shard, full, kCount)->Wait().ok());
  std::vector<uint32_t> host(kCount);
  ASSERT_EQ(cudaMemcpy(host.data(), full, kCount * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(host[i], 0x3f3f3f3fu) << i;
  cudaFree(busy);
  cudaFree(shard);
  cudaFree(full);
  cudaStreamDestroy(compute);
}

// Work::WaitOnDevice: the compute stream, not the host, waits for a gather. The gather waits
// behind a long queue on the compute stream (the shard's writes), so when WaitOnDevice returns
// the stream is still busy; a copy issued on it after reads the gathered values.
TEST(NcclCommunicatorTest, TheComputeStreamWaitsForAGatherOnTheDevice) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t compute = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), cudaSuccess);
  NcclCommunicatorOptions options;
  options.compute_stream = compute;
  options.timeout = absl::Seconds(60);
  auto comm = NcclCommunicator::Create(std::make_shared<testing::InMemoryStore>(), options);
  ASSERT_TRUE(comm.ok()) << comm.status();
  constexpr size_t kBusyBytes = size_t{1} << 30, kCount = 1 << 20;
  void* busy = nullptr;
  float* shard = nullptr;
  float* full = nullptr;
  uint32_t* host = nullptr;
  ASSERT_EQ(cudaMalloc(&busy, kBusyBytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&shard, kCount * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&full, kCount * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(&host, kCount * sizeof(uint32_t)), cudaSuccess);
  for (int i = 0; i < 100; ++i) cudaMemsetAsync(busy, i, kBusyBytes, compute);  // ~100 GiB
  cudaMemsetAsync(shard, 0x3f, kCount * sizeof(float), compute);
  std::unique_ptr<Work> gather = (*comm)->AllGather(shard, full, kCount);
  ASSERT_TRUE(gather->WaitOnDevice().ok());
  EXPECT_EQ(cudaStreamQuery(compute), cudaErrorNotReady) << "the host waited for the stream";
  cudaMemcpyAsync(host, full, kCount * sizeof(float), cudaMemcpyDeviceToHost, compute);
  ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
  for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(host[i], 0x3f3f3f3fu) << i;
  EXPECT_TRUE(gather->Wait().ok());
  cudaFree(busy);
  cudaFree(shard);
  cudaFree(full);
  cudaFreeHost(host);
  cudaStreamDestroy(compute);
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
#else
TEST(NcclCommunicatorTest, CollectivesMatchTheSequentialReference) {
  GTEST_SKIP() << "built without the CUDA toolkit (DTRAIN_HAVE_NCCL undefined)";
}
#endif

}  // namespace
}  // namespace dtrain
