// The rendezvous store's wire format: length-prefixed frames of little-endian fields, shared by
// TcpStoreServer and TcpStoreClient. Pure functions over bytes; no sockets, no threads.
//
// A frame is `u32 length | u8 type | payload`, where `length` counts the type byte and the
// payload and may not exceed MaxFrameBytes(limits). Payload fields are u8, u32, i64 (little
// endian) and byte strings (`u32 size | bytes`). A frame that breaks any rule closes its
// connection.
//
// Handshake (every connection, before any request):
//   client -> kHello      magic u32, version u32, client nonce (32 bytes)
//   server -> kChallenge  auth_required u8, server nonce, server proof (32 bytes each; zero
//                         when no token)        or kError (version mismatch, refused peer)
//   client -> kAuth       client proof (32 bytes; empty when no token)
//   server -> kOk                               or kError (wrong token), then closes
// Proofs are HMAC-SHA256(token, label || client nonce || server nonce), see auth.h.
//
// Requests (one outstanding per connection) and their replies:
//   kSet         key, value                    -> kOk
//   kGet         key, timeout_ms i64           -> kValue value | kTimeout
//   kAdd         key, delta i64                -> kInt new value | kError (value not an integer)
//   kCompareSet  key, expected, desired        -> kValue value afterwards ("" when absent)
//   kWait        count u32, keys, timeout_ms   -> kOk | kTimeout
//   kDelete      key                           -> kBool existed
//   kNumKeys                                   -> kInt count
//   kPing                                      -> kOk
//   kAddOnClose  key, delta i64                -> kOk; when this connection closes (the client
//                exits, is killed, or its host is gone) the server adds `delta` to `key`, as
//                kAdd would: how the others learn that a participant is lost
// kTimeout carries `count u32, keys` still missing; kError carries `code u8, message`.
// A negative timeout_ms waits forever.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dtrain {

// "DTRS" read as a little-endian u32: the first field of every kHello.
inline constexpr uint32_t kStoreMagic = 0x53525444;
inline constexpr uint32_t kStoreProtocolVersion = 2;

enum class StoreMessage : uint8_t {
  // Handshake.
  kHello = 1,
  kChallenge = 2,
  kAuth = 3,
  // Requests.
  kSet = 10,
  kGet = 11,
  kAdd = 12,
  kCompareSet = 13,
  kWait = 14,
  kDelete = 15,
  kNumKeys = 16,
  kPing = 17,
  kAddOnClose = 18,
  // Replies.
  kOk = 30,
  kValue = 31,
  kInt = 32,
  kBool = 33,
  kTimeout = 34,
  kError = 35,
};

const char* StoreMessageName(StoreMessage type);

struct StoreWireLimits {
  size_t max_key_bytes = 4 << 10;
  size_t max_value_bytes = 64 << 20;
  // Keys named by one kWait (bounds a frame that is all keys).
  size_t max_wait_keys = 16 << 10;
};

// The largest legal `length` field: a kCompareSet with two maximal values.
size_t MaxFrameBytes(const StoreWireLimits& limits);

inline constexpr size_t kFrameHeaderBytes = 4;
// Frames before the handshake completes are tiny; a peer that has not authenticated cannot make
// the server buffer more than this.
inline constexpr size_t kMaxHandshakeFrameBytes = 1024;

// Builds one frame; the length prefix is filled in by Finish().
class FrameWriter {
 public:
  explicit FrameWriter(StoreMessage type);

  FrameWriter& U8(uint8_t value);
  FrameWriter& U32(uint32_t value);
  FrameWriter& I64(int64_t value);
  // Appends raw bytes without a size (fixed-size fields such as nonces).
  FrameWriter& Raw(std::string_view bytes);
  FrameWriter& Bytes(std::string_view bytes);
  // Returns the frame; the writer is left empty.
  std::string Finish();

 private:
  std::string frame_;
};

// Reads the payload of one frame; every getter fails (InvalidArgument) past the end, and a
// string longer than `max_bytes` is rejected before it is copied.
class FrameReader {
 public:
  explicit FrameReader(std::string_view payload) : rest_(payload) {}

  absl::StatusOr<uint8_t> U8();
  absl::StatusOr<uint32_t> U32();
  absl::StatusOr<int64_t> I64();
  absl::StatusOr<std::string> Raw(size_t bytes);
  absl::StatusOr<std::string> Bytes(size_t max_bytes);
  // Fails when bytes are left over: a frame must hold exactly its fields.
  absl::Status ExpectEnd() const;

 private:
  std::string_view rest_;
};

struct FrameView {
  StoreMessage type;
  std::string_view payload;
  // Bytes of `buffer` the frame occupies, header included.
  size_t frame_bytes;
};

// The `length` field of a frame header (kFrameHeaderBytes bytes); an error for a zero or
// oversize length.
absl::StatusOr<uint32_t> ParseFrameLength(std::string_view header, size_t max_frame_bytes);

// Parses the frame at the start of `buffer`: nullopt while it is incomplete, an error for a zero
// or oversize length. Unknown types are left to the caller, which knows what it expects.
absl::StatusOr<std::optional<FrameView>> ParseFrame(std::string_view buffer,
                                                    size_t max_frame_bytes);

}  // namespace dtrain
