#include "parallel/store/tcp_store_server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <set>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "core/util/log.h"
#include "core/util/status.h"
#include "parallel/store/auth.h"
#include "parallel/store/socket.h"

namespace dtrain {
namespace {

// epoll user data: the two fixed fds, then connections numbered from kFirstConnectionId. Ids are
// never reused, so an event for a connection closed earlier in the same batch finds nothing.
constexpr uint64_t kListenerId = 0;
constexpr uint64_t kWakeId = 1;
constexpr uint64_t kFirstConnectionId = 2;

constexpr size_t kReadChunkBytes = 64 << 10;
// After accept() fails for lack of descriptors, stop polling the listener this long rather than
// spin on it (level-triggered) until connections close.
constexpr absl::Duration kAcceptPause = absl::Milliseconds(100);

enum class Phase { kAwaitHello, kAwaitAuth, kReady };

// A parked GET or WAIT. It is indexed under one missing key at a time (`watched_key`); when that
// key appears the waiter re-checks and either answers or moves on to the next missing key.
struct Waiter {
  StoreMessage type;
  std::vector<std::string> keys;
  std::string watched_key;
};

struct Connection {
  uint64_t id;
  UniqueFd fd;
  std::string peer;
  Phase phase = Phase::kAwaitHello;
  std::string client_nonce;
  std::string server_nonce;
  std::string in;   // Received bytes not yet parsed.
  std::string out;  // Replies not yet sent, from `out_sent` on.
  size_t out_sent = 0;
  uint32_t interest = 0;  // The epoll events currently registered.
  std::optional<Waiter> waiter;
  // The handshake deadline, then a parked waiter's; an entry of Loop::timers_.
  std::optional<absl::Time> deadline;
  bool doomed = false;  // Closed at the end of the current loop iteration.
  // kAddOnClose registrations: (key, delta) applied when the connection closes.
  std::vector<std::pair<std::string, int64_t>> on_close;
};

// Keepalive probes start after half the timeout idle and go every tenth of it; five unanswered
// ones end the connection.
void SetDeadPeerTimeout(int fd, absl::Duration timeout) {
  const int seconds = std::max<int>(1, absl::ToInt64Seconds(timeout));
  const int one = 1;
  const int idle_s = std::max(1, seconds / 2);
  const int interval_s = std::max(1, seconds / 10);
  const int probes = 5;
  const unsigned int user_timeout_ms = static_cast<unsigned int>(seconds) * 1000;
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof(idle_s));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof(interval_s));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes));
  ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof(user_timeout_ms));
}

std::string ErrorFrame(absl::StatusCode code, std::string_view message) {
  return FrameWriter(StoreMessage::kError).U8(static_cast<uint8_t>(code)).Bytes(message).Finish();
}

}  // namespace

class TcpStoreServer::Loop {
 public:
  Loop(UniqueFd listener, UniqueFd epoll, UniqueFd wake, std::string token,
       const TcpStoreServerOptions& options)
      : listener_(std::move(listener)),
        epoll_(std::move(epoll)),
        wake_(std::move(wake)),
        token_(std::move(token)),
        options_(options),
        max_frame_bytes_(MaxFrameBytes(options.limits)) {}

  // Serves until Stop(); runs on the server thread.
  void Run();
  // Thread-safe: wakes Run() and makes it return.
  void Stop();

