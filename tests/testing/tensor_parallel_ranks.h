// Tensor-parallel (and pipeline) ranks as threads of one process, each with Gloo communicators
// over an in-memory store: what tests of split models share.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/backend/cpu/cpu_backend.h"
#include "core/model/init.h"
#include "core/model/param_table.h"
#include "gtest/gtest.h"
#include "parallel/comm/backend_memory_guard.h"
#include "parallel/comm/gloo_communicator.h"
#include "parallel/tensor_parallel.h"
#include "tests/parallel/comm/test_store.h"

namespace dtrain::testing {

// The seed's initial values of `table`'s tensors into params, with biases and norm weights moved
// off 0 and 1 by global index: under init's 0 and 1 a bias counted on every rank, or a shard
// reading another's norm, would go unseen. Any split of the model gets the same values.
inline void InitDistinctParameters(const ModelConfig& config, const ParamTable& table,
                                   uint64_t seed, float* params) {
  InitParameters(config, table, seed, 0, table.total_numel(), params);
  for (const TensorEntry& entry : table.entries()) {
    if (!entry.is_bias && !entry.is_norm_weight) continue;
    ForEachGlobalRun(entry, 0, entry.numel, [&](size_t local, size_t global, size_t count) {
      for (size_t i = 0; i < count; ++i) {
        params[entry.offset + local + i] +=
            0.05f * static_cast<float>(static_cast<int>((global + i) % 7) - 3);
      }
    });
  }
}

// Runs fn(table, ops) for every rank of a tp-way split of `config` on its own thread, each with
// Gloo communicators for the tensor-parallel group (passed too, for its stats) and, when kv heads
// are replicated, for the ranks sharing one. Returns the ranks' tables.
inline std::vector<std::unique_ptr<ParamTable>> RunTensorParallelRanks(
    const ModelConfig& config, int tp_size,
    const std::function<void(const ParamTable&, TensorParallelOps*, const Communicator&)>& fn) {
  std::vector<std::unique_ptr<ParamTable>> tables(tp_size);
  auto store = std::make_shared<InMemoryStore>();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < tp_size; ++rank) {
    tables[rank] =
        std::make_unique<ParamTable>(config, ModelSlice{.tp_rank = rank, .tp_size = tp_size});
    threads.emplace_back([&, rank] {
      const ParamTable& table = *tables[rank];
      GlooCommunicatorOptions options;
      options.name = "tp";
      options.key_prefix = "comm/tp/";
      options.rank = rank;
      options.size = tp_size;
      options.timeout = absl::Seconds(60);
      auto tp = GlooCommunicator::Create(store, options);
      ASSERT_TRUE(tp.ok()) << tp.status();
      std::unique_ptr<GlooCommunicator> kv;
      const int replicas = table.dims().kv_replicas;
      if (replicas > 1) {
        options.name = "kv";
        options.key_prefix = absl::StrCat("comm/kv.", rank / replicas, "/");
        options.rank = rank % replicas;
        options.size = replicas;
        auto created = GlooCommunicator::Create(store, options);
        ASSERT_TRUE(created.ok()) << created.status();
        kv = *std::move(created);
      }
      CommTensorParallel ops(**tp, kv.get());
      fn(table, &ops, **tp);
      const absl::Status settled = ops.Settle();
      EXPECT_TRUE(settled.ok()) << settled;
    });
  }
  for (std::thread& thread : threads) thread.join();
  return tables;
}

// A Gloo communicator of `size` ranks named `name` under the store keys `prefix`, as `rank`;
// null, with a test failure, when it cannot connect.
inline std::unique_ptr<GlooCommunicator> ConnectGlooGroup(std::shared_ptr<InMemoryStore> store,
                                                          const std::string& name,
                                                          const std::string& prefix, int rank,
                                                          int size, absl::Duration timeout) {
  GlooCommunicatorOptions options;
  options.name = name;
  options.key_prefix = prefix;
  options.rank = rank;
  options.size = size;
  options.timeout = timeout;
  absl::StatusOr<std::unique_ptr<GlooCommunicator>> created =
      GlooCommunicator::Create(std::move(store), options);
  EXPECT_TRUE(created.ok()) << created.status();
  return created.ok() ? *std::move(created) : nullptr;
}

// Runs fn(stage, tp_rank, backend, tp, pp) for every rank of a pipeline of `stages` stages of
// `tp_size` tensor-parallel ranks each (one data-parallel replica) on its own thread, with a CPU
// backend and Gloo communicators for its tensor-parallel group (its stage's ranks) and its
// pipeline group (its tp rank's stages, rank = stage); as ProcessGroup::MeshGroups, null for a
// group of one rank, and guarded: their buffers must be the backend's memory.
inline void RunStageGridRanks(int stages, int tp_size,
                              const std::function<void(int stage, int tp_rank, Backend& backend,
                                                       Communicator* tp, Communicator* pp)>& fn) {
  auto store = std::make_shared<InMemoryStore>();
  auto connect = [&](const Backend& backend, const std::string& name, const std::string& prefix,
                     int rank, int size) -> std::unique_ptr<Communicator> {
    if (size == 1) return nullptr;
    std::unique_ptr<GlooCommunicator> gloo =
        ConnectGlooGroup(store, name, prefix, rank, size, absl::Seconds(60));
    // The pipeline's group sends and receives (Mesh::PpGroup), the others only collect.
    return gloo ? std::make_unique<BackendMemoryGuard>(std::move(gloo), backend,
                                                       /*point_to_point=*/name == "pp")
                : nullptr;
  };
  std::vector<std::thread> threads;
  for (int stage = 0; stage < stages; ++stage) {
    for (int tp_rank = 0; tp_rank < tp_size; ++tp_rank) {
      threads.emplace_back([&, stage, tp_rank] {
        CpuBackend backend(1);
        const auto tp =
            connect(backend, "tp", absl::StrCat("comm/tp.", stage, "/"), tp_rank, tp_size);
        const auto pp =
            connect(backend, "pp", absl::StrCat("comm/pp.", tp_rank, "/"), stage, stages);
        if ((tp_size > 1 && tp == nullptr) || (stages > 1 && pp == nullptr)) return;
        fn(stage, tp_rank, backend, tp.get(), pp.get());
      });
    }
  }
  for (std::thread& thread : threads) thread.join();
}

}  // namespace dtrain::testing
