#include "parallel/store/wire.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace dtrain {
namespace {

void AppendLittleEndian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint64_t LoadLittleEndian(const char* bytes, int count) {
  uint64_t value = 0;
  for (int i = 0; i < count; ++i) {
    value |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  }
  return value;
}

uint32_t LoadU32(const char* bytes) { return static_cast<uint32_t>(LoadLittleEndian(bytes, 4)); }

}  // namespace

const char* StoreMessageName(StoreMessage type) {
  switch (type) {
    case StoreMessage::kHello:
      return "HELLO";
    case StoreMessage::kChallenge:
      return "CHALLENGE";
    case StoreMessage::kAuth:
      return "AUTH";
    case StoreMessage::kSet:
      return "SET";
    case StoreMessage::kGet:
      return "GET";
    case StoreMessage::kAdd:
      return "ADD";
    case StoreMessage::kCompareSet:
      return "COMPARE_SET";
    case StoreMessage::kWait:
      return "WAIT";
    case StoreMessage::kDelete:
      return "DELETE";
    case StoreMessage::kNumKeys:
      return "NUM_KEYS";
    case StoreMessage::kPing:
      return "PING";
    case StoreMessage::kAddOnClose:
      return "ADD_ON_CLOSE";
    case StoreMessage::kOk:
      return "OK";
    case StoreMessage::kValue:
      return "VALUE";
    case StoreMessage::kInt:
      return "INT";
    case StoreMessage::kBool:
      return "BOOL";
    case StoreMessage::kTimeout:
      return "TIMEOUT";
    case StoreMessage::kError:
      return "ERROR";
  }
  return "UNKNOWN";
}

size_t MaxFrameBytes(const StoreWireLimits& limits) {
  // type byte + three size fields + key + expected + desired.
  const size_t compare_set = 1 + 3 * 4 + limits.max_key_bytes + 2 * limits.max_value_bytes;
  const size_t wait = 1 + 4 + limits.max_wait_keys * (4 + limits.max_key_bytes) + 8;
  return std::max(compare_set, wait);
}

FrameWriter::FrameWriter(StoreMessage type) {
  frame_.assign(kFrameHeaderBytes, '\0');
  frame_.push_back(static_cast<char>(type));
}

FrameWriter& FrameWriter::U8(uint8_t value) {
  frame_.push_back(static_cast<char>(value));
  return *this;
}

FrameWriter& FrameWriter::U32(uint32_t value) {
  AppendLittleEndian(frame_, value, 4);
  return *this;
}

FrameWriter& FrameWriter::I64(int64_t value) {
  AppendLittleEndian(frame_, static_cast<uint64_t>(value), 8);
  return *this;
}

FrameWriter& FrameWriter::Raw(std::string_view bytes) {
  frame_.append(bytes);
  return *this;
}

FrameWriter& FrameWriter::Bytes(std::string_view bytes) {
  U32(static_cast<uint32_t>(bytes.size()));
  return Raw(bytes);
}

std::string FrameWriter::Finish() {
  std::string length;
  AppendLittleEndian(length, frame_.size() - kFrameHeaderBytes, 4);
  frame_.replace(0, kFrameHeaderBytes, length);
  return std::move(frame_);
}

absl::StatusOr<uint8_t> FrameReader::U8() {
  if (rest_.empty()) return absl::InvalidArgumentError("frame ends inside a u8 field");
  const uint8_t value = static_cast<uint8_t>(rest_[0]);
  rest_.remove_prefix(1);
  return value;
}

absl::StatusOr<uint32_t> FrameReader::U32() {
  if (rest_.size() < 4) return absl::InvalidArgumentError("frame ends inside a u32 field");
  const uint32_t value = LoadU32(rest_.data());
  rest_.remove_prefix(4);
  return value;
}

absl::StatusOr<int64_t> FrameReader::I64() {
  if (rest_.size() < 8) return absl::InvalidArgumentError("frame ends inside an i64 field");
  const int64_t value = static_cast<int64_t>(LoadLittleEndian(rest_.data(), 8));
  rest_.remove_prefix(8);
  return value;
}

absl::StatusOr<std::string> FrameReader::Raw(size_t bytes) {
  if (rest_.size() < bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("frame ends inside a %d-byte field (%d bytes left)", bytes, rest_.size()));
  }
  std::string value(rest_.substr(0, bytes));
  rest_.remove_prefix(bytes);
  return value;
}

absl::StatusOr<std::string> FrameReader::Bytes(size_t max_bytes) {
  absl::StatusOr<uint32_t> size = U32();
  if (!size.ok()) return size.status();
  if (*size > max_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "string field of %d bytes exceeds the limit of %d bytes", *size, max_bytes));
  }
  return Raw(*size);
}

absl::Status FrameReader::ExpectEnd() const {
  if (rest_.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("%d unexpected bytes after the last field of a frame", rest_.size()));
}

absl::StatusOr<uint32_t> ParseFrameLength(std::string_view header, size_t max_frame_bytes) {
  const uint32_t length = LoadU32(header.data());
  if (length == 0 || length > max_frame_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "frame length %d is outside the allowed range [1, %d] bytes", length, max_frame_bytes));
  }
  return length;
}

absl::StatusOr<std::optional<FrameView>> ParseFrame(std::string_view buffer,
                                                    size_t max_frame_bytes) {
  if (buffer.size() < kFrameHeaderBytes) return std::optional<FrameView>();
  absl::StatusOr<uint32_t> length = ParseFrameLength(buffer, max_frame_bytes);
  if (!length.ok()) return length.status();
  if (buffer.size() - kFrameHeaderBytes < *length) return std::optional<FrameView>();
  return std::optional<FrameView>(FrameView{
      .type = static_cast<StoreMessage>(buffer[kFrameHeaderBytes]),
      .payload = buffer.substr(kFrameHeaderBytes + 1, *length - 1),
      .frame_bytes = kFrameHeaderBytes + *length,
  });
}

}  // namespace dtrain