 private:
  void AcceptAll();
  void HandleEvents(Connection& conn, uint32_t events);
  void ReadAvailable(Connection& conn);
  void Flush(Connection& conn);
  void UpdateInterest(Connection& conn);
  // Handles every complete frame buffered for `conn` while it has no parked request and no
  // unsent reply (one outstanding request per connection).
  void Pump(Connection& conn);
  absl::Status HandleFrame(Connection& conn, const FrameView& frame);
  absl::Status HandleHello(Connection& conn, FrameReader& reader);
  absl::Status HandleAuth(Connection& conn, FrameReader& reader);
  absl::Status HandleRequest(Connection& conn, StoreMessage type, FrameReader& reader);
  // kAdd's arithmetic; wakes the key's waiters on success.
  absl::StatusOr<int64_t> AddTo(const std::string& key, int64_t delta);
  void Park(Connection& conn, StoreMessage type, std::vector<std::string> keys, int64_t timeout_ms);
  // Answers `conn`'s waiter if all its keys exist, else indexes it under the next missing key.
  void Recheck(Connection& conn);
  void Notify(const std::string& key);
  void ExpireTimers();
  void SetDeadline(Connection& conn, absl::Time deadline);
  void ClearDeadline(Connection& conn);
  void ClearWaiter(Connection& conn);
  void Reply(Connection& conn, std::string frame);
  // Closes `conn` at the end of this iteration; `reason` is logged when not empty.
  void Doom(Connection& conn, std::string_view reason);
  // Closes the doomed connections and applies their kAddOnClose registrations.
  void ReapDoomed();
  int NextWakeMs() const;
  const std::string* FirstMissing(const std::vector<std::string>& keys) const;
  size_t MaxFrameFor(const Connection& conn) const;
  Connection* Find(uint64_t id);

  UniqueFd listener_;
  UniqueFd epoll_;
  UniqueFd wake_;
  const std::string token_;
  const TcpStoreServerOptions options_;
  const size_t max_frame_bytes_;

  absl::flat_hash_map<std::string, std::string> data_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Connection>> connections_;
  // Parked connections by the key each one waits for next.
  absl::flat_hash_map<std::string, std::vector<uint64_t>> watchers_;
  std::set<std::pair<absl::Time, uint64_t>> timers_;
  std::vector<uint64_t> doomed_;
  std::vector<uint64_t> to_pump_;
  uint64_t next_id_ = kFirstConnectionId;
  std::optional<absl::Time> accept_paused_until_;
  std::string read_chunk_ = std::string(kReadChunkBytes, '\0');
};

void TcpStoreServer::Loop::Stop() {
  const uint64_t one = 1;
  const ssize_t ignored = ::write(wake_.get(), &one, sizeof(one));
  (void)ignored;  // An eventfd write only fails when the counter is already non-zero.
}

void TcpStoreServer::Loop::Run() {
  std::vector<epoll_event> events(256);
  while (true) {
    const int ready =
        ::epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()), NextWakeMs());
    if (ready < 0) {
      if (errno == EINTR) continue;
      LogError("rendezvous store: epoll_wait failed (%s); the store stops serving",
               std::strerror(errno));
      return;
    }
    for (int i = 0; i < ready; ++i) {
      const uint64_t id = events[i].data.u64;
      if (id == kWakeId) return;
      if (id == kListenerId) {
        AcceptAll();
      } else if (Connection* conn = Find(id); conn != nullptr && !conn->doomed) {
        HandleEvents(*conn, events[i].events);
      }
    }
    ExpireTimers();
    // A closed connection's kAddOnClose may answer waiters, which may pump more frames.
    while (!to_pump_.empty() || !doomed_.empty()) {
      std::vector<uint64_t> ids;
      ids.swap(to_pump_);
      for (const uint64_t id : ids) {
        if (Connection* conn = Find(id); conn != nullptr && !conn->doomed) Pump(*conn);
      }
      ReapDoomed();
    }
  }
}

Connection* TcpStoreServer::Loop::Find(uint64_t id) {
  auto it = connections_.find(id);
  return it == connections_.end() ? nullptr : it->second.get();
}

int TcpStoreServer::Loop::NextWakeMs() const {
  std::optional<absl::Time> next;
  if (!timers_.empty()) next = timers_.begin()->first;
  if (accept_paused_until_ && (!next || *accept_paused_until_ < *next)) {
    next = accept_paused_until_;
  }
  if (!next) return -1;
  const absl::Duration left = *next - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(
      absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))), INT_MAX));
}

