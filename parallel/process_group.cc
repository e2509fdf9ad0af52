#include "parallel/process_group.h"

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <exception>
#include <functional>
#include <map>
#include <set>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/util/exit_codes.h"
#include "core/util/log.h"
#include "core/util/status.h"
#include "parallel/comm/backend_memory_guard.h"
#include "parallel/comm/faulty_ranks.h"
#include "parallel/comm/flight_recorder_diagnosis.h"
#include "parallel/comm/gloo_communicator.h"
#include "parallel/comm/nccl_module.h"
#include "parallel/store/auth.h"
#include "parallel/store/socket.h"
#include "parallel/store/tcp_store_client.h"

namespace dtrain {

absl::StatusOr<std::string> PeerHostname(const std::string& master_addr) {
  if (const char* names = std::getenv("GLOO_SOCKET_IFNAME"); names != nullptr && *names != 0) {
    const std::string list = names;
    const std::string name = list.substr(0, list.find(','));
    absl::StatusOr<std::string> address = InterfaceAddress(name);
    if (!address.ok()) {
      return absl::Status(address.status().code(),
                          absl::StrCat("GLOO_SOCKET_IFNAME: ", address.status().message()));
    }
    return address;
  }
  if (master_addr == "127.0.0.1" || master_addr == "localhost") return std::string("127.0.0.1");
  absl::StatusOr<std::string> source = SourceAddressTowards(master_addr);
  if (!source.ok()) {
    return absl::Status(source.status().code(),
                        absl::StrCat("choosing the address other ranks reach this one at: ",
                                     source.status().message(),
                                     "; check MASTER_ADDR, or set GLOO_SOCKET_IFNAME to the "
                                     "interface of the network between the nodes"));
  }
  return source;
}

namespace {

// Why this rank's world size and job differ from rank 0's (`zero`: its world size, a newline,
// its job, one setting a line); OK when they agree.
absl::Status CompareWithRankZero(const WorldMembership& world, const std::string& job,
                                 absl::string_view zero) {
  const std::pair<absl::string_view, absl::string_view> parts =
      absl::StrSplit(zero, absl::MaxSplits('\n', 1));
  if (parts.first != absl::StrCat(world.world_size)) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", world.rank, " was started for a world of ", world.world_size,
                     " ranks, rank 0 for ", parts.first,
                     "; start every rank with the same WORLD_SIZE (or Slurm task count)"));
  }
  if (parts.second == job) return absl::OkStatus();
  const std::vector<absl::string_view> here = absl::StrSplit(job, '\n');
  const std::vector<absl::string_view> there = absl::StrSplit(parts.second, '\n');
  std::string difference = "rank 0's has other keys (another dtrain version)";
  for (size_t i = 0; here.size() == there.size() && i < here.size(); ++i) {
    if (here[i] == there[i]) continue;
    difference = absl::StrCat("`", here[i], "` there, `", there[i], "` on rank 0");
    break;
  }
  return absl::FailedPreconditionError(
      absl::StrCat("rank ", world.rank, "'s resolved recipe differs from rank 0's: ", difference,
                   "; every rank must train the same recipe, with the same --set overrides"));
}

