#include "launch/environment.h"

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <initializer_list>
#include <numeric>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "core/util/exit_codes.h"
#include "core/util/fnv.h"
#include "core/util/log.h"
#include "core/util/status.h"
#include "launch/gpus.h"
#include "launch/hostlist.h"
#include "parallel/store/auth.h"

extern char** environ;

namespace dtrain {
namespace {

constexpr int kDefaultMasterPort = 29500;
constexpr std::array<const char*, 6> kShapeFields = {
    "rank", "world_size", "local_rank", "local_world_size", "node_rank", "num_nodes"};

// One value a source offers for a field, kept as text until the field is chosen, so that a
// malformed variable in a source that loses is never an error.
struct Candidate {
  std::string text;
  std::string from;      // provenance: "VARIABLE=value", "flag --x value", "derived from ..."
  std::string variable;  // the variable read, for messages; empty for flags and derivations
  absl::Status error;    // the source is present but unusable; reported only if chosen
};

struct Layer {
  WorldSource source = WorldSource::kSingle;
  std::map<std::string, Candidate> fields;
  // Slurm only: SLURM_STEP_TASKS_PER_NODE expanded, for the world-size check.
  std::vector<int> tasks_per_node;
  std::string tasks_per_node_from;

  void Add(const std::string& field, std::optional<Candidate> candidate) {
    if (candidate.has_value()) fields.emplace(field, std::move(*candidate));
  }
  bool HasShape() const {
    for (const char* field : kShapeFields) {
      if (fields.contains(std::string(field))) return true;
    }
    return false;
  }
};

class Env {
 public:
  explicit Env(const EnvironmentMap& map) : map_(map) {}

  // The value of `name`; unset and empty are the same.
  std::optional<std::string> Get(absl::string_view name) const {
    const auto it = map_.find(name);
    if (it == map_.end() || it->second.empty()) return std::nullopt;
    return it->second;
  }
  bool Has(absl::string_view name) const { return Get(name).has_value(); }
  bool HasAny(std::initializer_list<absl::string_view> names) const {
    for (const absl::string_view name : names) {
      if (Has(name)) return true;
    }
    return false;
  }
  // The first of `names` that is set, as a candidate.
  std::optional<Candidate> First(std::initializer_list<absl::string_view> names) const {
    for (const absl::string_view name : names) {
      if (std::optional<std::string> value = Get(name)) {
        return Candidate{*value, absl::StrCat(name, "=", *value), std::string(name), {}};
      }
    }
    return std::nullopt;
  }
  const EnvironmentMap& map() const { return map_; }

