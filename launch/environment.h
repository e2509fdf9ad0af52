// Where this process sits in the job, from its environment: the one place that reads the
// launcher's variables. For now torchrun's contract (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT); Slurm, Kubernetes and MPI sources arrive with the launcher.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace dtrain {

struct WorldEnvironment {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
};

// Absent variables mean one process. Values that are not integers, a rank outside the world, or
// a multi-process world without MASTER_ADDR are errors naming the variable and the fix.
absl::StatusOr<WorldEnvironment> WorldFromEnvironment();

}  // namespace dtrain
