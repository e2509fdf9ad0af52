// A TCP port for a test's server or rendezvous. Header-only because tests/CMakeLists.txt
// compiles only *_test.cc.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <random>

namespace dtrain::testing {

// A loopback port that was free a moment ago and that nothing listens on: bound to port 0, read
// back and closed (the kernel does not hand out the same ephemeral port again at once).
inline int FreeTcpPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(addr);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length);
  close(fd);
  return ntohs(addr.sin_port);
}

// Whether a listening socket could bind `port` on every interface just now.
inline bool TcpPortIsFree(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(port);
  const bool free = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return free;
}

// A port that was free a moment ago with its successor, both below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range): no outgoing connection takes either as its local port
// meanwhile, as one can take a port FreeTcpPort returned, or that port + 1. For a test whose
// processes listen on consecutive ports. 0 when none is found.
inline int FreeTcpPortPairBelowEphemeral() {
  int low = 32768;
  if (std::FILE* range = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(range, "%d", &low) != 1) low = 32768;
    std::fclose(range);
  }
  std::mt19937 random(static_cast<unsigned>(getpid()));
  const int first = 10000;
  if (low - 2 <= first) return 0;
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = first + static_cast<int>(random() % static_cast<unsigned>(low - 2 - first));
    if (TcpPortIsFree(port) && TcpPortIsFree(port + 1)) return port;
  }
  return 0;
}

// A free port held by a socket listening on every interface, as another process would hold it,
// until destroyed: FreeTcpPort's, or `port`.
class HeldTcpPort {
 public:
  explicit HeldTcpPort(int port = FreeTcpPort())
      : port_(port), fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(port_);
    bound_ =
        bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 && listen(fd_, 1) == 0;
  }
  ~HeldTcpPort() { close(fd_); }
  HeldTcpPort(const HeldTcpPort&) = delete;
  HeldTcpPort& operator=(const HeldTcpPort&) = delete;

  int port() const { return port_; }
  bool bound() const { return bound_; }  // false: the port was taken meanwhile; pick another

 private:
  int port_;
  int fd_;
  bool bound_ = false;
};

}  // namespace dtrain::testing
