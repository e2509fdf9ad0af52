// `dtrain doctor` on one node: the network (network.h), memlock, /dev/shm, GPUs against the
// recipe and their PCIe links (gpu_links.h), the checkpoint folder, the recipe's data and the
// master address, each an ok / info / warn / fail with its fix (check.h). Roots are parameters so
// that tests fake a node's /sys and /proc. Across nodes: cluster.h.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/recipe/recipe.h"
#include "launch/doctor/check.h"
#include "launch/environment.h"
#include "launch/gpus.h"
#include "parallel/planner/catalog.h"

namespace dtrain::doctor {

struct DoctorOptions {
  std::string sys_root = "/sys";
  std::string proc_root = "/proc";
  std::string shm_path = "/dev/shm";
  EnvironmentMap env;
  const Recipe* recipe = nullptr;  // nullptr: no recipe, so nothing is required of the node
  // RLIMIT_MEMLOCK's soft limit in bytes; nullopt for unlimited. Read from the process when unset.
  std::optional<std::optional<uint64_t>> memlock_bytes;
};

// Every single-node check, in the order they print. InvalidArgument (nothing checked) when the
// recipe's cluster section names a GPU or network the planner's catalog lacks.
absl::StatusOr<std::vector<CheckResult>> RunNodeChecks(const DoctorOptions& options);

// RDMA registers (pins) its buffers, so a bounded memlock limit fails NCCL's registration; a
// failure when the recipe needs RDMA, a warning on a node with RDMA ports, information on a node
// without. `limit_bytes` nullopt is unlimited.
CheckResult MemlockCheck(std::optional<uint64_t> limit_bytes, bool rdma_needed, bool rdma_present);

// NCCL's shared-memory transport puts its buffers in /dev/shm; a container's 64 MiB default is
// too small for a node of GPUs.
CheckResult ShmCheck(const std::string& shm_path);

// The driver's GPUs against the recipe: information without a recipe or a GPU, a warning when a
// recipe's run.device cpu leaves GPUs idle, a failure when a GPU recipe finds fewer than
// cluster.gpus_per_node.
CheckResult GpuCheck(const GpuInventory& gpus, const Recipe* recipe);

// `dir`, or where it does not exist yet, its nearest existing parent (where dtrain creates it).
std::filesystem::path NearestExistingFolder(const std::string& dir);

// Creates and removes a probe file in `dir`, or where `dir` does not exist yet, in its nearest
// existing parent (dtrain creates the rest); warns where its file system has no byte free.
CheckResult CheckpointFolderCheck(const std::string& dir);

// The launch environment's world; in a world of more than one, its master address resolves.
CheckResult MasterCheck(const EnvironmentMap& env);

}  // namespace dtrain::doctor