void TcpStoreServer::Loop::AcceptAll() {
  while (true) {
    sockaddr_storage address{};
    socklen_t address_bytes = sizeof(address);
    const int fd = ::accept4(listener_.get(), reinterpret_cast<sockaddr*>(&address), &address_bytes,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      LogWarn(
          "rendezvous store: accept failed (%s); retrying in %s (raise `ulimit -n` if it "
          "says too many open files)",
          std::strerror(errno), absl::FormatDuration(kAcceptPause));
      epoll_event paused{.events = 0, .data = {.u64 = kListenerId}};
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, listener_.get(), &paused);
      accept_paused_until_ = absl::Now() + kAcceptPause;
      return;
    }
    UniqueFd owned(fd);
    const std::string peer = FormatSocketAddress(address);
    if (token_.empty() && !IsThisHostsAddress(address)) {
      LogWarn(
          "rendezvous store: refused client %s: without DTRAIN_RDZV_TOKEN the store accepts "
          "only clients on its own host; set DTRAIN_RDZV_TOKEN to the same secret on every node",
          peer);
      const std::string refusal = ErrorFrame(
          absl::StatusCode::kPermissionDenied,
          absl::StrFormat("refused this client (%s): the job has no DTRAIN_RDZV_TOKEN, so only "
                          "clients on the store's own host are accepted; set DTRAIN_RDZV_TOKEN "
                          "on every node",
                          peer));
      // Best effort: the frame fits an empty socket buffer, and the fd closes either way.
      const ssize_t ignored = ::send(fd, refusal.data(), refusal.size(), MSG_NOSIGNAL);
      (void)ignored;
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    SetDeadPeerTimeout(fd, options_.dead_peer_timeout);
    auto conn = std::make_unique<Connection>();
    conn->id = next_id_++;
    conn->fd = std::move(owned);
    conn->peer = peer;
    epoll_event event{.events = EPOLLIN, .data = {.u64 = conn->id}};
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &event) != 0) {
      LogWarn("rendezvous store: cannot watch client %s (%s); closing it", peer,
              std::strerror(errno));
      continue;
    }
    conn->interest = EPOLLIN;
    SetDeadline(*conn, absl::Now() + options_.handshake_timeout);
    LogDebug("rendezvous store: client %s connected", peer);
    connections_.emplace(conn->id, std::move(conn));
  }
}

void TcpStoreServer::Loop::HandleEvents(Connection& conn, uint32_t events) {
  if (events & (EPOLLERR | EPOLLHUP)) {
    Doom(conn, "");
    return;
  }
  if (events & EPOLLIN) ReadAvailable(conn);
  if (!conn.doomed && (events & EPOLLOUT)) Flush(conn);
  if (!conn.doomed) Pump(conn);
}

size_t TcpStoreServer::Loop::MaxFrameFor(const Connection& conn) const {
  return conn.phase == Phase::kReady ? max_frame_bytes_ : kMaxHandshakeFrameBytes;
}

void TcpStoreServer::Loop::ReadAvailable(Connection& conn) {
  // Buffer at most one maximal frame: a client that sends ahead is read as it is served.
  while (conn.in.size() < kFrameHeaderBytes + MaxFrameFor(conn)) {
    const ssize_t got = ::recv(conn.fd.get(), read_chunk_.data(), read_chunk_.size(), 0);
    if (got > 0) {
      conn.in.append(read_chunk_.data(), static_cast<size_t>(got));
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    // EOF or a reset: the client is gone, whatever it had parked.
    Doom(conn, "");
    return;
  }
}

void TcpStoreServer::Loop::Flush(Connection& conn) {
  while (conn.out_sent < conn.out.size()) {
    const ssize_t sent = ::send(conn.fd.get(), conn.out.data() + conn.out_sent,
                                conn.out.size() - conn.out_sent, MSG_NOSIGNAL);
    if (sent > 0) {
      conn.out_sent += static_cast<size_t>(sent);
      continue;
    }
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    Doom(conn, "");
    return;
  }
  if (conn.out_sent == conn.out.size()) {
    conn.out.clear();
    conn.out_sent = 0;
  }
  UpdateInterest(conn);
}

void TcpStoreServer::Loop::UpdateInterest(Connection& conn) {
  uint32_t wanted = 0;
  if (conn.in.size() < kFrameHeaderBytes + MaxFrameFor(conn)) wanted |= EPOLLIN;
  if (!conn.out.empty()) wanted |= EPOLLOUT;
  if (wanted == conn.interest) return;
  epoll_event event{.events = wanted, .data = {.u64 = conn.id}};
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, conn.fd.get(), &event) != 0) {
    Doom(conn, absl::StrFormat("epoll_ctl failed: %s", std::strerror(errno)));
    return;
  }
  conn.interest = wanted;
}

