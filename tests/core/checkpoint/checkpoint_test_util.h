// Test helper: a two-tensor state written by `world` ranks (threads), each its share of every
// tensor, like the engine's SavedState. Header-only (tests/CMakeLists.txt compiles *_test.cc).
#pragma once

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/checkpoint/writer.h"
#include "tests/testing/run_dtrain.h"

namespace dtrain::testing {

// "a" has 10 values (i), "b" 7 values (100 + i); step s adds s to every value.
inline std::vector<float> TensorValues(const std::string& name, int64_t step) {
  std::vector<float> values(name == "a" ? 10 : 7);
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = static_cast<float>((name == "a" ? 0 : 100) + i + step);
  }
  return values;
}

inline Manifest BaseManifest() {
  Manifest m;
  m.dtrain_version = "test";
  m.recipe_yaml = "run:\n  seed: 1\n";
  m.tensors = {{"a", {2, 5}, 10}, {"b", {7}, 7}};
  return m;
}

inline SaveRequest RequestFor(const std::string& dir, int64_t step, int rank, int world,
                              const std::vector<std::vector<float>>& tensors) {
  SaveRequest r;
  r.dir = dir;
  r.step = step;
  r.rank = rank;
  r.world = world;
  r.nonce = 42 + static_cast<uint64_t>(step);
  r.timeout_s = 10;
  r.keep_last = 2;
  r.data = LoaderState{step * 8, absl::StrCat("cursor of rank ", rank, "\n")};
  r.manifest = BaseManifest();
  r.manifest.optimizer_step = step;
  for (int t = 0; t < 2; ++t) {
    const TensorRecord& record = r.manifest.tensors[t];
    const int64_t n = static_cast<int64_t>(tensors[t].size());
    const int64_t share = (n + world - 1) / world;
    const int64_t begin = std::min(n, rank * share), end = std::min(n, begin + share);
    AppendFlatRangeChunks(record.name, record.shape, begin, end, tensors[t].data() + begin,
                          r.chunks);
  }
  return r;
}

// Saves step `step` from `world` ranks; returns rank 0's status.
inline absl::Status SaveStep(const std::string& dir, int64_t step, int world = 2) {
  const std::vector<std::vector<float>> tensors = {TensorValues("a", step),
                                                   TensorValues("b", step)};
  std::vector<std::thread> others;
  for (int rank = 1; rank < world; ++rank) {
    others.emplace_back(
        [&, rank] { (void)WriteCheckpoint(RequestFor(dir, step, rank, world, tensors)); });
  }
  const absl::Status saved = WriteCheckpoint(RequestFor(dir, step, 0, world, tensors));
  for (std::thread& t : others) t.join();
  return saved;
}

inline std::string FreshDir(const std::string& name) {
  const std::string dir = TempPath(name);
  std::filesystem::remove_all(dir);
  return dir;
}

}  // namespace dtrain::testing
