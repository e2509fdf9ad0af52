// Header layout (POSIX.1-1988 ustar, with GNU and pax extensions): name 0..99, size 124..135,
// checksum 148..155, typeflag 156, magic 257..262, version 263..264, prefix 345..499.
#include "core/data/tar_reader.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/data/compressed_format.h"
#include "core/util/status.h"

namespace dtrain {
namespace {

constexpr size_t kBlock = kTarBlockBytes;
constexpr size_t kReadAheadBytes = size_t{16} << 10;  // headers and small members
// Read behind a large member's data in the same system call: its padding and the next pax +
// ustar header pair (at most 511 + 1024 + 512 bytes for Python's writer), and little of the
// next member's data, which would be copied out of the read-ahead buffer once more.
constexpr size_t kTailBytes = 2048;
constexpr int64_t kMaxMetadataBytes = int64_t{1} << 20;  // pax and GNU long-name records
constexpr int64_t kFirstDataChunk = int64_t{1} << 20;    // member buffers grow from this

int64_t Padded(int64_t size) { return (size + 511) / 512 * 512; }

// A NUL-terminated field of at most `size` bytes.
std::string Field(const char* block, size_t offset, size_t size) {
  const char* start = block + offset;
  return std::string(start, strnlen(start, size));
}

// An octal field (digits, optionally led by spaces and ended by NUL or space) or GNU base-256
// (top bit of the first byte set; negative values are rejected).
bool ParseNumber(const char* field, size_t size, int64_t* value) {
  const auto first = static_cast<unsigned char>(field[0]);
  *value = 0;
  if (first & 0x80) {
    if (first == 0xff) return false;
    *value = first & 0x7f;
    for (size_t i = 1; i < size; ++i) {
      if (*value > (std::numeric_limits<int64_t>::max() >> 8)) return false;
      *value = (*value << 8) | static_cast<unsigned char>(field[i]);
    }
    return true;
  }
  size_t i = 0;
  while (i < size && field[i] == ' ') ++i;
  for (; i < size && field[i] != '\0' && field[i] != ' '; ++i) {
    if (field[i] < '0' || field[i] > '7') return false;
    if (*value > (std::numeric_limits<int64_t>::max() >> 3)) return false;
    *value = *value * 8 + (field[i] - '0');
  }
  return true;
}

// The checksum is the sum of the header's bytes with the checksum field read as spaces;
// historic writers summed signed chars, so both sums are accepted.
bool ChecksumMatches(const char* block) {
  int64_t stored = 0;
  if (!ParseNumber(block + 148, 8, &stored)) return false;
  // Whole-block sums (a loop the compiler vectorizes), then the field swapped for spaces.
  int32_t unsigned_sum = 0;
  int32_t signed_sum = 0;
  for (size_t i = 0; i < kBlock; ++i) {
    unsigned_sum += static_cast<unsigned char>(block[i]);
    signed_sum += static_cast<signed char>(block[i]);
  }
  for (size_t i = 148; i < 156; ++i) {
    unsigned_sum += ' ' - static_cast<unsigned char>(block[i]);
    signed_sum += ' ' - static_cast<signed char>(block[i]);
  }
  return stored == unsigned_sum || stored == signed_sum;
}

bool IsZeroBlock(const char* block) {
  return std::all_of(block, block + kBlock, [](char c) { return c == 0; });
}

// Pax extended header records, "<length> <key>=<value>\n"; only path and size matter here.
bool ParsePax(absl::string_view records, std::string* path, int64_t* size) {
  while (!records.empty()) {
    const size_t space = records.find(' ');
    size_t length = 0;
    if (space == absl::string_view::npos || !absl::SimpleAtoi(records.substr(0, space), &length) ||
        length <= space + 1 || length > records.size() || records[length - 1] != '\n') {
      return false;
    }
    const absl::string_view record = records.substr(space + 1, length - space - 2);
    const size_t equals = record.find('=');
    if (equals == absl::string_view::npos) return false;
    const absl::string_view key = record.substr(0, equals);
    const absl::string_view value = record.substr(equals + 1);
    if (key == "path") *path = std::string(value);
    if (key == "size" && (!absl::SimpleAtoi(value, size) || *size < 0)) return false;
    records.remove_prefix(length);
  }
  return true;
}

}  // namespace

bool IsTarHeader(std::string_view head) {
  return head.size() >= kBlock && !IsZeroBlock(head.data()) && ChecksumMatches(head.data());
}

TarReader::TarReader(ByteSource* source, int64_t max_member_bytes)
    : source_(source), max_member_bytes_(max_member_bytes), buffer_(kReadAheadBytes) {}

absl::Status TarReader::Error(int64_t offset, const std::string& what) const {
  return absl::DataLossError(absl::StrCat("shard ", url(), ", byte ", offset, ": ", what));
}

absl::StatusOr<size_t> TarReader::ReadUpTo(char* out, size_t n) {
  size_t done = 0;
  while (done < n) {
    if (buffer_head_ < buffer_end_) {
      const size_t count = std::min(n - done, buffer_end_ - buffer_head_);
      std::memcpy(out + done, buffer_.data() + buffer_head_, count);
      buffer_head_ += count;
      done += count;
      continue;
    }
    // Large reads bypass the read-ahead buffer (one copy, as `cat` makes); what arrives beyond
    // them lands in the empty read-ahead buffer.
    const size_t wanted = n - done;
    const bool direct = wanted >= buffer_.size();
    absl::StatusOr<size_t> got =
        direct ? source_->ReadWithTail(out + done, wanted, buffer_.data(), kTailBytes)
               : source_->Read(buffer_.data(), buffer_.size());
    if (!got.ok()) {
      return absl::Status(got.status().code(), absl::StrCat(got.status().message(), " (at byte ",
                                                            offset_ + int64_t(done), ")"));
    }
    if (*got == 0) break;
    const size_t into_out = direct ? std::min(*got, wanted) : 0;
    done += into_out;
    buffer_head_ = 0;
    buffer_end_ = *got - into_out;
  }
  offset_ += static_cast<int64_t>(done);
  return done;
}

absl::Status TarReader::ReadBlock(char* block, const char* what) {
  const int64_t start = offset_;
  ASSIGN_OR_RETURN(const size_t got, ReadUpTo(block, kBlock));
  if (got == 0) {
    return Error(start, absl::StrCat("the archive ends without ", what,
                                     ": the shard was cut (possibly exactly between members); "
                                     "copy or write it again"));
  }
  if (got < kBlock && start == 0) {
    return Error(start, absl::StrCat("the shard holds ", got,
                                     " bytes, less than a tar header's 512: it is no tar archive "
                                     "(or was cut to nothing)"));
  }
  if (got < kBlock) {
    return Error(start, absl::StrCat("the archive ends inside a 512-byte header (", got,
                                     " bytes): the shard was cut; copy or write it again"));
  }
  return absl::OkStatus();
}

absl::Status TarReader::ReadData(int64_t size, const std::string& name, int64_t header_offset,
                                 std::string* out) {
  // Grow as bytes arrive rather than trusting the header, so a corrupt size in a short shard
  // costs no more memory than the shard itself. `out` keeps its old bytes until overwritten:
  // a recycled buffer of a similar member needs no zero-filling.
  int64_t done = 0;
  while (done < size) {
    const int64_t target = std::min(size, std::max(2 * done, kFirstDataChunk));
    if (static_cast<int64_t>(out->size()) < target) out->resize(static_cast<size_t>(target));
    const int64_t chunk = target - done;
    ASSIGN_OR_RETURN(const size_t got, ReadUpTo(out->data() + done, static_cast<size_t>(chunk)));
    done += static_cast<int64_t>(got);
    if (static_cast<int64_t>(got) < chunk) {
      return Error(offset_,
                   absl::StrCat("member '", name, "' (header at byte ", header_offset,
                                ") declares ", size, " bytes but the archive ends after ", done,
                                " of them: the shard was cut; copy or write it "
                                "again"));
    }
  }
  out->resize(static_cast<size_t>(size));
  return SkipPadding(size);
}

absl::Status TarReader::SkipData(int64_t size, const std::string& name, int64_t header_offset) {
  const int64_t padded = Padded(size);
  std::vector<char> scratch(static_cast<size_t>(std::min<int64_t>(padded, kMaxMetadataBytes)));
  for (int64_t done = 0; done < padded;) {
    const size_t chunk = static_cast<size_t>(std::min<int64_t>(padded - done, scratch.size()));
    ASSIGN_OR_RETURN(const size_t got, ReadUpTo(scratch.data(), chunk));
    done += static_cast<int64_t>(got);
    if (got < chunk) {
      return Error(offset_, absl::StrCat("entry '", name, "' (header at byte ", header_offset,
                                         ") is cut short: the shard was cut"));
    }
  }
  return absl::OkStatus();
}

absl::Status TarReader::SkipPadding(int64_t size) {
  char scratch[kBlock];
  const int64_t padding = Padded(size) - size;
  ASSIGN_OR_RETURN(const size_t got, ReadUpTo(scratch, static_cast<size_t>(padding)));
  if (static_cast<int64_t>(got) < padding) {
    return Error(offset_, "the archive ends inside a member's padding: the shard was cut");
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> TarReader::Next(TarMember* member) {
  if (ended_) return false;
  std::string long_name;  // from a GNU 'L' record, for the next header
  std::string pax_path;   // from a pax 'x' record, for the next header
  int64_t pax_size = -1;
  std::string metadata;
  char block[kBlock];
  while (true) {
    const int64_t header_offset = offset_;
    RETURN_IF_ERROR(ReadBlock(block, "the two zero blocks that close a tar archive"));
    if (IsZeroBlock(block)) {
      RETURN_IF_ERROR(ReadBlock(block, "the second of its two zero end blocks"));
      if (!IsZeroBlock(block)) {
        return Error(header_offset, "a zero block inside the archive: it is corrupt");
      }
      ended_ = true;
      // Drain the rest (writers pad to a record, 10 KiB by default), so a pipe's writer
      // finishes cleanly and an HTTP body is read to its end; a source that goes on far past
      // any record (a device such as /dev/zero) is not an archive's padding.
      constexpr int64_t kMaxPadding = int64_t{16} << 20;
      const int64_t end_offset = offset_;
      offset_ += static_cast<int64_t>(buffer_end_ - buffer_head_);
      buffer_head_ = buffer_end_;
      while (true) {
        absl::StatusOr<size_t> got = source_->Read(buffer_.data(), buffer_.size());
        if (!got.ok()) {
          return absl::Status(got.status().code(),
                              absl::StrCat(got.status().message(), " (at byte ", offset_, ")"));
        }
        if (*got == 0) break;
        offset_ += static_cast<int64_t>(*got);
        if (offset_ - end_offset > kMaxPadding) {
          return Error(end_offset,
                       "more than 16 MiB follow the archive's end blocks, which a "
                       "tar writer pads to a record: this is not one archive");
        }
      }
      return false;
    }
    if (!ChecksumMatches(block)) {
      if (const std::optional<CompressedFormat> format =
              CompressedFormatOf(std::string_view(block, kBlock));
          format && header_offset == 0) {
        const bool remote = url().starts_with("http://") || url().starts_with("https://");
        return Error(
            header_offset,
            absl::StrCat(
                "the shard is ", format->name, "-compressed, and dtrain reads plain tar: unpack it",
                *format->unpack == '\0'
                    ? ""
                    : absl::StrCat(", or read it as pipe:",
                                   remote ? absl::StrCat("curl -sfL ", url(), " | ", format->unpack)
                                          : absl::StrCat(format->unpack, " ", url()))));
      }
      return Error(header_offset,
                   "header checksum mismatch: the shard is corrupt or not a tar file");
    }
    const char type = block[156];
    int64_t size = 0;
    if (!ParseNumber(block + 124, 12, &size)) {
      return Error(header_offset, "the header's size field is not a number: the shard is corrupt");
    }
    const bool is_metadata = type == 'x' || type == 'g' || type == 'L' || type == 'K';
    if (!is_metadata && pax_size >= 0) size = pax_size;
    const int64_t limit = is_metadata ? kMaxMetadataBytes : max_member_bytes_;
    if (size > limit) {
      return Error(header_offset, absl::StrCat("entry of type '", std::string(1, type),
                                               "' declares ", size, " bytes, more than the ", limit,
                                               "-byte limit: the shard is corrupt"));
    }
    if (type == 'x' || type == 'L') {
      RETURN_IF_ERROR(
          ReadData(size, type == 'x' ? "pax header" : "GNU long name", header_offset, &metadata));
      if (type == 'L') {
        long_name.assign(metadata.c_str());  // NUL-terminated inside the record
      } else if (!ParsePax(metadata, &pax_path, &pax_size)) {
        return Error(header_offset, "malformed pax extended header: the shard is corrupt");
      }
      continue;
    }
    std::string name;
    if (!pax_path.empty()) {
      name = pax_path;
    } else if (!long_name.empty()) {
      name = long_name;
    } else {
      name = Field(block, 0, 100);
      const bool posix = std::memcmp(block + 257, "ustar\0", 6) == 0;
      const std::string prefix = posix ? Field(block, 345, 155) : "";
      if (!prefix.empty()) name = absl::StrCat(prefix, "/", name);
    }
    long_name.clear();
    pax_path.clear();
    pax_size = -1;
    const bool regular = type == '0' || type == '\0' || type == '7';
    if (!regular) {
      // Entries we skip (directories, links, devices, 'g' records) may still carry data.
      RETURN_IF_ERROR(SkipData(size, name, header_offset));
      continue;
    }
    member->name = std::move(name);
    member->offset = header_offset;
    RETURN_IF_ERROR(ReadData(size, member->name, header_offset, &member->data));
    return true;
  }
}

}  // namespace dtrain