void TcpStoreServer::Loop::Pump(Connection& conn) {
  size_t consumed = 0;
  while (!conn.doomed && !conn.waiter && conn.out.empty()) {
    const std::string_view rest = std::string_view(conn.in).substr(consumed);
    absl::StatusOr<std::optional<FrameView>> frame = ParseFrame(rest, MaxFrameFor(conn));
    if (!frame.ok()) {
      Doom(conn, std::string(frame.status().message()));
      break;
    }
    if (!frame->has_value()) break;
    consumed += (*frame)->frame_bytes;
    if (absl::Status handled = HandleFrame(conn, **frame); !handled.ok()) {
      Doom(conn, std::string(handled.message()));
    }
  }
  if (conn.doomed) return;
  conn.in.erase(0, consumed);
  UpdateInterest(conn);
}

absl::Status TcpStoreServer::Loop::HandleFrame(Connection& conn, const FrameView& frame) {
  FrameReader reader(frame.payload);
  const StoreMessage expected = conn.phase == Phase::kAwaitHello  ? StoreMessage::kHello
                                : conn.phase == Phase::kAwaitAuth ? StoreMessage::kAuth
                                                                  : frame.type;
  if (frame.type != expected) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sent a frame of type %s (%d) before completing the handshake",
                        StoreMessageName(frame.type), static_cast<int>(frame.type)));
  }
  switch (conn.phase) {
    case Phase::kAwaitHello:
      return HandleHello(conn, reader);
    case Phase::kAwaitAuth:
      return HandleAuth(conn, reader);
    case Phase::kReady:
      return HandleRequest(conn, frame.type, reader);
  }
  return absl::InternalError("unknown connection phase");
}

absl::Status TcpStoreServer::Loop::HandleHello(Connection& conn, FrameReader& reader) {
  ASSIGN_OR_RETURN(const uint32_t magic, reader.U32());
  if (magic != kStoreMagic) {
    return absl::InvalidArgumentError(
        absl::StrFormat("not a dtrain store client (magic 0x%08x)", magic));
  }
  ASSIGN_OR_RETURN(const uint32_t version, reader.U32());
  ASSIGN_OR_RETURN(conn.client_nonce, reader.Raw(kStoreNonceBytes));
  RETURN_IF_ERROR(reader.ExpectEnd());
  if (version != kStoreProtocolVersion) {
    const std::string message = absl::StrFormat(
        "speaks store protocol version %d but the client speaks %d; run the same dtrain version "
        "on every node",
        kStoreProtocolVersion, version);
    Reply(conn, ErrorFrame(absl::StatusCode::kFailedPrecondition, message));
    return absl::FailedPreconditionError(
        absl::StrFormat("the client speaks store protocol version %d, this store %d", version,
                        kStoreProtocolVersion));
  }
  std::string proof(kStoreProofBytes, '\0');
  conn.server_nonce.assign(kStoreNonceBytes, '\0');
  if (!token_.empty()) {
    ASSIGN_OR_RETURN(conn.server_nonce, RandomNonce());
    proof = ServerProof(token_, conn.client_nonce, conn.server_nonce);
  }
  conn.phase = Phase::kAwaitAuth;
  Reply(conn, FrameWriter(StoreMessage::kChallenge)
                  .U8(token_.empty() ? 0 : 1)
                  .Raw(conn.server_nonce)
                  .Raw(proof)
                  .Finish());
  return absl::OkStatus();
}

