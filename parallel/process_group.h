// The connections of one rank to the others: the rendezvous store (hosted by the node-0 agent of
// `dtrain launch`, or by rank 0 when ranks are started otherwise, e.g. by srun or torchrun) and
// the world communicator (Gloo on CPU), and the communicators of this rank's mesh groups.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/backend/backend.h"
#include "parallel/comm/communicator.h"
#include "parallel/comm/flight_recorder.h"
#include "parallel/mesh.h"
#include "parallel/store/store.h"
#include "parallel/store/tcp_store_client.h"
#include "parallel/store/tcp_store_server.h"
#include "parallel/world_membership.h"

namespace dtrain {

// The address peers reach this rank's Gloo devices at when none is given: the address of the
// interface GLOO_SOCKET_IFNAME names (PyTorch's variable; the first of a list), else 127.0.0.1
// for a loopback master, else the address this host reaches the master from, which the other
// nodes reach too (the host's name may resolve to 127.0.1.1, as Debian writes /etc/hosts).
absl::StatusOr<std::string> PeerHostname(const std::string& master_addr);

// The world's rendezvous store as ranks meet it: rank 0 serves it at MASTER_ADDR:PORT unless an
// agent hosts it (then null), and every rank connects with the world's token (set here).
absl::StatusOr<std::unique_ptr<TcpStoreServer>> ServeRendezvousStore(const WorldMembership& world);
absl::StatusOr<std::unique_ptr<TcpStoreClient>> ConnectRendezvousStore(
    const WorldMembership& world, TcpStoreClientOptions options);

class ProcessGroup {
 public:
  // Rank 0 starts the store at MASTER_ADDR:MASTER_PORT unless an agent hosts it; every rank
  // connects (with the job's token) and joins the world communicator. Ranks that do not arrive
  // within `timeout` fail the call, named. `key_prefix` separates the communicators of jobs
  // (and restarts) sharing one store. `job` is what every rank must agree on (the resolved
  // recipe's settings): a rank whose `job` or world size differs from rank 0's, or whose rank
  // another process holds, fails before connecting, naming the difference (rendezvous keys of
  // their own, which two jobs on one store meet in). `hostname` is the address peers reach this
  // rank's Gloo device at; empty = 127.0.0.1 for a loopback master, else this host's name.
  static absl::StatusOr<std::unique_ptr<ProcessGroup>> Connect(const WorldMembership& world,
                                                               absl::Duration timeout,
                                                               const std::string& key_prefix,
                                                               const std::string& job,
                                                               const std::string& hostname = "");
  ~ProcessGroup();

  // The last call on the group, with this rank's outcome; returns the status to report.
  // OK: waits until every rank is done (rank 0 may host the store the others still use) and,
  // under an agent, records that this rank finished: the agent counts a worker that exits 0
  // without it as one that left early.
  // An error (or a peer's failure met while waiting): publishes "rank R failed: <error>" in the
  // store unless another rank's failure came first; under an agent also the ranks the error
  // blames (faulty_ranks.h), and returns at once. The peers then fail on this rank's closed
  // connections instead of waiting out the timeout, and report the first failure before their
  // own; so does this rank when another rank's came first. Without an agent, every rank closes
  // its connections and returns only once every other rank has failed too or is blamed by some
  // rank's error (dead or hung), or after the timeout: rank 0 hosts the store the others read
  // the first failure from; and when no failure the message holds blames a rank, the first
  // error that does is added to it. The ranks some error blames that never failed themselves
  // end the message as its root cause, with where each sits in ConnectMesh's pipelined mesh.
  // With a flight recorder (EnableFlightRecorder), an error also dumps this rank's ring and
  // publishes its path under AgentKey "flight_recorder/<rank>"; without an agent, rank 0 then
  // compares the dumps of every rank and logs the diagnosis (flight_recorder_diagnosis.h); under
  // an agent, the agent does.
  absl::Status Leave(absl::Status outcome);

