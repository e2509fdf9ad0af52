#include "parallel/store/tcp_store_client.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/util/log.h"
#include "core/util/status.h"
#include "parallel/store/auth.h"

namespace dtrain {
namespace {

constexpr absl::Duration kFirstRetryDelay = absl::Milliseconds(10);
constexpr absl::Duration kMaxRetryDelay = absl::Seconds(1);

struct Frame {
  StoreMessage type;
  std::string payload;
};

absl::StatusOr<Frame> ReadFrame(int fd, absl::Time deadline, size_t max_frame_bytes) {
  // Every frame has a type byte, so the header and the type arrive as one read.
  ASSIGN_OR_RETURN(const std::string head, RecvExact(fd, kFrameHeaderBytes + 1, deadline));
  ASSIGN_OR_RETURN(const uint32_t length, ParseFrameLength(head, max_frame_bytes));
  ASSIGN_OR_RETURN(std::string payload, RecvExact(fd, length - 1, deadline));
  return Frame{.type = static_cast<StoreMessage>(head[kFrameHeaderBytes]),
               .payload = std::move(payload)};
}

// The status a kError frame carries, prefixed with the store's address.
absl::Status ErrorFromFrame(std::string_view address, std::string_view payload) {
  FrameReader reader(payload);
  absl::StatusOr<uint8_t> code = reader.U8();
  absl::StatusOr<std::string> message = reader.Bytes(payload.size());
  if (!code.ok() || !message.ok()) {
    return absl::InternalError(
        absl::StrFormat("rendezvous store at %s sent a malformed error reply", address));
  }
  const auto status_code = *code <= static_cast<uint8_t>(absl::StatusCode::kUnauthenticated)
                               ? static_cast<absl::StatusCode>(*code)
                               : absl::StatusCode::kUnknown;
  return absl::Status(status_code, absl::StrFormat("rendezvous store at %s %s", address, *message));
}

// One connection attempt to any address of host:port, waiting at most until `deadline`.
absl::StatusOr<UniqueFd> ConnectOnce(const std::string& host, int port, absl::Time deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* addresses = nullptr;
  const std::string port_string = absl::StrFormat("%d", port);
  if (const int rc = ::getaddrinfo(host.c_str(), port_string.c_str(), &hints, &addresses);
      rc != 0) {
    return absl::UnavailableError(
        absl::StrFormat("cannot resolve %s: %s", host, ::gai_strerror(rc)));
  }
  absl::Status last = absl::UnavailableError("no addresses");
  for (addrinfo* address = addresses; address != nullptr; address = address->ai_next) {
    UniqueFd fd(::socket(address->ai_family, address->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                         address->ai_protocol));
    if (!fd.valid()) {
      last = absl::UnavailableError(absl::StrFormat("socket: %s", std::strerror(errno)));
      continue;
    }
    if (::connect(fd.get(), address->ai_addr, address->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        last = absl::UnavailableError(std::strerror(errno));
        continue;
      }
      const absl::Duration left = std::max(deadline - absl::Now(), absl::ZeroDuration());
      pollfd entry{.fd = fd.get(), .events = POLLOUT, .revents = 0};
      const int ready =
          ::poll(&entry, 1,
                 static_cast<int>(std::min<int64_t>(
                     absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))), INT_MAX)));
      int error = 0;
      socklen_t error_bytes = sizeof(error);
      if (ready <= 0) {
        last = absl::UnavailableError("connection attempt timed out");
        continue;
      }
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &error_bytes);
      if (error != 0) {
        last = absl::UnavailableError(std::strerror(error));
        continue;
      }
    }
    ::freeaddrinfo(addresses);
    return fd;
  }
  ::freeaddrinfo(addresses);
  return last;
}

void TuneSocket(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // Keepalive detects a vanished server host during a wait without a timeout (about 60 s).
  const int idle_s = 30, interval_s = 10, probes = 3;
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof(idle_s));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof(interval_s));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes));
}

