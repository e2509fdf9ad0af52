// A TCP port for a test's server or rendezvous. Header-only because tests/CMakeLists.txt
// compiles only *_test.cc.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

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

// A free port held by a socket listening on every interface, as another process would hold it,
// until destroyed.
class HeldTcpPort {
 public:
  HeldTcpPort() : port_(FreeTcpPort()), fd_(socket(AF_INET, SOCK_STREAM, 0)) {
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