absl::Status TcpStoreServer::Loop::HandleAuth(Connection& conn, FrameReader& reader) {
  ASSIGN_OR_RETURN(const std::string proof, reader.Bytes(kStoreProofBytes));
  RETURN_IF_ERROR(reader.ExpectEnd());
  if (!token_.empty() &&
      !ProofsEqual(ClientProof(token_, conn.client_nonce, conn.server_nonce), proof)) {
    Reply(conn, ErrorFrame(absl::StatusCode::kPermissionDenied,
                           "rejected the token: DTRAIN_RDZV_TOKEN differs from the job's"));
    return absl::PermissionDeniedError(
        "failed authentication: the client's DTRAIN_RDZV_TOKEN differs from the job's");
  }
  conn.phase = Phase::kReady;
  ClearDeadline(conn);
  Reply(conn, FrameWriter(StoreMessage::kOk).Finish());
  return absl::OkStatus();
}

absl::Status TcpStoreServer::Loop::HandleRequest(Connection& conn, StoreMessage type,
                                                 FrameReader& reader) {
  const StoreWireLimits& limits = options_.limits;
  switch (type) {
    case StoreMessage::kSet: {
      ASSIGN_OR_RETURN(std::string key, reader.Bytes(limits.max_key_bytes));
      ASSIGN_OR_RETURN(std::string value, reader.Bytes(limits.max_value_bytes));
      RETURN_IF_ERROR(reader.ExpectEnd());
      data_[key] = std::move(value);
      Notify(key);
      Reply(conn, FrameWriter(StoreMessage::kOk).Finish());
      return absl::OkStatus();
    }
    case StoreMessage::kGet: {
      ASSIGN_OR_RETURN(std::string key, reader.Bytes(limits.max_key_bytes));
      ASSIGN_OR_RETURN(const int64_t timeout_ms, reader.I64());
      RETURN_IF_ERROR(reader.ExpectEnd());
      std::vector<std::string> keys;
      keys.push_back(std::move(key));
      Park(conn, type, std::move(keys), timeout_ms);
      return absl::OkStatus();
    }
    case StoreMessage::kAdd: {
      ASSIGN_OR_RETURN(std::string key, reader.Bytes(limits.max_key_bytes));
      ASSIGN_OR_RETURN(const int64_t delta, reader.I64());
      RETURN_IF_ERROR(reader.ExpectEnd());
      const absl::StatusOr<int64_t> updated = AddTo(key, delta);
      Reply(conn, updated.ok() ? FrameWriter(StoreMessage::kInt).I64(*updated).Finish()
                               : ErrorFrame(updated.status().code(),
                                            std::string(updated.status().message())));
      return absl::OkStatus();
    }
    case StoreMessage::kAddOnClose: {
      ASSIGN_OR_RETURN(std::string key, reader.Bytes(limits.max_key_bytes));
      ASSIGN_OR_RETURN(const int64_t delta, reader.I64());
      RETURN_IF_ERROR(reader.ExpectEnd());
      conn.on_close.emplace_back(std::move(key), delta);
      Reply(conn, FrameWriter(StoreMessage::kOk).Finish());
      return absl::OkStatus();
    }
    case StoreMessage::kCompareSet: {
      ASSIGN_OR_RETURN(std::string key, reader.Bytes(limits.max_key_bytes));
      ASSIGN_OR_RETURN(std::string expected, reader.Bytes(limits.max_value_bytes));
      ASSIGN_OR_RETURN(std::string desired, reader.Bytes(limits.max_value_bytes));
      RETURN_IF_ERROR(reader.ExpectEnd());
      auto it = data_.find(key);
      const bool matches = it == data_.end() ? expected.empty() : it->second == expected;
      if (matches) {
        data_[key] = desired;
        Notify(key);
        Reply(conn, FrameWriter(StoreMessage::kValue).Bytes(desired).Finish());
      } else {
        Reply(conn, FrameWriter(StoreMessage::kValue)
                        .Bytes(it == data_.end() ? std::string_view() : it->second)
                        .Finish());
      }
      return absl::OkStatus();
    }
    case StoreMessage::kWait: {
      ASSIGN_OR_RETURN(const uint32_t count, reader.U32());
      if (count > limits.max_wait_keys) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "WAIT names %d keys, over the limit of %d", count, limits.max_wait_keys));
      }
      std::vector<std::string> keys;
      keys.reserve(count);
      for (uint32_t i = 0; i < count; ++i) {
        ASSIGN_OR_RETURN(std::string key, reader.Bytes(limits.max_key_bytes));
        keys.push_back(std::move(key));
      }
      ASSIGN_OR_RETURN(const int64_t timeout_ms, reader.I64());
      RETURN_IF_ERROR(reader.ExpectEnd());
      Park(conn, type, std::move(keys), timeout_ms);
      return absl::OkStatus();
    }
    case StoreMessage::kDelete: {
      ASSIGN_OR_RETURN(std::string key, reader.Bytes(limits.max_key_bytes));
      RETURN_IF_ERROR(reader.ExpectEnd());
      const bool existed = data_.erase(key) > 0;
      Reply(conn, FrameWriter(StoreMessage::kBool).U8(existed ? 1 : 0).Finish());
      return absl::OkStatus();
    }
    case StoreMessage::kNumKeys:
      RETURN_IF_ERROR(reader.ExpectEnd());
      Reply(conn, FrameWriter(StoreMessage::kInt).I64(static_cast<int64_t>(data_.size())).Finish());
      return absl::OkStatus();
    case StoreMessage::kPing:
      RETURN_IF_ERROR(reader.ExpectEnd());
      Reply(conn, FrameWriter(StoreMessage::kOk).Finish());
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrFormat("sent a frame of type %s (%d), which is not a request",
                          StoreMessageName(type), static_cast<int>(type)));
  }
}