// Waits for the server's first bytes until `deadline`, asking `cancelled` (may be null) every
// kCancelPoll: a port that accepts and never answers (not a dtrain store) holds a waiting agent
// until its deadline, and a stop must not wait that long.
absl::Status WaitForAnswer(int fd, absl::Time deadline, const std::function<bool()>& cancelled,
                           std::string_view address) {
  constexpr absl::Duration kCancelPoll = absl::Milliseconds(200);
  while (true) {
    const absl::Status ready = WaitReadable(fd, std::min(deadline, absl::Now() + kCancelPoll));
    if (!absl::IsDeadlineExceeded(ready) || absl::Now() >= deadline) return ready;
    if (cancelled && cancelled()) {
      return absl::CancelledError(absl::StrFormat(
          "stopped while waiting for the rendezvous store at %s to answer", address));
    }
  }
}

absl::Status Handshake(int fd, std::string_view address, const std::string& token,
                       absl::Time deadline, const std::function<bool()>& cancelled) {
  auto failed = [&](const absl::Status& status) {
    return absl::Status(status.code(),
                        absl::StrFormat("handshake with rendezvous store at %s failed: %s "
                                        "(is that port a dtrain store of this job?)",
                                        address, status.message()));
  };
  ASSIGN_OR_RETURN(const std::string client_nonce, RandomNonce());
  const std::string hello = FrameWriter(StoreMessage::kHello)
                                .U32(kStoreMagic)
                                .U32(kStoreProtocolVersion)
                                .Raw(client_nonce)
                                .Finish();
  const absl::Status sent = SendAll(fd, hello, deadline);
  const absl::Status answered = WaitForAnswer(fd, deadline, cancelled, address);
  if (absl::IsCancelled(answered)) return answered;
  if (!answered.ok()) return failed(answered);
  // A server that refuses this peer may close before reading HELLO; its reason is still queued.
  absl::StatusOr<Frame> challenge = ReadFrame(fd, deadline, kMaxHandshakeFrameBytes);
  if (challenge.ok() && challenge->type == StoreMessage::kError) {
    return ErrorFromFrame(address, challenge->payload);
  }
  if (!sent.ok()) return failed(sent);
  if (!challenge.ok()) return failed(challenge.status());
  FrameReader reader(challenge->payload);
  absl::StatusOr<uint8_t> auth_required = reader.U8();
  absl::StatusOr<std::string> server_nonce = reader.Raw(kStoreNonceBytes);
  absl::StatusOr<std::string> server_proof = reader.Raw(kStoreProofBytes);
  if (challenge->type != StoreMessage::kChallenge || !server_proof.ok() ||
      !reader.ExpectEnd().ok()) {
    return failed(absl::InternalError("unexpected reply to HELLO"));
  }
  if (*auth_required != 0 && token.empty()) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "rendezvous store at %s requires a token: set DTRAIN_RDZV_TOKEN to the job's token",
        address));
  }
  if (*auth_required == 0 && !token.empty()) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "rendezvous store at %s does not check tokens but DTRAIN_RDZV_TOKEN is set here; set the "
        "same DTRAIN_RDZV_TOKEN for the process that runs the store (rank 0 or the launcher)",
        address));
  }
  std::string client_proof;
  if (!token.empty()) {
    if (!ProofsEqual(ServerProof(token, client_nonce, *server_nonce), *server_proof)) {
      return absl::PermissionDeniedError(absl::StrFormat(
          "rendezvous store at %s rejected the token: DTRAIN_RDZV_TOKEN differs from the job's",
          address));
    }
    client_proof = ClientProof(token, client_nonce, *server_nonce);
  }
  const std::string auth = FrameWriter(StoreMessage::kAuth).Bytes(client_proof).Finish();
  if (absl::Status sent = SendAll(fd, auth, deadline); !sent.ok()) return failed(sent);
  absl::StatusOr<Frame> accepted = ReadFrame(fd, deadline, kMaxHandshakeFrameBytes);
  if (!accepted.ok()) return failed(accepted.status());
  if (accepted->type == StoreMessage::kError) return ErrorFromFrame(address, accepted->payload);
  if (accepted->type != StoreMessage::kOk) {
    return failed(absl::InternalError("unexpected reply to AUTH"));
  }
  return absl::OkStatus();
}

