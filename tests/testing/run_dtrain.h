// Runs the dtrain binary (DTRAIN_BINARY) as a user would, for tests of whole commands.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace dtrain::testing {

struct Outcome {
  int exit_code = -1;
  std::string stdout_text;
  std::string stderr_text;
};

// A path in the test's temporary folder that no other test process uses (ctest runs tests in
// parallel, each in its own process, sharing the folder).
inline std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/", getpid(), "_", name);
}

// Runs `dtrain <args>` through the shell, capturing both streams.
inline Outcome RunDtrain(const std::string& args) {
  const std::string err_path = TempPath("dtrain_stderr.txt");
  const std::string command = absl::StrCat(DTRAIN_BINARY, " ", args, " 2>", err_path);
  Outcome outcome;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return outcome;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) {
    outcome.stdout_text.append(buffer, n);
  }
  const int status = pclose(pipe);
  outcome.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream err(err_path);
  outcome.stderr_text.assign(std::istreambuf_iterator<char>(err), {});
  return outcome;
}

// Writes `text` to TempPath(name); returns the path.
inline std::string WriteTempFile(const std::string& name, const std::string& text) {
  const std::string path = TempPath(name);
  std::ofstream(path) << text;
  return path;
}

}  // namespace dtrain::testing
