#include "launch/environment.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/util/status.h"

namespace dtrain {
namespace {

absl::StatusOr<int> IntFromEnv(const char* name, int fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  int parsed = 0;
  if (!absl::SimpleAtoi(value, &parsed)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "='", value, "' is not an integer; set it to a whole number"));
  }
  return parsed;
}

}  // namespace

absl::StatusOr<WorldEnvironment> WorldFromEnvironment() {
  WorldEnvironment world;
  ASSIGN_OR_RETURN(world.rank, IntFromEnv("RANK", 0));
  ASSIGN_OR_RETURN(world.world_size, IntFromEnv("WORLD_SIZE", 1));
  ASSIGN_OR_RETURN(world.local_rank, IntFromEnv("LOCAL_RANK", world.rank));
  ASSIGN_OR_RETURN(world.master_port, IntFromEnv("MASTER_PORT", world.master_port));
  if (world.world_size < 1 || world.rank < 0 || world.rank >= world.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("RANK=", world.rank,
                                                   " is outside WORLD_SIZE=", world.world_size,
                                                   "; set both, with 0 <= RANK < WORLD_SIZE"));
  }
  if (world.master_port <= 0 || world.master_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("MASTER_PORT=", world.master_port, " is not a TCP port (1-65535)"));
  }
  const char* addr = std::getenv("MASTER_ADDR");
  if (addr != nullptr && *addr != '\0') {
    world.master_addr = addr;
  } else if (world.world_size > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("WORLD_SIZE=", world.world_size,
                     " but MASTER_ADDR is not set: set it to the address of rank 0's host "
                     "(dtrain never guesses localhost for a multi-process job)"));
  }
  return world;
}

}  // namespace dtrain
