// Where this process sits in the job: the one place that reads the launcher's variables.
//
// ResolveWorld is a pure function of an environment map and command-line overrides, so every
// launcher can be tested without touching the process environment. Sources, highest first:
//   1. command-line flags, then DTRAIN_* (DTRAIN_RANK, DTRAIN_WORLD_SIZE, DTRAIN_LOCAL_RANK,
//      DTRAIN_LOCAL_WORLD_SIZE, DTRAIN_NODE_RANK, DTRAIN_NUM_NODES, DTRAIN_MASTER_ADDR,
//      DTRAIN_MASTER_PORT, DTRAIN_RUN_ID, DTRAIN_RESTART_COUNT), each per field;
//   2. torchrun's worker contract (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
//      MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_RUN_ID);
//   3. a Slurm step task (SLURM_STEP_ID set; a batch shell is not a rank);
//   4. Kubernetes pods: Kubeflow PyTorchJob v1 / Trainer v2 (PET_*), LeaderWorkerSet (LWS_*),
//      JobSet (JOBSET_JOB_INDEX, DTRAIN_PODS_PER_JOB, JOB_COMPLETION_INDEX), Indexed Job
//      (JOB_COMPLETION_INDEX);
//   5. Open MPI (OMPI_COMM_WORLD_*) or PMI (PMI_RANK, PMI_SIZE);
//   6. one process.
// The shape of the world (rank, world_size, local_rank, local_world_size, node_rank, num_nodes)
// comes from flags and DTRAIN_* per field, then from the highest launcher present (never mixed
// with a lower one), then is derived. The master address and port, run id and restart count
// take each field from the highest source that has it (MASTER_ADDR exported in a Slurm batch
// script wins over the node list). Every field records where its value came from.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "parallel/world_membership.h"

namespace dtrain {

// Variable name -> value. An empty value counts as unset.
using EnvironmentMap = absl::flat_hash_map<std::string, std::string>;

enum class WorldSource {
  kFlags,
  kDtrain,
  kTorchrun,
  kSlurm,
  kPyTorchJob,
  kTrainerV2,
  kIndexedJob,
  kJobSet,
  kLeaderWorkerSet,
  kOpenMpi,
  kPmi,
  kSingle,
};

// "flags", "dtrain", "torchrun", "slurm", "pytorchjob", "trainer-v2", "indexed-job", "jobset",
// "leaderworkerset", "openmpi", "pmi", "single".
const char* WorldSourceName(WorldSource source);

// The membership fields (rank, world_size, master_addr, master_port, restart_count, rdzv_token
// from DTRAIN_RDZV_TOKEN, agent_hosts_store from DTRAIN_AGENT_STORE=1, local_world_size,
// local_rank, node_rank, run_id) and the rest of the placement.
struct WorldEnvironment : WorldMembership {
  int num_nodes = 1;
  int max_restarts = 0;  // DTRAIN_MAX_RESTARTS, TORCHELASTIC_MAX_RESTARTS

  // Who placed this process: kFlags when flags set the rank, world size, node rank or node
  // count; kDtrain when DTRAIN_RANK or DTRAIN_WORLD_SIZE is set (a dtrain agent's worker); else
  // the highest launcher present (torchrun ... pmi); kSingle when there is none (flags that set
  // only --nproc-per-node included).
  WorldSource source = WorldSource::kSingle;

  // Slurm allocation facts for `dtrain launch`: inside an allocation (SLURM_JOB_ID set), and
  // whether this process is the batch (or salloc) shell rather than a task of a step; a batch
  // shell is not a rank and must start agents with srun.
  bool in_slurm_allocation = false;
  bool slurm_batch_shell = false;
  std::string slurm_job_id;
  int slurm_job_num_nodes = 0;  // SLURM_JOB_NUM_NODES (or SLURM_NNODES); 0 outside Slurm
  // The first host of Slurm's node list where a MASTER_ADDR of the environment names another
  // master (a stale export, say); empty otherwise. CheckMasterResolves refuses a loopback one.
  std::string slurm_first_host;
  // MASTER_ADDR where it is set without a launcher's world (no rank or world size beside it: a
  // batch script's export before srun sets them, say), a world of one with no master; empty
  // otherwise.
  std::string unused_master_addr;

  // GPUs on this node: SLURM_GPUS_ON_NODE, else the entries of CUDA_VISIBLE_DEVICES; -1 when
  // neither is set.
  int visible_gpus = -1;

  // Field name (as above, e.g. "master_addr") -> where its value came from: "VARIABLE=value",
  // "flag --x value", "default", or "derived from ...". The rdzv_token's value is not recorded.
  std::map<std::string, std::string> provenance;
};

// Command-line values; each one set wins over every environment variable.
struct WorldOverrides {
  std::optional<int> rank;
  std::optional<int> world_size;
  std::optional<int> local_rank;
  // Workers per node. Setting it makes the resolution node-level, as for the per-node agent:
  // process-level launchers (torchrun, a Slurm task, MPI) then give only the node rank and node
  // count, and rank / world_size are derived from them.
  std::optional<int> nproc_per_node;
  std::optional<int> node_rank;
  std::optional<int> num_nodes;
  std::optional<std::string> master_addr;
  std::optional<int> master_port;
  std::optional<std::string> run_id;
  std::optional<int> max_restarts;
  // The process will use GPUs: then more local processes than GPUs on the node (when the
  // environment says how many there are) is an error. One visible GPU is accepted for any
  // local world size, since launchers commonly bind each process to its own GPU.
  bool uses_gpus = false;
};

// The port derived under Slurm when none is given: a hash of the job and step ids into
// 20000-29999, skipping torchrun's defaults 29400 and 29500, so that concurrent steps on one
// node do not collide.
int SlurmDerivedPort(std::string_view job_id, std::string_view step_id);

// Resolves the world from `env` and `flags`. Pure: reads nothing else. Errors name the variables
// and the fix: a malformed integer, a port outside 1-65535, a rank outside the world, a local rank
// outside the local world, a node rank outside the nodes, a world size that differs from the sum
// of Slurm's tasks per node, more local processes than GPUs (when flags.uses_gpus), and a
// multi-process world without a master address (a world of one defaults to 127.0.0.1; dtrain
// never guesses localhost for more).
absl::StatusOr<WorldEnvironment> ResolveWorld(const EnvironmentMap& env,
                                              const WorldOverrides& flags);

// This process's environment (`environ`) as a map.
EnvironmentMap ProcessEnvironment();

// ResolveWorld(ProcessEnvironment(), {}).
absl::StatusOr<WorldEnvironment> WorldFromEnvironment();

// "MASTER_ADDR=NAME is set and unused: ..." where `world` has an unused_master_addr, else "".
std::string UnusedMasterNote(const WorldEnvironment& world);

// Checks that world.master_addr resolves (getaddrinfo), asking again each second for up to
// `wait` while the name is unknown (a Kubernetes pod's DNS record appears only once that pod
// runs, after pods that start sooner look it up); the error names the host and where it came
// from. Not pure: asks the resolver.
absl::Status CheckMasterResolves(const WorldEnvironment& world,
                                 absl::Duration wait = absl::ZeroDuration());

// The world of a rank about to join the others (`dtrain train`, `dtrain bench comm`):
// WorldFromEnvironment, and in a world of more than one, a master that does not resolve fails
// now, named, rather than after the rendezvous timeout.
absl::StatusOr<WorldEnvironment> RankWorldFromEnvironment();

}  // namespace dtrain
