#include "launch/doctor/cluster.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/util/host_name.h"
#include "core/util/status.h"
#include "launch/doctor/doctor.h"
#include "launch/hostlist.h"
#include "parallel/comm/gloo_communicator.h"
#include "parallel/comm_bench.h"
#include "parallel/process_group.h"

namespace dtrain::doctor {
namespace {

namespace fs = std::filesystem;

CheckResult Result(std::string name, Verdict verdict, std::string detail, std::string fix = "") {
  return CheckResult{std::move(name), verdict, std::move(detail), std::move(fix)};
}

std::string Lookup(const EnvironmentMap& env, const std::string& name) {
  const auto it = env.find(name);
  return it == env.end() ? "" : it->second;
}

// Slurm's name for the node; every task of the project's test cluster shares one host name.
std::string ThisNodeName(const EnvironmentMap& env) {
  if (std::string name = Lookup(env, "SLURMD_NODENAME"); !name.empty()) return name;
  return HostName();
}

int64_t NowNs() { return absl::ToUnixNanos(absl::Now()); }

std::string Millis(absl::Duration duration) {
  return absl::StrFormat("%.1f ms", absl::ToDoubleMilliseconds(duration));
}

// "n2 (rank 1)", or "rank 1" where the node is unknown.
std::string Label(const std::string& node, int rank) {
  return node.empty() ? absl::StrCat("rank ", rank) : absl::StrCat(node, " (rank ", rank, ")");
}

// ResultsText without its closing count line: one count closes the whole summary.
std::string WithoutCount(const std::string& results_text) {
  const size_t last_line = results_text.rfind('\n', results_text.size() - 2);
  return results_text.substr(0, last_line == std::string::npos ? 0 : last_line + 1);
}

std::string Key(int rank, absl::string_view what) {
  return absl::StrCat("doctor/", what, "/", rank);
}

std::string Where(const WorldEnvironment& world) {
  return absl::StrCat(world.master_addr, ":", world.master_port);
}

std::string ReachFix(const WorldEnvironment& world) {
  return absl::StrCat("on the node that cannot reach it, check that ", world.master_addr,
                      " resolves to node 0 (getent hosts ", world.master_addr,
                      ") and that TCP port ", world.master_port, " is open to it (nc -zv ",
                      world.master_addr, " ", world.master_port,
                      "): a firewall or a missing route; or set MASTER_ADDR to an address every "
                      "node reaches");
}

std::string ShareFix() {
  return "put checkpoint.dir on a file system every node mounts at the same path (NFS, Lustre, "
         "GPFS, ...): a node-local folder holds only that node's checkpoint chunks";
}

// One node's part of the run, as node 0 reads it from the store.
std::string EncodeReport(const std::string& node, const std::vector<CheckResult>& results) {
  nlohmann::ordered_json json = ResultsJson(results);
  json["node"] = node;
  return json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

NodeReport DecodeReport(int rank, const std::string& text) {
  NodeReport report{rank, "", {}};
  const nlohmann::json json = nlohmann::json::parse(text, nullptr, false);
  if (json.is_discarded() || !json.contains("checks")) {
    report.results.push_back(Result("cluster.report", Verdict::kFail,
                                    "its report did not parse: dtrain versions differ?",
                                    "run the same dtrain on every node"));
    return report;
  }
  report.node = json.value("node", report.node);
  for (const nlohmann::json& check : json["checks"]) {
    CheckResult result{check.value("name", ""), Verdict::kFail, check.value("detail", ""),
                       check.value("fix", "")};
    for (Verdict verdict : {Verdict::kOk, Verdict::kInfo, Verdict::kWarn, Verdict::kFail}) {
      if (check.value("verdict", "") == VerdictName(verdict)) result.verdict = verdict;
    }
    report.results.push_back(std::move(result));
  }
  return report;
}

// The rendezvous and the checks of one rank; every wait is bounded by the options' timeout (twice
// it where node 0 may first wait out a late node).
class Session {
 public:
  Session(const ClusterDoctorOptions& options, std::vector<CheckResult> own)
      : options_(options), world_(options.world) {
    self_.rank = world_.rank;
    self_.node = ThisNodeName(options.env);
    self_.results = std::move(own);
  }

  ClusterDoctorOutcome Run() {
    ClusterDoctorOutcome outcome;
    if (!Join()) {
      outcome.nodes.push_back(self_);
      outcome.summary = world_.rank == 0;
      return outcome;
    }
    return world_.rank == 0 ? RunNodeZero() : RunOther();
  }

 private:
  // Rank 0 hosts the store as it does for `srun dtrain train`; then every rank connects.
  bool Join() {
    const absl::Time start = absl::Now();
    absl::StatusOr<std::unique_ptr<TcpStoreServer>> server = ServeRendezvousStore(world_);
    if (!server.ok()) {
      self_.results.push_back(
          Result("cluster.master", Verdict::kFail,
                 absl::StrCat(Label(self_.node, 0), " cannot serve the rendezvous store at ",
                              Where(world_), ": ", server.status().message()),
                 "run rank 0 on the node MASTER_ADDR names, with a MASTER_PORT free there"));
      return false;
    }
    server_ = *std::move(server);
    TcpStoreClientOptions client_options;
    client_options.connect_timeout = options_.timeout;
    client_options.reply_timeout = options_.timeout;
    absl::StatusOr<std::unique_ptr<TcpStoreClient>> client =
        ConnectRendezvousStore(world_, client_options);
    if (!client.ok()) {
      self_.results.push_back(
          Result("cluster.reach", Verdict::kFail,
                 absl::StrCat(Label(self_.node, world_.rank), " cannot reach the master ",
                              Where(world_), ": ", client.status().message()),
                 ReachFix(world_)));
      return false;
    }
    store_ = *std::move(client);
    self_.results.push_back(Result(
        "cluster.reach", Verdict::kOk,
        absl::StrCat("reached the master ", Where(world_), " in ", Millis(absl::Now() - start))));
    return true;
  }

  ClusterDoctorOutcome RunNodeZero() {
    ClusterDoctorOutcome outcome;
    outcome.summary = true;
    const absl::Time deadline = absl::Now() + options_.timeout;
    std::vector<NodeReport>& nodes = outcome.nodes;
    nodes.push_back(self_);
    std::vector<int> present = {0};
    for (int rank = 1; rank < world_.world_size; ++rank) {
      const absl::Duration left = std::max(deadline - absl::Now(), absl::ZeroDuration());
      absl::StatusOr<std::string> report = store_->Get(Key(rank, "node"), left);
      if (report.ok()) {
        nodes.push_back(DecodeReport(rank, *report));
        present.push_back(rank);
        continue;
      }
      const std::string node = ExpectedNodeName(options_.env, rank);
      nodes.push_back(NodeReport{
          rank,
          node,
          {Result("cluster.reach", Verdict::kFail,
                  absl::StrCat(Label(node, rank), " did not reach the master ", Where(world_),
                               " within ", absl::FormatDuration(options_.timeout),
                               " (its own output says why, if it runs)"),
                  ReachFix(world_))}});
    }
    Publish("doctor/present", absl::StrJoin(present, ","));
    const auto node_of = [&](int rank) -> NodeReport& {
      return *std::find_if(nodes.begin(), nodes.end(),
                           [&](const NodeReport& n) { return n.rank == rank; });
    };
    for (size_t i = 1; i < present.size(); ++i) {
      NodeReport& node = node_of(present[i]);
      node.results.push_back(ServeClock(node.rank, Label(node.node, node.rank)));
    }
    ShareCheckpointFolder(present, node_of);
    outcome.cluster.push_back(NodeCountCheck(world_.num_nodes, options_.cluster));
    outcome.cluster.push_back(Bandwidth(static_cast<int>(present.size())));
    // The others read from the store this process hosts until they are done.
    const absl::Time done_deadline = absl::Now() + options_.timeout;
    while (absl::Now() < done_deadline) {
      const absl::StatusOr<int64_t> done = store_->Add("doctor/done", 0);
      if (!done.ok() || *done >= static_cast<int64_t>(present.size()) - 1) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return outcome;
  }

  ClusterDoctorOutcome RunOther() {
    ClusterDoctorOutcome outcome;
    const absl::Duration wait = 2 * options_.timeout;
    if (!store_->Set(Key(world_.rank, "node"), EncodeReport(self_.node, self_.results)).ok()) {
      return Lost(std::move(outcome), "could not send its report");
    }
    absl::StatusOr<std::string> present = store_->Get("doctor/present", wait);
    if (!present.ok()) return Lost(std::move(outcome), present.status().message());
    int count = 0;
    bool listed = false;
    for (absl::string_view rank : absl::StrSplit(*present, ',')) {
      ++count;
      listed = listed || rank == absl::StrCat(world_.rank);
    }
    if (!listed) {
      return Lost(std::move(outcome), "it reached the master after node 0 stopped waiting");
    }
    if (!SendClock().ok() || !AnswerCheckpointFolder().ok()) {
      return Lost(std::move(outcome), "node 0 stopped answering");
    }
    if (count == world_.world_size) (void)MeasureBandwidth();
    (void)store_->Add("doctor/done", 1);
    outcome.nodes.push_back(self_);
    outcome.in_summary = true;
    return outcome;
  }

  // A non-zero rank that lost node 0 after joining: it says so itself.
  ClusterDoctorOutcome Lost(ClusterDoctorOutcome outcome, absl::string_view why) {
    self_.results.push_back(Result(
        "cluster.node0", Verdict::kFail,
        absl::StrCat(Label(self_.node, world_.rank), " lost node 0 during the checks: ", why),
        "node 0's own output says what it saw"));
    outcome.nodes.push_back(self_);
    return outcome;
  }

  void Publish(const std::string& key, const std::string& value) { (void)store_->Set(key, value); }

  // Node 0's side of the clock round trips with `rank`: answers each ping with its time.
  CheckResult ServeClock(int rank, const std::string& who) {
    for (int i = 0; i < options_.clock_samples; ++i) {
      const std::string sample = absl::StrCat(rank, "/", i);
      if (!store_->Get(absl::StrCat("doctor/ping/", sample), options_.timeout).ok()) break;
      Publish(absl::StrCat("doctor/pong/", sample), absl::StrCat(NowNs()));
    }
    const absl::StatusOr<std::string> offset = store_->Get(Key(rank, "clock"), options_.timeout);
    std::pair<std::string, std::string> fields;
    ClockOffset parsed;
    if (offset.ok()) fields = absl::StrSplit(*offset, absl::MaxSplits(' ', 1));
    if (!offset.ok() || !absl::SimpleAtoi(fields.first, &parsed.offset_ns) ||
        !absl::SimpleAtoi(fields.second, &parsed.uncertainty_ns)) {
      return Result("cluster.clock", Verdict::kWarn,
                    absl::StrCat(who, " did not finish the clock round trips"),
                    "its own output says why");
    }
    return ClockSkewCheck(who, Label(self_.node, 0), parsed);
  }

  absl::Status SendClock() {
    std::vector<ClockSample> samples;
    for (int i = 0; i < options_.clock_samples; ++i) {
      const std::string sample = absl::StrCat(world_.rank, "/", i);
      ClockSample s;
      s.send_ns = NowNs();
      RETURN_IF_ERROR(store_->Set(absl::StrCat("doctor/ping/", sample), ""));
      absl::StatusOr<std::string> pong =
          store_->Get(absl::StrCat("doctor/pong/", sample), 2 * options_.timeout);
      s.receive_ns = NowNs();
      if (!pong.ok()) return pong.status();
      if (!absl::SimpleAtoi(*pong, &s.remote_ns)) return absl::DataLossError("clock");
      samples.push_back(s);
    }
    const ClockOffset offset = EstimateClockOffset(samples);
    return store_->Set(Key(world_.rank, "clock"),
                       absl::StrCat(offset.offset_ns, " ", offset.uncertainty_ns));
  }

  // Node 0 writes a nonce into the checkpoint folder (its nearest existing parent, where dtrain
  // would create it) and every node reads it back there.
  template <typename NodeOf>
  void ShareCheckpointFolder(const std::vector<int>& present, NodeOf node_of) {
    std::string published;  // "path\nnonce"; empty: nothing to check
    fs::path probe;
    std::string folder;
    if (!options_.checkpoint_dir.empty()) {
      folder = NearestExistingFolder(options_.checkpoint_dir).string();
      std::random_device random;
      const std::string nonce = absl::StrFormat("%08x%08x", random(), random());
      probe = fs::path(folder) / absl::StrCat(".dtrain-doctor-shared-", nonce);
      std::ofstream out(probe);
      out << nonce;
      out.close();
      if (out) published = absl::StrCat(probe.string(), "\n", nonce);
    }
    Publish("doctor/shared", published);
    for (size_t i = 1; i < present.size(); ++i) {
      NodeReport& node = node_of(present[i]);
      const absl::StatusOr<std::string> seen =
          store_->Get(Key(present[i], "shared"), options_.timeout);
      if (published.empty()) continue;  // no recipe, or node 0's own check says it is not writable
      if (!seen.ok()) {
        node.results.push_back(Result("cluster.checkpoint_shared", Verdict::kWarn,
                                      absl::StrCat(Label(node.node, node.rank), " did not answer"),
                                      "its own output says why"));
      } else if (seen->empty()) {
        node.results.push_back(Result("cluster.checkpoint_shared", Verdict::kOk,
                                      absl::StrCat(folder, " is node 0's folder here too")));
      } else {
        node.results.push_back(
            Result("cluster.checkpoint_shared", Verdict::kFail,
                   absl::StrCat(Label(node.node, node.rank), " does not see the file ",
                                Label(self_.node, 0), " wrote in ", folder, ": ", *seen,
                                "; checkpoint.dir is not shared"),
                   ShareFix()));
      }
    }
    std::error_code error;
    if (!probe.empty()) fs::remove(probe, error);
  }

  absl::Status AnswerCheckpointFolder() {
    ASSIGN_OR_RETURN(const std::string published,
                     store_->Get("doctor/shared", 2 * options_.timeout));
    std::string answer;
    if (!published.empty()) {
      const std::pair<std::string, std::string> fields =
          absl::StrSplit(published, absl::MaxSplits('\n', 1));
      std::ifstream in(fields.first);
      std::stringstream content;
      content << in.rdbuf();
      if (!in) {
        answer = absl::StrCat(fields.first, " does not exist here");
      } else if (content.str() != fields.second) {
        answer = absl::StrCat(fields.first, " holds something else here");
      }
    }
    return store_->Set(Key(world_.rank, "shared"), answer);
  }

  // Collective over every rank (node 0 runs it only when every rank arrived).
  absl::StatusOr<double> MeasureBandwidth() {
    GlooCommunicatorOptions comm_options;
    comm_options.name = "doctor";
    comm_options.key_prefix = "doctor/comm/";
    comm_options.rank = world_.rank;
    comm_options.size = world_.world_size;
    comm_options.timeout = options_.timeout;
    if (options_.hostname.empty()) {
      ASSIGN_OR_RETURN(comm_options.hostname, PeerHostname(world_.master_addr));
    } else {
      comm_options.hostname = options_.hostname;
    }
    ASSIGN_OR_RETURN(std::unique_ptr<GlooCommunicator> comm,
                     GlooCommunicator::Create(store_, comm_options));
    CommBenchOptions bench;
    bench.ops = {"all_reduce"};
    bench.min_bytes = bench.max_bytes = options_.bandwidth_bytes;
    bench.iters = 5;
    bench.warmup_iters = 2;
    ASSIGN_OR_RETURN(const std::vector<CommBenchRow> rows, RunCommBench(*comm, bench));
    return rows.back().busbw_gbps;
  }

  CheckResult Bandwidth(int present) {
    if (present < world_.world_size) {
      return Result("cluster.allreduce", Verdict::kInfo,
                    "not measured: not every node reached the master");
    }
    const absl::StatusOr<double> busbw = MeasureBandwidth();
    if (!busbw.ok()) {
      return Result(
          "cluster.allreduce", Verdict::kFail,
          absl::StrCat("the Gloo all-reduce across the nodes failed: ", busbw.status().message()),
          "every node must reach every other on any TCP port at the address it reaches the "
          "master from (or GLOO_SOCKET_IFNAME's, or --hostname); check the firewall between "
          "the nodes");
    }
    return BandwidthCheck(*busbw, options_.bandwidth_bytes, world_.num_nodes, options_.cluster);
  }

  const ClusterDoctorOptions& options_;
  const WorldEnvironment& world_;
  NodeReport self_;
  std::unique_ptr<TcpStoreServer> server_;  // rank 0, unless an agent hosts the store
  std::shared_ptr<TcpStoreClient> store_;
};

}  // namespace

ClockOffset EstimateClockOffset(const std::vector<ClockSample>& samples) {
  const ClockSample& best =
      *std::min_element(samples.begin(), samples.end(), [](const auto& a, const auto& b) {
        return a.receive_ns - a.send_ns < b.receive_ns - b.send_ns;
      });
  const int64_t round_trip = best.receive_ns - best.send_ns;
  return ClockOffset{best.remote_ns - (best.send_ns + round_trip / 2), round_trip / 2};
}

CheckResult ClockSkewCheck(const std::string& node, const std::string& reference,
                           const ClockOffset& offset, absl::Duration warn_over) {
  // Positive offset: node 0's clock reads later, so this node is behind.
  const absl::Duration skew = absl::Nanoseconds(std::abs(offset.offset_ns));
  const absl::Duration uncertainty = absl::Nanoseconds(offset.uncertainty_ns);
  const std::string detail = absl::StrCat(node, "'s clock is ", Millis(skew),
                                          offset.offset_ns > 0 ? " behind " : " ahead of ",
                                          reference, "'s (+/- ", Millis(uncertainty), ")");
  if (skew - uncertainty <= warn_over) return Result("cluster.clock", Verdict::kOk, detail);
  return Result("cluster.clock", Verdict::kWarn,
                absl::StrCat(detail, "; more than ", Millis(warn_over),
                             " makes logs and flight-recorder dumps disagree across nodes"),
                absl::StrCat("synchronise the clocks (chrony or ntpd on every node; chronyc "
                             "tracking shows the offset on ",
                             node, ")"));
}

CheckResult BandwidthCheck(double busbw_gbps, int64_t bytes, int nodes,
                           const ClusterSpec* cluster) {
  std::string detail =
      absl::StrFormat("all-reduce of %d MiB over %d nodes (Gloo): bus bandwidth %.2f GB/s",
                      bytes >> 20, nodes, busbw_gbps);
  if (cluster == nullptr) {
    return Result("cluster.allreduce", Verdict::kInfo,
                  absl::StrCat(detail, "; no recipe to compare with"));
  }
  const double expected = cluster->nic_gbps;
  absl::StrAppendFormat(&detail, ", %.0f%% of cluster.network %s's %.1f GB/s",
                        100 * busbw_gbps / expected, cluster->network_name, expected);
  if (busbw_gbps >= kMinBandwidthFraction * expected) {
    return Result("cluster.allreduce", Verdict::kOk, detail);
  }
  if (cluster->network_transport != Transport::kSocket) {
    return Result("cluster.allreduce", Verdict::kInfo,
                  absl::StrCat(detail, "; Gloo runs over TCP, not the RDMA that NCCL uses"));
  }
  return Result(
      "cluster.allreduce", Verdict::kWarn,
      absl::StrFormat("%s; below %.0f%% of it", detail, 100 * kMinBandwidthFraction),
      "the nodes talk over a slower network than cluster.network declares: check that the host "
      "names resolve to the fast interface (ip route get PEER, ethtool IFACE for its speed), or "
      "set cluster.network to the network the nodes have (dtrain plan --catalog)");
}

CheckResult NodeCountCheck(int nodes, const ClusterSpec* cluster) {
  const std::string detail =
      absl::StrCat(nodes, nodes == 1 ? " node" : " nodes", " ran the doctor");
  if (cluster == nullptr) {
    return Result("cluster.nodes", Verdict::kInfo, absl::StrCat(detail, "; no recipe"));
  }
  if (cluster->nodes == nodes) {
    return Result("cluster.nodes", Verdict::kOk, absl::StrCat(detail, ", as cluster.nodes says"));
  }
  return Result("cluster.nodes", Verdict::kWarn,
                absl::StrCat(detail, ", but cluster.nodes is ", cluster->nodes,
                             ": the plan and the bandwidth figures assume that many"),
                absl::StrCat("set cluster.nodes to ", nodes,
                             ", or run the job on as many nodes as cluster.nodes says"));
}

Verdict WorstVerdict(const std::vector<CheckResult>& results) {
  Verdict worst = Verdict::kOk;
  for (const CheckResult& result : results) {
    // kInfo needs no action: it ranks with ok.
    if (result.verdict == Verdict::kWarn || result.verdict == Verdict::kFail) {
      worst = std::max(worst, result.verdict);
    }
  }
  return worst;
}

std::string ClusterSummaryText(const std::vector<NodeReport>& nodes,
                               const std::vector<CheckResult>& cluster) {
  std::string text;
  std::vector<CheckResult> all = cluster;
  for (const NodeReport& node : nodes) {
    absl::StrAppend(&text, "== ", Label(node.node, node.rank), "\n");
    for (const CheckResult& result : node.results) all.push_back(result);
    absl::StrAppend(&text, WithoutCount(ResultsText(node.results)));
  }
  if (!cluster.empty()) {
    absl::StrAppend(&text, "== cluster\n");
    absl::StrAppend(&text, WithoutCount(ResultsText(cluster)));
  }
  absl::StrAppend(&text, "== verdict per node\n");
  for (const NodeReport& node : nodes) {
    absl::StrAppendFormat(&text, "%-5s %s\n", VerdictName(WorstVerdict(node.results)),
                          Label(node.node, node.rank));
  }
  const std::string counts = ResultsText(all);
  absl::StrAppend(&text, counts.substr(WithoutCount(counts).size()));
  return text;
}

nlohmann::ordered_json ClusterSummaryJson(const std::vector<NodeReport>& nodes,
                                          const std::vector<CheckResult>& cluster) {
  nlohmann::ordered_json json;
  json["nodes"] = nlohmann::ordered_json::array();
  for (const NodeReport& node : nodes) {
    nlohmann::ordered_json entry = ResultsJson(node.results);
    entry["node"] = node.node;
    entry["rank"] = node.rank;
    entry["verdict"] = VerdictName(WorstVerdict(node.results));
    json["nodes"].push_back(std::move(entry));
  }
  json["cluster"] = ResultsJson(cluster);
  return json;
}

std::string ExpectedNodeName(const EnvironmentMap& env, int rank) {
  const std::string nodelist = Lookup(env, "SLURM_STEP_NODELIST");
  const std::string tasks = Lookup(env, "SLURM_STEP_TASKS_PER_NODE");
  const std::string distribution = Lookup(env, "SLURM_DISTRIBUTION");
  // Other distributions (-m cyclic, plane) deal the ranks round the nodes: not derived here.
  if (nodelist.empty() || tasks.empty() || !IsBlockDistribution(distribution)) {
    return "";
  }
  const absl::StatusOr<std::vector<std::string>> hosts = ExpandHostlist(nodelist);
  const absl::StatusOr<std::vector<int>> counts = ExpandTasksPerNode(tasks);
  if (!hosts.ok() || !counts.ok() || hosts->size() != counts->size()) return "";
  const int node = NodeOfBlockTask(*counts, rank);
  return node >= 0 ? (*hosts)[node] : "";
}

ClusterDoctorOutcome RunClusterChecks(const ClusterDoctorOptions& options,
                                      std::vector<CheckResult> own) {
  return Session(options, std::move(own)).Run();
}

}  // namespace dtrain::doctor
