// `dtrain bench comm [--min-bytes 1K] [--max-bytes 64M] [--iters N] [--ops ...]`:
// collective bandwidth under torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/backend/cpu/cpu_backend.h"
#include "core/util/byte_size.h"
#include "launch/environment.h"
#include "parallel/comm_bench.h"

namespace dtrain::cli {

void AddBenchCommand(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Measure this machine or cluster");
  bench->require_subcommand(1);

  struct CommArgs {
    std::string min_bytes = "1K";
    std::string max_bytes = "64M";
    std::string hostname;
    CommBenchOptions options;
  };
  auto args = std::make_shared<CommArgs>();
  CLI::App* comm = bench->add_subcommand(
      "comm",
      "Bandwidth of all_reduce, all_gather, reduce_scatter and broadcast, as nccl-tests prints "
      "it; start one process per rank with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set");
  comm->add_option("--min-bytes", args->min_bytes, "Smallest array, e.g. 1K")
      ->capture_default_str();
  comm->add_option("--max-bytes", args->max_bytes, "Largest array (sizes double), e.g. 64M")
      ->capture_default_str();
  comm->add_option("--iters", args->options.iters, "Timed operations per size")
      ->check(Positive())
      ->capture_default_str();
  comm->add_option("--ops", args->options.ops, "Collectives to measure")
      ->delimiter(',')
      ->check(CLI::IsMember({"all_reduce", "all_gather", "reduce_scatter", "broadcast"}))
      ->capture_default_str();
  comm->add_option("--hostname", args->hostname,
                   "Address peers reach this rank at (default: as training picks it: "
                   "GLOO_SOCKET_IFNAME's interface, else the address this host reaches the "
                   "master from)");
  comm->callback([args] {
    absl::StatusOr<int64_t> min_bytes = ParseByteSize("--min-bytes", args->min_bytes);
    if (!min_bytes.ok()) Fail(min_bytes.status(), kExitUsage);
    absl::StatusOr<int64_t> max_bytes = ParseByteSize("--max-bytes", args->max_bytes);
    if (!max_bytes.ok()) Fail(max_bytes.status(), kExitUsage);
    args->options.min_bytes = *min_bytes;
    args->options.max_bytes = *max_bytes;
    absl::StatusOr<WorldEnvironment> world = RankWorldFromEnvironment();
    if (!world.ok()) Fail(world.status(), kExitFailure);
    if (world->world_size < 2) {
      // One rank moves nothing: its table would be copy speeds read as bandwidths.
      Fail(absl::InvalidArgumentError(
               "dtrain bench comm measures collectives between ranks and this world has one: "
               "start it as training's ranks start (srun -n 2 dtrain bench comm, or "
               "torchrun-style WORLD_SIZE, RANK, MASTER_ADDR and MASTER_PORT)"),
           kExitUsage);
    }
    // Before the rendezvous: sizes that cannot run are the command line's (an allocation of
    // --max-bytes 1T aborted every rank).
    if (absl::Status sizes =
            CheckCommBenchOptions(args->options, CpuBackend::MachineMemory().bytes /
                                                     std::max(world->local_world_size, 1));
        !sizes.ok()) {
      Fail(sizes, kExitUsage);
    }
    absl::StatusOr<std::string> table = RunGlooCommBench(args->options, *world, args->hostname);
    if (!table.ok()) Fail(table.status(), kExitFailure);
    std::cout << *table << std::flush;
  });
}

}  // namespace dtrain::cli