 private:
  const EnvironmentMap& map_;
};

absl::StatusOr<int> ParseInt(const Candidate& candidate) {
  RETURN_IF_ERROR(candidate.error);
  int value = 0;
  if (!absl::SimpleAtoi(candidate.text, &value)) {
    const std::string name = candidate.variable.empty() ? candidate.from : candidate.variable;
    return absl::InvalidArgumentError(
        absl::StrCat(name, "='", candidate.text, "' is not an integer; set it to a whole number"));
  }
  return value;
}

// torchrun's MASTER_ADDR is a bare host; "node0:29500", "[fe80::1]:29500" or "tcp://node0"
// would fail later as a name that does not resolve. A bare IPv6 address holds several colons
// and passes.
absl::Status CheckMasterAddressIsAHost(const Candidate& addr) {
  absl::string_view host = addr.text;
  absl::string_view port;
  if (const size_t scheme = host.find("://"); scheme != absl::string_view::npos) {
    host.remove_prefix(scheme + 3);
  }
  if (absl::StartsWith(host, "[")) {
    const size_t close = std::min(host.find(']'), host.size());
    if (absl::StartsWith(host.substr(std::min(close + 1, host.size())), ":")) {
      port = host.substr(close + 2);
    }
    host = host.substr(1, close - 1);
  } else if (const size_t colon = host.find(':');
             colon != absl::string_view::npos && colon == host.rfind(':')) {
    port = host.substr(colon + 1);
    host = host.substr(0, colon);
  }
  if (host == addr.text) return absl::OkStatus();
  const bool flag = addr.variable.empty();
  // The port's own setting beside the address's: --master-port, DTRAIN_/PET_MASTER_PORT.
  std::string port_setting = "MASTER_PORT=";
  if (flag) {
    port_setting = "--master-port=";
  } else if (absl::EndsWith(addr.variable, "MASTER_ADDR")) {
    port_setting = absl::StrCat(absl::StripSuffix(addr.variable, "ADDR"), "PORT=");
  }
  return absl::InvalidArgumentError(absl::StrCat(
      flag ? addr.from : absl::StrCat(addr.variable, "='", addr.text, "'"),
      " is not a bare host name or address: set ", flag ? "--master-addr" : addr.variable, "=",
      host, " and ", port_setting, port.empty() ? "<port>" : port));
}

Candidate Derived(std::string text, std::string from) {
  return Candidate{std::move(text), std::move(from), "", {}};
}

Candidate Unusable(std::string from, absl::Status error) {
  return Candidate{"", std::move(from), "", std::move(error)};
}

// ---- the sources, highest first ----

Layer FlagLayer(const WorldOverrides& flags) {
  Layer layer{.source = WorldSource::kFlags};
  const auto add_int = [&layer](const std::string& field, absl::string_view flag,
                                const std::optional<int>& value) {
    if (!value.has_value()) return;
    layer.Add(field, Derived(absl::StrCat(*value), absl::StrCat("flag ", flag, " ", *value)));
  };
  add_int("rank", "--rank", flags.rank);
  add_int("world_size", "--world-size", flags.world_size);
  add_int("local_rank", "--local-rank", flags.local_rank);
  add_int("local_world_size", "--nproc-per-node", flags.nproc_per_node);
  add_int("node_rank", "--node-rank", flags.node_rank);
  add_int("num_nodes", "--nnodes", flags.num_nodes);
  add_int("master_port", "--master-port", flags.master_port);
  if (flags.master_addr.has_value() && !flags.master_addr->empty()) {
    layer.Add("master_addr",
              Derived(*flags.master_addr, absl::StrCat("flag --master-addr ", *flags.master_addr)));
  }
  if (flags.run_id.has_value() && !flags.run_id->empty()) {
    layer.Add("run_id", Derived(*flags.run_id, absl::StrCat("flag --run-id ", *flags.run_id)));
  }
  return layer;
}

Layer DtrainLayer(const Env& env) {
  Layer layer{.source = WorldSource::kDtrain};
  layer.Add("rank", env.First({"DTRAIN_RANK"}));
  layer.Add("world_size", env.First({"DTRAIN_WORLD_SIZE"}));
  layer.Add("local_rank", env.First({"DTRAIN_LOCAL_RANK"}));
  layer.Add("local_world_size", env.First({"DTRAIN_LOCAL_WORLD_SIZE"}));
  layer.Add("node_rank", env.First({"DTRAIN_NODE_RANK"}));
  layer.Add("num_nodes", env.First({"DTRAIN_NUM_NODES"}));
  layer.Add("master_addr", env.First({"DTRAIN_MASTER_ADDR"}));
  layer.Add("master_port", env.First({"DTRAIN_MASTER_PORT"}));
  layer.Add("run_id", env.First({"DTRAIN_RUN_ID"}));
  layer.Add("restart_count", env.First({"DTRAIN_RESTART_COUNT"}));
  return layer;
}

bool HasPetVariables(const Env& env) {
  return env.HasAny({"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK"});
}

// MASTER_PORT, or the port after it where torchrun's agent serves its own store (a PyTorch
// TCPStore, which dtrain's store protocol is not) on MASTER_PORT: TORCHELASTIC_USE_AGENT_STORE
// True, under the static rendezvous and, since PyTorch 2.4, c10d's (unless
// TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1). Rank 0's node is MASTER_ADDR's there too.
std::optional<Candidate> TorchrunMasterPort(const Env& env) {
  std::optional<Candidate> port = env.First({"MASTER_PORT"});
  const std::optional<std::string> agent_store = env.Get("TORCHELASTIC_USE_AGENT_STORE");
  int number = 0;
  if (!port || !agent_store || !absl::EqualsIgnoreCase(*agent_store, "true") ||
      !absl::SimpleAtoi(port->text, &number) || number < 1 || number > 65535) {
    return port;
  }
  if (number == 65535) {
    return Unusable(
        port->from,
        absl::InvalidArgumentError(
            "MASTER_PORT=65535 leaves no port after it for dtrain's rendezvous store, "
            "which takes MASTER_PORT + 1 where torchrun's agent serves its own store on "
            "MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True): give torchrun a lower "
            "--master-port"));
  }
  return Derived(absl::StrCat(number + 1),
                 absl::StrCat("derived from MASTER_PORT=", number,
                              " + 1: torchrun's agent serves its own store on MASTER_PORT "
                              "(TORCHELASTIC_USE_AGENT_STORE=",
                              *agent_store, ")"));
}

// torchrun's workers. RANK and WORLD_SIZE alone are a hand-started torchrun-style process,
// unless Kubeflow's PET_* variables say they are PyTorchJob's pod index and pod count.
// MASTER_ADDR / MASTER_PORT count whoever set them (a batch script, PyTorchJob).
Layer TorchrunLayer(const Env& env, bool node_level) {
  Layer layer{.source = WorldSource::kTorchrun};
  const bool worker =
      env.HasAny({"LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID"}) ||
      (env.HasAny({"RANK", "WORLD_SIZE"}) && !HasPetVariables(env));
  if (worker) {
    layer.Add("node_rank", env.First({"GROUP_RANK"}));
    if (!node_level) {
      layer.Add("rank", env.First({"RANK"}));
      layer.Add("world_size", env.First({"WORLD_SIZE"}));
      layer.Add("local_rank", env.First({"LOCAL_RANK"}));
      layer.Add("local_world_size", env.First({"LOCAL_WORLD_SIZE"}));
    }
  }
  layer.Add("master_addr", env.First({"MASTER_ADDR"}));
  layer.Add("master_port", TorchrunMasterPort(env));
  layer.Add("run_id", env.First({"TORCHELASTIC_RUN_ID"}));
  layer.Add("restart_count", env.First({"TORCHELASTIC_RESTART_COUNT"}));
  return layer;
}

// The node of a Slurm task, as an index into its step's tasks per node (`counts`).
struct TaskNode {
  int index = 0;
  Candidate candidate;   // where `index` came from; or unusable, naming what is missing
  bool derived = false;  // not SLURM_NODEID itself: a node rank the layer must offer too
};

// SLURM_NODEID when set; without it, the node that holds SLURM_PROCID under srun's default block
// distribution (node 0's tasks first), which `-m cyclic` or `plane` would break.
TaskNode NodeOfTask(const Env& env, const std::vector<int>& counts, const Candidate& tasks) {
  const int nodes = static_cast<int>(counts.size());
  if (const std::optional<Candidate> node_id = env.First({"SLURM_NODEID"})) {
    absl::StatusOr<int> index = ParseInt(*node_id);
    if (index.ok() && (*index < 0 || *index >= nodes)) {
      index = absl::InvalidArgumentError(
          absl::StrCat(node_id->from, " has no entry in ", tasks.from, " (", nodes,
                       " nodes); this is not a consistent Slurm step environment"));
    }
    if (!index.ok()) return {0, Unusable(node_id->from, index.status())};
    return {*index, *node_id};
  }
  const std::optional<Candidate> rank = env.First({"SLURM_PROCID"});
  const std::string distribution = env.Get("SLURM_DISTRIBUTION").value_or("block");
  const auto missing = [&](const std::string& why) {
    return TaskNode{0, Unusable("SLURM_NODEID unset",
                                absl::InvalidArgumentError(absl::StrCat(
                                    "SLURM_NODEID is unset and ", why, ": this node's entry in ",
                                    tasks.from, " is unknown; set SLURM_NODEID")))};
  };
  if (!rank.has_value()) return missing("so is SLURM_PROCID");
  if (!IsBlockDistribution(distribution)) {
    return missing(absl::StrCat("SLURM_DISTRIBUTION=", distribution,
                                " places ranks across nodes in an order not derived here"));
  }
  absl::StatusOr<int> task = ParseInt(*rank);
  if (!task.ok()) return {0, Unusable(rank->from, task.status())};
  const std::string from = absl::StrCat("the node of ", rank->from, " (block distribution)");
  if (const int node = NodeOfBlockTask(counts, *task); node >= 0) {
    return {node, Derived(absl::StrCat(node), from), true};
  }
  return missing(absl::StrCat(rank->from, " is outside the ",
                              std::accumulate(counts.begin(), counts.end(), 0), " tasks of ",
                              tasks.from));
}

// A task of a Slurm step (srun). The batch shell has no SLURM_STEP_ID and gives nothing here.
Layer SlurmLayer(const Env& env, bool node_level) {
  Layer layer{.source = WorldSource::kSlurm};
  const std::optional<std::string> step_id = env.Get("SLURM_STEP_ID");
  if (!step_id.has_value()) return layer;
  layer.Add("node_rank", env.First({"SLURM_NODEID"}));
  layer.Add("num_nodes",
            env.First({"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"}));
  if (!node_level) {
    layer.Add("rank", env.First({"SLURM_PROCID"}));
    layer.Add("local_rank", env.First({"SLURM_LOCALID"}));
    layer.Add("world_size", env.First({"SLURM_NTASKS", "SLURM_NPROCS"}));
    if (std::optional<Candidate> tasks =
            env.First({"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"})) {
      absl::StatusOr<std::vector<int>> counts = ExpandTasksPerNode(tasks->text);
      if (!counts.ok()) {
        layer.Add("local_world_size",
                  Unusable(tasks->from, absl::InvalidArgumentError(absl::StrCat(
                                            tasks->variable, ": ", counts.status().message()))));
      } else {
        layer.tasks_per_node = *counts;
        layer.tasks_per_node_from = tasks->from;
        const TaskNode node = NodeOfTask(env, *counts, *tasks);
        if (node.derived) layer.Add("node_rank", node.candidate);
        if (!node.candidate.error.ok()) {
          layer.Add("local_world_size", Unusable(node.candidate.from, node.candidate.error));
        } else {
          layer.Add("local_world_size",
                    Derived(absl::StrCat((*counts)[node.index]),
                            absl::StrCat(tasks->from, " at ", node.candidate.from)));
        }
      }
    }
  }
  if (std::optional<Candidate> nodes =
          env.First({"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"})) {
    absl::StatusOr<std::string> first = FirstHost(nodes->text);
    const std::string from = absl::StrCat("first host of ", nodes->from);
    if (first.ok()) {
      layer.Add("master_addr", Derived(*first, from));
    } else {
      layer.Add("master_addr", Unusable(from, absl::InvalidArgumentError(absl::StrCat(
                                                  nodes->variable, ": ", first.status().message(),
                                                  "; or set MASTER_ADDR"))));
    }
  }
  const std::string job_id = env.Get("SLURM_JOB_ID").value_or(env.Get("SLURM_JOBID").value_or(""));
  const std::string ids = absl::StrCat("SLURM_JOB_ID=", job_id, ",SLURM_STEP_ID=", *step_id);
  layer.Add("run_id", Derived(absl::StrCat(job_id, ".", *step_id), "derived from " + ids));
  layer.Add("master_port",
            Derived(absl::StrCat(SlurmDerivedPort(job_id, *step_id)), "derived from " + ids));
  layer.Add("restart_count", env.First({"SLURM_RESTART_COUNT"}));
  return layer;
}

// "N" or torchrun's "MIN:MAX" with MIN == MAX; an elastic range cannot be resolved here.
Candidate NodeCount(const Candidate& nnodes) {
  const size_t colon = nnodes.text.find(':');
  if (colon == std::string::npos) return nnodes;
  const std::string min = nnodes.text.substr(0, colon);
  const std::string max = nnodes.text.substr(colon + 1);
  if (min != max) {
    return Unusable(nnodes.from, absl::InvalidArgumentError(absl::StrCat(
                                     nnodes.from,
                                     " is an elastic range; dtrain needs a fixed node count: set "
                                     "DTRAIN_NUM_NODES or --nnodes")));
  }
  return Candidate{max, nnodes.from, nnodes.variable, {}};
}

// Pods are nodes: they give the node rank, the node count, workers per node and the master.
Layer KubernetesLayer(const Env& env) {
  Layer layer;
  if (HasPetVariables(env)) {
    // PyTorchJob v1 also sets RANK / WORLD_SIZE / MASTER_ADDR (pod-level); Trainer v2 sets
    // PET_MASTER_ADDR instead.
    const bool v1 = !env.Has("PET_MASTER_ADDR") && env.HasAny({"RANK", "MASTER_ADDR"});
    layer.source = v1 ? WorldSource::kPyTorchJob : WorldSource::kTrainerV2;
    layer.Add("node_rank", env.First({"PET_NODE_RANK"}));
    if (std::optional<Candidate> nnodes = env.First({"PET_NNODES"})) {
      layer.Add("num_nodes", NodeCount(*nnodes));
    }
    if (v1) {
      layer.Add("node_rank", env.First({"RANK"}));  // no-op when PET_NODE_RANK is set
      layer.Add("num_nodes", env.First({"WORLD_SIZE"}));
    }
    // nprocPerNode "auto" (PyTorchJob's default), "gpu" or "cpu" are for `dtrain launch` to
    // count (launch/launcher.cc); only a number sizes the node here.
    if (std::optional<Candidate> nproc = env.First({"PET_NPROC_PER_NODE"});
        nproc && !IsProcessesPerNodeWord(nproc->text)) {
      layer.Add("local_world_size", std::move(nproc));
    }
    layer.Add("master_addr", env.First({"PET_MASTER_ADDR"}));
    layer.Add("master_port", env.First({"PET_MASTER_PORT"}));
  } else if (env.Has("LWS_WORKER_INDEX")) {
    layer.source = WorldSource::kLeaderWorkerSet;
    layer.Add("node_rank", env.First({"LWS_WORKER_INDEX"}));
    layer.Add("num_nodes", env.First({"LWS_GROUP_SIZE"}));
    layer.Add("master_addr", env.First({"LWS_LEADER_ADDRESS"}));
  } else if (env.Has("JOBSET_JOB_INDEX")) {
    layer.source = WorldSource::kJobSet;
    const Candidate job = *env.First({"JOBSET_JOB_INDEX"});
    const Candidate pods =
        env.First({"DTRAIN_PODS_PER_JOB"}).value_or(Derived("1", "DTRAIN_PODS_PER_JOB unset: 1"));
    const Candidate pod =
        env.First({"JOB_COMPLETION_INDEX"}).value_or(Derived("0", "JOB_COMPLETION_INDEX unset: 0"));
    const std::string from =
        absl::StrCat("derived from ", job.from, " x ", pods.from, " + ", pod.from);
    absl::StatusOr<int> job_index = ParseInt(job);
    absl::StatusOr<int> pods_per_job = ParseInt(pods);
    absl::StatusOr<int> pod_index = ParseInt(pod);
    if (!job_index.ok()) {
      layer.Add("node_rank", Unusable(from, job_index.status()));
    } else if (!pods_per_job.ok()) {
      layer.Add("node_rank", Unusable(from, pods_per_job.status()));
    } else if (!pod_index.ok()) {
      layer.Add("node_rank", Unusable(from, pod_index.status()));
    } else if (*pods_per_job < 1 || *pod_index < 0 || *pod_index >= *pods_per_job) {
      layer.Add("node_rank", Unusable(from, absl::InvalidArgumentError(absl::StrCat(
                                                pod.from, " must be below ", pods.from,
                                                ": set DTRAIN_PODS_PER_JOB to the replicated job's "
                                                "parallelism (pods per job)"))));
    } else {
      layer.Add("node_rank",
                Derived(absl::StrCat(int64_t{*job_index} * *pods_per_job + *pod_index), from));
    }
    layer.Add("restart_count", env.First({"JOBSET_RESTART_ATTEMPT"}));
  } else if (env.Has("JOB_COMPLETION_INDEX")) {
    layer.source = WorldSource::kIndexedJob;
    layer.Add("node_rank", env.First({"JOB_COMPLETION_INDEX"}));
  }
  return layer;
}

Layer MpiLayer(const Env& env, bool node_level) {
  Layer layer;
  if (env.Has("OMPI_COMM_WORLD_RANK")) {
    layer.source = WorldSource::kOpenMpi;
    if (node_level) return layer;
    layer.Add("rank", env.First({"OMPI_COMM_WORLD_RANK"}));
    layer.Add("world_size", env.First({"OMPI_COMM_WORLD_SIZE"}));
    layer.Add("local_rank", env.First({"OMPI_COMM_WORLD_LOCAL_RANK"}));
    layer.Add("local_world_size", env.First({"OMPI_COMM_WORLD_LOCAL_SIZE"}));
  } else if (env.Has("PMI_RANK")) {
    layer.source = WorldSource::kPmi;
    if (node_level) return layer;
    layer.Add("rank", env.First({"PMI_RANK"}));
    layer.Add("world_size", env.First({"PMI_SIZE"}));
    layer.Add("local_rank", env.First({"MPI_LOCALRANKID"}));
    layer.Add("local_world_size", env.First({"MPI_LOCALNRANKS"}));
  }
  return layer;
}

// ---- resolution ----

struct Chosen {
  int value = 0;
  std::string from;
  WorldSource source = WorldSource::kSingle;
  bool given = false;  // from a source, not derived or defaulted
};

std::string Describe(absl::string_view label, const Chosen& chosen) {
  return absl::StrCat(label, " ", chosen.value, " (", chosen.from, ")");
}

absl::Status ShapeError(std::string message) {
  return absl::InvalidArgumentError(std::move(message));
}

std::string MasterHint(WorldSource source) {
  switch (source) {
    case WorldSource::kIndexedJob:
      return " (an Indexed Job publishes no master: set DTRAIN_MASTER_ADDR=<job>-0.<subdomain>, "
             "the index-0 pod behind a headless Service)";
    case WorldSource::kJobSet:
      return " (a JobSet publishes no master: set DTRAIN_MASTER_ADDR="
             "<jobset>-<replicated-job>-0-0.<subdomain>)";
    case WorldSource::kOpenMpi:
    case WorldSource::kPmi:
      return " (MPI publishes no master address: export it to every rank, e.g. mpirun -x "
             "MASTER_ADDR=$(hostname))";
    case WorldSource::kPyTorchJob:
    case WorldSource::kTrainerV2:
      return " (Kubeflow normally sets MASTER_ADDR or PET_MASTER_ADDR: check the job spec)";
    case WorldSource::kLeaderWorkerSet:
      return " (LeaderWorkerSet normally sets LWS_LEADER_ADDRESS: check the pod spec)";
    default:
      return "";
  }
}

}  // namespace

const char* WorldSourceName(WorldSource source) {
  switch (source) {
    case WorldSource::kFlags:
      return "flags";
    case WorldSource::kDtrain:
      return "dtrain";
    case WorldSource::kTorchrun:
      return "torchrun";
    case WorldSource::kSlurm:
      return "slurm";
    case WorldSource::kPyTorchJob:
      return "pytorchjob";
    case WorldSource::kTrainerV2:
      return "trainer-v2";
    case WorldSource::kIndexedJob:
      return "indexed-job";
    case WorldSource::kJobSet:
      return "jobset";
    case WorldSource::kLeaderWorkerSet:
      return "leaderworkerset";
    case WorldSource::kOpenMpi:
      return "openmpi";
    case WorldSource::kPmi:
      return "pmi";
    case WorldSource::kSingle:
      return "single";
  }
  return "single";
}

int SlurmDerivedPort(std::string_view job_id, std::string_view step_id) {
  const uint64_t hash = Fnv1a("dtrain/" + std::string(job_id) + "." + std::string(step_id));
  int port = 20000 + static_cast<int>(hash % 10000);
  if (port == 29400 || port == 29500) ++port;
  return port;
}

absl::StatusOr<WorldEnvironment> ResolveWorld(const EnvironmentMap& map,
                                              const WorldOverrides& flags) {
  const Env env(map);
  const bool node_level = flags.nproc_per_node.has_value();
  const std::vector<Layer> layers = {FlagLayer(flags),
                                     DtrainLayer(env),
                                     TorchrunLayer(env, node_level),
                                     SlurmLayer(env, node_level),
                                     KubernetesLayer(env),
                                     MpiLayer(env, node_level)};
  const Layer& flag_layer = layers[0];
  const Layer& dtrain_layer = layers[1];
  // The launcher that gives the shape: the highest one present; lower ones are not mixed in.
  const Layer* primary = nullptr;
  for (size_t i = 2; i < layers.size() && primary == nullptr; ++i) {
    if (layers[i].HasShape()) primary = &layers[i];
  }

  WorldEnvironment world;
  std::map<std::string, Chosen> shape;
  for (const char* name : kShapeFields) {
    const std::string field(name);
    for (const Layer* layer : {&flag_layer, &dtrain_layer, primary}) {
      if (layer == nullptr) continue;
      const auto it = layer->fields.find(field);
      if (it == layer->fields.end()) continue;
      ASSIGN_OR_RETURN(const int value, ParseInt(it->second));
      shape[field] = Chosen{value, it->second.from, layer->source, true};
      break;
    }
  }
  const auto given = [&shape](const char* field) { return shape.contains(field); };
  const auto given_by = [&shape](const char* field, WorldSource source) {
    const auto it = shape.find(field);
    return it != shape.end() && it->second.source == source;
  };

  // Which launcher this is: flags when they name the rank, the world or the node, DTRAIN_* when
  // they name the rank or the world (DTRAIN_NUM_NODES alone completes a JobSet), else the
  // launcher that gave the rest; workers per node alone do not make a launcher.
  const auto flags_name = [&given_by](std::initializer_list<const char*> fields,
                                      WorldSource source) {
    for (const char* field : fields) {
      if (given_by(field, source)) return true;
    }
    return false;
  };
  if (flags_name({"rank", "world_size", "node_rank", "num_nodes"}, WorldSource::kFlags)) {
    world.source = WorldSource::kFlags;
  } else if (flags_name({"rank", "world_size"}, WorldSource::kDtrain)) {
    world.source = WorldSource::kDtrain;
  } else if (primary != nullptr) {
    world.source = primary->source;
  }

  // A torchrun-style process names its rank and its world together: WORLD_SIZE alone made every
  // process rank 0, and RANK alone (a batch shell's `export RANK=$SLURM_PROCID`, the same in every
  // task) made each a world of one, over a launcher below that placed them all.
  if (primary != nullptr && primary->source == WorldSource::kTorchrun && !node_level) {
    const Layer* below = nullptr;
    for (const Layer* layer = primary + 1; layer < layers.data() + layers.size() && !below;
         ++layer) {
      if (layer->HasShape()) below = layer;
    }
    const auto instead = [below](absl::string_view variable) {
      return below == nullptr ? std::string()
                              : absl::StrCat(", or unset ", variable, " so that ",
                                             WorldSourceName(below->source), "'s ranks apply");
    };
    if (given_by("world_size", WorldSource::kTorchrun) && !given("rank") &&
        shape["world_size"].value > 1) {
      return ShapeError(absl::StrCat(Describe("world size", shape["world_size"]),
                                     " without RANK would make every process rank 0: set RANK "
                                     "(and LOCAL_RANK) in each process",
                                     instead("WORLD_SIZE")));
    }
    // A launcher that places one process (a one-task srun step) agrees with a world of one.
    int below_world = 1;
    if (below != nullptr && below->fields.contains("world_size")) {
      below_world = ParseInt(below->fields.at("world_size")).value_or(1);
    }
    if (given_by("rank", WorldSource::kTorchrun) && !given("world_size") && below_world > 1) {
      return ShapeError(absl::StrCat(Describe("rank", shape["rank"]),
                                     " without WORLD_SIZE would make each process a world of one: "
                                     "set WORLD_SIZE",
                                     instead("RANK")));
    }
  }

  for (const char* field : {"world_size", "num_nodes"}) {
    if (given(field) && shape[field].value < 1) {
      return ShapeError(absl::StrCat(
          Describe(field == std::string("world_size") ? "world size" : "nodes", shape[field]),
          " must be at least 1"));
    }
  }

  // Node level (`dtrain launch` starts the processes of a node itself): a process's RANK and
  // WORLD_SIZE with nothing naming the node (a PyTorchJob pod without nprocPerNode, a torchrun
  // worker's environment) would make every node a job of its own.
  // A WORLD_SIZE of this node's processes (exported by many single-node scripts) names no other.
  if (node_level && !given("node_rank") && !given("num_nodes")) {
    const std::optional<std::string> rank = env.Get("RANK");
    const std::optional<std::string> world_size = env.Get("WORLD_SIZE");
    const bool this_node_only =
        !world_size || *world_size == "1" || *world_size == absl::StrCat(*flags.nproc_per_node);
    if ((rank && *rank != "0") || !this_node_only) {
      return ShapeError(absl::StrCat(
          "RANK=", rank.value_or("(unset)"), " and WORLD_SIZE=", world_size.value_or("(unset)"),
          " place one process of a larger world, but dtrain launch starts the processes of "
          "a node itself and nothing names this node: set PET_NNODES and PET_NODE_RANK (a "
          "PyTorchJob with nprocPerNode sets them) or --nnodes and --node-rank, or run "
          "`dtrain train` as each process"));
    }
  }

  // Pod-level launchers that do not publish the node count.
  if ((world.source == WorldSource::kJobSet || world.source == WorldSource::kIndexedJob) &&
      !given("num_nodes")) {
    return ShapeError(absl::StrCat(
        WorldSourceName(world.source), ": node rank ", shape["node_rank"].value, " (",
        shape["node_rank"].from,
        ") but no node count: set DTRAIN_NUM_NODES (or --nnodes) to the number of pods"));
  }

  // Derive what no source gave. A process-level launcher without per-node counts puts every rank
  // on one node, as torchrun's hand-started form always did.
  const bool any_shape = !shape.empty();
  const auto derive = [&shape, any_shape](const char* field, int value, std::string from) {
    shape[field] =
        Chosen{value, any_shape ? std::move(from) : "default", WorldSource::kSingle, false};
  };
  if (!given("local_world_size")) {
    if (given("world_size") && given("num_nodes")) {
      const Chosen& ws = shape["world_size"];
      const Chosen& nodes = shape["num_nodes"];
      if (nodes.value < 1 || ws.value % nodes.value != 0) {
        return ShapeError(absl::StrCat(Describe("world size", ws), " does not split evenly over ",
                                       Describe("nodes", nodes),
                                       ": set the processes per node (DTRAIN_LOCAL_WORLD_SIZE or "
                                       "--nproc-per-node)"));
      }
      derive("local_world_size", ws.value / nodes.value, "derived from world_size / num_nodes");
    } else if (given("world_size")) {
      derive("local_world_size", shape["world_size"].value,
             "derived from world_size (no per-node count given: all ranks on one node)");
    } else {
      shape["local_world_size"] = Chosen{1, "default", WorldSource::kSingle, false};
    }
  }
  const int local_world_size = shape["local_world_size"].value;
  if (local_world_size < 1) {
    return ShapeError(absl::StrCat(Describe("local world size", shape["local_world_size"]),
                                   " must be at least 1"));
  }
  if (!given("num_nodes")) {
    if (given("world_size")) {
      derive("num_nodes", (shape["world_size"].value + local_world_size - 1) / local_world_size,
             "derived from world_size / local_world_size");
    } else {
      shape["num_nodes"] = Chosen{1, "default", WorldSource::kSingle, false};
    }
  }
  if (!given("world_size")) {
    derive("world_size", shape["num_nodes"].value * local_world_size,
           "derived from num_nodes x local_world_size");
  }
  if (!given("node_rank")) {
    if (given("rank")) {
      derive("node_rank", shape["rank"].value / local_world_size,
             "derived from rank / local_world_size");
    } else {
      shape["node_rank"] = Chosen{0, "default", WorldSource::kSingle, false};
    }
  }
  if (!given("local_rank")) {
    if (given("rank")) {
      derive("local_rank", shape["rank"].value % local_world_size,
             "derived from rank % local_world_size");
    } else {
      shape["local_rank"] = Chosen{0, "default", WorldSource::kSingle, false};
    }
  }
  if (!given("rank")) {
    derive("rank", shape["node_rank"].value * local_world_size + shape["local_rank"].value,
           "derived from node_rank x local_world_size + local_rank");
  }

  const Chosen& rank = shape["rank"];
  const Chosen& world_size = shape["world_size"];
  const Chosen& local_rank = shape["local_rank"];
  const Chosen& local_world = shape["local_world_size"];
  const Chosen& node_rank = shape["node_rank"];
  const Chosen& num_nodes = shape["num_nodes"];
  if (world_size.value < 1) {
    return ShapeError(absl::StrCat(Describe("world size", world_size), " must be at least 1"));
  }
  const auto check_rank = [&]() -> absl::Status {
    if (rank.value >= 0 && rank.value < world_size.value) return absl::OkStatus();
    return ShapeError(absl::StrCat(Describe("rank", rank), " is outside ",
                                   Describe("world size", world_size),
                                   "; set both, with 0 <= rank < world size"));
  };
  // A given rank is checked first; a derived one only after the node and local rank it came from.
  if (rank.given) RETURN_IF_ERROR(check_rank());
  if (num_nodes.value < 1 || node_rank.value < 0 || node_rank.value >= num_nodes.value) {
    return ShapeError(absl::StrCat(Describe("node rank", node_rank), " is outside ",
                                   Describe("nodes", num_nodes),
                                   "; set both, with 0 <= node rank < nodes"));
  }
  if (local_rank.value < 0 || local_rank.value >= local_world.value) {
    return ShapeError(absl::StrCat(Describe("local rank", local_rank), " is outside ",
                                   Describe("local world size", local_world),
                                   "; set both, with 0 <= local rank < local world size"));
  }
  if (!rank.given) RETURN_IF_ERROR(check_rank());
  if (local_world.value > world_size.value) {
    return ShapeError(absl::StrCat(Describe("local world size", local_world), " exceeds ",
                                   Describe("world size", world_size),
                                   "; a node cannot hold more processes than the world"));
  }
  if (primary != nullptr && primary->source == WorldSource::kSlurm &&
      given_by("world_size", WorldSource::kSlurm) && !primary->tasks_per_node.empty()) {
    int64_t total = 0;
    for (const int count : primary->tasks_per_node) total += count;
    if (total != world_size.value) {
      return ShapeError(absl::StrCat(
          Describe("world size", world_size), " differs from the ", total, " tasks of ",
          primary->tasks_per_node_from,
          ": a stale SLURM_NTASKS (exported by the batch script, or srun -n differing from the "
          "allocation); start the step with srun and matching -n / --ntasks-per-node"));
    }
  } else if (world_size.given && num_nodes.given && local_world.given &&
             world_size.value != num_nodes.value * local_world.value) {
    return ShapeError(
        absl::StrCat(Describe("world size", world_size), " is not ", Describe("nodes", num_nodes),
                     " x ", Describe("local world size", local_world), "; set them consistently"));
  }
  // Every launcher but Slurm (whose -m cyclic deals ranks round the nodes) numbers the processes
  // node by node. A rank off that count is a stale or hand-edited variable: two processes would
  // take one local rank (one GPU) while another stays idle.
  const bool slurm = primary != nullptr && primary->source == WorldSource::kSlurm;
  if (!slurm && rank.given && node_rank.given && local_rank.given && local_world.given &&
      rank.value != node_rank.value * local_world.value + local_rank.value) {
    return ShapeError(absl::StrCat(
        Describe("rank", rank), " is not ", Describe("node rank", node_rank), " x ",
        Describe("local world size", local_world), " + ", Describe("local rank", local_rank),
        "; set them consistently (a stale variable from another launcher?)"));
  }
  world.rank = rank.value;
  world.world_size = world_size.value;
  world.local_rank = local_rank.value;
  world.local_world_size = local_world.value;
  world.node_rank = node_rank.value;
  world.num_nodes = num_nodes.value;
  for (const char* name : kShapeFields) {
    world.provenance[std::string(name)] = shape[std::string(name)].from;
  }

  // Fields any source may give, each from the highest that has it.
  const auto first = [&layers](const std::string& field) -> const Candidate* {
    for (const Layer& layer : layers) {
      const auto it = layer.fields.find(field);
      if (it != layer.fields.end()) return &it->second;
    }
    return nullptr;
  };
  if (const Candidate* port = first("master_port")) {
    ASSIGN_OR_RETURN(world.master_port, ParseInt(*port));
    if (world.master_port < 1 || world.master_port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat(port->from, ": ", world.master_port, " is not a TCP port (1-65535)"));
    }
    world.provenance["master_port"] = port->from;
  } else {
    world.master_port = kDefaultMasterPort;
    world.provenance["master_port"] = "default";
  }
  if (const Candidate* addr = first("master_addr")) {
    RETURN_IF_ERROR(addr->error);
    RETURN_IF_ERROR(CheckMasterAddressIsAHost(*addr));
    world.master_addr = addr->text;
    world.provenance["master_addr"] = addr->from;
    for (const Layer& layer : layers) {
      const auto slurm = layer.fields.find("master_addr");
      if (layer.source == WorldSource::kSlurm && slurm != layer.fields.end() &&
          slurm->second.error.ok() && slurm->second.text != addr->text &&
          addr->variable == "MASTER_ADDR") {
        world.slurm_first_host = slurm->second.text;
      }
    }
  } else if (world.world_size > 1 && !(num_nodes.value == 1 && (num_nodes.given || node_level))) {
    return absl::InvalidArgumentError(absl::StrCat(
        Describe("world size", world_size),
        " but MASTER_ADDR is not set: set MASTER_ADDR (or DTRAIN_MASTER_ADDR, or --master-addr) "
        "to the address of rank 0's host",
        MasterHint(world.source), "; dtrain never guesses localhost for a multi-process job"));
  } else {
    // One process, or a world known to sit on this one node: loopback is right, not a guess.
    world.master_addr = "127.0.0.1";
    world.provenance["master_addr"] =
        world.world_size == 1 ? "default (one process)" : "default (one node: num_nodes 1)";
  }
  if (const Candidate* run_id = first("run_id")) {
    world.run_id = run_id->text;
    world.provenance["run_id"] = run_id->from;
  } else {
    world.provenance["run_id"] = "default";
  }
  const auto count_field = [&](const std::string& field, std::optional<Candidate> candidate,
                               int& out) -> absl::Status {
    if (!candidate.has_value()) {
      world.provenance[field] = "default";
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(out, ParseInt(*candidate));
    if (out < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(candidate->from, " is negative; it counts restarts"));
    }
    world.provenance[field] = candidate->from;
    return absl::OkStatus();
  };
  const Candidate* restart = first("restart_count");
  RETURN_IF_ERROR(count_field("restart_count",
                              restart ? std::optional<Candidate>(*restart) : std::nullopt,
                              world.restart_count));
  world.job_restarts = world.restart_count;
  int slurm_requeues = 0;
  if (env.Get("DTRAIN_RESTART_COUNT") &&
      absl::SimpleAtoi(env.Get("SLURM_RESTART_COUNT").value_or(""), &slurm_requeues) &&
      slurm_requeues > 0) {
    world.job_restarts += slurm_requeues;
  }
  RETURN_IF_ERROR(count_field("max_restarts",
                              flags.max_restarts.has_value()
                                  ? std::optional<Candidate>(Derived(
                                        absl::StrCat(*flags.max_restarts),
                                        absl::StrCat("flag --max-restarts ", *flags.max_restarts)))
                                  : env.First({"DTRAIN_MAX_RESTARTS", "TORCHELASTIC_MAX_RESTARTS"}),
                              world.max_restarts));

