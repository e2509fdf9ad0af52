// Helpers for the data tests: tar archives built in memory, Python writers, temporary folders.
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/data/tar_writer.h"

namespace dtrain::testing {

// A whole archive of regular files, with the two zero end blocks.
inline std::string TarArchive(const std::vector<std::pair<std::string, std::string>>& members,
                              TarSizeField size_field = TarSizeField::kOctalWhereItFits) {
  std::string tar;
  for (const auto& [name, data] : members) {
    const int64_t size = static_cast<int64_t>(data.size());
    tar += TarHeader(name, size, '0', size_field) + data + TarPadding(size);
  }
  return tar + TarEnd();
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

inline void WriteFile(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary) << data;
}

inline std::string TestScript(const std::string& name) {
  return std::string(DTRAIN_SOURCE_DIR) + "/tests/core/data/" + name;
}

// Runs Debian's python3 (the tests' scripts need only its standard library); true on success.
inline bool RunPython(const std::string& arguments) {
  return std::system(("/usr/bin/python3 " + arguments).c_str()) == 0;
}

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "dtrain_data_XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace dtrain::testing
