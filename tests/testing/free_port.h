// A TCP port for a test's server or rendezvous. Header-only because tests/CMakeLists.txt
// compiles only *_test.cc.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <random>

namespace dtrain::testing {

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

// A loopback port bound to 0, read back and closed: free a moment ago, in the ephemeral range.
inline int KernelPickedTcpPort() {
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

// The first of `count` consecutive ports that were free a moment ago, below the kernel's
// ephemeral range (net.ipv4.ip_local_port_range), so that no outgoing connection takes one as its
// local port meanwhile. A port bound to 0, read back and closed is in that range, and under
// ctest -j the many connections of the multi-process tests running beside took such a port before
// the test's server bound it ("address already in use", the other ranks then waiting out their
// timeout). Drawn at random, so tests side by side rarely draw the same. Where the ephemeral
// range leaves no room below it, one port is the kernel's pick; 0 when none is found.
inline int FreeTcpPorts(int count) {
  int low = 32768;
  if (std::FILE* range = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(range, "%d", &low) != 1) low = 32768;
    std::fclose(range);
  }
  static std::mt19937 random(std::random_device{}());
  const int first = 10000;
  if (low - count <= first) return count == 1 ? KernelPickedTcpPort() : 0;
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port =
        first + static_cast<int>(random() % static_cast<unsigned>(low - count - first));
    bool free = true;
    for (int i = 0; i < count && free; ++i) free = TcpPortIsFree(port + i);
    if (free) return port;
  }
  return 0;
}

inline int FreeTcpPort() { return FreeTcpPorts(1); }

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