// Milliseconds for the wire: -1 waits forever.
int64_t WireTimeoutMs(absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) return -1;
  return std::max<int64_t>(0,
                           absl::ToInt64Milliseconds(absl::Ceil(timeout, absl::Milliseconds(1))));
}

std::string ShortKey(std::string_view key) {
  constexpr size_t kShown = 64;
  return key.size() <= kShown ? std::string(key) : absl::StrFormat("%s...", key.substr(0, kShown));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpStoreClient>> TcpStoreClient::Connect(
    std::string_view host, int port, const TcpStoreClientOptions& options) {
  const std::string host_string(host);
  const std::string address = FormatHostPort(host, port);
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + options.connect_timeout;
  absl::Duration delay = kFirstRetryDelay;
  absl::Time next_report = start + kWaitReportInterval;
  while (true) {
    absl::StatusOr<UniqueFd> fd = ConnectOnce(host_string, port, deadline);
    if (fd.ok()) {
      TuneSocket(fd->get());
      // At most connect_timeout again: a port that accepts and never answers is no store.
      RETURN_IF_ERROR(
          Handshake(fd->get(), address, options.token,
                    absl::Now() + std::min(options.reply_timeout, options.connect_timeout),
                    options.cancelled));
      return std::unique_ptr<TcpStoreClient>(new TcpStoreClient(address, std::move(*fd), options));
    }
    if (options.cancelled && options.cancelled()) {
      return absl::CancelledError(
          absl::StrFormat("stopped while waiting for the rendezvous store at %s", address));
    }
    const absl::Time now = absl::Now();
    if (now >= next_report && now < deadline) {
      LogInfo("still waiting for the rendezvous store at %s (%s of %s): %s", address,
              absl::FormatDuration(absl::Trunc(now - start, absl::Seconds(1))),
              absl::FormatDuration(options.connect_timeout), fd.status().message());
      next_report = now + kWaitReportInterval;
    }
    if (now >= deadline) {
      return absl::UnavailableError(absl::StrFormat(
          "could not connect to the rendezvous store at %s within %s (last error: %s); check "
          "MASTER_ADDR and MASTER_PORT, that no firewall blocks the port, and that rank 0 (or the "
          "launcher) has started",
          address, absl::FormatDuration(absl::Trunc(now - start, absl::Milliseconds(1))),
          fd.status().message()));
    }
    absl::SleepFor(std::min(delay, deadline - now));
    delay = std::min(2 * delay, kMaxRetryDelay);
  }
}

TcpStoreClient::TcpStoreClient(std::string address, UniqueFd fd,
                               const TcpStoreClientOptions& options)
    : address_(std::move(address)), options_(options), fd_(std::move(fd)) {}

absl::StatusOr<TcpStoreClient::Reply> TcpStoreClient::Call(std::string_view request,
                                                           absl::Time deadline,
                                                           std::string_view what) {
  absl::MutexLock lock(&mu_);
  if (!broken_.ok()) return broken_;
  absl::StatusOr<Frame> frame = absl::UnknownError("unsent");
  if (absl::Status sent = SendAll(fd_.get(), request, deadline); sent.ok()) {
    frame = ReadFrame(fd_.get(), deadline, MaxFrameBytes(options_.limits));
  } else {
    frame = sent;
  }
  if (!frame.ok()) {
    if (absl::IsDeadlineExceeded(frame.status())) {
      broken_ = absl::DeadlineExceededError(absl::StrFormat(
          "no reply from the rendezvous store at %s to %s in time; the store's process (rank 0 or "
          "the launcher) may be hung or its host unreachable",
          address_, what));
    } else {
      broken_ = absl::UnavailableError(absl::StrFormat(
          "lost the connection to the rendezvous store at %s during %s (%s); the store's process "
          "(rank 0 or the launcher) may have exited",
          address_, what, frame.status().message()));
    }
    fd_.Reset();
    return broken_;
  }
  if (frame->type == StoreMessage::kError) return ErrorFromFrame(address_, frame->payload);
  return Reply{.type = frame->type, .payload = std::move(frame->payload)};
}

absl::Status TcpStoreClient::CheckKey(std::string_view key) const {
  if (key.size() <= options_.limits.max_key_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("store key %s is %d bytes, over the limit of %d bytes", ShortKey(key),
                      key.size(), options_.limits.max_key_bytes));
}

absl::Status TcpStoreClient::CheckValue(std::string_view key, std::string_view value) const {
  RETURN_IF_ERROR(CheckKey(key));
  if (value.size() <= options_.limits.max_value_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("value for store key %s is %d bytes, over the limit of %d bytes",
                      ShortKey(key), value.size(), options_.limits.max_value_bytes));
}

absl::Status TcpStoreClient::Unexpected(const Reply& reply, std::string_view what) const {
  return absl::InternalError(absl::StrFormat("rendezvous store at %s answered %s with %s", address_,
                                             what, StoreMessageName(reply.type)));
}

absl::Status TcpStoreClient::TimedOut(const Reply& reply, absl::Duration timeout) const {
  FrameReader reader(reply.payload);
  std::vector<std::string> missing;
  absl::StatusOr<uint32_t> count = reader.U32();
  for (uint32_t i = 0; count.ok() && i < *count; ++i) {
    absl::StatusOr<std::string> key = reader.Bytes(options_.limits.max_key_bytes);
    if (!key.ok()) break;
    missing.push_back(ShortKey(*key));
  }
  return absl::DeadlineExceededError(absl::StrFormat(
      "timed out after %s waiting for %s %s in store %s", absl::FormatDuration(timeout),
      missing.size() == 1 ? "key" : "keys", absl::StrJoin(missing, ", "), address_));
}

absl::Status TcpStoreClient::Set(std::string_view key, std::string_view value) {
  RETURN_IF_ERROR(CheckValue(key, value));
  const std::string what = absl::StrFormat("SET %s", ShortKey(key));
  ASSIGN_OR_RETURN(const Reply reply,
                   Call(FrameWriter(StoreMessage::kSet).Bytes(key).Bytes(value).Finish(),
                        absl::Now() + options_.reply_timeout, what));
  if (reply.type != StoreMessage::kOk) return Unexpected(reply, what);
  return absl::OkStatus();
}

absl::StatusOr<std::string> TcpStoreClient::Get(std::string_view key, absl::Duration timeout) {
  RETURN_IF_ERROR(CheckKey(key));
  const std::string what = absl::StrFormat("GET %s", ShortKey(key));
  const absl::Time deadline = absl::Now() + timeout + options_.reply_timeout;
  ASSIGN_OR_RETURN(
      const Reply reply,
      Call(FrameWriter(StoreMessage::kGet).Bytes(key).I64(WireTimeoutMs(timeout)).Finish(),
           deadline, what));
  if (reply.type == StoreMessage::kTimeout) return TimedOut(reply, timeout);
  if (reply.type != StoreMessage::kValue) return Unexpected(reply, what);
  FrameReader reader(reply.payload);
  return reader.Bytes(options_.limits.max_value_bytes);
}

absl::StatusOr<int64_t> TcpStoreClient::Add(std::string_view key, int64_t delta) {
  RETURN_IF_ERROR(CheckKey(key));
  const std::string what = absl::StrFormat("ADD %s", ShortKey(key));
  ASSIGN_OR_RETURN(const Reply reply,
                   Call(FrameWriter(StoreMessage::kAdd).Bytes(key).I64(delta).Finish(),
                        absl::Now() + options_.reply_timeout, what));
  if (reply.type != StoreMessage::kInt) return Unexpected(reply, what);
  FrameReader reader(reply.payload);
  return reader.I64();
}

absl::StatusOr<std::string> TcpStoreClient::CompareSet(std::string_view key,
                                                       std::string_view expected,
                                                       std::string_view desired) {
  RETURN_IF_ERROR(CheckValue(key, expected));
  RETURN_IF_ERROR(CheckValue(key, desired));
  const std::string what = absl::StrFormat("COMPARE_SET %s", ShortKey(key));
  ASSIGN_OR_RETURN(
      const Reply reply,
      Call(
          FrameWriter(StoreMessage::kCompareSet).Bytes(key).Bytes(expected).Bytes(desired).Finish(),
          absl::Now() + options_.reply_timeout, what));
  if (reply.type != StoreMessage::kValue) return Unexpected(reply, what);
  FrameReader reader(reply.payload);
  return reader.Bytes(options_.limits.max_value_bytes);
}

absl::Status TcpStoreClient::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  if (keys.size() > options_.limits.max_wait_keys) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cannot wait for %d store keys at once, over the limit of %d; wait in batches", keys.size(),
        options_.limits.max_wait_keys));
  }
  FrameWriter request(StoreMessage::kWait);
  request.U32(static_cast<uint32_t>(keys.size()));
  for (const std::string& key : keys) {
    RETURN_IF_ERROR(CheckKey(key));
    request.Bytes(key);
  }
  request.I64(WireTimeoutMs(timeout));
  const std::string what = absl::StrFormat("WAIT for %d keys", keys.size());
  ASSIGN_OR_RETURN(const Reply reply,
                   Call(request.Finish(), absl::Now() + timeout + options_.reply_timeout, what));
  if (reply.type == StoreMessage::kTimeout) return TimedOut(reply, timeout);
  if (reply.type != StoreMessage::kOk) return Unexpected(reply, what);
  return absl::OkStatus();
}