  // Records this rank's last `entries` operations of every group (parallel/comm/flight_recorder.h)
  // for dumps into `dump_dir`, and dumps on SIGUSR2 and when the process terminates on an
  // uncaught exception (Gloo's I/O thread throws one when a peer sends more bytes than a
  // desynchronised receive expects). Call right after Connect, before ConnectMesh; 0 entries:
  // nothing is recorded. One process group per process records.
  void EnableFlightRecorder(size_t entries, const std::string& dump_dir);

  Communicator& world() { return *world_; }
  Store& store() { return *store_; }

  // This rank's tp, dp and pp groups of a mesh, owned by the process group: null for a group of
  // one rank (nothing to communicate). Their collectives run on the backend's memory
  // (BackendMemoryGuard); host values cross them through it (host_values.h).
  struct MeshGroups {
    Communicator* tp = nullptr;
    Communicator* dp = nullptr;
    Communicator* pp = nullptr;
  };
  // Joins this rank's groups of `mesh` under this job and attempt's store namespace, with the
  // world's timeout, on `backend`'s memory: NCCL for run.device `device` cuda, else Gloo at the
  // world's address (a group of every rank is then the world's communicator). Every rank calls
  // it once, right after Connect, so that a rank failing later fails the others' next
  // collective at once instead of their rendezvous. `backend` must outlive the process group.
  absl::StatusOr<MeshGroups> ConnectMesh(const Mesh& mesh, Backend& backend,
                                         absl::string_view device);
  // Joins this rank's group of Mesh::KvReplicaGroup (after ConnectMesh, every rank of the mesh
  // with the same `replicas`), on the same terms as ConnectMesh's groups.
  absl::StatusOr<Communicator*> ConnectKvReplicas(const Mesh& mesh, int replicas);

 private:
  ProcessGroup() = default;

  absl::Status Fail(const absl::Status& error);
  // Under an agent, the ranks `error` blames (FaultyRanks), for its root cause.
  void PublishBlame(const absl::Status& error);
  // A rank's error as Fail records it for the others (without an agent).
  struct RankFailure {
    std::vector<int> blamed;  // world ranks, faulty_ranks.h
    std::string message;
  };
  // Fail's wait without an agent, after this rank's own error blamed `blamed`: the failures of
  // the ranks, by rank, once each has failed or is blamed and the blamed ones had a grace to
  // fail (or the timeout passed); this rank's own entry has no message.
  std::map<int, RankFailure> AwaitPeersFailing(int rank, const std::vector<int>& blamed);
  std::string FailedKey(int rank) const;
  // Dumps the flight recorder (if any) after `error` and publishes the path (or the failure to
  // write it, as an empty path) for whoever diagnoses.
  void PublishFlightDump(const absl::Status& error);
  // The std::terminate handler while a process group records: dumps, then the previous handler.
  [[noreturn]] static void DumpAndTerminate();
  // The communicator of a group of the mesh as ConnectMesh describes it; none for one rank.
  absl::StatusOr<std::unique_ptr<Communicator>> CreateGroup(const GroupSpec& spec) const;

  WorldMembership membership_;
  std::string failure_key_;                 // the first failure of this attempt
  std::unique_ptr<TcpStoreServer> server_;  // rank 0 only
  std::shared_ptr<Store> store_;
  std::unique_ptr<Communicator> world_;
  Backend* backend_ = nullptr;                 // ConnectMesh's: the groups' memory
  bool nccl_ = false;                          // the groups are NCCL's (run.device: cuda)
  MeshCommunicators mesh_;                     // the groups of ConnectMesh of more than one rank
  std::optional<Mesh> layout_;                 // ConnectMesh's mesh, for where a rank sits
  std::unique_ptr<Communicator> kv_replicas_;  // ConnectKvReplicas's, on the same terms
  std::string comm_namespace_;                 // "<job prefix>attempt-<n>/comm/"
  std::string hostname_;  // the address peers reach this rank's Gloo devices at
  absl::Duration timeout_;
  std::shared_ptr<FlightRecorder> recorder_;  // null: off
};

}  // namespace dtrain
