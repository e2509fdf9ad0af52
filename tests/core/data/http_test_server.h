// range_server.py on loopback for the duration of a test: started with posix_spawn, its port
// read from its first stdout line (10 s limit), stopped with SIGTERM in the destructor.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "tests/core/data/tar_test_util.h"

extern char** environ;

namespace dtrain::testing {

class HttpTestServer {
 public:
  explicit HttpTestServer(const std::string& root, const std::vector<std::string>& flags = {}) {
    int fds[2];
    if (pipe(fds) != 0) return;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    std::vector<std::string> args = {"/usr/bin/python3", TestScript("range_server.py"), root};
    args.insert(args.end(), flags.begin(), flags.end());
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    pollfd ready = {.fd = fds[0], .events = POLLIN};
    std::string line;
    char c;
    while (poll(&ready, 1, 10000) == 1 && read(fds[0], &c, 1) == 1 && c != '\n') line += c;
    close(fds[0]);
    port_ = line.empty() ? 0 : std::stoi(line);
  }
  ~HttpTestServer() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
  }

  int port() const { return port_; }
  std::string Url(const std::string& path) const {
    return "http://127.0.0.1:" + std::to_string(port_) + "/" + path;
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace dtrain::testing
