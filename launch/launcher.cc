#include "launch/launcher.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/util/exit_codes.h"
#include "core/util/files.h"
#include "core/util/log.h"
#include "core/util/status.h"
#include "core/util/subprocess.h"
#include "core/util/thread_pool.h"
#include "launch/agent.h"
#include "launch/gpus.h"
#include "parallel/store/auth.h"

namespace dtrain {
namespace {

absl::StatusOr<std::string> DtrainPath() {
  std::error_code error;
  const std::filesystem::path path = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot find the dtrain binary (/proc/self/exe): ", error.message()));
  }
  return path.string();
}

absl::StatusOr<std::string> GenerateToken() {
  ASSIGN_OR_RETURN(const std::string bytes, RandomNonce());
  return absl::BytesToHexString(bytes);
}

std::vector<std::string> EnvironmentEntries(const EnvironmentMap& env) {
  std::vector<std::string> entries;
  for (const auto& [name, value] : env) entries.push_back(absl::StrCat(name, "=", value));
  std::sort(entries.begin(), entries.end());
  return entries;
}

// The first `name` in the directories of PATH, as execvp would find it.
absl::StatusOr<std::string> FindOnPath(const EnvironmentMap& env, const std::string& name) {
  const auto path = env.find("PATH");
  if (path != env.end()) {
    for (const absl::string_view dir : absl::StrSplit(path->second, ':')) {
      const std::string candidate = absl::StrCat(dir, "/", name);
      if (access(candidate.c_str(), X_OK) == 0) return candidate;
    }
  }
  return absl::FailedPreconditionError(
      absl::StrCat(name, " is not on PATH; run where Slurm's client commands are installed"));
}

// `--set KEY=VALUE` for each recipe override, as the agent and its workers take them.
void AppendOverrides(const std::vector<std::string>& overrides, std::vector<std::string>& argv) {
  for (const std::string& override : overrides) argv.insert(argv.end(), {"--set", override});
}

// `name`'s value in `env` as a positive number; 0 when it is absent or not one. (A lookup with
// [] would add the name, empty, to what srun is given: srun refuses an empty
// SLURM_NTASKS_PER_NODE.)
int PositiveInt(const EnvironmentMap& env, const std::string& name) {
  const auto it = env.find(name);
  int value = 0;
  return it != env.end() && absl::SimpleAtoi(it->second, &value) && value > 0 ? value : 0;
}

// Passes a SIGTERM or SIGINT of the batch shell to the job's steps: `scancel --signal=TERM JOB`
// signals every step but the batch shell's (other steps the job runs beside the agents' too), as
// a time limit's --signal=TERM does, so the agents checkpoint and stop.
// False when scancel could not be run.
bool ForwardStopToSteps(int signal, const EnvironmentMap& env, const std::string& job_id) {
  const absl::StatusOr<std::string> scancel = FindOnPath(env, "scancel");
  if (!scancel.ok()) {
    LogWarn("SIG%s to the batch shell cannot be passed to the agents: %s", sigabbrev_np(signal),
            scancel.status().message());
    return false;
  }
  // Slurm signals the batch shell alone (sbatch --signal=B:TERM, scancel --batch), or with every
  // other process of the job (a requeue, a plain scancel), whose agents are stopping already.
  LogInfo(
      "SIG%s to the batch shell: passing SIGTERM to the agents (scancel --signal=TERM %s), which "
      "checkpoint and stop (where Slurm signalled the whole job, they have it already)",
      sigabbrev_np(signal), job_id);
  absl::StatusOr<std::unique_ptr<Subprocess>> sent =
      Subprocess::Spawn({*scancel, "--signal=TERM", job_id}, SubprocessOptions{});
  if (!sent.ok()) {
    LogWarn("cannot run scancel: %s", sent.status().message());
    return false;
  }
  const std::optional<ExitStatus> done = (*sent)->WaitFor(absl::Seconds(30));
  if (!done || !done->ok()) {
    LogWarn("scancel --signal=TERM %s: %s (a job Slurm is ending has no step left to signal)",
            job_id, done ? done->ToString() : "no answer in 30 s");
  }
  return done && done->ok();
}

// From the batch shell: one agent per node through srun, which forwards the job steps' signals
// to the agents and reports their exit; srun's exit code. srun answers a SIGTERM of its own by
// killing the step at once, so it runs in a process group of its own, away from the batch shell's
// signals, and this process passes them on (ForwardStopToSteps).
absl::StatusOr<int> RunAgentsThroughSrun(const LaunchOptions& options,
                                         const WorldEnvironment& shell, EnvironmentMap env) {
  ASSIGN_OR_RETURN(const std::string dtrain, DtrainPath());
  int nodes = shell.slurm_job_num_nodes;
  if (const std::optional<int> asked = options.world.num_nodes; asked.has_value()) {
    if (*asked > nodes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--nnodes ", *asked, " is more than the ", nodes, " nodes of Slurm job ",
          shell.slurm_job_id, "; submit it with sbatch --nodes=", *asked, ", or lower --nnodes"));
    }
    nodes = *asked;
  }
  // sbatch --ntasks-per-node N asks Slurm for N tasks, but the agents count their workers.
  if (const int tasks = PositiveInt(env, "SLURM_NTASKS_PER_NODE");
      options.nproc_kind.empty() && !options.world.nproc_per_node && tasks > 1) {
    LogWarn(
        "the job asks for %d tasks per node (sbatch --ntasks-per-node), but `dtrain launch` "
        "runs one agent per node, whose workers --nproc-per-node counts (default 1); add "
        "--nproc-per-node %d for %d workers a node",
        tasks, tasks, tasks);
  }
  // --ntasks too: the batch shell exports SLURM_NTASKS of the job, which srun would read back.
  ASSIGN_OR_RETURN(const std::string srun, FindOnPath(env, "srun"));
  std::vector<std::string> argv = {srun, "--ntasks-per-node=1", absl::StrCat("--nodes=", nodes),
                                   absl::StrCat("--ntasks=", nodes), "--kill-on-bad-exit=1"};
  // The agent's workers need the node's CPUs, not the one CPU of a default task.
  if (const int cpus = PositiveInt(env, "SLURM_CPUS_ON_NODE"); cpus > 1) {
    argv.push_back(absl::StrCat("--cpus-per-task=", cpus));
  }
  for (std::string& arg : LaunchCommandLine(dtrain, options)) argv.push_back(std::move(arg));
  if (env["DTRAIN_RDZV_TOKEN"].empty()) {
    ASSIGN_OR_RETURN(env["DTRAIN_RDZV_TOKEN"], GenerateToken());
  }
  LogInfo("Slurm job %s: starting one agent on each of %s: %s", shell.slurm_job_id,
          nodes == shell.slurm_job_num_nodes
              ? absl::StrCat("its ", nodes, " nodes")
              : absl::StrCat(nodes, " of its ", shell.slurm_job_num_nodes, " nodes (--nnodes)"),
          absl::StrJoin(argv, " "));
  // Blocked before srun starts and taken by sigtimedwait, so none is lost (children start with an
  // empty signal mask).
  sigset_t stops;
  sigemptyset(&stops);
  sigaddset(&stops, SIGTERM);
  sigaddset(&stops, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stops, nullptr);
  SubprocessOptions spawn;
  spawn.environment = EnvironmentEntries(env);
  spawn.own_process_group = true;
  // A process group of its own is in the background of an salloc shell's terminal, where a read
  // would stop it (SIGTTIN): the agents take no input.
  spawn.stdin_stream = SubprocessOptions::Stream::kNull;
  ASSIGN_OR_RETURN(const std::unique_ptr<Subprocess> agents, Subprocess::Spawn(argv, spawn));
  bool forwarded = false;
  while (true) {
    if (const std::optional<ExitStatus> done = agents->Poll()) {
      return done->signal != 0 ? 128 + done->signal : done->code;
    }
    const timespec poll = {.tv_sec = 0, .tv_nsec = 200'000'000};
    const int signal = sigtimedwait(&stops, nullptr, &poll);
    if (signal <= 0) continue;
    // The first stop is passed on; a second one (a second Ctrl-C), or one scancel could not pass,
    // is srun's own: it ends the step at once.
    if (std::exchange(forwarded, true) || !ForwardStopToSteps(signal, env, shell.slurm_job_id)) {
      agents->Signal(SIGTERM);
    }
  }
}

}  // namespace

