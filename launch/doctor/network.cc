#include "launch/doctor/network.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "parallel/planner/plan_report.h"

namespace dtrain::doctor {
namespace {

namespace fs = std::filesystem;

// A sysfs attribute's first line, trimmed; empty when it cannot be read (a down interface's
// speed reads as an error, not a number).
std::string ReadAttribute(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return "";
  return std::string(absl::StripAsciiWhitespace(line));
}

std::vector<fs::path> SortedEntries(const fs::path& folder) {
  std::vector<fs::path> entries;
  std::error_code error;
  for (fs::directory_iterator it(folder, error), end; !error && it != end; it.increment(error)) {
    entries.push_back(it->path());
  }
  std::sort(entries.begin(), entries.end());
  return entries;
}

bool IsZeroGid(const std::string& gid) {
  return std::all_of(gid.begin(), gid.end(), [](char c) { return c == '0' || c == ':'; });
}

// sysfs writes an IPv4-mapped GID as 0000:0000:0000:0000:0000:ffff:0a00:0001.
bool IsIpv4MappedGid(const std::string& gid) {
  return absl::StartsWith(gid, "0000:0000:0000:0000:0000:ffff:");
}

std::string SpeedText(int speed_mbps) {
  if (speed_mbps < 0) return "speed unknown";
  if (speed_mbps >= 1000 && speed_mbps % 1000 == 0) return absl::StrCat(speed_mbps / 1000, " Gb/s");
  return absl::StrCat(speed_mbps, " Mb/s");
}

std::string InterfaceText(const NetInterface& nic) {
  return absl::StrCat(nic.name, " ", nic.operstate, " ", SpeedText(nic.speed_mbps));
}

std::string PortText(const RdmaPort& port) {
  std::string text = absl::StrCat(port.label(), " ", port.roce() ? "RoCE" : port.link_layer, " ",
                                  port.state, ", ", port.rate.empty() ? "rate unknown" : port.rate);
  if (port.roce()) {
    const int index = PreferredRoceGidIndex(port);
    absl::StrAppend(&text,
                    index < 0 ? ", no RoCE v2 GID" : absl::StrCat(", RoCE v2 GID index ", index));
  }
  return text;
}

std::string NetworkText(const ClusterSpec& cluster) {
  return absl::StrCat("cluster.network ", cluster.network_name, " (",
                      TransportName(cluster.network_transport), ")");
}

// Ports of the link layer the recipe's network needs (InfiniBand ports for InfiniBand, Ethernet
// ports for RoCE); every port without a recipe.
bool PortFitsRecipe(const RdmaPort& port, const ClusterSpec* cluster) {
  if (!RecipeNeedsRdma(cluster)) return true;
  return port.roce() == (cluster->network_transport == Transport::kRoce);
}

std::string Lookup(const EnvironmentMap& env, const std::string& name) {
  const auto it = env.find(name);
  return it == env.end() ? "" : it->second;
}

CheckResult Result(std::string name, Verdict verdict, std::string detail, std::string fix = "") {
  return CheckResult{std::move(name), verdict, std::move(detail), std::move(fix)};
}

CheckResult InterfacesCheck(const NetworkInventory& inventory) {
  std::vector<std::string> shown;
  bool any_up = false;
  for (const NetInterface& nic : inventory.interfaces) {
    shown.push_back(InterfaceText(nic));
    any_up = any_up || nic.operstate == "up";
  }
  if (!any_up) {
    return Result("network.interfaces", Verdict::kWarn,
                  shown.empty() ? "no network interface but loopback"
                                : absl::StrCat("none up: ", absl::StrJoin(shown, ", ")),
                  "bring the node's network interface up (ip link set DEV up); other nodes "
                  "cannot reach this one");
  }
  return Result("network.interfaces", Verdict::kOk, absl::StrJoin(shown, ", "));
}

std::vector<CheckResult> RdmaChecks(const NetworkInventory& inventory, const ClusterSpec* cluster) {
  std::vector<CheckResult> results;
  const bool needed = RecipeNeedsRdma(cluster);
  bool usable = false;
  for (const RdmaPort& port : inventory.ports) {
    const std::string name = absl::StrCat("rdma.", port.label());
    const bool fits = PortFitsRecipe(port, cluster);
    usable =
        usable || (fits && port.active() && (!port.roce() || PreferredRoceGidIndex(port) >= 0));
    if (!port.active()) {
      results.push_back(Result(name, Verdict::kWarn, PortText(port),
                               "the port is not ACTIVE: check its cable and, on InfiniBand, the "
                               "subnet manager (ibstat); or leave it out of NCCL_IB_HCA"));
    } else if (port.roce() && PreferredRoceGidIndex(port) < 0) {
      results.push_back(Result(name, Verdict::kWarn, PortText(port),
                               "give the port's interface an IP address so that it gets a RoCE v2 "
                               "GID (show_gids lists them)"));
    } else {
      results.push_back(Result(name, Verdict::kOk, PortText(port)));
    }
  }
  if (needed && !usable) {
    const bool roce = cluster->network_transport == Transport::kRoce;
    results.push_back(Result(
        "network.rdma", Verdict::kFail,
        absl::StrCat(NetworkText(*cluster), " across ", cluster->nodes,
                     " nodes, but this node has ",
                     inventory.ports.empty()
                         ? "no InfiniBand or RoCE device"
                         : absl::StrCat("no ACTIVE ", roce ? "RoCE (Ethernet) port with a RoCE "
                                                             "v2 GID"
                                                           : "InfiniBand port")),
        absl::StrCat("load the RDMA driver (mlx5_ib) and bring ", roce ? "a RoCE" : "an InfiniBand",
                     " port up (ibv_devinfo), or set cluster.network to the network this "
                     "cluster has (dtrain plan --catalog: eth-25, eth-100 for TCP sockets)")));
  } else if (needed) {
    results.push_back(Result("network.rdma", Verdict::kOk,
                             absl::StrCat(NetworkText(*cluster), ": this node has a usable port")));
  } else if (inventory.ports.empty()) {
    results.push_back(
        Result("network.rdma", Verdict::kInfo,
               cluster == nullptr
                   ? "no InfiniBand or RoCE device; NCCL will use TCP sockets"
                   : absl::StrCat("no InfiniBand or RoCE device; ", NetworkText(*cluster), " on ",
                                  cluster->nodes, cluster->nodes == 1 ? " node" : " nodes",
                                  " does not need one")));
  }
  return results;
}

// The ports NCCL will use: those NCCL_IB_HCA selects, every port when it is unset.
std::vector<const RdmaPort*> SelectedPorts(const NetworkInventory& inventory,
                                           const EnvironmentMap& env) {
  const std::string hca = Lookup(env, "NCCL_IB_HCA");
  std::vector<const RdmaPort*> selected;
  for (const RdmaPort& port : inventory.ports) {
    if (hca.empty() || NcclListSelects(hca, port.device, port.port)) selected.push_back(&port);
  }
  return selected;
}

std::vector<std::string> Labels(const std::vector<RdmaPort>& ports) {
  std::vector<std::string> labels;
  for (const RdmaPort& port : ports) labels.push_back(port.label());
  return labels;
}

std::optional<CheckResult> SocketIfnameCheck(const NetworkInventory& inventory,
                                             const std::string& value) {
  if (value.empty()) return std::nullopt;
  const std::string name = "nccl.NCCL_SOCKET_IFNAME";
  std::vector<std::string> selected, all;
  bool any_up = false;
  for (const NetInterface& nic : inventory.interfaces) {
    all.push_back(nic.name);
    if (!NcclListSelects(value, nic.name, 0)) continue;
    selected.push_back(InterfaceText(nic));
    any_up = any_up || nic.operstate == "up";
  }
  if (selected.empty()) {
    return Result(name, Verdict::kFail,
                  absl::StrCat("'", value, "' selects none of this node's interfaces (",
                               absl::StrJoin(all, ", "), ")"),
                  "set NCCL_SOCKET_IFNAME to the fast interface, e.g. =" +
                      (all.empty() ? std::string("eth0") : all.front()) + " (ip -br link)");
  }
  if (!any_up) {
    return Result(name, Verdict::kFail,
                  absl::StrCat("'", value, "' selects only interfaces that are down: ",
                               absl::StrJoin(selected, ", ")),
                  "bring the interface up or name one that is up (ip -br link)");
  }
  return Result(name, Verdict::kOk,
                absl::StrCat("'", value, "' selects ", absl::StrJoin(selected, ", ")));
}

// dtrain's Gloo binds the address of the first interface GLOO_SOCKET_IFNAME names (exactly, as
// PyTorch's Gloo does), and training fails at once when it is missing.
std::optional<CheckResult> GlooIfnameCheck(const NetworkInventory& inventory,
                                           const std::string& value) {
  if (value.empty()) return std::nullopt;
  const std::string name = "gloo.GLOO_SOCKET_IFNAME";
  const std::string first = value.substr(0, value.find(','));
  std::vector<std::string> all;
  const NetInterface* named = nullptr;
  for (const NetInterface& nic : inventory.interfaces) {
    all.push_back(nic.name);
    if (nic.name == first) named = &nic;
  }
  if (named == nullptr) {
    return Result(name, Verdict::kFail,
                  absl::StrCat("'", first, "' is none of this node's interfaces (",
                               absl::StrJoin(all, ", "), "); training would stop at start"),
                  "set GLOO_SOCKET_IFNAME to the interface of the network between the nodes "
                  "(ip -br addr), or unset it");
  }
  if (named->operstate == "down") {
    return Result(name, Verdict::kFail, absl::StrCat("'", first, "' is down"),
                  "bring the interface up or name one that is up (ip -br link)");
  }
  return Result(name, Verdict::kOk,
                absl::StrCat("'", first, "': ", InterfaceText(*named),
                             ", the address the ranks' Gloo binds"));
}

std::optional<CheckResult> IbHcaCheck(const NetworkInventory& inventory, const EnvironmentMap& env,
                                      const ClusterSpec* cluster) {
  const std::string value = Lookup(env, "NCCL_IB_HCA");
  if (value.empty()) return std::nullopt;
  const std::string name = "nccl.NCCL_IB_HCA";
  const Verdict missing = RecipeNeedsRdma(cluster) ? Verdict::kFail : Verdict::kWarn;
  if (inventory.ports.empty()) {
    return Result(name, missing, absl::StrCat("'", value, "' but this node has no RDMA device"),
                  "unset NCCL_IB_HCA on nodes without InfiniBand or RoCE, or load the RDMA "
                  "driver (ibv_devinfo)");
  }
  std::vector<std::string> active;
  for (const RdmaPort* port : SelectedPorts(inventory, env)) {
    if (port->active() && PortFitsRecipe(*port, cluster)) active.push_back(port->label());
  }
  if (active.empty()) {
    return Result(name, missing,
                  absl::StrCat("'", value, "' selects no ACTIVE port",
                               RecipeNeedsRdma(cluster) ? " of the recipe's network" : "",
                               "; this node has ", absl::StrJoin(Labels(inventory.ports), ", ")),
                  "name the active ports of the fast network, e.g. =" +
                      inventory.ports.front().label() + " (ibv_devinfo)");
  }
  return Result(name, Verdict::kOk,
                absl::StrCat("'", value, "' selects ", absl::StrJoin(active, ", ")));
}

// On RoCE the GID index picks the protocol and address NCCL uses: index 0 is usually RoCE v1 on
// the link-local address, which does not route between subnets.
std::optional<CheckResult> GidIndexCheck(const NetworkInventory& inventory,
                                         const EnvironmentMap& env, const ClusterSpec* cluster) {
  const std::string value = Lookup(env, "NCCL_IB_GID_INDEX");
  const std::string name = "nccl.NCCL_IB_GID_INDEX";
  std::vector<const RdmaPort*> roce;
  for (const RdmaPort* port : SelectedPorts(inventory, env)) {
    if (port->roce() && port->active()) roce.push_back(port);
  }
  // -1 is NCCL's own default, spelled out: the GID is picked automatically (2.21 and later).
  if (value.empty() || value == "-1") {
    if (roce.empty()) {
      if (value.empty()) return std::nullopt;
      return Result(name, Verdict::kOk, "'-1': NCCL's default, no RoCE port here");
    }
    const int preferred = PreferredRoceGidIndex(*roce.front());
    if (preferred < 0) return std::nullopt;  // the port's own check says what is missing
    const bool needed = RecipeNeedsRdma(cluster);
    return Result(
        name, needed ? Verdict::kWarn : Verdict::kInfo,
        absl::StrCat(value.empty() ? "unset" : "'-1' (NCCL's default)", " on RoCE port ",
                     roce.front()->label(), "; NCCL before 2.21 then uses GID 0 (RoCE v1)"),
        needed ? absl::StrCat("export NCCL_IB_GID_INDEX=", preferred, "  # the RoCE v2 ", "GID of ",
                              roce.front()->label())
               : "");
  }
  int index = -1;
  if (!absl::SimpleAtoi(value, &index) || index < 0) {
    return Result(name, Verdict::kFail, absl::StrCat("'", value, "' is not a GID index"),
                  "set NCCL_IB_GID_INDEX to a number from the GID table (show_gids)");
  }
  if (roce.empty()) {
    return Result(
        name, Verdict::kInfo,
        absl::StrCat("'", value, "'; no ACTIVE RoCE port uses it (InfiniBand ignores it)"));
  }
  for (const RdmaPort* port : roce) {
    const auto entry = std::find_if(port->gids.begin(), port->gids.end(),
                                    [&](const GidEntry& gid) { return gid.index == index; });
    if (entry != port->gids.end() && entry->type == "RoCE v2" && IsIpv4MappedGid(entry->gid)) {
      continue;
    }
    if (entry != port->gids.end() && entry->type == "RoCE v2" &&
        PreferredRoceGidIndex(*port) == index) {
      continue;  // an IPv6-only port: its first RoCE v2 GID is the right one
    }
    const int preferred = PreferredRoceGidIndex(*port);
    const std::string found =
        entry == port->gids.end()
            ? "is empty"
            : absl::StrCat("is ", entry->type, " ", entry->gid,
                           entry->type == "RoCE v2" ? " (IPv6, not the IPv4 address)" : "");
    return Result(name, Verdict::kFail,
                  absl::StrCat("'", value, "': GID ", index, " of ", port->label(), " ", found),
                  preferred < 0 ? std::string("give the port's interface an IP address (show_gids)")
                                : absl::StrCat("export NCCL_IB_GID_INDEX=", preferred,
                                               "  # the RoCE v2 GID of ", port->label()));
  }
  return Result(name, Verdict::kOk,
                absl::StrCat("'", value, "' is a RoCE v2 GID on every selected RoCE port"));
}

std::optional<CheckResult> IbDisableCheck(const EnvironmentMap& env, const ClusterSpec* cluster) {
  const std::string value = Lookup(env, "NCCL_IB_DISABLE");
  if (value.empty()) return std::nullopt;
  const std::string name = "nccl.NCCL_IB_DISABLE";
  if (value == "1" && RecipeNeedsRdma(cluster)) {
    return Result(
        name, Verdict::kFail,
        absl::StrCat("1, but ", NetworkText(*cluster), ": NCCL would fall back to TCP sockets"),
        "unset NCCL_IB_DISABLE");
  }
  if (value != "0" && value != "1") {
    return Result(name, Verdict::kFail, absl::StrCat("'", value, "' is neither 0 nor 1"),
                  "set NCCL_IB_DISABLE=1 for TCP sockets, or unset it");
  }
  return Result(name, Verdict::kOk, value);
}

std::optional<CheckResult> GdrLevelCheck(const EnvironmentMap& env) {
  const std::string value = Lookup(env, "NCCL_NET_GDR_LEVEL");
  if (value.empty()) return std::nullopt;
  const std::string name = "nccl.NCCL_NET_GDR_LEVEL";
  // NCCL's path types, and the integers 0-5 of older releases.
  static const std::set<std::string> kLevels = {"LOC", "PIX", "PXB", "PHB", "SYS", "0",
                                                "1",   "2",   "3",   "4",   "5"};
  if (kLevels.count(value) == 0) {
    return Result(name, Verdict::kFail, absl::StrCat("'", value, "' is not a GPUDirect level"),
                  "set it to LOC, PIX, PXB, PHB or SYS (the farthest GPU-NIC path that may use "
                  "GPUDirect RDMA), or unset it");
  }
  return Result(name, Verdict::kOk, value);
}

}  // namespace

bool RdmaPort::active() const { return absl::EndsWith(state, "ACTIVE"); }

std::string RdmaPort::label() const { return absl::StrCat(device, ":", port); }

NetworkInventory ReadNetwork(const std::string& sys_root) {
  NetworkInventory inventory;
  for (const fs::path& folder : SortedEntries(fs::path(sys_root) / "class/net")) {
    NetInterface nic;
    nic.name = folder.filename().string();
    if (nic.name == "lo") continue;
    nic.operstate = ReadAttribute(folder / "operstate");
    if (!absl::SimpleAtoi(ReadAttribute(folder / "speed"), &nic.speed_mbps)) nic.speed_mbps = -1;
    inventory.interfaces.push_back(std::move(nic));
  }
  for (const fs::path& device : SortedEntries(fs::path(sys_root) / "class/infiniband")) {
    for (const fs::path& folder : SortedEntries(device / "ports")) {
      RdmaPort port;
      port.device = device.filename().string();
      if (!absl::SimpleAtoi(folder.filename().string(), &port.port)) continue;
      port.state = ReadAttribute(folder / "state");
      port.rate = ReadAttribute(folder / "rate");
      port.link_layer = ReadAttribute(folder / "link_layer");
      for (const fs::path& gid_path : SortedEntries(folder / "gids")) {
        GidEntry gid;
        if (!absl::SimpleAtoi(gid_path.filename().string(), &gid.index)) continue;
        gid.gid = ReadAttribute(gid_path);
        if (gid.gid.empty() || IsZeroGid(gid.gid)) continue;
        gid.type = ReadAttribute(folder / "gid_attrs/types" / gid_path.filename());
        port.gids.push_back(std::move(gid));
      }
      std::sort(port.gids.begin(), port.gids.end(),
                [](const GidEntry& a, const GidEntry& b) { return a.index < b.index; });
      inventory.ports.push_back(std::move(port));
    }
  }
  return inventory;
}

int PreferredRoceGidIndex(const RdmaPort& port) {
  int first_v2 = -1;
  for (const GidEntry& gid : port.gids) {
    if (gid.type != "RoCE v2") continue;
    if (IsIpv4MappedGid(gid.gid)) return gid.index;
    if (first_v2 < 0) first_v2 = gid.index;
  }
  return first_v2;
}

bool NcclListSelects(const std::string& spec, const std::string& name, int port) {
  absl::string_view list = spec;
  const bool exclude = absl::ConsumePrefix(&list, "^");
  const bool exact = absl::ConsumePrefix(&list, "=");
  bool listed = false;
  for (absl::string_view entry : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    const std::pair<absl::string_view, absl::string_view> parts =
        absl::StrSplit(entry, absl::MaxSplits(':', 1));
    int entry_port = 0;
    if (!parts.second.empty() && port != 0 &&
        (!absl::SimpleAtoi(parts.second, &entry_port) || entry_port != port)) {
      continue;
    }
    if (exact ? name == parts.first : absl::StartsWith(name, parts.first)) listed = true;
  }
  return listed != exclude;
}

bool RecipeNeedsRdma(const ClusterSpec* cluster) {
  return cluster != nullptr && cluster->nodes > 1 &&
         (cluster->network_transport == Transport::kInfiniband ||
          cluster->network_transport == Transport::kRoce);
}

std::vector<CheckResult> NetworkChecks(const NetworkInventory& inventory, const EnvironmentMap& env,
                                       const ClusterSpec* cluster) {
  std::vector<CheckResult> results = {InterfacesCheck(inventory)};
  for (CheckResult& rdma : RdmaChecks(inventory, cluster)) results.push_back(std::move(rdma));

  // The variables dtrain knows how to check against this node, then those `dtrain plan`
  // recommends for the recipe's network that no check above covered.
  std::set<std::string> checked;
  for (std::optional<CheckResult> result :
       {SocketIfnameCheck(inventory, Lookup(env, "NCCL_SOCKET_IFNAME")),
        GlooIfnameCheck(inventory, Lookup(env, "GLOO_SOCKET_IFNAME")),
        IbHcaCheck(inventory, env, cluster), GidIndexCheck(inventory, env, cluster),
        IbDisableCheck(env, cluster), GdrLevelCheck(env)}) {
    if (!result.has_value()) continue;
    checked.insert(result->name);
    results.push_back(std::move(*result));
  }
  if (cluster == nullptr) return results;
  for (const auto& [assignment, why] : NetworkEnvironment(*cluster)) {
    const std::pair<std::string, std::string> parts =
        absl::StrSplit(assignment, absl::MaxSplits('=', 1));
    const std::string& variable = parts.first;
    const std::string name = "nccl." + variable;
    if (checked.count(name) > 0) continue;
    const std::string value = Lookup(env, variable);
    const std::string recommended =
        absl::StrCat("export ", assignment, why.empty() ? "" : "  # ", why);
    if (value.empty()) {
      results.push_back(
          Result(name, Verdict::kWarn,
                 absl::StrCat("unset; dtrain plan recommends it for ", NetworkText(*cluster)),
                 recommended));
    } else if (value == parts.second) {
      results.push_back(Result(name, Verdict::kOk, value));
    } else {
      results.push_back(Result(name, Verdict::kInfo,
                               absl::StrCat("'", value, "'; dtrain plan recommends '", parts.second,
                                            "' for ", NetworkText(*cluster))));
    }
  }
  return results;
}

}  // namespace dtrain::doctor
