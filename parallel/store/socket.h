// Small POSIX socket helpers for the rendezvous store: an owning fd, address formatting, and
// deadline-bounded send/receive for the client's blocking calls. No state; thread-compatible.
#pragma once

#include <sys/socket.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dtrain {

// Owns one file descriptor and closes it on destruction; movable, not copyable.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.Release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { Reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release();
  void Reset();

 private:
  int fd_ = -1;
};

// "10.0.0.1:29500" or "[::1]:29500": how messages name an endpoint.
std::string FormatHostPort(std::string_view host, int port);
std::string FormatSocketAddress(const sockaddr_storage& address);

// The IP address (no port) of a socket address: "10.0.0.1", "::1"; an IPv4-mapped IPv6 address
// (a dual-stack listener's IPv4 peer) as IPv4.
std::string FormatIpAddress(const sockaddr_storage& address);

// This host's interfaces' IPv4 and IPv6 addresses, as (interface name, address) pairs.
std::vector<std::pair<std::string, std::string>> InterfaceAddresses();

// The IPv4 address of network interface `name` (else its IPv6 one); NotFound naming the
// interfaces there are.
absl::StatusOr<std::string> InterfaceAddress(const std::string& name);

// The address this host sends from to reach `host` (the route's source: what the kernel picks
// for a connection there); no packet is sent. Unavailable when `host` does not resolve or has no
// route.
absl::StatusOr<std::string> SourceAddressTowards(const std::string& host);

// Writes every byte of `bytes` to a non-blocking socket, polling until `deadline`
// (DeadlineExceeded; Unavailable when the peer is gone). Never raises SIGPIPE.
absl::Status SendAll(int fd, std::string_view bytes, absl::Time deadline);
// Waits until `fd` has bytes to read (or the peer closed); DeadlineExceeded when `deadline`
// passes first.
absl::Status WaitReadable(int fd, absl::Time deadline);
// Reads exactly `bytes` bytes; Unavailable when the peer closes first.
absl::StatusOr<std::string> RecvExact(int fd, size_t bytes, absl::Time deadline);

}  // namespace dtrain
