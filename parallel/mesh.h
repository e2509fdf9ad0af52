// The device mesh: world ranks form a dp x pp x tp grid, tp innermost (consecutive ranks, the
// same node, the fastest links), then dp, then pp:
//   rank = (pp_index * dp + dp_index) * tp + tp_index.
// A Mesh is an immutable value (thread-safe); it gives each rank its coordinates and the world
// ranks of its tp, dp and pp groups, and builds their communicators through a factory.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "parallel/comm/communicator.h"

namespace dtrain {

struct MeshShape {
  int dp = 1;
  int pp = 1;
  int tp = 1;
};

struct MeshCoords {
  int dp = 0;
  int pp = 0;
  int tp = 0;
};

// One group as a communicator factory needs it.
struct GroupSpec {
  std::string name;              // "tp", "dp" or "pp"
  std::string key_prefix;        // store namespace, equal on the members, distinct per group
  std::vector<int> world_ranks;  // members in group-rank order
  int rank = 0;                  // this rank's index in world_ranks
  // Its members Send and Recv to each other (the pipeline's stages), not only collect: NCCL then
  // connects each pair (nccl_communicator.h).
  bool point_to_point = false;
};

using CommunicatorFactory =
    std::function<absl::StatusOr<std::unique_ptr<Communicator>>(const GroupSpec&)>;

struct MeshCommunicators {
  std::unique_ptr<Communicator> tp;
  std::unique_ptr<Communicator> dp;
  std::unique_ptr<Communicator> pp;
};

class Mesh {
 public:
  // InvalidArgument naming the three sizes and the world size unless dp * pp * tp equals it
  // (and every size is positive and rank is in the world).
  static absl::StatusOr<Mesh> Create(MeshShape shape, int world_size, int rank);

  const MeshShape& shape() const { return shape_; }
  int rank() const { return rank_; }
  int world_size() const { return shape_.dp * shape_.pp * shape_.tp; }
  MeshCoords coords() const { return CoordsOf(rank_); }

  MeshCoords CoordsOf(int rank) const;
  int RankAt(const MeshCoords& coords) const;
  // Where `rank` sits, for messages: "pipeline stage 1 of 2, tp rank 1, dp rank 0", each
  // dimension of size 1 left out ("" in a mesh of one rank).
  std::string Describe(int rank) const;

  // This rank's groups: the ranks that differ from it only in that coordinate.
  GroupSpec TpGroup(const std::string& key_namespace = "comm/") const;
  GroupSpec DpGroup(const std::string& key_namespace = "comm/") const;
  GroupSpec PpGroup(const std::string& key_namespace = "comm/") const;
  // The ranks of this rank's tp group holding the same replicated kv head (tensor_parallel.h):
  // tp ranks [g k, (g + 1) k) for k = `replicas` and g = tp rank / k.
  GroupSpec KvReplicaGroup(int replicas, const std::string& key_namespace = "comm/") const;

  // Creates tp, then dp, then pp (every rank in the same order, so rendezvous cannot
  // deadlock); `key_namespace` separates meshes built more than once in one job (e.g. after a
  // restart: "comm/gen3/").
  absl::StatusOr<MeshCommunicators> CreateCommunicators(
      const CommunicatorFactory& factory, const std::string& key_namespace = "comm/") const;

 private:
  Mesh(MeshShape shape, int rank) : shape_(shape), rank_(rank) {}

  MeshShape shape_;
  int rank_;
};

}  // namespace dtrain
