#include "core/data/tar_writer.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace dtrain {

namespace {
constexpr size_t kBlockBytes = 512;
constexpr int64_t kMaxOctalSize = (int64_t{1} << 33) - 1;  // 11 octal digits
}  // namespace

std::string TarHeader(std::string_view name, int64_t size, char type, TarSizeField size_field) {
  std::string block(kBlockBytes, '\0');
  name.copy(block.data(), std::min<size_t>(name.size(), 100));
  std::snprintf(block.data() + 100, 8, "%07o", 0644);
  std::snprintf(block.data() + 108, 8, "%07o", 0);
  std::snprintf(block.data() + 116, 8, "%07o", 0);
  if (size_field == TarSizeField::kBase256 || size > kMaxOctalSize) {
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
  // The checksum counts its own field as spaces.
  std::memset(block.data() + 148, ' ', 8);
  unsigned sum = 0;
  for (const char c : block) sum += static_cast<unsigned char>(c);
  std::snprintf(block.data() + 148, 8, "%06o", sum);
  return block;
}

std::string TarPadding(int64_t size) {
  return std::string((kBlockBytes - static_cast<size_t>(size) % kBlockBytes) % kBlockBytes, '\0');
}

std::string TarEnd() { return std::string(2 * kBlockBytes, '\0'); }

}  // namespace dtrain
