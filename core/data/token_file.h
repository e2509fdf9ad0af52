// Token arrays from files on disk: the foundation data source (a token array in memory).
//
// Formats (data.format): "text" reads every byte of a file as one token 0..255; "llmc" reads
// llm.c token shards: a 256 x int32 little-endian header (header[0] = 20240520 magic,
// header[1] = 1 version, header[2] = token count) followed by that many uint16 tokens.
// Files are concatenated in the order given. Tokens are held as int32 in host memory (4 bytes per
// token); larger corpora stream through the WebDataset loader instead.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dtrain {

enum class TokenFormat { kText, kLlmc };

// "text" | "llmc"; anything else is InvalidArgument naming it.
absl::StatusOr<TokenFormat> ParseTokenFormat(const std::string& name);

// Expands each glob(3) pattern, sorting each pattern's matches bytewise (not by locale) and
// keeping the patterns' order. A pattern that matches nothing is NotFound naming it.
absl::StatusOr<std::vector<std::string>> ExpandFilePatterns(
    const std::vector<std::string>& patterns);

// Reads and concatenates the tokens of `files`. Errors name the file and the fix: unreadable
// file, a folder or other file that is not a regular one, text that is an archive (tar or
// compressed), llm.c header with a wrong magic or version or a size that disagrees with its token
// count, a token >= vocab_size (with its position in the file). The folder, other-file and archive
// errors ask for kExitUsage: a restart would meet them again.
absl::StatusOr<std::vector<int32_t>> LoadTokenFiles(const std::vector<std::string>& files,
                                                    TokenFormat format, int vocab_size);

}  // namespace dtrain
