// A child process: the one place in dtrain that starts programs (the agent's workers, the
// requeue command, `pipe:` shard commands). What differs between them is in SubprocessOptions;
// what every child gets is the same: an empty signal mask and SIGPIPE at its default action even
// where this process ignores it (communicators do), so a child whose reader went away ends as in
// a shell pipeline; and a failed exec reported by Spawn, not as a child exiting 127.
//
// Not thread-safe. With a parent_death_signal, the thread that spawned the child must outlive it
// (PR_SET_PDEATHSIG fires when that thread exits).
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dtrain {

// How a process ended.
struct ExitStatus {
  int code = 0;    // exit code when it exited
  int signal = 0;  // the signal that killed it, 0 when it exited
  bool ok() const { return signal == 0 && code == 0; }
  // "exit code 3" or "signal 9 (SIGKILL)".
  std::string ToString() const;
};

struct SubprocessOptions {
  // Where each standard stream of the child goes: this process's own, /dev/null, or a pipe that
  // this process reads (stdout and stderr only).
  enum class Stream { kInherit, kNull, kPipe };
  Stream stdin_stream = Stream::kInherit;
  Stream stdout_stream = Stream::kInherit;
  Stream stderr_stream = Stream::kInherit;
  // Read ends of the pipes return EAGAIN instead of blocking (for a poll loop over many).
  bool nonblocking_pipes = false;
  // "NAME=value" entries; nullopt: this process's environment.
  std::optional<std::vector<std::string>> environment;
  // The child leads a process group of its own: Signal() reaches everything it started, and
  // once it ended what it left behind is killed.
  bool own_process_group = false;
  // Not 0: the child gets this signal when this process (the spawning thread) dies, even by
  // SIGKILL.
  int parent_death_signal = 0;
};

class Subprocess {
 public:
  // Starts argv[0] (a path; no PATH search). Fails, naming the program, when it cannot be
  // started (no pipes or processes left, or exec failed).
  static absl::StatusOr<std::unique_ptr<Subprocess>> Spawn(const std::vector<std::string>& argv,
                                                           const SubprocessOptions& options);

  // A child still running is SIGKILLed (its group, with own_process_group) and reaped.
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  // Read ends of the child's stdout and stderr pipes; -1 without a pipe or once closed.
  int stdout_fd() const { return stdout_fd_; }
  int stderr_fd() const { return stderr_fd_; }
  void CloseOutput(int fd);

  // Sends `signal` to the child (its group, with own_process_group); a no-op once reaped.
  void Signal(int signal);
  // Reaps the child without blocking: its exit status once it has ended, nullopt while it runs.
  std::optional<ExitStatus> Poll();
  // Reaps the child, blocking until it has ended.
  ExitStatus Wait();
  // Reaps the child once it has ended, waiting at most `timeout`: nullopt while it still runs.
  std::optional<ExitStatus> WaitFor(absl::Duration timeout);
  // Gives up on a child that outlived SIGKILL (stuck in the kernel: uninterruptible sleep on a
  // hung file system or device): it counts as ended by SIGKILL and is never reaped here (init
  // reaps it once this process has exited).
  void Abandon();
  const std::optional<ExitStatus>& exit_status() const { return exit_status_; }

 private:
  Subprocess(pid_t pid, bool own_process_group, int stdout_fd, int stderr_fd)
      : pid_(pid),
        own_process_group_(own_process_group),
        stdout_fd_(stdout_fd),
        stderr_fd_(stderr_fd) {}
  // Reaps the child once it has ended (waiting for that with `block`); with own_process_group
  // its group is killed first, before the group id can be reused.
  std::optional<ExitStatus> Reap(bool block);

  pid_t pid_;
  bool own_process_group_;
  int stdout_fd_;
  int stderr_fd_;
  std::optional<ExitStatus> exit_status_;
};

}  // namespace dtrain
