// One child process of the agent: the one place in dtrain's library that spawns a process that
// outlives a call. The child runs in its own process group (so a signal reaches everything it
// started), dies with the agent (PR_SET_PDEATHSIG: a SIGKILLed agent leaves no worker behind),
// reads /dev/null and writes its stdout and stderr into pipes the agent drains.
//
// Not thread-safe; the thread that spawned it must outlive it (PDEATHSIG fires when that thread
// exits).
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dtrain {

// How a process ended.
struct ExitStatus {
  int code = 0;    // exit code when it exited
  int signal = 0;  // the signal that killed it, 0 when it exited
  bool ok() const { return signal == 0 && code == 0; }
  // "exit code 3" or "signal 9 (SIGKILL)".
  std::string ToString() const;
};

class WorkerProcess {
 public:
  // Starts argv[0] (a path) with exactly `environment` ("NAME=value" entries). Fails, naming the
  // program, when it cannot be started.
  static absl::StatusOr<std::unique_ptr<WorkerProcess>> Spawn(
      const std::vector<std::string>& argv, const std::vector<std::string>& environment);

  // Kills the process group (SIGKILL) and reaps the child if it is still running.
  ~WorkerProcess();
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Read ends of the child's stdout and stderr (non-blocking; -1 once closed by CloseOutput).
  int stdout_fd() const { return stdout_fd_; }
  int stderr_fd() const { return stderr_fd_; }
  void CloseOutput(int fd);

  // Sends `signal` to the child's process group (no-op once it has been reaped).
  void Signal(int signal);
  // Reaps the child without blocking: its exit status once it has ended, nullopt while it runs.
  std::optional<ExitStatus> Poll();
  const std::optional<ExitStatus>& exit_status() const { return exit_status_; }

 private:
  WorkerProcess(pid_t pid, int stdout_fd, int stderr_fd)
      : pid_(pid), stdout_fd_(stdout_fd), stderr_fd_(stderr_fd) {}

  pid_t pid_;
  int stdout_fd_;
  int stderr_fd_;
  std::optional<ExitStatus> exit_status_;
};

}  // namespace dtrain
