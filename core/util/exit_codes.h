// The exit codes of dtrain's commands, which the agent reads from its workers too.
#pragma once

namespace dtrain {

// The work failed.
inline constexpr int kExitFailure = 1;
// The command line or the recipe is wrong; nothing ran.
inline constexpr int kExitUsage = 2;
// 128 + SIGTERM, as a process that SIGTERM ended: stopped after saving a checkpoint, the run not
// done, so that Kubernetes and Slurm do not count it as finished (torchrun's agent also exits
// non-zero on SIGTERM).
inline constexpr int kExitStopped = 143;

}  // namespace dtrain
