// `dtrain bench comm`: nccl-tests-style bandwidth of the collectives on a Communicator, so that
// numbers compare across machines and with nccl-tests. Every rank runs the same sizes; times are
// averaged over ranks (as nccl-tests does) and rank 0 prints the table.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "parallel/comm/communicator.h"
#include "parallel/world_membership.h"

namespace dtrain {

struct CommBenchOptions {
  // Any of all_reduce, all_gather, reduce_scatter, broadcast; in this order.
  std::vector<std::string> ops = {"all_reduce", "all_gather", "reduce_scatter", "broadcast"};
  int64_t min_bytes = 1 << 10;  // doubled up to max_bytes
  int64_t max_bytes = 64 << 20;
  int iters = 20;        // timed operations per size, issued back to back, waited at the end
  int warmup_iters = 3;  // untimed, per size, and first at the largest and smallest size
};

struct CommBenchRow {
  std::string op;
  int64_t bytes = 0;      // the whole array: the all-gather output, the reduce-scatter input
  int64_t count = 0;      // float elements of the whole array
  double time_us = 0;     // per operation, averaged over ranks
  double algbw_gbps = 0;  // bytes / time, GB/s = 1e9 bytes/s
  double busbw_gbps = 0;  // algbw x BusBandwidthFactor
};

// nccl-tests' factor from algorithm to bus bandwidth on n ranks: 2(n-1)/n for all_reduce,
// (n-1)/n for all_gather and reduce_scatter, 1 for broadcast.
double BusBandwidthFactor(std::string_view op, int n);

// InvalidArgument naming the fix for sizes or iterations that cannot run: min_bytes > 0, not above
// max_bytes, iters > 0, and, where `memory_bytes` (what one rank may hold) is above 0, the
// largest size's buffers (the whole array and a rank's part: up to 2 x max_bytes) within it.
absl::Status CheckCommBenchOptions(const CommBenchOptions& options, double memory_bytes);

// Collective; every rank must call it with the same options.
absl::StatusOr<std::vector<CommBenchRow>> RunCommBench(Communicator& comm,
                                                       const CommBenchOptions& options);

// The table, columns defined once in its header comment.
std::string FormatCommBenchTable(const std::vector<CommBenchRow>& rows, std::string_view backend,
                                 int world_size);

// The whole command on this rank of `world`: joins the process group (its Gloo device on
// `hostname`; empty = 127.0.0.1 for a loopback master, else this host's name) and runs the
// bench; returns rank 0's table ("" on other ranks).
absl::StatusOr<std::string> RunGlooCommBench(const CommBenchOptions& options,
                                             const WorldMembership& world,
                                             const std::string& hostname);

}  // namespace dtrain
