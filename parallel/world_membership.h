// A rank's membership in its job: who it is and how it reaches the others. The launch layer
// resolves it from the environment (launch/environment.h, whose WorldEnvironment extends it with
// where each value came from); the process group and the training loop only read it.
#pragma once

#include <string>

namespace dtrain {

struct WorldMembership {
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int restart_count = 0;           // each restart of the job joins a fresh store namespace
  std::string rdzv_token;          // the store's shared secret; never print it
  bool agent_hosts_store = false;  // a `dtrain launch` agent hosts the store: rank 0 joins it
                                   // as a client instead of hosting it, and the agent prefixes
                                   // the rank to every log line
};

}  // namespace dtrain