  if (std::optional<std::string> token = env.Get("DTRAIN_RDZV_TOKEN")) {
    world.rdzv_token = *token;
    world.provenance["rdzv_token"] =
        absl::StrCat("DTRAIN_RDZV_TOKEN (set, ", token->size(), " characters)");
  } else {
    world.provenance["rdzv_token"] = "default (none: the store is unauthenticated)";
  }
  if (std::optional<Candidate> agent = env.First({"DTRAIN_AGENT_STORE"})) {
    if (agent->text != "0" && agent->text != "1") {
      return absl::InvalidArgumentError(
          absl::StrCat("DTRAIN_AGENT_STORE='", agent->text, "' must be 0 or 1"));
    }
    world.agent_hosts_store = agent->text == "1";
    world.provenance["agent_hosts_store"] = agent->from;
  } else {
    world.provenance["agent_hosts_store"] = "default";
  }

  // Slurm allocation facts, for `dtrain launch`.
  if (std::optional<Candidate> job = env.First({"SLURM_JOB_ID", "SLURM_JOBID"})) {
    world.in_slurm_allocation = true;
    world.slurm_job_id = job->text;
    world.slurm_batch_shell = !env.Has("SLURM_STEP_ID");
    world.provenance["in_slurm_allocation"] = job->from;
    world.provenance["slurm_batch_shell"] =
        world.slurm_batch_shell ? "SLURM_STEP_ID unset: a batch or salloc shell, not a rank"
                                : absl::StrCat("SLURM_STEP_ID=", *env.Get("SLURM_STEP_ID"));
    if (std::optional<Candidate> count = env.First({"SLURM_JOB_NUM_NODES", "SLURM_NNODES"})) {
      ASSIGN_OR_RETURN(world.slurm_job_num_nodes, ParseInt(*count));
    }
  } else {
    world.provenance["in_slurm_allocation"] = "SLURM_JOB_ID unset";
    world.provenance["slurm_batch_shell"] = "SLURM_JOB_ID unset";
  }

