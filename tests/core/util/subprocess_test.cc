// Subprocess: exit codes and signals, pipes and /dev/null, environments, the process group,
// PR_SET_PDEATHSIG and a failed exec. SIGPIPE's default action is checked where it matters, in
// shard_source_test.cc (pipe: commands).
#include "core/util/subprocess.h"

#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;
using Stream = SubprocessOptions::Stream;

SubprocessOptions Piped() {
  SubprocessOptions options;
  options.stdout_stream = Stream::kPipe;
  options.stderr_stream = Stream::kPipe;
  return options;
}

// Everything the child wrote on `fd` until it closed (a blocking pipe).
std::string ReadAll(int fd) {
  std::string text;
  char buffer[256];
  for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) text.append(buffer, n);
  return text;
}

// Whether every writer of pipe `fd` is gone (EOF) within `timeout`, a generous cap: a process
// still holding it open keeps it from closing.
bool ClosesWithin(int fd, absl::Duration timeout) {
  pollfd entry = {fd, POLLIN, 0};
  if (poll(&entry, 1, absl::ToInt64Milliseconds(timeout)) != 1) return false;
  char byte;
  return read(fd, &byte, 1) == 0;
}

std::unique_ptr<Subprocess> SpawnShell(const std::string& script,
                                       const SubprocessOptions& options) {
  absl::StatusOr<std::unique_ptr<Subprocess>> process =
      Subprocess::Spawn({"/bin/sh", "-c", script}, options);
  EXPECT_TRUE(process.ok()) << process.status();
  return process.ok() ? *std::move(process) : nullptr;
}

TEST(SubprocessTest, ReportsExitCodesAndSignals) {
  auto exits = SpawnShell("echo out; echo err >&2; exit 3", Piped());
  EXPECT_EQ(ReadAll(exits->stdout_fd()), "out\n");
  EXPECT_EQ(ReadAll(exits->stderr_fd()), "err\n");
  EXPECT_EQ(exits->Wait().ToString(), "exit code 3");
  EXPECT_EQ(exits->Poll()->code, 3) << "the status stays once reaped";

  auto killed = SpawnShell("kill -9 $$", SubprocessOptions());
  EXPECT_EQ(killed->Wait().ToString(), "signal 9 (SIGKILL)");
  EXPECT_FALSE(killed->Wait().ok());
}

TEST(SubprocessTest, WaitForGivesUpAtItsTimeout) {
  auto sleeper = SpawnShell("exec sleep 30", SubprocessOptions());
  const absl::Time start = absl::Now();
  EXPECT_FALSE(sleeper->WaitFor(absl::Milliseconds(200)).has_value());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
  sleeper->Signal(SIGTERM);
  const std::optional<ExitStatus> ended = sleeper->WaitFor(absl::Seconds(20));
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->signal, SIGTERM);
}