std::vector<std::string> LaunchCommandLine(const std::string& dtrain_path,
                                           const LaunchOptions& options) {
  std::vector<std::string> argv = {dtrain_path, "launch"};
  if (!options.recipe_path.empty()) argv.push_back(options.recipe_path);
  AppendOverrides(options.overrides, argv);
  const WorldOverrides& world = options.world;
  if (!options.nproc_kind.empty()) {
    argv.push_back("--nproc-per-node=" + options.nproc_kind);
  } else if (world.nproc_per_node) {
    argv.push_back(absl::StrCat("--nproc-per-node=", *world.nproc_per_node));
  }
  if (world.num_nodes) argv.push_back(absl::StrCat("--nnodes=", *world.num_nodes));
  if (world.master_port) argv.push_back(absl::StrCat("--master-port=", *world.master_port));
  if (world.master_addr) argv.push_back(absl::StrCat("--master-addr=", *world.master_addr));
  if (world.run_id) argv.push_back(absl::StrCat("--run-id=", *world.run_id));
  argv.push_back(absl::StrCat("--max-restarts=", options.max_restarts));
  if (!options.log_dir.empty()) argv.push_back(absl::StrCat("--log-dir=", options.log_dir));
  argv.push_back(
      absl::StrCat("--rdzv-timeout-s=", absl::ToInt64Seconds(options.rendezvous_timeout)));
  argv.push_back(absl::StrCat("--stop-grace-s=", absl::ToInt64Seconds(options.stop_grace)));
  if (options.requeue) argv.push_back("--requeue");
  return argv;
}

