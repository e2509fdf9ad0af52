// `dtrain doctor` across nodes: `srun --ntasks-per-node=1 dtrain doctor RECIPE` (or any launcher
// that sets the world as for training). Every process runs the node checks (doctor.h), then the
// processes meet as `srun dtrain train` ranks do: rank 0 hosts the rendezvous store at
// MASTER_ADDR:MASTER_PORT (ResolveWorld) and every rank connects with the job's token. Over the
// store they check that every node reaches the master within a bounded timeout (a node that
// does not is named, by rank 0 and by itself), each node's clock offset from node 0 (round
// trips through the store), that the checkpoint folder is the same folder on every node (node 0
// writes a nonce file, each node reads it back), and an all-reduce's bus bandwidth on the Gloo
// communicator training uses, against the recipe's cluster.network. Rank 0 prints one summary;
// the other ranks print only what they could not send to it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "launch/doctor/check.h"
#include "launch/environment.h"
#include "parallel/planner/catalog.h"

namespace dtrain::doctor {

// One round trip to node 0: this node's clock when it asked, node 0's when it answered, this
// node's when the answer came (Unix nanoseconds, wall clock: what logs and dumps compare).
struct ClockSample {
  int64_t send_ns = 0;
  int64_t remote_ns = 0;
  int64_t receive_ns = 0;
};

struct ClockOffset {
  int64_t offset_ns = 0;       // node 0's clock minus this node's
  int64_t uncertainty_ns = 0;  // half the round trip of the sample used
};

// NTP's estimate from the sample with the shortest round trip (the least room for asymmetric
// delay): node 0 answered somewhere within the round trip, assumed at its middle. `samples` must
// not be empty.
ClockOffset EstimateClockOffset(const std::vector<ClockSample>& samples);

// Above this the flight recorder's and the step logs' times no longer line up across nodes.
inline constexpr absl::Duration kClockSkewWarn = absl::Milliseconds(100);

// ok within `warn_over` (after allowing for the estimate's uncertainty), else a warning naming
// `node`, the skew and whether its clock is ahead of or behind node 0's (`reference`).
CheckResult ClockSkewCheck(const std::string& node, const std::string& reference,
                           const ClockOffset& offset, absl::Duration warn_over = kClockSkewWarn);

// Below this fraction of the catalog's bus bandwidth the network is not what the recipe declares.
inline constexpr double kMinBandwidthFraction = 0.5;

// The all-reduce's bus bandwidth against cluster.network's busbw (per NIC; Gloo uses one TCP
// connection per peer). Judged ok / warn on a TCP-socket network; on an RDMA network Gloo's TCP
// path is not the one NCCL takes, so a shortfall is information. `cluster` null (no recipe):
// information.
CheckResult BandwidthCheck(double busbw_gbps, int64_t bytes, int nodes, const ClusterSpec* cluster);

// The nodes that ran the doctor against the recipe's cluster.nodes, which the planner's layout
// and the bandwidth figures assume: ok when equal, else a warning with the value to set.
// `cluster` null (no recipe): information.
CheckResult NodeCountCheck(int nodes, const ClusterSpec* cluster);

// What node 0 knows of one node: its node checks and the cluster checks that name it.
struct NodeReport {
  int rank = 0;
  std::string node;  // SLURMD_NODENAME, else the host name; empty: unknown
  std::vector<CheckResult> results;
};

// The worst verdict among `results` (kOk for none).
Verdict WorstVerdict(const std::vector<CheckResult>& results);

// Each node's checks under its name, then the cluster-wide checks, then one verdict per node
// (the worst of its checks) and the closing counts.
std::string ClusterSummaryText(const std::vector<NodeReport>& nodes,
                               const std::vector<CheckResult>& cluster);
nlohmann::ordered_json ClusterSummaryJson(const std::vector<NodeReport>& nodes,
                                          const std::vector<CheckResult>& cluster);

// The name of the node world rank `rank` runs on, from Slurm's step node list and tasks per node
// under srun's default block distribution (SLURM_DISTRIBUTION unset or block), else empty: for
// ranks that never reached node 0.
std::string ExpectedNodeName(const EnvironmentMap& env, int rank);

struct ClusterDoctorOptions {
  EnvironmentMap env;  // the process environment: the world, the node's name
  WorldEnvironment world;
  // How long a node may take to reach the master, and bound of every later wait.
  absl::Duration timeout = absl::Seconds(30);
  // The address peers reach this node's Gloo device at; empty: as training picks it (loopback
  // for a loopback master, else the host name).
  std::string hostname;
  std::string checkpoint_dir;  // empty: no recipe, not checked
  const ClusterSpec* cluster = nullptr;
  int64_t bandwidth_bytes = int64_t{64} << 20;
  int clock_samples = 8;
};

struct ClusterDoctorOutcome {
  bool summary = false;  // rank 0: `nodes` and `cluster` hold every node's report
  // A non-zero rank whose whole report reached node 0's summary: it need print nothing.
  bool in_summary = false;
  std::vector<NodeReport> nodes;  // rank 0: every node; other ranks: their own
  std::vector<CheckResult> cluster;
};

// Runs on every rank with its node checks (`own`); collective, bounded by options.timeout per
// wait. Never an error: what fails is a fail result naming the node.
ClusterDoctorOutcome RunClusterChecks(const ClusterDoctorOptions& options,
                                      std::vector<CheckResult> own);

}  // namespace dtrain::doctor
