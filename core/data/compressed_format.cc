#include "core/data/compressed_format.h"

#include <array>
#include <utility>

namespace dtrain {

std::optional<CompressedFormat> CompressedFormatOf(std::string_view head) {
  using namespace std::string_view_literals;
  static constexpr std::array<std::pair<std::string_view, CompressedFormat>, 5> kMagic = {{
      {"\x1f\x8b"sv, {"gzip", "gunzip -c"}},
      {"\x28\xb5\x2f\xfd"sv, {"zstd", "zstd -dc"}},
      {"\xfd"
       "7zXZ\0"sv,
       {"xz", "xz -dc"}},
      {"BZh"sv, {"bzip2", "bzip2 -dc"}},
      {"PK\x03\x04"sv, {"zip", ""}},
  }};
  for (const auto& [magic, format] : kMagic) {
    if (head.substr(0, magic.size()) == magic) return format;
  }
  return std::nullopt;
}

}  // namespace dtrain
