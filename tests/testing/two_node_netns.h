// Two "nodes" on one machine for tests: this host's network namespace (node 0, 10.213.9.1) and a
// second namespace joined to it by a veth pair (node 1, 10.213.9.2), and a way to run shell
// commands and read their output. The namespace, the pair and the addresses are one per machine:
// a test holds MachineLock from before it makes them until after they are gone. Needs root and
// `ip netns`.
#pragma once

#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"

namespace dtrain::testing {

inline constexpr char kNamespace[] = "dtrain-node1";
inline constexpr char kNodeZeroAddress[] = "10.213.9.1";
inline constexpr char kNodeOneAddress[] = "10.213.9.2";

inline int Shell(const std::string& command) { return system(command.c_str()); }

// ctest runs tests as processes side by side: a test holds this lock while the namespace exists.
class MachineLock {
 public:
  MachineLock() : fd_(open("/tmp/dtrain-two-node-netns.lock", O_CREAT | O_RDWR, 0644)) {
    if (fd_ >= 0) flock(fd_, LOCK_EX);
  }
  ~MachineLock() {
    if (fd_ >= 0) close(fd_);
  }
  MachineLock(const MachineLock&) = delete;
  MachineLock& operator=(const MachineLock&) = delete;

 private:
  int fd_;
};

class SecondNode {
 public:
  SecondNode() {
    Remove();
    ok_ = Shell(absl::StrCat(
              "ip netns add ", kNamespace,
              " && ip link add dtrain-dr0 type veth peer name dtrain-dr1",
              " && ip link set dtrain-dr1 netns ", kNamespace, " && ip addr add ", kNodeZeroAddress,
              "/24 dev dtrain-dr0 && ip link set dtrain-dr0 up", " && ip -n ", kNamespace,
              " addr add ", kNodeOneAddress, "/24 dev dtrain-dr1 && ip -n ", kNamespace,
              " link set dtrain-dr1 up && ip -n ", kNamespace, " link set lo up")) == 0;
  }
  ~SecondNode() { Remove(); }
  bool ok() const { return ok_; }
  bool CutOff() {
    return Shell(absl::StrCat("ip -n ", kNamespace, " link set dtrain-dr1 down")) == 0;
  }

 private:
  static void Remove() {
    Shell(absl::StrCat("ip netns del ", kNamespace,
                       " 2>/dev/null; ip link del dtrain-dr0 2>/dev/null"));
  }
  bool ok_ = false;
};

struct ShellRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

inline ShellRun RunShell(const std::string& command) {
  ShellRun run;
  FILE* pipe = popen(absl::StrCat(command, " 2>&1").c_str(), "r");
  if (pipe == nullptr) return run;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) run.output.append(buffer, n);
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

// Whether this process may make network namespaces (root, with `ip netns`).
inline bool CanMakeNamespaces() {
  return geteuid() == 0 && Shell("ip netns list >/dev/null 2>&1") == 0;
}

}  // namespace dtrain::testing
