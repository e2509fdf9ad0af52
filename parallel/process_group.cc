#include "parallel/process_group.h"

#include <unistd.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/util/status.h"
#include "parallel/comm/faulty_ranks.h"
#include "parallel/comm/gloo_communicator.h"
#include "parallel/store/tcp_store_client.h"

namespace dtrain {

absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::Connect(const WorldMembership& world,
                                                                    absl::Duration timeout,
                                                                    const std::string& key_prefix,
                                                                    const std::string& hostname) {
  std::unique_ptr<ProcessGroup> group(new ProcessGroup());
  group->membership_ = world;
  if (world.rank == 0 && !world.agent_hosts_store) {
    TcpStoreServerOptions server_options;
    server_options.token = world.rdzv_token;
    ASSIGN_OR_RETURN(group->server_,
                     TcpStoreServer::Start(world.master_addr, world.master_port, server_options));
  }
  TcpStoreClientOptions client_options;
  client_options.connect_timeout = timeout;
  client_options.token = world.rdzv_token;
  ASSIGN_OR_RETURN(std::unique_ptr<TcpStoreClient> client,
                   TcpStoreClient::Connect(world.master_addr, world.master_port, client_options));
  group->store_ = std::move(client);

  // A restarted group must not meet the keys of the attempt before it in the agent's store.
  const std::string attempt = absl::StrCat("attempt-", world.restart_count);
  group->comm_namespace_ = absl::StrCat(key_prefix, attempt, "/comm/");
  group->failure_key_ = absl::StrCat(key_prefix, attempt, "/failure");
  group->timeout_ = timeout;
  group->hostname_ = hostname;
  if (group->hostname_.empty()) {
    // Peers reach this rank by its host name, or over loopback when the master is local.
    const bool loopback = world.master_addr == "127.0.0.1" || world.master_addr == "localhost";
    char name[256] = {};
    group->hostname_ = loopback || gethostname(name, sizeof(name) - 1) != 0 ? "127.0.0.1" : name;
  }
  GlooCommunicatorOptions options;
  options.name = "world";
  options.key_prefix = group->comm_namespace_ + "world/";
  options.rank = world.rank;
  options.size = world.world_size;
  options.timeout = timeout;
  options.hostname = group->hostname_;
  ASSIGN_OR_RETURN(group->world_, GlooCommunicator::Create(group->store_, options));
  // The agent reports when every worker is past rendezvous.
  if (world.agent_hosts_store) {
    RETURN_IF_ERROR(group->store_->Add(AgentKey(world.restart_count, "connected"), 1).status());
  }
  return group;
}

absl::StatusOr<std::unique_ptr<Communicator>> ProcessGroup::CreateGroup(
    const GroupSpec& spec) const {
  const size_t size = spec.world_ranks.size();
  if (size == 1 || size == static_cast<size_t>(world_->size())) return nullptr;
  GlooCommunicatorOptions options;
  options.name = spec.name;
  options.key_prefix = spec.key_prefix;
  options.rank = spec.rank;
  options.size = static_cast<int>(size);
  options.world_ranks = spec.world_ranks;
  options.timeout = timeout_;
  options.hostname = hostname_;
  return GlooCommunicator::Create(store_, options);
}

absl::StatusOr<ProcessGroup::MeshGroups> ProcessGroup::ConnectMesh(const Mesh& mesh) {
  ASSIGN_OR_RETURN(
      mesh_, mesh.CreateCommunicators([this](const GroupSpec& spec) { return CreateGroup(spec); },
                                      comm_namespace_));
  const MeshShape& shape = mesh.shape();
  return MeshGroups{View(mesh_.tp, shape.tp), View(mesh_.dp, shape.dp), View(mesh_.pp, shape.pp)};
}

absl::StatusOr<Communicator*> ProcessGroup::ConnectKvReplicas(const Mesh& mesh, int replicas) {
  ASSIGN_OR_RETURN(kv_replicas_, CreateGroup(mesh.KvReplicaGroup(replicas, comm_namespace_)));
  return View(kv_replicas_, replicas);
}

Communicator* ProcessGroup::View(const std::unique_ptr<Communicator>& created, int size) const {
  if (created) return created.get();
  return size > 1 ? world_.get() : nullptr;
}

absl::Status ProcessGroup::Leave(absl::Status outcome) {
  if (outcome.ok()) outcome = world_->Barrier();
  if (!outcome.ok()) return Fail(outcome);
  if (!membership_.agent_hosts_store) return outcome;
  return store_
      ->Add(AgentKey(membership_.restart_count, absl::StrCat("finished/", membership_.rank)), 1)
      .status();
}

absl::Status ProcessGroup::Fail(const absl::Status& error) {
  const int rank = membership_.rank;
  if (const std::vector<int> blamed = FaultyRanks(error);
      !blamed.empty() && membership_.agent_hosts_store) {
    (void)store_->Set(AgentKey(membership_.restart_count, absl::StrCat("blame/", rank)),
                      absl::StrJoin(blamed, ","));
  }
  const std::string own = absl::StrCat("rank ", rank, " failed: ", error.message());
  const absl::StatusOr<std::string> first = store_->CompareSet(failure_key_, "", own);
  if (!first.ok()) {
    return absl::Status(
        error.code(),
        absl::StrCat(error.message(), " (the other ranks' errors are unknown: the store ",
                     membership_.agent_hosts_store ? "of the node-0 agent" : "hosted by rank 0",
                     " is unreachable: ", first.status().message(), ")"));
  }
  if (*first == own) return error;
  return absl::Status(error.code(),
                      absl::StrCat(*first, "; then rank ", rank, " failed too: ", error.message()));
}

}  // namespace dtrain
