// Compressed files by their first bytes (gzip, zstd, xz, bzip2, zip): what dtrain reads as tar
// shards or packs as text must be unpacked first, and the errors say how.
#pragma once

#include <optional>
#include <string_view>

namespace dtrain {

struct CompressedFormat {
  const char* name;  // "gzip"
  // A filter from stdin to stdout: "gunzip -c" (empty for zip, whose reader needs a file).
  const char* unpack;
};

// The format whose magic bytes `head` (a file's first bytes) starts with; none for other bytes.
std::optional<CompressedFormat> CompressedFormatOf(std::string_view head);

}  // namespace dtrain
