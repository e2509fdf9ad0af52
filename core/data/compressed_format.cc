#include "core/data/compressed_format.h"

#include <array>
#include <utility>

namespace dtrain {

std::optional<CompressedFormat> CompressedFormatOf(std::string_view head) {
  using namespace std::string_view_literals;
  static constexpr std::array<std::pair<std::string_view, CompressedFormat>, 4> kMagic = {{
      {"\x1f\x8b"sv, {"gzip", "gunzip -c"}},
      {"\x28\xb5\x2f\xfd"sv, {"zstd", "zstd -dc"}},
      {"\xfd"
       "7zXZ\0"sv,
       {"xz", "xz -dc"}},
      {"PK\x03\x04"sv, {"zip", ""}},
  }};
  for (const auto& [magic, format] : kMagic) {
    if (head.substr(0, magic.size()) == magic) return format;
  }
  // bzip2: "BZh", the block size '1' to '9', then a block's magic (pi's digits) or, empty, the
  // stream's end (sqrt(pi)'s): text may well begin "BZh".
  const std::string_view after = head.substr(std::min<size_t>(head.size(), 4), 6);
  if (head.starts_with("BZh") && head.size() >= 4 && head[3] >= '1' && head[3] <= '9' &&
      (after == "\x31\x41\x59\x26\x53\x59"sv || after == "\x17\x72\x45\x38\x50\x90"sv)) {
    return CompressedFormat{"bzip2", "bzip2 -dc"};
  }
  return std::nullopt;
}

}  // namespace dtrain
