// The per-node agent of `dtrain launch` (what torchrun's elastic agent is to PyTorch): it starts
// this node's workers, watches them and the other nodes' agents, and decides together with them
// when the group stops, restarts or ends.
//
// - Node 0's agent hosts the rendezvous store; every agent and worker connects to it. Workers are
//   told so (DTRAIN_AGENT_STORE=1) and get their ranks as DTRAIN_* and torchrun's variables.
// - A worker that fails anywhere makes every agent stop its workers (SIGTERM, then SIGKILL after
//   the failure grace); while restarts remain, all nodes start their workers again (the trainer
//   resumes from the newest complete checkpoint); otherwise the agent exits 1 and node 0 prints
//   the root cause: the rank a failed worker's error blames (one that never started the
//   collective its peers failed in: hung or gone), else the first failing rank; its node (and
//   pipeline stage, which a pipelined worker records), exit code or signal, its last stderr
//   lines. A worker that exits 0 before it finished its part (ProcessGroup::Leave records that)
//   fails too.
// - SIGTERM or SIGINT (time limit, preemption) is forwarded to the workers, which checkpoint and
//   exit; whatever still runs after the stop grace is killed; then node 0 may requeue the job.
//   Every agent learns of it through the store. SIGUSR1 and SIGUSR2 are forwarded without teardown.
// - An agent whose store connection closes before it finished (killed, crashed, host gone) is
//   lost: the others stop their workers (failure grace). While restarts remain they wait for a new
//   agent on that node (it rejoins at the next attempt); otherwise, or on SIGTERM (Slurm tearing
//   down the step, which is then not a preemption), node 0 names the lost agent as the root cause
//   and the job exits 1. Without node 0's agent the store is gone: the others stop and exit 1.
// - Worker output goes to the agent's stdout and stderr, each line prefixed "[rank R] ", or to
//   `<log_dir>/rank-<R>.log`.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "launch/environment.h"

namespace dtrain {

struct AgentOptions {
  // What each worker runs; argv[0] is a path. The agent adds only environment variables.
  std::vector<std::string> worker_argv;
  int nproc_per_node = 1;
  int max_restarts = 0;
  // The run's checkpoint folder and checkpoint.resume: node 0 names the checkpoint each restart
  // resumes from (an empty folder: it does not).
  std::string checkpoint_dir, checkpoint_resume;
  std::string log_dir;  // empty: rank-prefixed lines on the agent's own stdout and stderr
  // Waiting for the other agents: to arrive, to stop their workers, to finish.
  absl::Duration rendezvous_timeout = absl::Minutes(5);
  // SIGTERM to SIGKILL when the job is told to stop: room for a checkpoint, and shorter than
  // Slurm's KillWait (30 s by default) so that dtrain, not Slurm, ends the workers.
  absl::Duration stop_grace = absl::Seconds(20);
  // SIGTERM to SIGKILL when the group is torn down after a failure (nothing is saved then): room
  // for the survivors to name the dead rank and dump their flight recorders, which took them
  // over 3 s on a loaded machine (under 1 s idle).
  absl::Duration failure_grace = absl::Seconds(10);
  // The agent's environment, which workers inherit ("NAME=value"), less the launchers' rank
  // variables. CUDA_VISIBLE_DEVICES stays: each worker takes the visible GPU of its local rank.
  std::vector<std::string> environment;
  // Run by node 0 once the workers stopped cleanly after SIGTERM (`scontrol requeue JOB`), so a
  // preempted or timed-out job comes back and resumes from its checkpoint. Empty: none.
  std::vector<std::string> requeue_argv;
  // Prints the job's record before that (`scontrol show job --oneliner JOB`): a job whose
  // JobState is COMPLETING or CANCELLED (scancel) ends instead. Empty: requeue without asking.
  std::vector<std::string> job_state_argv;
};

// The environment of worker `local_rank` in restart `attempt`: `options.environment` without
// any launcher's rank variables, plus dtrain's and torchrun's for this worker.
std::vector<std::string> WorkerEnvironment(const WorldEnvironment& node,
                                           const AgentOptions& options, int local_rank,
                                           int attempt);

// Runs this node's agent until the job ends. `node` gives node_rank, num_nodes, the master
// address and port (port 0 on a single node: any free port), run id and token. Returns the exit
// code: 0 when every worker succeeded (or stopped cleanly when told to), 1 when the job failed
// with no restarts left. Errors are rendezvous failures (a missing agent, an unreachable store).
absl::StatusOr<int> RunAgent(const WorldEnvironment& node, const AgentOptions& options);

// A node's agent that failed before it could join the job (its own checks of the recipe and
// the world): leaves `error` in node 0's store, trying to connect for at most `timeout`, so that
// the others end the rendezvous at once naming it instead of waiting out its timeout. Node 0
// starts its store to leave its own failure there, and serves it until every other node has read
// it and gone, or failed its own checks too, or for `timeout`.
void ReportFailureBeforeJoining(const WorldEnvironment& node, const absl::Status& error,
                                absl::Duration timeout);

}  // namespace dtrain
