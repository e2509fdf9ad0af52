// What this node's network is, read from sysfs, and whether NCCL's variables fit it and the
// recipe's cluster.network: interfaces and their speeds (<sys>/class/net), InfiniBand and RoCE
// ports with their state, rate and GID table (<sys>/class/infiniband), and NCCL_SOCKET_IFNAME,
// NCCL_IB_HCA, NCCL_IB_GID_INDEX, NCCL_IB_DISABLE, NCCL_NET_GDR_LEVEL plus every variable
// `dtrain plan` recommends (parallel/planner/plan_report.h). The sysfs root is a parameter so
// tests can lay out a fake InfiniBand or RoCE node.
#pragma once

#include <string>
#include <vector>

#include "launch/doctor/check.h"
#include "launch/environment.h"
#include "parallel/planner/catalog.h"

namespace dtrain::doctor {

struct NetInterface {
  std::string name;
  std::string operstate;  // "up", "down", "unknown" (loopback, some virtual interfaces)
  int speed_mbps = -1;    // -1: the driver does not say (down, virtual)
};

struct GidEntry {
  int index = 0;
  std::string gid;   // as sysfs writes it, e.g. "0000:0000:0000:0000:0000:ffff:0a00:0001"
  std::string type;  // "IB/RoCE v1" or "RoCE v2"
};

struct RdmaPort {
  std::string device;  // e.g. "mlx5_0"
  int port = 1;
  std::string state;           // e.g. "4: ACTIVE"
  std::string rate;            // e.g. "400 Gb/sec (4X NDR)"
  std::string link_layer;      // "InfiniBand" or "Ethernet" (RoCE)
  std::vector<GidEntry> gids;  // the non-zero entries, by index

  bool active() const;
  bool roce() const { return link_layer == "Ethernet"; }
  std::string label() const;  // "mlx5_0:1", as NCCL_IB_HCA names it
};

struct NetworkInventory {
  std::vector<NetInterface> interfaces;  // loopback left out
  std::vector<RdmaPort> ports;
};

// Reads `sys_root`/class/net and `sys_root`/class/infiniband; a missing folder is an empty list.
NetworkInventory ReadNetwork(const std::string& sys_root);

// The GID index NCCL_IB_GID_INDEX should name on a RoCE port: the RoCE v2 GID of an IPv4 address
// (::ffff:a.b.c.d, routable across subnets), else the first RoCE v2 GID; -1 when there is none.
int PreferredRoceGidIndex(const RdmaPort& port);

// Whether NCCL's interface or HCA list `spec` (NCCL_SOCKET_IFNAME, NCCL_IB_HCA syntax: entries
// separated by commas, a leading ^ excludes, a leading = matches names exactly rather than as
// prefixes, ":port" narrows an HCA to one port) selects `name` (and `port`; 0 for interfaces).
bool NcclListSelects(const std::string& spec, const std::string& name, int port);

// The network checks. `cluster` is the recipe's resolved cluster, or nullptr without a recipe;
// the recipe asks for RDMA when it spans nodes over an InfiniBand or RoCE network, and only then
// is a missing or inactive RDMA port a failure rather than information.
std::vector<CheckResult> NetworkChecks(const NetworkInventory& inventory, const EnvironmentMap& env,
                                       const ClusterSpec* cluster);

// True when `cluster` spans nodes over InfiniBand or RoCE.
bool RecipeNeedsRdma(const ClusterSpec* cluster);

}  // namespace dtrain::doctor
