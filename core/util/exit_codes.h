// The exit codes of dtrain's commands, which the agent reads from its workers too.
#pragma once

#include <optional>

#include "absl/status/status.h"

namespace dtrain {

// The work failed.
inline constexpr int kExitFailure = 1;
// The command line, the recipe or the files it names are wrong (damaged checkpoints included);
// nothing ran, and a restart would fail the same way.
inline constexpr int kExitUsage = 2;
// A write found its file system full (ENOSPC, EDQUOT) or the file-size limit (EFBIG): a
// checkpoint, whose restart would train to the same save and fail there again, so the agent does
// not restart (the newest complete checkpoint stays), or another output (data pack's shards, an
// export).
inline constexpr int kExitDiskFull = 3;
// 128 + SIGTERM, as a process that SIGTERM ended: stopped after saving a checkpoint, the run not
// done, so that Kubernetes and Slurm do not count it as finished (torchrun's agent also exits
// non-zero on SIGTERM).
inline constexpr int kExitStopped = 143;

// The exit code a failed `status` asks its command to end with, carried as a payload from where
// the failure is understood (the checkpoint writer knows a full disk) to the command's end.
void SetExitCode(absl::Status& status, int exit_code);
// `status` with SetExitCode(exit_code), for a return statement.
absl::Status WithExitCode(absl::Status status, int exit_code);
// What SetExitCode recorded, if anything.
std::optional<int> ExitCodeOf(const absl::Status& status);

}  // namespace dtrain
