// Runs only where the build has NCCL and the machine has a GPU; skips otherwise. One process
// drives one GPU, so the multi-rank cases need one thread per visible device.
#include <gtest/gtest.h>

#ifdef DTRAIN_HAVE_NCCL
#include <cuda_runtime.h>

#include <memory>
#include <thread>
#include <vector>

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
#else
TEST(NcclCommunicatorTest, CollectivesMatchTheSequentialReference) {
  GTEST_SKIP() << "built without the CUDA toolkit (DTRAIN_HAVE_NCCL undefined)";
}
#endif

}  // namespace
}  // namespace dtrain