absl::StatusOr<int64_t> TcpStoreServer::Loop::AddTo(const std::string& key, int64_t delta) {
  int64_t current = 0;
  auto it = data_.find(key);
  if (it != data_.end() && !absl::SimpleAtoi(absl::string_view(it->second), &current)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot add to key %s: its value is not an integer", key));
  }
  int64_t updated = 0;
  if (__builtin_add_overflow(current, delta, &updated)) {
    return absl::OutOfRangeError(
        absl::StrFormat("adding %d to key %s (%d) overflows int64", delta, key, current));
  }
  data_[key] = absl::StrFormat("%d", updated);
  Notify(key);
  return updated;
}

const std::string* TcpStoreServer::Loop::FirstMissing(const std::vector<std::string>& keys) const {
  for (const std::string& key : keys) {
    if (!data_.contains(key)) return &key;
  }
  return nullptr;
}

void TcpStoreServer::Loop::Park(Connection& conn, StoreMessage type, std::vector<std::string> keys,
                                int64_t timeout_ms) {
  conn.waiter = Waiter{.type = type, .keys = std::move(keys), .watched_key = {}};
  if (timeout_ms >= 0) SetDeadline(conn, absl::Now() + absl::Milliseconds(timeout_ms));
  Recheck(conn);
  // A zero timeout is a check: answer it now rather than after a loop iteration.
  if (conn.waiter && timeout_ms == 0) ExpireTimers();
}

void TcpStoreServer::Loop::Recheck(Connection& conn) {
  Waiter& waiter = *conn.waiter;
  if (const std::string* missing = FirstMissing(waiter.keys); missing != nullptr) {
    waiter.watched_key = *missing;
    watchers_[waiter.watched_key].push_back(conn.id);
    return;
  }
  std::string reply =
      waiter.type == StoreMessage::kGet
          ? FrameWriter(StoreMessage::kValue).Bytes(data_.at(waiter.keys[0])).Finish()
          : FrameWriter(StoreMessage::kOk).Finish();
  ClearWaiter(conn);
  Reply(conn, std::move(reply));
  to_pump_.push_back(conn.id);
}

void TcpStoreServer::Loop::Notify(const std::string& key) {
  auto it = watchers_.find(key);
  if (it == watchers_.end()) return;
  std::vector<uint64_t> ids = std::move(it->second);
  watchers_.erase(it);
  for (const uint64_t id : ids) Recheck(*Find(id));
}

