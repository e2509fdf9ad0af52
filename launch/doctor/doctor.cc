#include "launch/doctor/doctor.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/data/datasets.h"
#include "launch/doctor/gpu_links.h"
#include "launch/doctor/network.h"

namespace dtrain::doctor {
namespace {

namespace fs = std::filesystem;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// Below this /dev/shm is a container default (64 MiB) or close to it: NCCL's shared-memory
// buffers for eight GPUs already take hundreds of MiB.
constexpr double kMinShmGib = 1.0;

CheckResult Result(std::string name, Verdict verdict, std::string detail, std::string fix = "") {
  return CheckResult{std::move(name), verdict, std::move(detail), std::move(fix)};
}

std::optional<uint64_t> ProcessMemlockBytes() {
  rlimit limit{};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) {
    return std::nullopt;
  }
  return static_cast<uint64_t>(limit.rlim_cur);
}

}  // namespace

CheckResult MemlockCheck(std::optional<uint64_t> limit_bytes, bool rdma_needed, bool rdma_present) {
  if (!limit_bytes.has_value()) return Result("node.memlock", Verdict::kOk, "ulimit -l unlimited");
  if (!rdma_needed && !rdma_present) {
    return Result(
        "node.memlock", Verdict::kInfo,
        absl::StrFormat("ulimit -l is %d KiB; no RDMA port here needs more", *limit_bytes / 1024));
  }
  return Result("node.memlock", rdma_needed ? Verdict::kFail : Verdict::kWarn,
                absl::StrFormat("ulimit -l is %d KiB; RDMA pins its buffers and needs unlimited",
                                *limit_bytes / 1024),
                "raise it to unlimited: 'memlock unlimited' in /etc/security/limits.conf, "
                "LimitMEMLOCK=infinity for slurmd, --ulimit memlock=-1 for docker");
}

CheckResult ShmCheck(const std::string& shm_path) {
  struct statvfs stats {};
  if (statvfs(shm_path.c_str(), &stats) != 0) {
    return Result("node.shm", Verdict::kWarn, absl::StrCat(shm_path, ": ", std::strerror(errno)),
                  "mount a tmpfs at /dev/shm; NCCL's shared-memory transport needs it");
  }
  const double size_gib = static_cast<double>(stats.f_blocks) * stats.f_frsize / kGiB;
  const std::string detail = absl::StrFormat("%s is %.2f GiB", shm_path, size_gib);
  if (size_gib < kMinShmGib) {
    return Result("node.shm", Verdict::kWarn, absl::StrCat(detail, "; NCCL needs more"),
                  "enlarge it: docker --shm-size=16g, a Kubernetes emptyDir with medium: Memory "
                  "at /dev/shm, or mount -o remount,size=16G /dev/shm");
  }
  return Result("node.shm", Verdict::kOk, detail);
}

