#include "parallel/store/auth.h"

#include <netdb.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "parallel/store/socket.h"

namespace dtrain {
namespace {

std::string Proof(std::string_view label, std::string_view token, std::string_view client_nonce,
                  std::string_view server_nonce) {
  std::string message(label);
  message.append(client_nonce);
  message.append(server_nonce);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int digest_bytes = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), digest,
       &digest_bytes);
  return std::string(reinterpret_cast<const char*>(digest), digest_bytes);
}

}  // namespace

absl::StatusOr<std::string> RandomNonce() {
  std::string nonce(kStoreNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), static_cast<int>(nonce.size())) !=
      1) {
    return absl::InternalError(
        "OpenSSL RAND_bytes failed: the system random source is unavailable");
  }
  return nonce;
}

std::string ServerProof(std::string_view token, std::string_view client_nonce,
                        std::string_view server_nonce) {
  return Proof("dtrain-rdzv-server", token, client_nonce, server_nonce);
}

std::string ClientProof(std::string_view token, std::string_view client_nonce,
                        std::string_view server_nonce) {
  return Proof("dtrain-rdzv-client", token, client_nonce, server_nonce);
}

bool ProofsEqual(std::string_view expected, std::string_view received) {
  return expected.size() == received.size() &&
         CRYPTO_memcmp(expected.data(), received.data(), expected.size()) == 0;
}

bool IsLoopbackAddress(const sockaddr_storage& address) {
  if (address.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(address);
    return (ntohl(v4.sin_addr.s_addr) >> 24) == 127;
  }
  if (address.ss_family == AF_INET6) {
    const in6_addr& v6 = reinterpret_cast<const sockaddr_in6&>(address).sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

namespace {

// Every address `host` resolves to, in getaddrinfo's order; none when it does not resolve.
std::vector<sockaddr_storage> HostAddresses(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* addresses = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &addresses) != 0) return {};
  std::vector<sockaddr_storage> found;
  for (const addrinfo* address = addresses; address != nullptr; address = address->ai_next) {
    sockaddr_storage& storage = found.emplace_back();
    std::memcpy(&storage, address->ai_addr, address->ai_addrlen);
  }
  ::freeaddrinfo(addresses);
  return found;
}

}  // namespace

bool NamesThisHost(const std::string& host, std::string& resolved) {
  const std::vector<sockaddr_storage> addresses = HostAddresses(host);
  resolved = addresses.empty() ? "" : FormatIpAddress(addresses.front());
  return absl::c_any_of(addresses, IsThisHostsAddress);
}

bool ResolvesToLoopbackOnly(const std::string& host) {
  const std::vector<sockaddr_storage> addresses = HostAddresses(host);
  return !addresses.empty() && absl::c_all_of(addresses, IsLoopbackAddress);
}

std::string MasterOnThisHostHint(const std::string& master_addr) {
  std::string resolved;
  if (!NamesThisHost(master_addr, resolved)) return "";
  return absl::StrCat("; MASTER_ADDR '", master_addr, "'",
                      resolved == master_addr ? "" : absl::StrCat(" (", resolved, ")"),
                      " is an address of this host: unless node 0 runs here too (then its store "
                      "is not up), set it to node 0's host name, the same on every node (in a "
                      "Slurm batch script, the first host of SLURM_JOB_NODELIST)");
}

bool IsThisHostsAddress(const sockaddr_storage& address) {
  if (IsLoopbackAddress(address)) return true;
  const std::string ip = FormatIpAddress(address);
  for (const auto& [interface, own] : InterfaceAddresses()) {
    if (own == ip) return true;
  }
  return false;
}

}  // namespace dtrain
