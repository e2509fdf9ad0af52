#include "parallel/mesh.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/util/status.h"

namespace dtrain {
namespace {

// A group varies one coordinate; `index` numbers the groups of that kind, so that the key
// prefix is unique and the same on every member.
GroupSpec MakeGroup(const Mesh& mesh, const std::string& name, const std::string& key_namespace,
                    int index, int size, const std::function<MeshCoords(int)>& member) {
  GroupSpec group;
  group.name = name;
  group.key_prefix = absl::StrCat(key_namespace, name, ".", index, "/");
  for (int i = 0; i < size; ++i) {
    const int world_rank = mesh.RankAt(member(i));
    if (world_rank == mesh.rank()) group.rank = i;
    group.world_ranks.push_back(world_rank);
  }
  return group;
}

}  // namespace

absl::StatusOr<Mesh> Mesh::Create(MeshShape shape, int world_size, int rank) {
  if (shape.dp < 1 || shape.pp < 1 || shape.tp < 1 ||
      static_cast<int64_t>(shape.dp) * shape.pp * shape.tp != world_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "parallel layout dp=%d x pp=%d x tp=%d needs %d ranks but the world has %d; choose "
        "positive sizes whose product is the world size",
        shape.dp, shape.pp, shape.tp, static_cast<int64_t>(shape.dp) * shape.pp * shape.tp,
        world_size));
  }
  if (rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rank %d is outside a world of %d ranks", rank, world_size));
  }
  return Mesh(shape, rank);
}

MeshCoords Mesh::CoordsOf(int rank) const {
  MeshCoords coords;
  coords.tp = rank % shape_.tp;
  coords.dp = rank / shape_.tp % shape_.dp;
  coords.pp = rank / (shape_.tp * shape_.dp);
  return coords;
}

int Mesh::RankAt(const MeshCoords& coords) const {
  return (coords.pp * shape_.dp + coords.dp) * shape_.tp + coords.tp;
}

std::string Mesh::Describe(int rank) const {
  const MeshCoords at = CoordsOf(rank);
  std::vector<std::string> parts;
  if (shape_.pp > 1) parts.push_back(absl::StrCat("pipeline stage ", at.pp, " of ", shape_.pp));
  if (shape_.tp > 1) parts.push_back(absl::StrCat("tp rank ", at.tp));
  if (shape_.dp > 1) parts.push_back(absl::StrCat("dp rank ", at.dp));
  return absl::StrJoin(parts, ", ");
}

GroupSpec Mesh::TpGroup(const std::string& key_namespace) const {
  const MeshCoords me = coords();
  return MakeGroup(*this, "tp", key_namespace, me.pp * shape_.dp + me.dp, shape_.tp,
                   [&](int i) { return MeshCoords{.dp = me.dp, .pp = me.pp, .tp = i}; });
}

GroupSpec Mesh::DpGroup(const std::string& key_namespace) const {
  const MeshCoords me = coords();
  return MakeGroup(*this, "dp", key_namespace, me.pp * shape_.tp + me.tp, shape_.dp,
                   [&](int i) { return MeshCoords{.dp = i, .pp = me.pp, .tp = me.tp}; });
}

GroupSpec Mesh::PpGroup(const std::string& key_namespace) const {
  const MeshCoords me = coords();
  GroupSpec group = MakeGroup(*this, "pp", key_namespace, me.dp * shape_.tp + me.tp, shape_.pp,
                              [&](int i) { return MeshCoords{.dp = me.dp, .pp = i, .tp = me.tp}; });
  group.point_to_point = true;
  return group;
}

GroupSpec Mesh::KvReplicaGroup(int replicas, const std::string& key_namespace) const {
  const MeshCoords me = coords();
  const int group = me.tp / replicas;
  const int groups_per_tp = shape_.tp / replicas;
  return MakeGroup(
      *this, "kv", key_namespace, (me.pp * shape_.dp + me.dp) * groups_per_tp + group, replicas,
      [&](int i) { return MeshCoords{.dp = me.dp, .pp = me.pp, .tp = group * replicas + i}; });
}

absl::StatusOr<MeshCommunicators> Mesh::CreateCommunicators(
    const CommunicatorFactory& factory, const std::string& key_namespace) const {
  MeshCommunicators comms;
  ASSIGN_OR_RETURN(comms.tp, factory(TpGroup(key_namespace)));
  ASSIGN_OR_RETURN(comms.dp, factory(DpGroup(key_namespace)));
  ASSIGN_OR_RETURN(comms.pp, factory(PpGroup(key_namespace)));
  return comms;
}

}  // namespace dtrain