CheckResult GpuCheck(const GpuInventory& gpus, const Recipe* recipe) {
  const bool wants_gpus = recipe != nullptr && recipe->cuda();
  // A GPU recipe left at the default device (the shipped configs' cluster.* plan for GPUs).
  if (recipe != nullptr && !wants_gpus && gpus.visible > 0) {
    return Result("node.gpus", Verdict::kWarn,
                  absl::StrCat(gpus.description, "; run.device is cpu, so none is used"),
                  "set run.device: cuda to train on them");
  }
  if (!wants_gpus) {
    return Result("node.gpus", Verdict::kInfo,
                  absl::StrCat(gpus.description,
                               recipe == nullptr ? "" : "; run.device is cpu, so none is used"));
  }
  // What this node's processes can use: CUDA_VISIBLE_DEVICES (a Slurm job's --gpus, a shared
  // node's cgroup) narrows the driver's list.
  const int wanted = recipe->cluster.gpus_per_node;
  if (gpus.installed == 0) {
    return Result("node.gpus", Verdict::kFail,
                  absl::StrCat(gpus.description, ", but run.device is cuda"),
                  "run on a GPU node with the NVIDIA driver loaded, or set run.device: cpu");
  }
  if (gpus.visible == 0) {
    return Result("node.gpus", Verdict::kFail,
                  absl::StrCat(gpus.description, ": every GPU is hidden, but run.device is cuda"),
                  "leave CUDA_VISIBLE_DEVICES to the launcher (Slurm sets it from --gpus), or "
                  "list GPUs of this node in it");
  }
  if (gpus.visible < wanted) {
    return Result(
        "node.gpus", Verdict::kFail,
        absl::StrCat(gpus.description, ": ", gpus.visible, " visible, but run.device is cuda with ",
                     "cluster.gpus_per_node ", wanted),
        absl::StrCat("set cluster.gpus_per_node to ", gpus.visible, " (or run where ", wanted,
                     " GPUs are visible), and leave CUDA_VISIBLE_DEVICES to the launcher"));
  }
  if (gpus.visible > wanted) {
    return Result(
        "node.gpus", Verdict::kWarn,
        absl::StrCat(gpus.description, ": ", gpus.visible, " visible; cluster.gpus_per_node is ",
                     wanted, ", so some stay idle"),
        absl::StrCat("set cluster.gpus_per_node to ", gpus.visible));
  }
  return Result("node.gpus", Verdict::kOk, gpus.description);
}

fs::path NearestExistingFolder(const std::string& dir) {
  std::error_code error;
  fs::path existing = fs::absolute(dir, error);
  while (!existing.empty() && !fs::exists(existing, error) && existing != existing.parent_path()) {
    existing = existing.parent_path();
  }
  return existing;
}

CheckResult CheckpointFolderCheck(const std::string& dir) {
  std::error_code error;
  const fs::path existing = NearestExistingFolder(dir);
  const bool exists = existing == fs::absolute(dir, error);
  const std::string elsewhere = "or set checkpoint.dir to a writable folder that every node shares";
  // What the run would find creating the rest (it passed here and failed there): a file on the
  // way, or a name longer than the file system takes.
  if (!fs::is_directory(existing, error)) {
    return Result(
        "node.checkpoint_dir", Verdict::kFail,
        absl::StrCat(existing.string(), " is a file, not a folder, so ", dir, " cannot be created"),
        absl::StrCat("move the file, ", elsewhere));
  }
  const long name_max = pathconf(existing.c_str(), _PC_NAME_MAX);
  for (const fs::path& part : fs::absolute(dir, error).lexically_relative(existing)) {
    if (name_max > 0 && static_cast<long>(part.native().size()) > name_max) {
      return Result("node.checkpoint_dir", Verdict::kFail,
                    absl::StrCat(dir, " does not exist, and its part '",
                                 part.native().substr(0, 32), "...' is ", part.native().size(),
                                 " bytes, more than the ", name_max, " that its file system takes"),
                    absl::StrCat("shorten checkpoint.dir, ", elsewhere));
    }
  }
  const fs::path probe = existing / absl::StrCat(".dtrain-doctor-probe-", getpid());
  const int fd = open(probe.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0600);
  if (fd < 0) {
    const int failure = errno;
    const std::string fix =
        failure == EROFS ? absl::StrCat(
                               "its file system is mounted read-only: remount it "
                               "read-write (mount -o remount,rw), ",
                               elsewhere)
        : failure == ENOSPC || failure == EDQUOT
            ? absl::StrCat("its file system (or quota) is full: free space there, ", elsewhere)
            : absl::StrCat("make it writable for this user (chown, chmod u+w), ", elsewhere);
    return Result(
        "node.checkpoint_dir", Verdict::kFail,
        absl::StrCat(
            exists ? dir : absl::StrCat(dir, " does not exist and its parent ", existing.string()),
            " is not writable: ", std::strerror(failure)),
        fix);
  }
  close(fd);
  fs::remove(probe, error);
  const std::string writable = exists
                                   ? absl::StrCat(dir, " is writable")
                                   : absl::StrCat(dir, " does not exist yet; ", existing.string(),
                                                  " is writable, so dtrain can create it");
  // An empty file fits in a full file system; a checkpoint does not.
  struct statvfs space;
  if (statvfs(existing.c_str(), &space) == 0 && space.f_bavail == 0) {
    return Result("node.checkpoint_dir", Verdict::kWarn,
                  absl::StrCat(writable, ", but its file system has 0 bytes free"),
                  absl::StrCat("free space there, ", elsewhere));
  }
  return Result("node.checkpoint_dir", Verdict::kOk, writable);
}

