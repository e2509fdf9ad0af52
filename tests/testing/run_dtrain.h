// Runs the dtrain binary (DTRAIN_BINARY) as a user would, for tests of whole commands.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/io/safetensors.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

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

// Runs `<prefix> dtrain <args>` through the shell, capturing both streams. `prefix` may set the
// environment, e.g. "env -i RANK=1".
inline Outcome RunDtrain(const std::string& args, const std::string& prefix = "") {
  const std::string err_path = TempPath("dtrain_stderr.txt");
  const std::string command = absl::StrCat(prefix, " ", DTRAIN_BINARY, " ", args, " 2>", err_path);
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

// A RunDtrain prefix that runs dtrain in a mount namespace of its own, with a tmpfs of `kib` KiB
// (and mount options `options`, such as ",nr_inodes=4" or ",ro") over the folder `dir` (created
// here): a file system that fills up. The shell commands `then` run after the mount. Empty when
// this process cannot make one (it needs root and unshare -m); the test then skips.
inline std::string SmallFileSystemPrefix(const std::string& dir, int kib,
                                         const std::string& options = "",
                                         const std::string& then = "true") {
  if (geteuid() != 0 || std::system("unshare -m true 2>/dev/null") != 0) return "";
  std::filesystem::create_directories(dir);
  return absl::StrCat("unshare -m sh -c 'mount -t tmpfs -o size=", kib, "k", options, " none ", dir,
                      " && ", then, " && exec \"$0\" \"$@\"'");
}

// TempPath(name) as an empty folder's path (whatever an earlier run left there is removed).
inline std::string FreshTempDir(const std::string& name) {
  const std::string dir = TempPath(name);
  std::filesystem::remove_all(dir);
  return dir;
}

// The "loss" of every line of a run's metrics.jsonl, in step order.
inline std::vector<double> MetricsLosses(const std::string& metrics_path) {
  std::vector<double> losses;
  std::ifstream in(metrics_path);
  for (std::string line; std::getline(in, line);) {
    losses.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  }
  return losses;
}

// What a run's metrics.jsonl says, each in step order (val_loss: the steps that evaluated;
// tp_sent_bytes, pp_sent_bytes: 0 where the line has none).
struct RunMetrics {
  std::vector<double> loss, grad_norm, val_loss, tp_sent_bytes, pp_sent_bytes, exposed_comm_ms;
};

inline RunMetrics ReadRunMetrics(const std::string& metrics_path) {
  RunMetrics metrics;
  std::ifstream in(metrics_path);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    metrics.loss.push_back(j["loss"].get<double>());
    metrics.grad_norm.push_back(j["grad_norm"].get<double>());
    metrics.tp_sent_bytes.push_back(j.value("tp_sent_bytes", 0.0));
    metrics.pp_sent_bytes.push_back(j.value("pp_sent_bytes", 0.0));
    metrics.exposed_comm_ms.push_back(j.value("exposed_comm_ms", 0.0));
    if (j.contains("val_loss") && !j["val_loss"].is_null()) {
      metrics.val_loss.push_back(j["val_loss"].get<double>());
    }
  }
  return metrics;
}

// The tensors of the safetensors file at `path` (nothing, with a test failure naming it, when it
// cannot be read): a run's exported weights.
inline SafetensorsContents ReadWeights(const std::string& path) {
  absl::StatusOr<SafetensorsContents> contents = ReadSafetensors(path);
  EXPECT_TRUE(contents.ok()) << path << ": " << contents.status();
  return contents.ok() ? *std::move(contents) : SafetensorsContents{};
}

// `actual` holds every tensor of `expected` (which must hold some) under the same name and shape,
// each value within `tolerance` of expected's.
inline void ExpectWeightsNear(const SafetensorsContents& actual,
                              const SafetensorsContents& expected, double tolerance) {
  ASSERT_FALSE(expected.floats.empty());
  EXPECT_EQ(actual.shapes, expected.shapes);
  for (const auto& [name, values] : expected.floats) {
    const auto it = actual.floats.find(name);
    ASSERT_NE(it, actual.floats.end()) << name;
    ASSERT_EQ(it->second.size(), values.size()) << name;
    for (size_t i = 0; i < values.size(); ++i) {
      ASSERT_NEAR(it->second[i], values[i], tolerance) << name << " element " << i;
    }
  }
}

// Writes `text` to TempPath(name); returns the path.
inline std::string WriteTempFile(const std::string& name, const std::string& text) {
  const std::string path = TempPath(name);
  std::ofstream(path) << text;
  return path;
}

}  // namespace dtrain::testing
