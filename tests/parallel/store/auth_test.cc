#include "parallel/store/auth.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <cstdlib>

#include "parallel/store/socket.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;

sockaddr_storage Address(const char* text) {
  sockaddr_storage address{};
  auto& v4 = reinterpret_cast<sockaddr_in&>(address);
  auto& v6 = reinterpret_cast<sockaddr_in6&>(address);
  if (inet_pton(AF_INET, text, &v4.sin_addr) == 1) {
    v4.sin_family = AF_INET;
  } else {
    EXPECT_EQ(inet_pton(AF_INET6, text, &v6.sin6_addr), 1) << text;
    v6.sin6_family = AF_INET6;
  }
  return address;
}

TEST(StoreAuthTest, LoopbackClassifier) {
  for (const char* loopback : {"127.0.0.1", "127.255.3.4", "::1", "::ffff:127.0.0.1"}) {
    EXPECT_TRUE(IsLoopbackAddress(Address(loopback))) << loopback;
  }
  for (const char* remote : {"10.0.0.1", "192.168.1.7", "128.0.0.1", "0.0.0.0",
                             "::", "::ffff:10.1.2.3", "2001:db8::1", "fe80::1"}) {
    EXPECT_FALSE(IsLoopbackAddress(Address(remote))) << remote;
  }
  sockaddr_storage unix_socket{};
  unix_socket.ss_family = AF_UNIX;
  EXPECT_FALSE(IsLoopbackAddress(unix_socket));
}

// This host's addresses are its interfaces' (and loopback); a documentation address is not.
TEST(StoreAuthTest, ThisHostsAddressClassifier) {
  for (const auto& [interface, address] : InterfaceAddresses()) {
    if (address.rfind("fe80:", 0) == 0) continue;  // link-local: needs a scope to parse
    EXPECT_TRUE(IsThisHostsAddress(Address(address.c_str()))) << interface << " " << address;
  }
  EXPECT_TRUE(IsThisHostsAddress(Address("127.3.2.1")));
  EXPECT_FALSE(IsThisHostsAddress(Address("203.0.113.7")));
  EXPECT_FALSE(IsThisHostsAddress(Address("2001:db8::7")));
}

// A name or address resolves to this host or not; the first address is kept for messages.
TEST(StoreAuthTest, NamesThisHostResolvesTheName) {
  std::string resolved;
  EXPECT_TRUE(NamesThisHost("127.0.0.1", resolved));
  EXPECT_EQ(resolved, "127.0.0.1");
  EXPECT_TRUE(NamesThisHost("localhost", resolved));
  EXPECT_FALSE(NamesThisHost("192.0.2.1", resolved));  // TEST-NET-1: nobody's
  EXPECT_EQ(resolved, "192.0.2.1");
  EXPECT_FALSE(NamesThisHost("no-such-host.invalid", resolved));
  EXPECT_EQ(resolved, "");
}

// A node other than the master's that names its own host as the master gets told so.
TEST(StoreAuthTest, AMasterAddressOfThisHostGetsAHint) {
  EXPECT_EQ(MasterOnThisHostHint("127.0.0.1"),
            "; MASTER_ADDR '127.0.0.1' is an address of this host: unless node 0 runs here too "
            "(then its store is not up), set it to node 0's host name, the same on every node (in "
            "a Slurm batch script, the first host of SLURM_JOB_NODELIST)");
  EXPECT_THAT(MasterOnThisHostHint("localhost"),
              HasSubstr("; MASTER_ADDR 'localhost' ("));  // 127.0.0.1 or ::1
  EXPECT_EQ(MasterOnThisHostHint("192.0.2.1"), "");
  EXPECT_EQ(MasterOnThisHostHint("no-such-host.invalid"), "");
}

TEST(StoreAuthTest, ProofsDependOnTokenNoncesAndDirection) {
  const std::string client_nonce = *RandomNonce();
  const std::string server_nonce = *RandomNonce();
  ASSERT_EQ(client_nonce.size(), kStoreNonceBytes);
  EXPECT_NE(client_nonce, server_nonce);

  const std::string proof = ClientProof("secret", client_nonce, server_nonce);
  EXPECT_EQ(proof.size(), kStoreProofBytes);
  EXPECT_TRUE(ProofsEqual(proof, ClientProof("secret", client_nonce, server_nonce)));
  EXPECT_FALSE(ProofsEqual(proof, ClientProof("secreT", client_nonce, server_nonce)));
  EXPECT_FALSE(ProofsEqual(proof, ClientProof("secret", server_nonce, client_nonce)));
  EXPECT_FALSE(ProofsEqual(proof, ServerProof("secret", client_nonce, server_nonce)));
  EXPECT_FALSE(ProofsEqual(proof, proof.substr(1)));
}

}  // namespace
}  // namespace dtrain