  // GPUs on this node, and whether the local processes fit on them.
  std::string gpus_from = "neither SLURM_GPUS_ON_NODE nor CUDA_VISIBLE_DEVICES is set";
  if (std::optional<Candidate> slurm_gpus = env.First({"SLURM_GPUS_ON_NODE"})) {
    absl::StatusOr<int> count = ParseInt(*slurm_gpus);
    if (count.ok()) {
      world.visible_gpus = *count;
      gpus_from = slurm_gpus->from;
    } else if (flags.uses_gpus) {
      return count.status();
    }
  } else if (const auto it = map.find("CUDA_VISIBLE_DEVICES"); it != map.end()) {
    world.visible_gpus = CountVisibleGpus(it->second, /*installed=*/-1);
    gpus_from = absl::StrCat("CUDA_VISIBLE_DEVICES=", it->second);
  }
  world.provenance["visible_gpus"] = gpus_from;
  if (flags.uses_gpus && world.visible_gpus == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("no GPU is visible to this process (", gpus_from,
                     "): request GPUs from the scheduler (e.g. srun --gpus-per-node) or unset "
                     "CUDA_VISIBLE_DEVICES"));
  }
  if (flags.uses_gpus && world.visible_gpus >= 2 && world.local_world_size > world.visible_gpus) {
    return absl::FailedPreconditionError(absl::StrCat(
        Describe("local world size", local_world), " is more than the ", world.visible_gpus,
        " GPUs on this node (", gpus_from,
        "): start at most one process per GPU (--nproc-per-node, srun --ntasks-per-node)"));
  }
  // No launcher's world (a torchrun or srun world of one sets its ranks beside it), nor a batch
  // shell's, whose MASTER_ADDR is for the ranks srun starts.
  if (const std::optional<std::string> set = env.Get("MASTER_ADDR");
      set && world.source == WorldSource::kSingle && !world.slurm_batch_shell) {
    world.unused_master_addr = *set;
  }
  return world;
}

