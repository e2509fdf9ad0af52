// Byte sizes as people write them on a command line: 4096, 64K, 1.5MB, 1GiB.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {

// A positive number, optionally fractional, with an optional unit (any case): none or B, bytes;
// K, M, G and KiB, MiB, GiB, powers of 1024 (as nccl-tests and dd read K, M, G); KB, MB, GB,
// powers of 1000. Rounded down to whole bytes. InvalidArgument naming `name` (the option) and
// `text` for anything else, for less than `minimum` bytes, and for more than 2^62 bytes.
absl::StatusOr<int64_t> ParseByteSize(absl::string_view name, absl::string_view text,
                                      int64_t minimum = 1);

}  // namespace dtrain
