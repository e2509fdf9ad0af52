// A rank's membership in its job: who it is and how it reaches the others. The launch layer
// resolves it from the environment (launch/environment.h, whose WorldEnvironment extends it with
// where each value came from); the process group and the training loop only read it.
#pragma once

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace dtrain {

struct WorldMembership {
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int restart_count = 0;  // each restart of the job joins a fresh store namespace
  // The job's restarts, for its metrics: restart_count, after the requeues of a Slurm job
  // (SLURM_RESTART_COUNT) where a `dtrain launch` agent counts its own restarts from 0 in each.
  int job_restarts = 0;
  std::string rdzv_token;          // the store's shared secret; never print it
  bool agent_hosts_store = false;  // a `dtrain launch` agent hosts the store: rank 0 joins it
                                   // as a client instead of hosting it, and the agent prefixes
                                   // the rank to every log line
  int local_world_size = 1;        // ranks on this machine, which share its memory
  int local_rank = 0;
  int node_rank = 0;
  std::string run_id;  // empty when no launcher names the run
};

// A key of the store through which the workers of restart `restart_count` report to a `dtrain
// launch` agent (launch/agent.h): "connected" (a counter of the ranks past rendezvous),
// "finished/<rank>" (a rank that completed its part), "blame/<rank>" (the ranks that rank's
// error blames, comma-separated), "flight_recorder/<rank>" (the path of its flight-recorder dump).
inline std::string AgentKey(int restart_count, absl::string_view name) {
  return absl::StrCat("workers/attempt-", restart_count, "/", name);
}

}  // namespace dtrain
