// A streaming tar reader: regular files in archive order from a ByteSource, never seeking.
//
// Reads ustar (prefix + "/" + name), GNU (long names in 'L' records, base-256 sizes) and pax
// ('x' records override path and size) headers, and verifies every header checksum. The
// archive must end with two zero blocks, so a shard cut anywhere, even exactly between members,
// is an error. Errors are DataLoss naming the URL and byte offset. Borrows the source; one thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/data/shard_source.h"

namespace dtrain {

struct TarMember {
  std::string name;
  std::string data;
  int64_t offset = 0;  // byte offset of the member's first header in the archive
};

// Bytes of a tar header, and of each block of a member's data.
inline constexpr size_t kTarBlockBytes = 512;

// Whether `head`, a file's first bytes (kTarBlockBytes or more), begins with a tar header whose
// checksum holds: a WebDataset shard, say, where text was expected.
bool IsTarHeader(std::string_view head);

class TarReader {
 public:
  // Members larger than `max_member_bytes` are an error (a corrupt size must not exhaust
  // memory).
  explicit TarReader(ByteSource* source, int64_t max_member_bytes = int64_t{1} << 32);

  // The next regular file into *member (other entry types are skipped): true, or false after the
  // end blocks, once the rest of the source has been drained.
  absl::StatusOr<bool> Next(TarMember* member);

  const std::string& url() const { return source_->url(); }
  int64_t offset() const { return offset_; }  // bytes consumed so far

 private:
  // Copies exactly `n` bytes into `out`; returns fewer only at the end of the source.
  absl::StatusOr<size_t> ReadUpTo(char* out, size_t n);
  absl::Status ReadBlock(char* block, const char* what);
  absl::Status ReadData(int64_t size, const std::string& name, int64_t header_offset,
                        std::string* out);
  absl::Status SkipData(int64_t size, const std::string& name, int64_t header_offset);
  absl::Status SkipPadding(int64_t size);
  absl::Status Error(int64_t offset, const std::string& what) const;

  ByteSource* source_;
  int64_t max_member_bytes_;
  std::vector<char> buffer_;  // read-ahead: [buffer_head_, buffer_end_) not yet consumed
  size_t buffer_head_ = 0;
  size_t buffer_end_ = 0;
  int64_t offset_ = 0;
  bool ended_ = false;
};

}  // namespace dtrain
