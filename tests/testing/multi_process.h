// Test helper: runs N local ranks as processes with torchrun's variables (RANK, LOCAL_RANK,
// WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT) set, waits up to a timeout
// (then SIGKILLs the stragglers) and collects each rank's exit code and combined output.
// Header-only because tests/CMakeLists.txt compiles only *_test.cc. Call from one thread.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/testing/free_port.h"  // callers pass its port as master_port

namespace dtrain::testing {

struct RankResult {
  int exit_code = -1;  // 128 + signal when killed by one
  bool timed_out = false;
  std::string output;  // stdout and stderr interleaved
};

// A failed expectation's account of a rank: its exit code and error lines ("error: ..." and
// logged "E ..." lines), which a truncated CI log of a long output would lose, then the output.
inline std::ostream& operator<<(std::ostream& out, const RankResult& rank) {
  out << "exit code " << rank.exit_code << (rank.timed_out ? " (timed out)" : "") << "; errors:\n";
  std::istringstream lines(rank.output);
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with("error: ") || line.starts_with("E ")) out << line << "\n";
  }
  return out << "output:\n" << rank.output;
}

// Whether some rank printed `text`: for what only the rank that failed first is sure to print.
inline bool SomeRankPrinted(const std::vector<RankResult>& ranks, const std::string& text) {
  return std::any_of(ranks.begin(), ranks.end(), [&](const RankResult& rank) {
    return rank.output.find(text) != std::string::npos;
  });
}

// The ranks' process ids while they run, -1 for a rank that has ended; `watch` may signal them.
using RankWatch = std::function<void(const std::vector<pid_t>& pids)>;

// Starts world_size children; each sets the environment, sends its output to a temporary file
// and runs `child(rank)`, whose return value is its exit code (it should exec or _exit-safe work).
// `watch`, when set, runs every 10 ms until every rank has ended.
inline std::vector<RankResult> RunRanksAsProcesses(int world_size, int master_port,
                                                   absl::Duration timeout,
                                                   const std::function<int(int rank)>& child,
                                                   const RankWatch& watch = nullptr) {
  std::vector<pid_t> pids(world_size, -1);
  std::vector<std::string> logs(world_size);
  for (int rank = 0; rank < world_size; ++rank) {
    std::string path = ::testing::TempDir() + "dtrain_rank_XXXXXX";
    const int log_fd = mkstemp(path.data());
    logs[rank] = path;
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(log_fd, STDOUT_FILENO);
      dup2(log_fd, STDERR_FILENO);
      setenv("RANK", std::to_string(rank).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(world_size).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(world_size).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(master_port).c_str(), 1);
      _exit(child(rank));
    }
    close(log_fd);
    pids[rank] = pid;
  }
  std::vector<RankResult> results(world_size);
  const absl::Time deadline = absl::Now() + timeout;
  int running = world_size;
  while (running > 0) {
    for (int rank = 0; rank < world_size; ++rank) {
      if (pids[rank] < 0) continue;
      int status = 0;
      const bool expired = absl::Now() > deadline;
      if (expired) {
        kill(pids[rank], SIGKILL);
        results[rank].timed_out = true;
      }
      if (waitpid(pids[rank], &status, expired ? 0 : WNOHANG) == pids[rank]) {
        results[rank].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        pids[rank] = -1;
        --running;
      }
    }
    if (watch && running > 0) watch(pids);
    absl::SleepFor(absl::Milliseconds(10));
  }
  for (int rank = 0; rank < world_size; ++rank) {
    std::ifstream in(logs[rank]);
    std::stringstream text;
    text << in.rdbuf();
    results[rank].output = text.str();
    unlink(logs[rank].c_str());
  }
  return results;
}

// The same for a program: every rank execs argv.
inline std::vector<RankResult> RunLocalProcesses(const std::vector<std::string>& argv,
                                                 int world_size, int master_port,
                                                 absl::Duration timeout,
                                                 const RankWatch& watch = nullptr) {
  return RunRanksAsProcesses(
      world_size, master_port, timeout,
      [&](int) {
        std::vector<char*> args;
        for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
        args.push_back(nullptr);
        execv(args[0], args.data());
        return 127;  // exec failed
      },
      watch);
}

// The same for a program whose rank `target` gets `signal` once `ready()` holds (checked every
// 10 ms while the ranks run); a stopped target is SIGKILLed once every other rank has ended.
inline std::vector<RankResult> SignalRankMidRun(const std::vector<std::string>& argv,
                                                int world_size, int target, int signal,
                                                absl::Duration timeout,
                                                const std::function<bool()>& ready) {
  bool signalled = false;
  return RunLocalProcesses(argv, world_size, FreeTcpPort(), timeout,
                           [&](const std::vector<pid_t>& pids) {
                             if (pids[target] < 0) return;
                             if (!signalled && ready()) {
                               kill(pids[target], signal);
                               signalled = true;
                             }
                             bool others_ended = true;
                             for (int rank = 0; rank < world_size; ++rank) {
                               if (rank != target && pids[rank] > 0) others_ended = false;
                             }
                             if (signalled && others_ended) kill(pids[target], SIGKILL);
                           });
}

// `dtrain train recipe --set ...` (DTRAIN_BINARY) as `world` local ranks on a free port, within
// 240 s.
inline std::vector<RankResult> RunTrainRanks(const std::string& recipe, int world,
                                             const std::vector<std::string>& sets) {
  std::vector<std::string> argv = {DTRAIN_BINARY, "train", recipe};
  for (const std::string& set : sets) argv.insert(argv.end(), {"--set", set});
  return RunLocalProcesses(argv, world, FreeTcpPort(), absl::Seconds(240));
}

}  // namespace dtrain::testing
