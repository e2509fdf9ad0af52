// Who may talk to the rendezvous store. With a job token, both ends prove they know it by an
// HMAC-SHA256 challenge-response over fresh nonces (the token never crosses the wire); without
// one, only peers on this host are admitted. Thread-safe.
#pragma once

#include <sys/socket.h>

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace dtrain {

inline constexpr size_t kStoreNonceBytes = 32;
inline constexpr size_t kStoreProofBytes = 32;  // SHA-256 output.

// Cryptographically random bytes (OpenSSL RAND_bytes); fails only when the RNG is not seeded.
absl::StatusOr<std::string> RandomNonce();

// The server proves the token first so that a client never answers an impostor; the two proofs
// use different labels, so one can never be replayed as the other.
std::string ServerProof(std::string_view token, std::string_view client_nonce,
                        std::string_view server_nonce);
std::string ClientProof(std::string_view token, std::string_view client_nonce,
                        std::string_view server_nonce);

// Constant-time comparison (CRYPTO_memcmp) so timing does not reveal a matching prefix.
bool ProofsEqual(std::string_view expected, std::string_view received);

// 127.0.0.0/8, ::1 and IPv4-mapped 127.0.0.0/8.
bool IsLoopbackAddress(const sockaddr_storage& address);

// Loopback, or an address of one of this host's interfaces: a process on this host, the peers a
// store without a token admits (a rank reaching its own host by its network address included).
bool IsThisHostsAddress(const sockaddr_storage& address);
// Whether `host` (a name or an address) resolves to an address of this host; `resolved` gets the
// first address it resolves to ("" when none), for messages.
bool NamesThisHost(const std::string& host, std::string& resolved);
// Whether `host` resolves, and to loopback addresses only (localhost, 127.0.1.1).
bool ResolvesToLoopbackOnly(const std::string& host);
// For the error of a rank or agent on another node than the master's that cannot reach the store
// at `master_addr`: when that name is an address of this host (localhost, or
// MASTER_ADDR=$(hostname) expanded on each node), what to set instead, as "; ..."; else "".
std::string MasterOnThisHostHint(const std::string& master_addr);

}  // namespace dtrain
