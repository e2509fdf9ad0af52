#include "parallel/store/prefix_store.h"

#include <gtest/gtest.h>

#include "parallel/store/tcp_store_client.h"
#include "parallel/store/tcp_store_server.h"

namespace dtrain {
namespace {

TEST(PrefixStoreTest, NamespacesKeysOnTheBaseStore) {
  TcpStoreServerOptions server_options;
  server_options.token = std::string();
  absl::StatusOr<std::unique_ptr<TcpStoreServer>> server =
      TcpStoreServer::Start("127.0.0.1", 0, server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  TcpStoreClientOptions client_options;
  client_options.token = std::string();
  absl::StatusOr<std::unique_ptr<TcpStoreClient>> base =
      TcpStoreClient::Connect("127.0.0.1", (*server)->port(), client_options);
  ASSERT_TRUE(base.ok()) << base.status();

  PrefixStore generation0(**base, "gen0");
  PrefixStore generation1(**base, "gen1");
  ASSERT_TRUE(generation0.Set("rank/0", "a").ok());
  ASSERT_TRUE(generation1.Set("rank/0", "b").ok());
  EXPECT_EQ(*(*base)->Get("gen0/rank/0", absl::Seconds(1)), "a");
  EXPECT_EQ(*generation1.Get("rank/0", absl::Seconds(1)), "b");
  EXPECT_EQ(*generation0.Add("count", 2), 2);
  EXPECT_EQ(*generation1.Add("count", 5), 5);
  EXPECT_EQ(*generation0.CompareSet("rank/0", "a", "c"), "c");
  EXPECT_TRUE(generation0.Wait({"rank/0", "count"}, absl::Seconds(1)).ok());
  EXPECT_TRUE(*generation1.Delete("count"));
  EXPECT_FALSE(*generation1.Delete("count"));
  EXPECT_EQ(*generation0.NumKeys(), 3);  // The whole base store: gen0 x2, gen1 x1.
  EXPECT_TRUE(generation0.Ping().ok());

  const absl::Status missing = generation1.Wait({"rank/9"}, absl::Milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(missing));
  EXPECT_NE(missing.message().find("gen1/rank/9"), std::string::npos) << missing;
}

}  // namespace
}  // namespace dtrain