void TcpStoreServer::Loop::ExpireTimers() {
  const absl::Time now = absl::Now();
  while (!timers_.empty() && timers_.begin()->first <= now) {
    Connection& conn = *Find(timers_.begin()->second);
    ClearDeadline(conn);
    if (conn.phase != Phase::kReady) {
      Doom(conn, absl::StrFormat("did not complete the handshake within %s",
                                 absl::FormatDuration(options_.handshake_timeout)));
      continue;
    }
    FrameWriter timeout(StoreMessage::kTimeout);
    std::vector<const std::string*> missing;
    for (const std::string& key : conn.waiter->keys) {
      if (!data_.contains(key)) missing.push_back(&key);
    }
    timeout.U32(static_cast<uint32_t>(missing.size()));
    for (const std::string* key : missing) timeout.Bytes(*key);
    ClearWaiter(conn);
    Reply(conn, timeout.Finish());
    to_pump_.push_back(conn.id);
  }
  if (accept_paused_until_ && *accept_paused_until_ <= now) {
    accept_paused_until_.reset();
    epoll_event event{.events = EPOLLIN, .data = {.u64 = kListenerId}};
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, listener_.get(), &event);
  }
}

void TcpStoreServer::Loop::SetDeadline(Connection& conn, absl::Time deadline) {
  ClearDeadline(conn);
  conn.deadline = deadline;
  timers_.emplace(deadline, conn.id);
}

void TcpStoreServer::Loop::ClearDeadline(Connection& conn) {
  if (conn.deadline) timers_.erase({*conn.deadline, conn.id});
  conn.deadline.reset();
}

void TcpStoreServer::Loop::ClearWaiter(Connection& conn) {
  if (!conn.waiter) return;
  if (auto it = watchers_.find(conn.waiter->watched_key); it != watchers_.end()) {
    std::erase(it->second, conn.id);
    if (it->second.empty()) watchers_.erase(it);
  }
  conn.waiter.reset();
  ClearDeadline(conn);
}

void TcpStoreServer::Loop::Reply(Connection& conn, std::string frame) {
  conn.out.append(frame);
  Flush(conn);
}

void TcpStoreServer::Loop::Doom(Connection& conn, std::string_view reason) {
  if (conn.doomed) return;
  if (!reason.empty()) {
    LogWarn("rendezvous store: closing the connection from %s: %s", conn.peer, reason);
  }
  conn.doomed = true;
  ClearWaiter(conn);
  ClearDeadline(conn);
  doomed_.push_back(conn.id);
}

void TcpStoreServer::Loop::ReapDoomed() {
  // Notify may doom further connections (a failed reply): they join doomed_ and close here too.
  while (!doomed_.empty()) {
    std::vector<uint64_t> ids;
    ids.swap(doomed_);
    for (const uint64_t id : ids) {
      auto it = connections_.find(id);
      std::vector<std::pair<std::string, int64_t>> on_close = std::move(it->second->on_close);
      const std::string peer = it->second->peer;
      connections_.erase(it);
      for (const auto& [key, delta] : on_close) {
        if (absl::StatusOr<int64_t> added = AddTo(key, delta); !added.ok()) {
          LogWarn("rendezvous store: on closing the connection from %s: %s", peer,
                  added.status().message());
        }
      }
    }
  }
}

TcpStoreServer::TcpStoreServer(int port, std::unique_ptr<Loop> loop)
    : port_(port), loop_(std::move(loop)), thread_([this] { loop_->Run(); }) {}