// An abandoned child counts as killed and is not waited for, by the destructor either.
TEST(SubprocessTest, AbandonedChildrenAreNotWaitedFor) {
  auto stopped = SpawnShell("kill -STOP $$", SubprocessOptions());
  ASSERT_FALSE(stopped->WaitFor(absl::Milliseconds(100)).has_value());
  const pid_t pid = stopped->pid();
  stopped->Abandon();
  EXPECT_EQ(stopped->Poll()->ToString(), "signal 9 (SIGKILL)");
  stopped.reset();
  // Still stopped ("T"), neither killed (a zombie, "Z") nor reaped (no such process).
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  ASSERT_TRUE(std::getline(stat, line)) << "the destructor reaped an abandoned child";
  EXPECT_EQ(line[line.rfind(')') + 2], 'T') << line;
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

TEST(SubprocessTest, NonblockingPipesSayWhenNothingIsThereYet) {
  SubprocessOptions options = Piped();
  options.nonblocking_pipes = true;
  auto sleeper = SpawnShell("sleep 30", options);
  char byte;
  EXPECT_EQ(read(sleeper->stdout_fd(), &byte, 1), -1);
  EXPECT_EQ(errno, EAGAIN);
  EXPECT_FALSE(sleeper->Poll().has_value());
  // The destructor kills and reaps it.
}

TEST(SubprocessTest, EnvironmentIsGivenOrInherited) {
  setenv("DTRAIN_SUBPROCESS_TEST", "inherited", 1);
  auto inherits = SpawnShell("echo $DTRAIN_SUBPROCESS_TEST", Piped());
  EXPECT_EQ(ReadAll(inherits->stdout_fd()), "inherited\n");
  SubprocessOptions options = Piped();
  options.environment = std::vector<std::string>{"ONLY=this"};
  auto given = SpawnShell("echo $ONLY $DTRAIN_SUBPROCESS_TEST", options);
  EXPECT_EQ(ReadAll(given->stdout_fd()), "this\n");
  unsetenv("DTRAIN_SUBPROCESS_TEST");
}

TEST(SubprocessTest, NullStreamsReadAndWriteDevNull) {
  SubprocessOptions options = Piped();
  options.stdin_stream = Stream::kNull;
  options.stderr_stream = Stream::kNull;
  auto child = SpawnShell("readlink /proc/self/fd/0 /proc/self/fd/2", options);
  EXPECT_EQ(ReadAll(child->stdout_fd()), "/dev/null\n/dev/null\n");
  EXPECT_EQ(child->stderr_fd(), -1);
}

TEST(SubprocessTest, OwnProcessGroupTakesGrandchildrenAlong) {
  SubprocessOptions options = Piped();
  options.own_process_group = true;
  // The grandchild keeps the pipe open: it closes only when the whole group is gone.
  auto sleeper = SpawnShell("sleep 300 & wait", options);
  sleeper->Signal(SIGTERM);
  EXPECT_EQ(sleeper->Wait().ToString(), "signal 15 (SIGTERM)");
  EXPECT_TRUE(ClosesWithin(sleeper->stdout_fd(), absl::Seconds(60)))
      << "the grandchild must die with the group";

  // A child that ends by itself: what it left running in its group is killed when it is reaped.
  auto leaves = SpawnShell("sleep 300 & exit 0", options);
  EXPECT_TRUE(leaves->Wait().ok());
  EXPECT_TRUE(ClosesWithin(leaves->stdout_fd(), absl::Seconds(60)));
}

TEST(SubprocessTest, DiesWithTheThreadThatSpawnedIt) {
  SubprocessOptions options;
  options.parent_death_signal = SIGKILL;
  std::unique_ptr<Subprocess> orphan;
  std::thread([&] { orphan = SpawnShell("sleep 30", options); }).join();
  EXPECT_EQ(orphan->Wait().ToString(), "signal 9 (SIGKILL)");
}

// Spawning runs no pthread_atfork handler: OpenBLAS's stops its threads under a GEMM that another
// thread runs, which then waits for them forever (a trainer hung when its data loader's thread
// started a `pipe:` shard command mid-step). The spawning thread's signal mask, blocked around the
// clone, is as it was.
int fork_handler_runs = 0;

TEST(SubprocessTest, SpawningRunsNoForkHandlersAndKeepsTheSignalMask) {
  ASSERT_EQ(pthread_atfork([] { ++fork_handler_runs; }, nullptr, nullptr), 0);
  sigset_t before, after;
  ASSERT_EQ(pthread_sigmask(SIG_SETMASK, nullptr, &before), 0);
  auto child = SpawnShell("exit 4", SubprocessOptions());
  ASSERT_EQ(pthread_sigmask(SIG_SETMASK, nullptr, &after), 0);
  EXPECT_EQ(child->Wait().ToString(), "exit code 4");
  EXPECT_EQ(fork_handler_runs, 0);
  for (int signal = 1; signal < NSIG; ++signal) {
    EXPECT_EQ(sigismember(&before, signal), sigismember(&after, signal)) << "signal " << signal;
  }
}

TEST(SubprocessTest, FailedExecIsAnErrorNamingTheProgram) {
  const absl::StatusOr<std::unique_ptr<Subprocess>> missing =
      Subprocess::Spawn({"/no/such/dtrain"}, SubprocessOptions());
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(),
              HasSubstr("cannot run /no/such/dtrain: No such file or directory"));
}

}  // namespace
}  // namespace dtrain
