// The peer of `dtrain bench comm` in scripts/bench/comm_vs_gloo.sh: Gloo's own all-reduce
// (gloo::allreduce, ring), float32 sum, on the same sizes, rendezvous through a FileStore.
// Built by the script with g++ against Debian's libgloo-dev; not part of the CMake build.
//
// Usage: raw_gloo_allreduce RANK SIZE STORE_DIR MIN_BYTES MAX_BYTES ITERS
// Prints, on rank 0, one line per size: "bytes time_us busbw_gbps" (time averaged over ranks).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "gloo/allreduce.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/transport/tcp/device.h"

namespace {

void Sum(void* out, const void* a, const void* b, size_t n) {
  float* o = static_cast<float*>(out);
  const float* x = static_cast<const float*>(a);
  const float* y = static_cast<const float*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
}

void AllReduce(const std::shared_ptr<gloo::Context>& context, std::vector<float>& data) {
  gloo::AllreduceOptions options(context);
  options.setOutput(data.data(), data.size());
  options.setReduceFunction(&Sum);
  gloo::allreduce(options);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: %s RANK SIZE STORE_DIR MIN_BYTES MAX_BYTES ITERS\n", argv[0]);
    return 2;
  }
  const int rank = std::atoi(argv[1]);
  const int size = std::atoi(argv[2]);
  const long min_bytes = std::atol(argv[4]);
  const long max_bytes = std::atol(argv[5]);
  const int iters = std::atoi(argv[6]);

  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(argv[3]);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->connectFullMesh(store, device);

  const int warmup = 3;
  for (long bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
    std::vector<float> data(bytes / sizeof(float), 1.0f);
    for (int i = 0; i < warmup; ++i) AllReduce(context, data);
    std::vector<float> sync(1, 0.0f);
    AllReduce(context, sync);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) AllReduce(context, data);
    std::vector<float> time_us(
        1,
        std::chrono::duration<float, std::micro>(std::chrono::steady_clock::now() - start).count() /
            iters);
    AllReduce(context, time_us);
    const double average_us = time_us[0] / size;
    const double busbw = bytes / (average_us * 1e-6) / 1e9 * 2.0 * (size - 1) / size;
    if (rank == 0) std::printf("%ld %.1f %.3f\n", bytes, average_us, busbw);
  }
  return 0;
}