EnvironmentMap ProcessEnvironment() {
  EnvironmentMap env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const absl::string_view text(*entry);
    const size_t equals = text.find('=');
    if (equals == absl::string_view::npos) continue;
    env.emplace(std::string(text.substr(0, equals)), std::string(text.substr(equals + 1)));
  }
  return env;
}

std::string UnusedMasterNote(const WorldEnvironment& world) {
  if (world.unused_master_addr.empty()) return "";
  return absl::StrCat("MASTER_ADDR=", world.unused_master_addr,
                      " is set and unused: no rank or world size is set beside it");
}

absl::StatusOr<WorldEnvironment> WorldFromEnvironment() {
  return ResolveWorld(ProcessEnvironment(), WorldOverrides{});
}

absl::StatusOr<WorldEnvironment> RankWorldFromEnvironment() {
  ASSIGN_OR_RETURN(WorldEnvironment world, WorldFromEnvironment());
  if (world.world_size > 1) RETURN_IF_ERROR(CheckMasterResolves(world));
  return world;
}

namespace {

// A MASTER_ADDR of the environment that overrides Slurm's node list with this host's own
// loopback (a single-node export left behind) in a job of several nodes: the others would wait
// out their rendezvous timeout for a store they cannot reach.
absl::Status CheckMasterIsNoStaleLoopback(const WorldEnvironment& world, const std::string& from) {
  if (world.slurm_first_host.empty() || world.num_nodes < 2 ||
      !ResolvesToLoopbackOnly(world.master_addr) ||
      ResolvesToLoopbackOnly(world.slurm_first_host)) {
    return absl::OkStatus();
  }
  return WithExitCode(
      absl::InvalidArgumentError(absl::StrCat(
          "master address '", world.master_addr, "' (", from,
          ") is a loopback address, but this Slurm job spans ", world.num_nodes,
          " nodes, the first of them ", world.slurm_first_host,
          ": the other nodes cannot reach a store there; unset MASTER_ADDR (dtrain then takes "
          "the job's first node), or set it to ",
          world.slurm_first_host)),
      kExitUsage);
}

}  // namespace

