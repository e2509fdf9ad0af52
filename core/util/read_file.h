// Reading a whole input file, or opening one to stream, with errors that say why: a folder opens
// as a stream and fails at its first read (std::istreambuf_iterator throws), so it is refused
// before.
#pragma once

#include <fstream>
#include <string>

#include "absl/status/statusor.h"

namespace dtrain {

// `path` opened for reading: NotFound when it does not exist, InvalidArgument when it is a folder,
// otherwise the error of open(2) with its errno; each names `path`.
absl::StatusOr<std::ifstream> OpenInputFile(const std::string& path);

// The bytes of the file at `path`: OpenInputFile's errors, or the read's with its errno.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

}  // namespace dtrain
