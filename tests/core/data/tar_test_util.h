// Helpers for the data tests: tar archives built in memory, Python writers, temporary folders.
#pragma once

#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::testing {

// One 512-byte ustar header; `base256` writes the size in GNU base-256 form.
inline std::string TarHeader(const std::string& name, int64_t size, char type = '0',
                             bool base256 = false) {
  std::string block(512, '\0');
  name.copy(block.data(), std::min<size_t>(name.size(), 100));
  std::snprintf(block.data() + 100, 8, "%07o", 0644);
  std::snprintf(block.data() + 108, 8, "%07o", 0);
  std::snprintf(block.data() + 116, 8, "%07o", 0);
  if (base256) {
    block[124] = static_cast<char>(0x80);
    for (int i = 0; i < 8; ++i) block[135 - i] = static_cast<char>((size >> (8 * i)) & 0xff);
  } else {
    std::snprintf(block.data() + 124, 12, "%011llo", static_cast<unsigned long long>(size));
  }
  std::snprintf(block.data() + 136, 12, "%011o", 0);
  block[156] = type;
  std::memcpy(block.data() + 257,
              "ustar\0"
              "00",
              8);
  std::memset(block.data() + 148, ' ', 8);
  unsigned sum = 0;
  for (unsigned char c : block) sum += c;
  std::snprintf(block.data() + 148, 8, "%06o", sum);
  return block;
}

inline std::string Padded(std::string data) {
  data.resize((data.size() + 511) / 512 * 512, '\0');
  return data;
}

// A whole archive of regular files, with the two zero end blocks.
inline std::string TarArchive(const std::vector<std::pair<std::string, std::string>>& members,
                              bool base256 = false) {
  std::string tar;
  for (const auto& [name, data] : members) {
    tar += TarHeader(name, static_cast<int64_t>(data.size()), '0', base256) + Padded(data);
  }
  return tar + std::string(1024, '\0');
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