// Before the ranks connect, every rank takes its seat and compares its world size and job with
// rank 0's; then all wait until every seat is checked. A rank whose seat another process holds
// (a duplicate RANK, a second job on this store, or a restarted process while rank 0 still waits
// for the one before) fails alone, leaving the job to the first. A rank that differs from rank 0
// fails, and so does every other at once, naming it: they would otherwise wait out the timeout
// for ranks that never connect, or crash in a collective whose sizes differ. Ranks that never
// come are named when `timeout` (one deadline for both waits) has passed.
absl::Status CheckSameJob(Store& store, const WorldMembership& world, const std::string& job,
                          absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  const std::string prefix = absl::StrCat("rendezvous/attempt-", world.restart_count, "/");
  const auto seat = [&](int rank) { return absl::StrCat(prefix, "rank-", rank); };
  ASSIGN_OR_RETURN(const int64_t claims, store.Add(seat(world.rank), 1));
  if (claims > 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", world.rank, " has joined the rendezvous at ", world.master_addr, ":",
        world.master_port, " already: another process was started as rank ", world.rank,
        " (a duplicate RANK), another job uses the same MASTER_ADDR and MASTER_PORT, or this "
        "rank was restarted while rank 0 still waits for the one before (it gives up within "
        "parallel.timeout_s); give each rank its own RANK and each job its own MASTER_PORT"));
  }
  const auto checked_in = [&](int rank) { return absl::StrCat(prefix, "checked-rank-", rank); };
  // "settled" holds the verdict: "ok" once every rank checked, else "refused", the rank that
  // differs and why; the others' errors blame it.
  const std::string job_key = prefix + "job", settled_key = prefix + "settled";
  // A wait that ran out names the ranks whose seats are still empty, and those seated that never
  // checked in (hung, or stopped, between the two): before rank 0 published the job, only rank 0
  // (the others wait for it to check in). Other errors (the store lost) are what they are.
  const auto waited = [&](const absl::Status& status) {
    if (!absl::IsDeadlineExceeded(status)) return status;
    const bool job_published = store.Get(job_key, absl::Milliseconds(1)).ok();
    std::vector<int> missing, silent;
    for (int r = 0; r < world.world_size; ++r) {
      if (r == world.rank) continue;
      for (auto [key, late] : {std::pair{seat(r), &missing}, {checked_in(r), &silent}}) {
        const absl::StatusOr<std::string> found = store.Get(key, absl::Milliseconds(1));
        if (found.ok()) continue;
        if (!absl::IsDeadlineExceeded(found.status())) return found.status();
        if (late == &missing || job_published || r == 0) late->push_back(r);
        break;
      }
    }
    std::vector<std::string> whom;
    if (!missing.empty()) {
      whom.push_back(absl::StrCat("rank(s) ", absl::StrJoin(missing, ", "),
                                  " never joined (exited, crashed or not started)"));
    }
    if (!silent.empty()) {
      whom.push_back(absl::StrCat("rank(s) ", absl::StrJoin(silent, ", "),
                                  " joined but never checked in (hung or stopped)"));
    }
    if (whom.empty()) whom.push_back("every rank checked in, but it did not settle");
    absl::Status error = absl::DeadlineExceededError(
        absl::StrCat("rank ", world.rank, " of ", world.world_size, ": ",
                     absl::StrJoin(whom, ", and "), " at the rendezvous at ", world.master_addr,
                     ":", world.master_port, " within ", absl::FormatDuration(timeout)));
    missing.insert(missing.end(), silent.begin(), silent.end());
    SetFaultyRanks(error, missing);
    return error;
  };
  // Waits for `key` until the deadline, saying every kWaitReportInterval what for.
  const auto get_saying = [&](const std::string& key, const std::function<std::string()>& what) {
    while (true) {
      const absl::Time until = std::min(deadline, absl::Now() + kWaitReportInterval);
      absl::StatusOr<std::string> value = store.Get(key, until - absl::Now());
      if (!absl::IsDeadlineExceeded(value.status()) || absl::Now() >= deadline) return value;
      // One rank a node says so: a thousand ranks would each print it.
      if (world.local_rank != 0) continue;
      LogInfo(
          "rank %d: %s at the rendezvous at %s:%d (%s of parallel.timeout_s %s)", world.rank,
          what(), world.master_addr, world.master_port,
          absl::FormatDuration(absl::Trunc(timeout - (deadline - absl::Now()), absl::Seconds(1))),
          absl::FormatDuration(timeout));
    }
  };
  if (world.rank == 0) {
    RETURN_IF_ERROR(store.Set(job_key, absl::StrCat(world.world_size, "\n", job)));
  } else {
    const absl::StatusOr<std::string> zero =
        get_saying(job_key, [] { return std::string("waiting for rank 0"); });
    if (!zero.ok()) return waited(zero.status());
    // Another recipe or world on one rank is the command line's error (exit 2): every restart
    // would meet it again.
    const absl::Status verdict = CompareWithRankZero(world, job, *zero);
    if (!verdict.ok()) {
      RETURN_IF_ERROR(
          store.Set(settled_key, absl::StrCat("refused\n", world.rank, "\n", verdict.message())));
      return WithExitCode(verdict, kExitUsage);
    }
  }
  RETURN_IF_ERROR(store.Set(checked_in(world.rank), ""));
  ASSIGN_OR_RETURN(const int64_t checked, store.Add(prefix + "checked", 1));
  if (checked == world.world_size) RETURN_IF_ERROR(store.Set(settled_key, "ok"));
  const absl::StatusOr<std::string> settled = get_saying(settled_key, [&] {
    return absl::StrCat(store.Add(prefix + "checked", 0).value_or(-1), " of ", world.world_size,
                        " ranks checked in, waiting for the others");
  });
  if (!settled.ok()) return waited(settled.status());
  if (*settled == "ok") return absl::OkStatus();
  const std::vector<std::string> refused = absl::StrSplit(*settled, absl::MaxSplits('\n', 2));
  int differing = -1;
  if (refused.size() != 3 || refused[0] != "refused" || !absl::SimpleAtoi(refused[1], &differing)) {
    return absl::DataLossError(absl::StrCat("rendezvous key ", settled_key, " holds '", *settled,
                                            "', not a verdict of dtrain's ranks"));
  }
  absl::Status error = WithExitCode(absl::FailedPreconditionError(refused[2]), kExitUsage);
  SetFaultyRanks(error, {differing});
  return error;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpStoreServer>> ServeRendezvousStore(const WorldMembership& world) {
  if (world.rank != 0 || world.agent_hosts_store) return nullptr;
  TcpStoreServerOptions options;
  options.token = world.rdzv_token;
  if (world.world_size == world.local_world_size) {
    return TcpStoreServer::Start(world.master_addr, world.master_port, options);
  }
  // Several hosts: every interface, as torch's TCPStore listens, since MASTER_ADDR may resolve
  // on rank 0's host to an address the others do not reach (Debian maps a host's own name to
  // 127.0.1.1 there). It must still name this host.
  if (std::string resolved; !NamesThisHost(world.master_addr, resolved)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank 0 hosts the rendezvous store, but MASTER_ADDR '", world.master_addr, "'",
        resolved.empty() ? " does not resolve"
                         : absl::StrCat(" (", resolved, ") is not an address of rank 0's host"),
        "; set MASTER_ADDR to rank 0's host"));
  }
  return TcpStoreServer::Start("", world.master_port, options);
}

