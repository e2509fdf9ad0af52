// `dtrain launch RECIPE`: decides from the environment how this process takes part in the job.
//
// - In a Slurm batch (or salloc) shell: re-executes itself through
//   `srun --ntasks-per-node=1 --nodes=<job nodes>`, one agent per node, with a fresh
//   rendezvous token; that srun's exit code is the launch's.
// - As the one task per node of a Slurm step, in a Kubernetes pod, or with --node-rank and
//   --nnodes: this node's agent (launch/agent.h).
// - Outside any scheduler: a standalone agent on this machine, like torchrun --standalone
//   (loopback master, a free port, a generated token).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "launch/environment.h"

namespace dtrain {

struct LaunchOptions {
  std::string recipe_path;             // empty: the built-in tiny recipe
  std::vector<std::string> overrides;  // --set key=value, passed on to every worker
  int recipe_threads = 0;              // run.threads of the resolved recipe (0 = all cores)
  // The resolved recipe's checkpoint folder and checkpoint.resume, which restarts resume from.
  std::string checkpoint_dir, checkpoint_resume;
  // The recipe's rules that need the world size and the nodes, checked before any worker starts
  // (none: no check).
  std::function<absl::Status(int world_size, int num_nodes)> check_world;
  WorldOverrides world;  // --nproc-per-node, --node-rank, --nnodes, --master-*
  // --nproc-per-node gpu, auto or cpu, counted by each node's agent (ParseProcessesPerNode in
  // launch/gpus.h); empty: world.nproc_per_node, or the pod's.
  std::string nproc_kind;
  int max_restarts = 0;
  std::string log_dir;
  absl::Duration rendezvous_timeout = absl::Minutes(5);
  absl::Duration stop_grace = absl::Seconds(20);
  // After a clean stop on SIGTERM, requeue the Slurm job (`scontrol requeue`).
  bool requeue = false;
};

// The command line that starts the same launch again (for srun to run on every node).
std::vector<std::string> LaunchCommandLine(const std::string& dtrain_path,
                                           const LaunchOptions& options);

// Runs the launch; returns the exit code (see agent.h). In a Slurm batch shell it does not
// return unless srun cannot be started. Errors name the variable, flag or node to fix.
absl::StatusOr<int> Launch(const LaunchOptions& options);

}  // namespace dtrain
