#include "core/util/subprocess.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

extern char** environ;

namespace dtrain {
namespace {

using Stream = SubprocessOptions::Stream;

std::vector<char*> NullTerminated(const std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (const std::string& s : strings) pointers.push_back(const_cast<char*>(s.c_str()));
  pointers.push_back(nullptr);
  return pointers;
}

// Everything the child needs between clone and exec, prepared before the clone.
struct ChildSetup {
  char* const* argv;
  char* const* envp;
  const SubprocessOptions* options;
  pid_t parent;
  int stdout_write = -1;  // write ends of the output pipes, -1 without one
  int stderr_write = -1;
  int exec_error_write = -1;  // close-on-exec: a successful exec closes it silently
};

// Points `target` at /dev/null or `pipe_fd` as `stream` says; kInherit leaves it.
void Redirect(Stream stream, int pipe_fd, int null_fd, int target) {
  if (stream == Stream::kNull && null_fd >= 0) dup2(null_fd, target);
  if (stream == Stream::kPipe) dup2(pipe_fd, target);
}

// Runs in the child between clone and exec, on this process's memory: system calls only, no
// locks, no allocation. Starts with every signal blocked; on failure writes errno to the exec
// error pipe.
[[noreturn]] void ExecChild(const ChildSetup& setup) {
  const SubprocessOptions& options = *setup.options;
  if (options.own_process_group) setpgid(0, 0);
  if (options.parent_death_signal != 0) {
    prctl(PR_SET_PDEATHSIG, options.parent_death_signal);
    if (getppid() != setup.parent) _exit(127);  // the parent died before prctl took effect
  }
  // This process's handlers would run on its memory: until exec, a caught signal does what it
  // would do without them. SIGPIPE also where this process ignores it.
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  for (int signal = 1; signal < NSIG; ++signal) {
    struct sigaction current {};
    if (sigaction(signal, nullptr, &current) != 0) continue;
    const bool caught = (current.sa_flags & SA_SIGINFO) != 0 ||
                        (current.sa_handler != SIG_DFL && current.sa_handler != SIG_IGN);
    if (caught || signal == SIGPIPE) sigaction(signal, &default_action, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  const bool any_null = options.stdin_stream == Stream::kNull ||
                        options.stdout_stream == Stream::kNull ||
                        options.stderr_stream == Stream::kNull;
  const int null_fd = any_null ? open("/dev/null", O_RDWR) : -1;
  Redirect(options.stdin_stream, -1, null_fd, STDIN_FILENO);
  Redirect(options.stdout_stream, setup.stdout_write, null_fd, STDOUT_FILENO);
  Redirect(options.stderr_stream, setup.stderr_write, null_fd, STDERR_FILENO);
  execve(setup.argv[0], setup.argv, setup.envp);
  const int error = errno;
  (void)!write(setup.exec_error_write, &error, sizeof(error));
  _exit(127);
}

int ChildMain(void* setup) { ExecChild(*static_cast<const ChildSetup*>(setup)); }

// The child's stack from clone to exec: ExecChild's few calls, with room to spare.
constexpr size_t kChildStackBytes = size_t{256} << 10;

// clone(CLONE_VM | CLONE_VFORK), as posix_spawn does, rather than fork(): fork runs the
// pthread_atfork handlers, and OpenBLAS's stops its threads under a GEMM that another thread is
// running, which then waits for them forever (a `pipe:` shard opened by the loader's thread hung
// the trainer's step). This thread waits until the child has exec'd or failed, with every signal
// blocked, so that no handler of this process runs while the child shares its memory.
pid_t CloneChild(const ChildSetup& setup) {
  void* stack = mmap(nullptr, kChildStackBytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (stack == MAP_FAILED) return -1;
  sigset_t all, previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  const pid_t pid = clone(ChildMain, static_cast<char*>(stack) + kChildStackBytes,
                          CLONE_VM | CLONE_VFORK | SIGCHLD, const_cast<ChildSetup*>(&setup));
  const int error = errno;
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  munmap(stack, kChildStackBytes);
  errno = error;
  return pid;
}

// A pipe for `stream` when it is kPipe; both ends close on exec.
bool OpenPipe(Stream stream, bool nonblocking, int fds[2]) {
  if (stream != Stream::kPipe) return true;
  if (pipe2(fds, O_CLOEXEC) != 0) return false;
  if (nonblocking) fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  return true;
}

void ClosePipe(int fds[2]) {
  for (int i = 0; i < 2; ++i) {
    if (fds[i] >= 0) close(fds[i]);
    fds[i] = -1;
  }
}

}  // namespace

std::string ExitStatus::ToString() const {
  if (signal == 0) return absl::StrCat("exit code ", code);
  const char* name = sigabbrev_np(signal);
  return absl::StrCat("signal ", signal, name ? absl::StrCat(" (SIG", name, ")") : "");
}

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Spawn(const std::vector<std::string>& argv,
                                                              const SubprocessOptions& options) {
  const std::vector<char*> args = NullTerminated(argv);
  const std::vector<char*> envp =
      options.environment ? NullTerminated(*options.environment) : std::vector<char*>();
  int out[2] = {-1, -1}, err[2] = {-1, -1}, exec_error[2] = {-1, -1};
  if (!OpenPipe(options.stdout_stream, options.nonblocking_pipes, out) ||
      !OpenPipe(options.stderr_stream, options.nonblocking_pipes, err) ||
      pipe2(exec_error, O_CLOEXEC) != 0) {
    const int error = errno;
    ClosePipe(out);
    ClosePipe(err);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot create pipes for ", argv[0], ": ", strerror(error)));
  }
  const ChildSetup setup{.argv = args.data(),
                         .envp = options.environment ? envp.data() : environ,
                         .options = &options,
                         .parent = getpid(),
                         .stdout_write = out[1],
                         .stderr_write = err[1],
                         .exec_error_write = exec_error[1]};
  const pid_t pid = CloneChild(setup);
  const int clone_error = errno;
  for (int* fds : {out, err, exec_error}) {
    if (fds[1] >= 0) close(fds[1]);
    fds[1] = -1;
  }
  if (pid < 0) {
    for (int* fds : {out, err, exec_error}) ClosePipe(fds);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start ", argv[0], ": clone failed: ", strerror(clone_error)));
  }
  auto process =
      std::unique_ptr<Subprocess>(new Subprocess(pid, options.own_process_group, out[0], err[0]));
  int error = 0;
  ssize_t got;
  while ((got = read(exec_error[0], &error, sizeof(error))) < 0 && errno == EINTR) {
  }
  close(exec_error[0]);
  if (got == sizeof(error)) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot run ", argv[0], ": ", strerror(error)));
  }
  return process;
}

Subprocess::~Subprocess() {
  if (!exit_status_) {
    Signal(SIGKILL);
    Reap(/*block=*/true);
  }
  CloseOutput(stdout_fd_);
  CloseOutput(stderr_fd_);
}

void Subprocess::CloseOutput(int fd) {
  if (fd < 0) return;
  close(fd);
  if (fd == stdout_fd_) stdout_fd_ = -1;
  if (fd == stderr_fd_) stderr_fd_ = -1;
}

void Subprocess::Signal(int signal) {
  // After the child was reaped its pid (and group id) may belong to someone else.
  if (!exit_status_) kill(own_process_group_ ? -pid_ : pid_, signal);
}

std::optional<ExitStatus> Subprocess::Poll() { return Reap(/*block=*/false); }

ExitStatus Subprocess::Wait() {
  std::optional<ExitStatus> exit;
  while (!(exit = Reap(/*block=*/true))) {
  }
  return *exit;
}

std::optional<ExitStatus> Subprocess::WaitFor(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (std::optional<ExitStatus> exit = Poll()) return exit;
    if (absl::Now() >= deadline) return std::nullopt;
    absl::SleepFor(absl::Milliseconds(10));
  }
}

void Subprocess::Abandon() {
  if (!exit_status_) exit_status_ = ExitStatus{.signal = SIGKILL};
}

std::optional<ExitStatus> Subprocess::Reap(bool block) {
  if (exit_status_) return exit_status_;
  siginfo_t info{};
  // WNOWAIT: look without reaping, so that the group id cannot be reused before the kill below.
  const int flags = WEXITED | WNOWAIT | (block ? 0 : WNOHANG);
  if (waitid(P_PID, pid_, &info, flags) != 0) {
    // Interrupted, or reaped elsewhere (ECHILD: nobody can tell how it ended).
    if (errno != ECHILD) return std::nullopt;
    exit_status_ = ExitStatus{.code = -1};
    return exit_status_;
  }
  if (info.si_pid != pid_) return std::nullopt;
  // The child's own children (its process group) must not outlive it.
  if (own_process_group_) kill(-pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
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
