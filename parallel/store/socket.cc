#include "parallel/store/socket.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace dtrain {
namespace {

// Milliseconds poll() may sleep before `deadline`: -1 forever, at least 0.
int PollTimeoutMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(
      absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))), INT_MAX));
}

// Waits until `fd` is ready for `events`; DeadlineExceeded when `deadline` passes first.
absl::Status PollUntil(int fd, short events, absl::Time deadline) {
  while (true) {
    pollfd entry{.fd = fd, .events = events, .revents = 0};
    const int ready = ::poll(&entry, 1, PollTimeoutMs(deadline));
    if (ready > 0) return absl::OkStatus();
    if (ready == 0) return absl::DeadlineExceededError("no progress before the deadline");
    if (errno != EINTR)
      return absl::UnavailableError(absl::StrFormat("poll: %s", std::strerror(errno)));
  }
}

}  // namespace

absl::Status WaitReadable(int fd, absl::Time deadline) { return PollUntil(fd, POLLIN, deadline); }

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    Reset();
    fd_ = other.Release();
  }
  return *this;
}

int UniqueFd::Release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

void UniqueFd::Reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string FormatHostPort(std::string_view host, int port) {
  if (host.find(':') != std::string_view::npos) return absl::StrFormat("[%s]:%d", host, port);
  return absl::StrFormat("%s:%d", host, port);
}

std::string FormatSocketAddress(const sockaddr_storage& address) {
  if (address.ss_family == AF_INET) {
    return FormatHostPort(FormatIpAddress(address),
                          ntohs(reinterpret_cast<const sockaddr_in&>(address).sin_port));
  }
  if (address.ss_family == AF_INET6) {
    return FormatHostPort(FormatIpAddress(address),
                          ntohs(reinterpret_cast<const sockaddr_in6&>(address).sin6_port));
  }
  return absl::StrFormat("(address family %d)", address.ss_family);
}

std::string FormatIpAddress(const sockaddr_storage& address) {
  char text[INET6_ADDRSTRLEN] = "?";
  if (address.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(address).sin_addr, text,
                sizeof(text));
  } else if (address.ss_family == AF_INET6) {
    const in6_addr& v6 = reinterpret_cast<const sockaddr_in6&>(address).sin6_addr;
    // An IPv4 peer of a dual-stack listener (::ffff:10.0.0.1) is named as IPv4.
    if (IN6_IS_ADDR_V4MAPPED(&v6)) {
      ::inet_ntop(AF_INET, &v6.s6_addr[12], text, sizeof(text));
    } else {
      ::inet_ntop(AF_INET6, &v6, text, sizeof(text));
    }
  }
  return text;
}

std::vector<std::pair<std::string, std::string>> InterfaceAddresses() {
  std::vector<std::pair<std::string, std::string>> addresses;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return addresses;
  for (const ifaddrs* entry = list; entry != nullptr; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr) continue;
    const int family = entry->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    sockaddr_storage address{};
    std::memcpy(&address, entry->ifa_addr,
                family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
    addresses.emplace_back(entry->ifa_name, FormatIpAddress(address));
  }
  ::freeifaddrs(list);
  return addresses;
}

absl::StatusOr<std::string> InterfaceAddress(const std::string& name) {
  std::string v4, v6;
  std::vector<std::string> names;
  for (const auto& [interface, address] : InterfaceAddresses()) {
    if (std::find(names.begin(), names.end(), interface) == names.end()) names.push_back(interface);
    if (interface != name) continue;
    std::string& slot = address.find(':') == std::string::npos ? v4 : v6;
    if (slot.empty()) slot = address;
  }
  if (!v4.empty()) return v4;
  if (!v6.empty()) return v6;
  return absl::NotFoundError(absl::StrCat("network interface '", name,
                                          "' has no address here; this host has ",
                                          absl::StrJoin(names, ", "), " (ip -br addr)"));
}

absl::StatusOr<std::string> SourceAddressTowards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (const int error = ::getaddrinfo(host.c_str(), "9", &hints, &found); error != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve ", host, ": ", ::gai_strerror(error)));
  }
  absl::Status status = absl::UnavailableError(absl::StrCat("no route to ", host));
  std::string source;
  for (const addrinfo* entry = found; entry != nullptr && source.empty(); entry = entry->ai_next) {
    // Connecting a UDP socket only picks the route and the source address.
    UniqueFd fd(::socket(entry->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!fd.valid() || ::connect(fd.get(), entry->ai_addr, entry->ai_addrlen) != 0) continue;
    sockaddr_storage local{};
    socklen_t bytes = sizeof(local);
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &bytes) == 0) {
      source = FormatIpAddress(local);
    }
  }
  ::freeaddrinfo(found);
  if (source.empty()) return status;
  return source;
}

absl::Status SendAll(int fd, std::string_view bytes, absl::Time deadline) {
  while (!bytes.empty()) {
    const ssize_t sent = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (sent > 0) {
      bytes.remove_prefix(static_cast<size_t>(sent));
      continue;
    }
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (absl::Status ready = PollUntil(fd, POLLOUT, deadline); !ready.ok()) return ready;
      continue;
    }
    return absl::UnavailableError(absl::StrFormat("send: %s", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> RecvExact(int fd, size_t bytes, absl::Time deadline) {
  std::string data(bytes, '\0');
  size_t received = 0;
  while (received < bytes) {
    const ssize_t got = ::recv(fd, data.data() + received, bytes - received, 0);
    if (got > 0) {
      received += static_cast<size_t>(got);
      continue;
    }
    if (got == 0) return absl::UnavailableError("the peer closed the connection");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (absl::Status ready = PollUntil(fd, POLLIN, deadline); !ready.ok()) return ready;
      continue;
    }
    return absl::UnavailableError(absl::StrFormat("recv: %s", std::strerror(errno)));
  }
  return data;
}

}  // namespace dtrain