absl::StatusOr<bool> TcpStoreClient::Delete(std::string_view key) {
  RETURN_IF_ERROR(CheckKey(key));
  const std::string what = absl::StrFormat("DELETE %s", ShortKey(key));
  ASSIGN_OR_RETURN(const Reply reply, Call(FrameWriter(StoreMessage::kDelete).Bytes(key).Finish(),
                                           absl::Now() + options_.reply_timeout, what));
  if (reply.type != StoreMessage::kBool) return Unexpected(reply, what);
  FrameReader reader(reply.payload);
  ASSIGN_OR_RETURN(const uint8_t existed, reader.U8());
  return existed != 0;
}

absl::StatusOr<int64_t> TcpStoreClient::NumKeys() {
  ASSIGN_OR_RETURN(const Reply reply, Call(FrameWriter(StoreMessage::kNumKeys).Finish(),
                                           absl::Now() + options_.reply_timeout, "NUM_KEYS"));
  if (reply.type != StoreMessage::kInt) return Unexpected(reply, "NUM_KEYS");
  FrameReader reader(reply.payload);
  return reader.I64();
}

absl::Status TcpStoreClient::AddOnClose(std::string_view key, int64_t delta) {
  RETURN_IF_ERROR(CheckKey(key));
  const std::string what = absl::StrFormat("ADD_ON_CLOSE %s", ShortKey(key));
  ASSIGN_OR_RETURN(const Reply reply,
                   Call(FrameWriter(StoreMessage::kAddOnClose).Bytes(key).I64(delta).Finish(),
                        absl::Now() + options_.reply_timeout, what));
  if (reply.type != StoreMessage::kOk) return Unexpected(reply, what);
  return absl::OkStatus();
}

absl::Status TcpStoreClient::Ping() {
  ASSIGN_OR_RETURN(const Reply reply, Call(FrameWriter(StoreMessage::kPing).Finish(),
                                           absl::Now() + options_.reply_timeout, "PING"));
  if (reply.type != StoreMessage::kOk) return Unexpected(reply, "PING");
  return absl::OkStatus();
}

}  // namespace dtrain