// The recipe's data as this node sees it: a run whose files are not here fails at its start, on
// every restart.
CheckResult DataCheck(const Recipe& recipe) {
  if (const absl::Status found = CheckDataFilesExist(recipe); !found.ok()) {
    return Result("node.data", Verdict::kFail, std::string(found.message()),
                  "give every node the data at these paths (a shared file system), or fix them");
  }
  return Result("node.data", Verdict::kOk,
                recipe.data.format == "webdataset"
                    ? "the local shards the run needs at its start are here"
                    : "every pattern of data.train and data.val matches files here");
}

CheckResult MasterCheck(const EnvironmentMap& env) {
  absl::StatusOr<WorldEnvironment> world = ResolveWorld(env, {});
  if (!world.ok()) {
    return Result("launch.master", Verdict::kFail, std::string(world.status().message()),
                  "correct the variable the message names (dtrain env shows each value's source)");
  }
  if (world->world_size == 1) {
    return Result(
        "launch.master", Verdict::kInfo,
        absl::StrCat(
            "a world of one (", WorldSourceName(world->source), "): no master to reach",
            world->unused_master_addr.empty() ? "" : absl::StrCat("; ", UnusedMasterNote(*world))));
  }
  const std::string where = absl::StrCat(world->master_addr, ":", world->master_port);
  if (absl::Status resolves = CheckMasterResolves(*world); !resolves.ok()) {
    return Result("launch.master", Verdict::kFail, std::string(resolves.message()),
                  "set MASTER_ADDR to a host name every node resolves (getent hosts NAME)");
  }
  return Result("launch.master", Verdict::kOk,
                absl::StrCat(where, " resolves (", world->provenance["master_addr"], "), world of ",
                             world->world_size, " from ", WorldSourceName(world->source)));
}

absl::StatusOr<std::vector<CheckResult>> RunNodeChecks(const DoctorOptions& options) {
  std::optional<ClusterSpec> cluster;
  if (options.recipe != nullptr) {
    absl::StatusOr<ClusterSpec> resolved = ResolveCluster(options.recipe->cluster);
    if (!resolved.ok()) return resolved.status();
    cluster = *resolved;
  }
  const ClusterSpec* spec = cluster.has_value() ? &*cluster : nullptr;
  const NetworkInventory network = ReadNetwork(options.sys_root);
  std::vector<CheckResult> results = NetworkChecks(network, options.env, spec);
  results.push_back(MemlockCheck(
      options.memlock_bytes.has_value() ? *options.memlock_bytes : ProcessMemlockBytes(),
      RecipeNeedsRdma(spec), !network.ports.empty()));
  results.push_back(ShmCheck(options.shm_path));
  const GpuInventory gpus = FindGpus(options.env, options.proc_root);
  results.push_back(GpuCheck(gpus, options.recipe));
  for (CheckResult& link : GpuLinkChecks(ReadPcieGpus(options.sys_root), gpus)) {
    results.push_back(std::move(link));
  }
  if (options.recipe != nullptr) {
    results.push_back(CheckpointFolderCheck(options.recipe->checkpoint_dir()));
    results.push_back(DataCheck(*options.recipe));
  }
  results.push_back(MasterCheck(options.env));
  return results;
}

}  // namespace dtrain::doctor
