#include "parallel/process_group.h"

#include <unistd.h>

#include "core/util/status.h"
#include "parallel/comm/gloo_communicator.h"
#include "parallel/store/tcp_store_client.h"

namespace dtrain {

absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::Connect(const WorldEnvironment& world,
                                                                    absl::Duration timeout,
                                                                    const std::string& key_prefix,
                                                                    const std::string& hostname) {
  std::unique_ptr<ProcessGroup> group(new ProcessGroup());
  if (world.rank == 0) {
    ASSIGN_OR_RETURN(group->server_, TcpStoreServer::Start(world.master_addr, world.master_port));
  }
  TcpStoreClientOptions client_options;
  client_options.connect_timeout = timeout;
  ASSIGN_OR_RETURN(std::unique_ptr<TcpStoreClient> client,
                   TcpStoreClient::Connect(world.master_addr, world.master_port, client_options));
  group->store_ = std::move(client);

  GlooCommunicatorOptions options;
  options.name = "world";
  options.key_prefix = key_prefix + "comm/world/";
  options.rank = world.rank;
  options.size = world.world_size;
  options.timeout = timeout;
  options.hostname = hostname;
  if (options.hostname.empty()) {
    // Peers reach this rank by its host name, or over loopback when the master is local.
    const bool loopback = world.master_addr == "127.0.0.1" || world.master_addr == "localhost";
    char name[256] = {};
    options.hostname = loopback || gethostname(name, sizeof(name) - 1) != 0 ? "127.0.0.1" : name;
  }
  ASSIGN_OR_RETURN(group->world_, GlooCommunicator::Create(group->store_, options));
  return group;
}

ProcessGroup::~ProcessGroup() {
  if (world_) (void)world_->Barrier();
}

}  // namespace dtrain
