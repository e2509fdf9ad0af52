#include "launch/worker_process.h"

#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace {

// A pipe whose read end is non-blocking; both ends close on exec.
bool OpenPipe(int fds[2]) {
  if (pipe2(fds, O_CLOEXEC) != 0) return false;
  fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  return true;
}

std::vector<char*> NullTerminated(const std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (const std::string& s : strings) pointers.push_back(const_cast<char*>(s.c_str()));
  pointers.push_back(nullptr);
  return pointers;
}

// Runs in the child between fork and exec: async-signal-safe calls only. On failure writes
// errno to `error_fd` (close-on-exec, so a successful exec closes it silently).
[[noreturn]] void ExecChild(char* const* argv, char* const* envp, pid_t agent, int out_fd,
                            int err_fd, int error_fd) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != agent) _exit(127);  // the agent died before prctl took effect
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  const int null_fd = open("/dev/null", O_RDONLY);
  if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
  dup2(out_fd, STDOUT_FILENO);
  dup2(err_fd, STDERR_FILENO);
  execve(argv[0], argv, envp);
  const int error = errno;
  (void)!write(error_fd, &error, sizeof(error));
  _exit(127);
}

}  // namespace

std::string ExitStatus::ToString() const {
  if (signal == 0) return absl::StrCat("exit code ", code);
  const char* name = sigabbrev_np(signal);
  return absl::StrCat("signal ", signal, name ? absl::StrCat(" (SIG", name, ")") : "");
}

absl::StatusOr<std::unique_ptr<WorkerProcess>> WorkerProcess::Spawn(
    const std::vector<std::string>& argv, const std::vector<std::string>& environment) {
  const std::vector<char*> args = NullTerminated(argv);
  const std::vector<char*> envp = NullTerminated(environment);
  int out[2], err[2], exec_error[2];
  if (!OpenPipe(out) || !OpenPipe(err) || pipe2(exec_error, O_CLOEXEC) != 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot create pipes for ", argv[0], ": ", strerror(errno)));
  }
  const pid_t agent = getpid();
  const pid_t pid = fork();
  if (pid == 0) ExecChild(args.data(), envp.data(), agent, out[1], err[1], exec_error[1]);
  close(out[1]);
  close(err[1]);
  close(exec_error[1]);
  if (pid < 0) {
    close(out[0]);
    close(err[0]);
    close(exec_error[0]);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start ", argv[0], ": fork failed: ", strerror(errno)));
  }
  setpgid(pid, pid);  // also here, so that Signal() works before the child ran setpgid
  auto process = std::unique_ptr<WorkerProcess>(new WorkerProcess(pid, out[0], err[0]));
  int error = 0;
  const ssize_t got = read(exec_error[0], &error, sizeof(error));
  close(exec_error[0]);
  if (got == sizeof(error)) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot run ", argv[0], ": ", strerror(error),
                     "; check that the dtrain binary is at that path on every node"));
  }
  return process;
}

WorkerProcess::~WorkerProcess() {
  if (!exit_status_) {
    Signal(SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  CloseOutput(stdout_fd_);
  CloseOutput(stderr_fd_);
}

void WorkerProcess::CloseOutput(int fd) {
  if (fd < 0) return;
  close(fd);
  if (fd == stdout_fd_) stdout_fd_ = -1;
  if (fd == stderr_fd_) stderr_fd_ = -1;
}

void WorkerProcess::Signal(int signal) {
  // After the child was reaped its pid (and group id) may belong to someone else.
  if (!exit_status_) kill(-pid_, signal);
}

std::optional<ExitStatus> WorkerProcess::Poll() {
  if (exit_status_) return exit_status_;
  siginfo_t info{};
  // WNOWAIT: look without reaping, so that the group id cannot be reused before the kill below.
  if (waitid(P_PID, pid_, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid != pid_) {
    return std::nullopt;
  }
  // The worker's own children (its process group) must not outlive it.
  kill(-pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
  ExitStatus exit;
  if (WIFSIGNALED(status)) {
    exit.signal = WTERMSIG(status);
  } else {
    exit.code = WEXITSTATUS(status);
  }
  exit_status_ = exit;
  return exit_status_;
}

}  // namespace dtrain