TcpStoreServer::~TcpStoreServer() {
  loop_->Stop();
  thread_.join();
}

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(
    std::string_view host, int port, const TcpStoreServerOptions& options) {
  const std::string where = FormatHostPort(host.empty() ? "::" : host, port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* addresses = nullptr;
  const std::string host_string(host);
  const std::string port_string = absl::StrFormat("%d", port);
  if (const int rc = ::getaddrinfo(host.empty() ? nullptr : host_string.c_str(),
                                   port_string.c_str(), &hints, &addresses);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot start the rendezvous store on %s: cannot resolve the host (%s)",
                        where, ::gai_strerror(rc)));
  }
  // Every interface: IPv6's wildcard first, dual-stack (IPv4 clients arrive as IPv4-mapped
  // addresses), so that a master address of either family reaches it; IPv4's where the host
  // has no IPv6.
  std::vector<addrinfo*> candidates;
  for (addrinfo* address = addresses; address != nullptr; address = address->ai_next) {
    candidates.push_back(address);
  }
  if (host.empty()) {
    std::stable_partition(candidates.begin(), candidates.end(),
                          [](const addrinfo* address) { return address->ai_family == AF_INET6; });
  }
  UniqueFd listener;
  int bind_errno = 0;
  // A port still held by the last attempt's dying process frees within seconds: retry it.
  const absl::Time bind_deadline = absl::Now() + options.bind_retry;
  while (true) {
    for (const addrinfo* address : candidates) {
      if (listener.valid()) break;
      UniqueFd fd(::socket(address->ai_family, address->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                           address->ai_protocol));
      if (!fd.valid()) {
        bind_errno = errno;
        continue;
      }
      // Lets a restarted job reuse the port while connections of the last one sit in
      // TIME_WAIT; Linux still refuses a second listener on it.
      const int one = 1, zero = 0;
      ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      if (address->ai_family == AF_INET6 && host.empty()) {
        ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
      }
      if (::bind(fd.get(), address->ai_addr, address->ai_addrlen) != 0 ||
          ::listen(fd.get(), SOMAXCONN) != 0) {
        bind_errno = errno;
        continue;
      }
      listener = std::move(fd);
    }
    if (listener.valid() || bind_errno != EADDRINUSE || absl::Now() >= bind_deadline) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  ::freeaddrinfo(addresses);
  if (!listener.valid()) {
    if (bind_errno == EADDRINUSE) {
      return absl::UnavailableError(absl::StrFormat(
          "cannot start the rendezvous store on %s: address already in use (retried for %s); "
          "pick another port (MASTER_PORT) or stop the other job that is using it",
          where, absl::FormatDuration(options.bind_retry)));
    }
    return absl::UnavailableError(absl::StrFormat(
        "cannot start the rendezvous store on %s: %s (is the host an address of this machine? "
        "check MASTER_ADDR)",
        where, std::strerror(bind_errno)));
  }
  sockaddr_storage bound{};
  socklen_t bound_bytes = sizeof(bound);
  ::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&bound), &bound_bytes);
  const int bound_port = bound.ss_family == AF_INET6
                             ? ntohs(reinterpret_cast<const sockaddr_in6&>(bound).sin6_port)
                             : ntohs(reinterpret_cast<const sockaddr_in&>(bound).sin_port);

  UniqueFd epoll(::epoll_create1(EPOLL_CLOEXEC));
  UniqueFd wake(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!epoll.valid() || !wake.valid()) {
    return absl::InternalError(absl::StrFormat(
        "cannot start the rendezvous store on %s: epoll/eventfd: %s", where, std::strerror(errno)));
  }
  epoll_event listen_event{.events = EPOLLIN, .data = {.u64 = kListenerId}};
  epoll_event wake_event{.events = EPOLLIN, .data = {.u64 = kWakeId}};
  if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, listener.get(), &listen_event) != 0 ||
      ::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, wake.get(), &wake_event) != 0) {
    return absl::InternalError(absl::StrFormat(
        "cannot start the rendezvous store on %s: epoll_ctl: %s", where, std::strerror(errno)));
  }
  std::string token = options.token;
  LogInfo("rendezvous store listening on %s (%s)", FormatSocketAddress(bound),
          token.empty() ? "no DTRAIN_RDZV_TOKEN: clients on this host only" : "token required");
  auto loop = std::make_unique<Loop>(std::move(listener), std::move(epoll), std::move(wake),
                                     std::move(token), options);
  return std::unique_ptr<TcpStoreServer>(new TcpStoreServer(bound_port, std::move(loop)));
}

}  // namespace dtrain