absl::StatusOr<int> Launch(const LaunchOptions& options) {
  const EnvironmentMap env = ProcessEnvironment();
  // First as a process, to see what launched this one (and how many tasks share its node): the
  // shape flags describe the agents' world, not this process's.
  WorldOverrides process_flags = options.world;
  process_flags.nproc_per_node.reset();
  process_flags.node_rank.reset();
  process_flags.num_nodes.reset();
  ASSIGN_OR_RETURN(const WorldEnvironment process, ResolveWorld(env, process_flags));
  if (process.slurm_batch_shell && !options.world.node_rank) {
    return RunAgentsThroughSrun(options, process, env);
  }
  if (process.source == WorldSource::kSlurm && process.local_world_size > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "`dtrain launch` is one agent per node, but this Slurm step runs ",
        process.local_world_size,
        " tasks on this node; start it with `srun --ntasks-per-node=1`, call it from the batch "
        "script without srun, or run `srun dtrain train` for one task per rank"));
  }

  // Then as a node: the agent's view.
  WorldOverrides node_flags = options.world;
  const bool pod_level =
      process.source == WorldSource::kPyTorchJob || process.source == WorldSource::kTrainerV2 ||
      process.source == WorldSource::kJobSet || process.source == WorldSource::kIndexedJob ||
      process.source == WorldSource::kLeaderWorkerSet;
  // --nproc-per-node's kind, else a PyTorchJob's nprocPerNode (a kind or a count), counted here.
  const auto pet_nproc = env.find("PET_NPROC_PER_NODE");
  const std::string kind = !options.nproc_kind.empty() ? options.nproc_kind
                           : pod_level && !node_flags.nproc_per_node && pet_nproc != env.end()
                               ? pet_nproc->second
                               : "";
  if (!kind.empty()) {
    absl::StatusOr<int> count = ParseProcessesPerNode(kind, FindGpus(env));
    if (!count.ok() && kind != options.nproc_kind) {
      count = Renamed(count.status(),
                      absl::StrCat("PET_NPROC_PER_NODE=", kind, ": ", count.status().message()));
    }
    ASSIGN_OR_RETURN(node_flags.nproc_per_node, std::move(count));
  }
  if (!node_flags.nproc_per_node)
    node_flags.nproc_per_node = pod_level ? process.local_world_size : 1;
  ASSIGN_OR_RETURN(WorldEnvironment node, ResolveWorld(env, node_flags));
  const bool standalone = node.num_nodes == 1 && node.source == WorldSource::kSingle;
  if (standalone && node.provenance["master_port"] == "default") node.master_port = 0;
  // A pod's master name resolves once the master's pod runs (its DNS record comes then): asked
  // again within the rendezvous timeout. Elsewhere a name that does not resolve is a mistake, on
  // one node too, where the agent would wait out the rendezvous timeout for it.
  RETURN_IF_ERROR(
      CheckMasterResolves(node, pod_level ? options.rendezvous_timeout : absl::ZeroDuration()));
  if (node.rdzv_token.empty()) {
    if (node.num_nodes > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a launch over ", node.num_nodes,
          " nodes needs a shared rendezvous token: set "
          "DTRAIN_RDZV_TOKEN to the same secret on every node (in Kubernetes, from a Secret); "
          "`dtrain launch` from a Slurm batch script generates one itself"));
    }
    ASSIGN_OR_RETURN(node.rdzv_token, GenerateToken());
  }

  AgentOptions agent;
  ASSIGN_OR_RETURN(const std::string dtrain, DtrainPath());
  agent.worker_argv = {dtrain, "train"};
  if (!options.recipe_path.empty()) agent.worker_argv.push_back(options.recipe_path);
  AppendOverrides(options.overrides, agent.worker_argv);
  agent.nproc_per_node = *node_flags.nproc_per_node;
  // The others would wait for this node until their rendezvous timeout, saying nothing.
  const auto fail_before_joining = [&](absl::Status error) {
    ReportFailureBeforeJoining(node, error,
                               std::min(options.rendezvous_timeout, absl::Seconds(10)));
    return error;
  };
  if (options.check_world) {
    if (absl::Status fits =
            options.check_world(node.num_nodes * agent.nproc_per_node, node.num_nodes);
        !fits.ok()) {
      return fail_before_joining(std::move(fits));
    }
  }
  if (!options.log_dir.empty()) {
    std::error_code error;
    std::filesystem::create_directories(options.log_dir, error);
    if (const int failure = error ? error.value() : FileCreationError(options.log_dir);
        failure != 0) {
      // A folder that cannot be made where it is (ENOENT under /proc) is the flag's to fix, as
      // FileError takes one it may not write.
      const absl::Status status =
          FileError(failure, absl::StrCat("make the worker logs in --log-dir ", options.log_dir),
                    "point --log-dir at a writable folder");
      return fail_before_joining(failure == ENOENT ? WithExitCode(status, kExitUsage) : status);
    }
  }
  // CPU workers share the node's cores instead of each taking all of them.
  if (options.recipe_threads == 0 && agent.nproc_per_node > 1) {
    agent.worker_argv.insert(
        agent.worker_argv.end(),
        {"--set", absl::StrCat("run.threads=", std::max(1, UsableCpus() / agent.nproc_per_node))});
  }
  agent.max_restarts = options.max_restarts;
  agent.checkpoint_dir = options.checkpoint_dir;
  agent.checkpoint_resume = options.checkpoint_resume;
  agent.log_dir = options.log_dir;
  agent.rendezvous_timeout = options.rendezvous_timeout;
  agent.stop_grace = options.stop_grace;
  agent.environment = EnvironmentEntries(env);
  if (options.requeue) {
    if (!node.in_slurm_allocation) {
      return absl::InvalidArgumentError(
          "--requeue needs a Slurm job to requeue; drop it outside Slurm");
    }
    ASSIGN_OR_RETURN(const std::string scontrol, FindOnPath(env, "scontrol"));
    agent.requeue_argv = {scontrol, "requeue", node.slurm_job_id};
    agent.job_state_argv = {scontrol, "show", "job", "--oneliner", node.slurm_job_id};
  }
  LogInfo("node %d of %d (%s): %d worker%s, master %s:%s, run %s", node.node_rank, node.num_nodes,
          WorldSourceName(node.source), agent.nproc_per_node, agent.nproc_per_node == 1 ? "" : "s",
          node.master_addr,
          node.master_port == 0 ? "any free port" : absl::StrCat(node.master_port),
          node.run_id.empty() ? "named by run.name" : node.run_id);
  return RunAgent(node, agent);
}

}  // namespace dtrain