absl::StatusOr<std::unique_ptr<TcpStoreClient>> ConnectRendezvousStore(
    const WorldMembership& world, TcpStoreClientOptions options) {
  options.token = world.rdzv_token;
  return TcpStoreClient::Connect(world.master_addr, world.master_port, options);
}

absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::Connect(const WorldMembership& world,
                                                                    absl::Duration timeout,
                                                                    const std::string& key_prefix,
                                                                    const std::string& job,
                                                                    const std::string& hostname) {
  std::unique_ptr<ProcessGroup> group(new ProcessGroup());
  group->membership_ = world;
  ASSIGN_OR_RETURN(group->server_, ServeRendezvousStore(world));
  TcpStoreClientOptions client_options;
  client_options.connect_timeout = timeout;
  // A rank cut off from the store fails within parallel.timeout_s, where a request could wait
  // the client's own 60 s for its reply.
  client_options.reply_timeout = std::min(client_options.reply_timeout, timeout);
  absl::StatusOr<std::unique_ptr<TcpStoreClient>> store =
      ConnectRendezvousStore(world, client_options);
  if (absl::IsUnavailable(store.status()) && world.node_rank > 0) {
    return Renamed(store.status(),
                   absl::StrCat(store.status().message(), MasterOnThisHostHint(world.master_addr)));
  }
  ASSIGN_OR_RETURN(group->store_, std::move(store));
  // The rank a failed check blames (one that differs, or never came) is the agent's root cause.
  if (absl::Status same = CheckSameJob(*group->store_, world, job, timeout); !same.ok()) {
    group->PublishBlame(same);
    return same;
  }

  // A restarted group must not meet the keys of the attempt before it in the agent's store.
  const std::string attempt = absl::StrCat("attempt-", world.restart_count);
  group->comm_namespace_ = absl::StrCat(key_prefix, attempt, "/comm/");
  group->failure_key_ = absl::StrCat(key_prefix, attempt, "/failure");
  group->timeout_ = timeout;
  if (hostname.empty()) {
    ASSIGN_OR_RETURN(group->hostname_, PeerHostname(world.master_addr));
  } else {
    group->hostname_ = hostname;
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
  if (size == 1) return nullptr;
  if (nccl_) {
    ASSIGN_OR_RETURN(const NcclModule* module, LoadNcclModule());
    ASSIGN_OR_RETURN(std::unique_ptr<Communicator> created,
                     module->create_communicator(store_, spec, timeout_, *backend_));
    return std::make_unique<BackendMemoryGuard>(
        FlightRecorder::Wrap(recorder_, std::move(created), spec.world_ranks), *backend_,
        spec.point_to_point);
  }
  // Gloo's world communicator serves a group of every rank (and records its operations).
  if (size == static_cast<size_t>(world_->size())) {
    return std::make_unique<BackendMemoryGuard>(*world_, spec.name, *backend_, spec.point_to_point);
  }
  GlooCommunicatorOptions options;
  options.name = spec.name;
  options.key_prefix = spec.key_prefix;
  options.rank = spec.rank;
  options.size = static_cast<int>(size);
  options.world_ranks = spec.world_ranks;
  options.timeout = timeout_;
  options.hostname = hostname_;
  ASSIGN_OR_RETURN(std::unique_ptr<Communicator> created,
                   GlooCommunicator::Create(store_, options));
  return std::make_unique<BackendMemoryGuard>(
      FlightRecorder::Wrap(recorder_, std::move(created), spec.world_ranks), *backend_,
      spec.point_to_point);
}

namespace {

// The process group a terminating process dumps the flight recorder of, and the handler before.
std::atomic<ProcessGroup*> recording_group{nullptr};
std::terminate_handler terminate_before_recording = nullptr;

}  // namespace

void ProcessGroup::EnableFlightRecorder(size_t entries, const std::string& dump_dir) {
  if (entries == 0) return;
  recorder_ =
      std::make_shared<FlightRecorder>(membership_.rank, membership_.world_size, entries, dump_dir);
  world_ = FlightRecorder::Wrap(recorder_, std::move(world_), {});
  FlightRecorder::InstallDumpSignal();
  ProcessGroup* expected = nullptr;
  if (recording_group.compare_exchange_strong(expected, this)) {
    terminate_before_recording = std::set_terminate(&ProcessGroup::DumpAndTerminate);
  }
}

ProcessGroup::~ProcessGroup() {
  ProcessGroup* expected = this;
  if (recording_group.compare_exchange_strong(expected, nullptr)) {
    std::set_terminate(terminate_before_recording);
  }
}

void ProcessGroup::DumpAndTerminate() {
  // Any thread may terminate; the first one dumps. The store calls are bounded by their timeouts.
  if (ProcessGroup* group = recording_group.exchange(nullptr)) {
    std::string what = "an uncaught exception";
    if (const std::exception_ptr exception = std::current_exception()) {
      try {
        std::rethrow_exception(exception);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
    }
    group->PublishFlightDump(
        absl::InternalError(absl::StrCat("the process terminates on an exception: ", what)));
  }
  if (terminate_before_recording != nullptr) terminate_before_recording();
  std::abort();
}

void ProcessGroup::PublishFlightDump(const absl::Status& error) {
  if (!recorder_) return;
  absl::StatusOr<std::string> path = recorder_->Dump(std::string(error.message()));
  if (!path.ok()) LogWarn("flight recorder: %s", path.status().message());
  (void)store_->Set(FlightDumpKey(membership_.restart_count, membership_.rank), path.value_or(""));
}

absl::StatusOr<ProcessGroup::MeshGroups> ProcessGroup::ConnectMesh(const Mesh& mesh,
                                                                   Backend& backend,
                                                                   absl::string_view device) {
  backend_ = &backend;
  nccl_ = device == "cuda";
  layout_ = mesh;
  ASSIGN_OR_RETURN(
      mesh_, mesh.CreateCommunicators([this](const GroupSpec& spec) { return CreateGroup(spec); },
                                      comm_namespace_));
  const MeshShape& shape = mesh.shape();
  // Where this rank sits in a pipelined mesh, for the agent's root cause: a dead or hung rank
  // cannot say so itself (launch/agent.h).
  if (membership_.agent_hosts_store && shape.pp > 1) {
    RETURN_IF_ERROR(
        store_->Set(AgentKey(membership_.restart_count, absl::StrCat("where/", membership_.rank)),
                    mesh.Describe(mesh.rank())));
  }
  return MeshGroups{mesh_.tp.get(), mesh_.dp.get(), mesh_.pp.get()};
}

absl::StatusOr<Communicator*> ProcessGroup::ConnectKvReplicas(const Mesh& mesh, int replicas) {
  ASSIGN_OR_RETURN(kv_replicas_, CreateGroup(mesh.KvReplicaGroup(replicas, comm_namespace_)));
  return kv_replicas_.get();
}

absl::Status ProcessGroup::Leave(absl::Status outcome) {
  if (outcome.ok()) outcome = world_->Barrier();
  if (!outcome.ok()) return Fail(outcome);
  if (!membership_.agent_hosts_store) return outcome;
  return store_
      ->Add(AgentKey(membership_.restart_count, absl::StrCat("finished/", membership_.rank)), 1)
      .status();
}

void ProcessGroup::PublishBlame(const absl::Status& error) {
  const std::vector<int> blamed = FaultyRanks(error);
  if (blamed.empty() || !membership_.agent_hosts_store) return;
  (void)store_->Set(AgentKey(membership_.restart_count, absl::StrCat("blame/", membership_.rank)),
                    absl::StrJoin(blamed, ","));
}

absl::Status ProcessGroup::Fail(const absl::Status& error) {
  // The process is on its way out with its error: a stop (an agent's SIGTERM when another rank
  // failed first) could only cut its report short, or keep it from the root cause. An agent
  // still kills it if it lingers.
  std::signal(SIGTERM, SIG_IGN);
  const int rank = membership_.rank;
  const std::vector<int> blamed = FaultyRanks(error);
  PublishFlightDump(error);
  PublishBlame(error);
  const std::string own = absl::StrCat("rank ", rank, " failed: ", error.message());
  const absl::StatusOr<std::string> first = store_->CompareSet(failure_key_, "", own);
  if (!first.ok()) {
    return Renamed(
        error,
        absl::StrCat(error.message(), " (the other ranks' errors are unknown: the store ",
                     membership_.agent_hosts_store ? "of the node-0 agent" : "hosted by rank 0",
                     " is unreachable: ", first.status().message(), ")"));
  }
  // The agent names the first failure when no error blames another rank: ranks that failed on
  // their own end in any order, and the agent stops the others while they still exit.
  if (*first == own && membership_.agent_hosts_store) {
    (void)store_->Set(AgentKey(membership_.restart_count, "first_failure"), absl::StrCat(rank));
  }
  // A rank that failed as the first did (a data file every rank misses) says so in a word.
  std::string reported =
      *first == own ? std::string(error.message())
      : absl::EndsWith(*first, absl::StrCat(" failed: ", error.message()))
          ? absl::StrCat(*first, "; rank ", rank, " failed the same way")
          : absl::StrCat(*first, "; then rank ", rank, " failed too: ", error.message());
  // An agent names the root cause itself, from the blamed ranks.
  if (!membership_.agent_hosts_store) {
    (void)store_->Set(FailedKey(rank),
                      absl::StrCat(absl::StrJoin(blamed, ","), "\n", error.message()));
    const std::map<int, RankFailure> failures = AwaitPeersFailing(rank, blamed);
    // Every rank that failed dumped before it recorded its failure: the dumps are all there.
    if (server_ && recorder_) {
      if (const std::optional<FlightDiagnosis> diagnosis = DiagnosePublishedFlightDumps(
              *store_, membership_.restart_count, membership_.world_size)) {
        LogError("flight recorder: %s", diagnosis->text);
      }
    }
    // The root causes: ranks an error blames that never failed themselves (dead or hung). An
    // error may blame a rank that was only stuck behind one (it failed too), or none at all (a
    // peer's closed connection); then the first error that blames a root cause is added.
    std::set<int> roots;
    for (const auto& [r, failure] : failures) {
      for (const int b : failure.blamed) {
        if (!failures.contains(b)) roots.insert(b);
      }
    }
    const auto blames_root = [&](const auto& failure) {
      return std::any_of(failure.second.blamed.begin(), failure.second.blamed.end(),
                         [&](int b) { return roots.contains(b); });
    };
    const auto reported_root = [&](const auto& failure) {
      return blames_root(failure) &&
             (failure.first == rank ||
              *first == absl::StrCat("rank ", failure.first, " failed: ", failure.second.message));
    };
    const auto cause = std::find_if(failures.begin(), failures.end(), blames_root);
    if (cause != failures.end() && std::none_of(failures.begin(), failures.end(), reported_root)) {
      absl::StrAppend(&reported, "; rank ", cause->first, "'s error blames rank(s) ",
                      absl::StrJoin(cause->second.blamed, ", "), ": ", cause->second.message);
    }
    // An error blames every rank that never started its collective, those stuck behind the
    // root cause in other groups too: the roots are named apart.
    if (!roots.empty()) {
      std::vector<std::string> named;
      for (const int root : roots) {
        named.push_back(layout_ && layout_->shape().pp > 1 && root < layout_->world_size()
                            ? absl::StrCat("rank ", root, " (", layout_->Describe(root), ")")
                            : absl::StrCat("rank ", root));
      }
      absl::StrAppend(&reported, "; root cause: ", absl::StrJoin(named, ", "),
                      ": blamed, and never reported a failure (dead or hung)");
    }
  }
  return Renamed(error, reported);
}

// Rank 0's process hosts the store in which the other ranks read the first failure, so every
// rank stays until the others have failed too (or the timeout), and rank 0 until they have read
// each other's errors. The communicators close first, so that the peers fail on the closed
// connections at once. A dead or hung rank never fails here, but some rank's error blames it;
// a blamed rank that was only stuck behind it fails about when the first error came (its
// collective started about when theirs did), so blamed ranks get kBlamedGrace to fail too.
std::map<int, ProcessGroup::RankFailure> ProcessGroup::AwaitPeersFailing(
    int rank, const std::vector<int>& blamed) {
  constexpr absl::Duration kBlamedGrace = absl::Seconds(2);
  kv_replicas_.reset();
  mesh_ = {};
  world_.reset();
  std::map<int, RankFailure> failures;
  failures[rank] = RankFailure{blamed, ""};
  std::set<int> all_blamed(blamed.begin(), blamed.end());
  const absl::Time deadline = absl::Now() + timeout_;
  absl::Time grace_end = absl::InfiniteFuture();
  bool store_lost = false;
  while (!store_lost && absl::Now() < std::min(deadline, grace_end)) {
    absl::SleepFor(absl::Milliseconds(20));
    bool waiting_for_unblamed = false;
    for (int r = 0; r < membership_.world_size && !store_lost; ++r) {
      if (failures.contains(r)) continue;
      const absl::StatusOr<std::string> value = store_->Get(FailedKey(r), absl::ZeroDuration());
      if (!value.ok()) {
        store_lost = !absl::IsDeadlineExceeded(value.status());  // rank 0 has gone
        waiting_for_unblamed |= !all_blamed.contains(r);
        continue;
      }
      const std::pair<std::string, std::string> fields =
          absl::StrSplit(*value, absl::MaxSplits('\n', 1));
      RankFailure& failure = failures[r];
      failure.message = fields.second;
      for (const absl::string_view field : absl::StrSplit(fields.first, ',', absl::SkipEmpty())) {
        if (int b = 0; absl::SimpleAtoi(field, &b)) failure.blamed.push_back(b);
      }
      all_blamed.insert(failure.blamed.begin(), failure.blamed.end());
    }
    if (failures.size() == static_cast<size_t>(membership_.world_size)) break;
    if (!waiting_for_unblamed && grace_end == absl::InfiniteFuture()) {
      grace_end = absl::Now() + kBlamedGrace;
    }
  }
  const std::string read_key = failure_key_ + "/read";
  if (!server_) {
    (void)store_->Add(read_key, 1);
  } else {
    while (absl::Now() < deadline) {
      const absl::StatusOr<int64_t> read = store_->Add(read_key, 0);
      if (!read.ok() || *read >= static_cast<int64_t>(failures.size()) - 1) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  return failures;
}

std::string ProcessGroup::FailedKey(int rank) const {
  return absl::StrCat(failure_key_, "/rank-", rank);
}

}  // namespace dtrain
