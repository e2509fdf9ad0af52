// Rewrites a checkpoint's manifest the way format version 1 wrote it, for tests that older
// checkpoints still load.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "core/checkpoint/box.h"
#include "nlohmann/json.hpp"

namespace dtrain::testing {

// Chunks as flat element ranges [begin, end), no data types. Each chunk must be one run of its
// tensor (as every chunk of a version 1 layout was: a data-parallel shard's flat range), so its
// range starts at its first element's flat position.
inline void RewriteAsVersion1(const std::string& step_dir) {
  using Json = nlohmann::json;
  const std::string path = step_dir + "/manifest.json";
  Json manifest = Json::parse(std::ifstream(path));
  manifest["format_version"] = 1;
  manifest.erase("crc32c");  // which version 1 did not write
  std::map<std::string, std::vector<int64_t>> shapes;
  for (Json& tensor : manifest["tensors"]) {
    shapes[tensor["name"]] = tensor["shape"].get<std::vector<int64_t>>();
    tensor.erase("dtype");
  }
  for (Json& chunk : manifest["chunks"]) {
    const Box box{chunk["offsets"].get<std::vector<int64_t>>(),
                  chunk["lengths"].get<std::vector<int64_t>>()};
    const int64_t begin = FlatIndexOfFirst(box, shapes[chunk["tensor"]]);
    chunk["begin"] = begin;
    chunk["end"] = begin + BoxNumel(box);
    for (const char* key : {"offsets", "lengths", "dtype"}) chunk.erase(key);
  }
  std::ofstream(path) << manifest.dump(1);
}

}  // namespace dtrain::testing
