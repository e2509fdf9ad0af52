#include "parallel/comm_bench.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/util/status.h"
#include "parallel/process_group.h"

namespace dtrain {
namespace {

// Whether each rank holds 1/n of the operation's whole array (the all-gather input, the
// reduce-scatter output).
bool Sharded(std::string_view op) { return op == "all_gather" || op == "reduce_scatter"; }

// The per-rank element count for an array of `bytes` and the operation's array layout.
int64_t PerRankCount(std::string_view op, int64_t bytes, int n) {
  const int64_t elements = bytes / static_cast<int64_t>(sizeof(float));
  return std::max<int64_t>(1, Sharded(op) ? elements / n : elements);
}

absl::StatusOr<std::unique_ptr<Work>> Issue(Communicator& comm, std::string_view op,
                                            std::vector<float>& full, std::vector<float>& shard,
                                            int64_t count) {
  if (op == "all_reduce") return comm.AllReduce(full.data(), count, ReduceOp::kSum);
  if (op == "all_gather") return comm.AllGather(shard.data(), full.data(), count);
  if (op == "reduce_scatter") {
    return comm.ReduceScatter(full.data(), shard.data(), count, ReduceOp::kSum);
  }
  if (op == "broadcast") return comm.Broadcast(full.data(), count, 0);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown collective '", std::string(op),
                   "'; choose all_reduce, all_gather, reduce_scatter or broadcast"));
}

}  // namespace

double BusBandwidthFactor(std::string_view op, int n) {
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "all_gather" || op == "reduce_scatter") return static_cast<double>(n - 1) / n;
  return 1.0;
}

absl::Status CheckCommBenchOptions(const CommBenchOptions& options, double memory_bytes) {
  if (options.min_bytes <= 0 || options.max_bytes < options.min_bytes || options.iters <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "bench sizes %d..%d bytes with %d iterations: need 0 < --min-bytes <= --max-bytes and "
        "--iters > 0",
        options.min_bytes, options.max_bytes, options.iters));
  }
  if (const double needed = 2.0 * static_cast<double>(options.max_bytes);
      memory_bytes > 0 && needed > memory_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--max-bytes %d needs up to %.1f GiB of buffers on each rank, and each has %.1f GiB of "
        "this machine's memory: lower --max-bytes",
        options.max_bytes, needed / (1 << 30), memory_bytes / (1 << 30)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<CommBenchRow>> RunCommBench(Communicator& comm,
                                                       const CommBenchOptions& options) {
  RETURN_IF_ERROR(CheckCommBenchOptions(options, 0));
  const int n = comm.size();
  // `iters` operations of `bytes`, issued back to back; returns this rank's time per operation.
  // Operations complete in issue order: waiting for the last one first sleeps once, as
  // nccl-tests synchronizes its stream once, rather than waking for every operation.
  const auto run = [&](const std::string& op, int64_t bytes, int iters) -> absl::StatusOr<double> {
    const int64_t count = PerRankCount(op, bytes, n);
    std::vector<float> full(Sharded(op) ? count * n : count, 1.0f);
    std::vector<float> shard(count, 1.0f);
    std::vector<std::unique_ptr<Work>> works;
    RETURN_IF_ERROR(comm.Barrier());  // every rank's buffers are ready: the clocks start together
    const absl::Time start = absl::Now();
    for (int i = 0; i < iters; ++i) {
      ASSIGN_OR_RETURN(auto work, Issue(comm, op, full, shard, count));
      works.push_back(std::move(work));
    }
    for (auto work = works.rbegin(); work != works.rend(); ++work) {
      RETURN_IF_ERROR((*work)->Wait());
    }
    return absl::ToDoubleMicroseconds(absl::Now() - start) / iters;
  };
  std::vector<CommBenchRow> rows;
  for (const std::string& op : options.ops) {
    // Warm-up at the largest and the smallest size first, as nccl-tests does: with only its own
    // warm-up, the first size paid for the transport's first use.
    for (const int64_t bytes : {options.max_bytes, options.min_bytes}) {
      RETURN_IF_ERROR(run(op, bytes, options.warmup_iters).status());
    }
    for (int64_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= 2) {
      RETURN_IF_ERROR(run(op, bytes, options.warmup_iters).status());
      ASSIGN_OR_RETURN(const double rank_time_us, run(op, bytes, options.iters));
      float time_us = static_cast<float>(rank_time_us);
      RETURN_IF_ERROR(comm.AllReduce(&time_us, 1, ReduceOp::kAvg)->Wait());

      CommBenchRow row;
      row.op = op;
      const int64_t count = PerRankCount(op, bytes, n);
      row.count = Sharded(op) ? count * n : count;
      row.bytes = row.count * static_cast<int64_t>(sizeof(float));
      row.time_us = time_us;
      row.algbw_gbps = row.bytes / (time_us * 1e-6) / 1e9;
      row.busbw_gbps = row.algbw_gbps * BusBandwidthFactor(op, n);
      rows.push_back(row);
    }
  }
  return rows;
}

std::string FormatCommBenchTable(const std::vector<CommBenchRow>& rows, std::string_view backend,
                                 int world_size) {
  std::string out = absl::StrFormat(
      "# dtrain bench comm: backend %s, %d ranks, float32, sum\n"
      "#   size: bytes of the whole array (all_gather output, reduce_scatter input)\n"
      "#   count: float elements of the whole array\n"
      "#   time: microseconds per operation, averaged over ranks\n"
      "#   algbw: size / time in GB/s (1e9 bytes/s)\n"
      "#   busbw: algbw x 2(n-1)/n (all_reduce), (n-1)/n (all_gather, reduce_scatter), "
      "1 (broadcast)\n"
      "%-15s %12s %12s %12s %9s %9s\n",
      std::string(backend), world_size, "op", "size", "count", "time(us)", "algbw", "busbw");
  for (const CommBenchRow& row : rows) {
    absl::StrAppendFormat(&out, "%-15s %12d %12d %12.1f %9.3f %9.3f\n", row.op, row.bytes,
                          row.count, row.time_us, row.algbw_gbps, row.busbw_gbps);
  }
  return out;
}

absl::StatusOr<std::string> RunGlooCommBench(const CommBenchOptions& options,
                                             const WorldMembership& world,
                                             const std::string& hostname) {
  ASSIGN_OR_RETURN(std::unique_ptr<ProcessGroup> group,
                   ProcessGroup::Connect(world, absl::Seconds(300), "bench/", "", hostname));
  const absl::StatusOr<std::vector<CommBenchRow>> rows = RunCommBench(group->world(), options);
  RETURN_IF_ERROR(group->Leave(rows.status()));
  return world.rank == 0 ? FormatCommBenchTable(*rows, "gloo", world.world_size) : "";
}

}  // namespace dtrain
