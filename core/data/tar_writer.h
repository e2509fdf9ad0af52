// Writing tar archives: the ustar headers of the shards `dtrain data pack` writes and of the
// archives the tests build, in the forms TarReader reads back.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace dtrain {

// How a header's size field is written: 11 octal digits where they suffice (below 8 GiB), GNU
// base-256 above; or base-256 whatever the size (readers must accept both forms).
enum class TarSizeField { kOctalWhereItFits, kBase256 };

// One 512-byte ustar header with mode 0644, owner 0 and mtime 0 for a member of `size` bytes of
// entry `type` ('0' a regular file, '5' a directory, ...). Names longer than the 100-byte name
// field are cut: this writer has no prefix field or pax records.
std::string TarHeader(std::string_view name, int64_t size, char type = '0',
                      TarSizeField size_field = TarSizeField::kOctalWhereItFits);

// The zero bytes that pad a member of `size` bytes to whole 512-byte blocks.
std::string TarPadding(int64_t size);

// The two zero blocks that end an archive.
std::string TarEnd();

}  // namespace dtrain