absl::Status CheckMasterResolves(const WorldEnvironment& world, absl::Duration wait) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const auto it = world.provenance.find("master_addr");
  const std::string from = it == world.provenance.end() ? "unknown" : it->second;
  const absl::Time deadline = absl::Now() + wait;
  for (bool logged = false;; logged = true) {
    addrinfo* result = nullptr;
    const int code = getaddrinfo(world.master_addr.c_str(), nullptr, &hints, &result);
    if (result != nullptr) freeaddrinfo(result);
    if (code == 0) return CheckMasterIsNoStaleLoopback(world, from);
    const bool unknown_yet = code == EAI_NONAME || code == EAI_AGAIN || code == EAI_FAIL;
    if (!unknown_yet || absl::Now() >= deadline) {
      // A name no server knows, outside a pod (where it may come later): the same at a restart.
      const absl::Status error = absl::UnavailableError(absl::StrCat(
          "master address '", world.master_addr, "' (", from, ") does not resolve",
          wait > absl::ZeroDuration() ? absl::StrCat(" within ", absl::FormatDuration(wait)) : "",
          ": ", gai_strerror(code),
          "; set MASTER_ADDR (or DTRAIN_MASTER_ADDR, or --master-addr) to a host name or "
          "address every node can reach"));
      return code == EAI_NONAME && wait == absl::ZeroDuration() ? WithExitCode(error, kExitUsage)
                                                                : error;
    }
    if (!logged) {
      LogInfo(
          "master address '%s' does not resolve yet (%s); asking again each second for up "
          "to %s",
          world.master_addr, gai_strerror(code), absl::FormatDuration(wait));
    }
    absl::SleepFor(std::min(absl::Seconds(1), deadline - absl::Now()));
  }
}

}  // namespace dtrain
