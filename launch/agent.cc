#include "launch/agent.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <filesystem>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "core/checkpoint/format.h"
#include "core/checkpoint/reader.h"
#include "core/util/exit_codes.h"
#include "core/util/files.h"
#include "core/util/host_name.h"
#include "core/util/log.h"
#include "core/util/status.h"
#include "core/util/subprocess.h"
#include "parallel/comm/flight_recorder_diagnosis.h"
#include "parallel/store/auth.h"
#include "parallel/store/socket.h"
#include "parallel/store/tcp_store_client.h"
#include "parallel/store/tcp_store_server.h"
#include "parallel/world_membership.h"

namespace dtrain {
namespace {

constexpr int kStderrTailLines = 20;
constexpr absl::Duration kMonitorInterval = absl::Milliseconds(100);
// Until every worker is past rendezvous: node 0 reports that moment closely.
constexpr absl::Duration kRendezvousInterval = absl::Milliseconds(10);
// How long node 0 keeps the store up for the other agents to read the final state.
constexpr absl::Duration kExitTimeout = absl::Seconds(30);
// How long node 0 waits for a Slurm command (`scontrol requeue`, `scontrol show job`) to answer.
constexpr absl::Duration kCommandTimeout = absl::Seconds(30);
// How long a worker may take to end after SIGKILL before the agent leaves it behind.
constexpr absl::Duration kKillTimeout = absl::Seconds(30);
// How often an agent blocked in a barrier looks for agents that were lost meanwhile.
constexpr absl::Duration kBarrierLivenessInterval = absl::Seconds(1);
// Agent liveness. Each agent asks the store to count its connection's close (the store sees it
// at once when the agent exits or is killed, and within its dead-peer timeout when the agent's
// host stops answering). A close is settled when the agent said it finished first, or when a new
// agent of its node (the next incarnation) took its place. More closes than settled ones: an agent
// was lost.
constexpr char kClosedKey[] = "agent/closed";
constexpr char kSettledKey[] = "agent/settled";
constexpr char kReplacedKey[] = "agent/replaced";
// Nodes that failed before joining (ReportFailureBeforeJoining), each also under
// "<key>/node-<N>" with its error.
constexpr char kEarlyFailuresKey[] = "agent/failed-before-joining";
constexpr char kNodeCountKey[] = "agent/nnodes";  // node 0's --nnodes, the job's
// How long a node waits for node 0's count of nodes (set as node 0 starts the store).
constexpr absl::Duration kNodeCountWait = absl::Seconds(10);

// A key of node `node`'s, or of one of its agents (`incarnation`).
std::string NodeKey(const std::string& name, int node) {
  return absl::StrCat(name, "/node-", node);
}
std::string NodeKey(const std::string& name, int node, int incarnation) {
  return absl::StrCat(name, "/node-", node, "/", incarnation);
}

std::string EarlyFailureKey(int node) { return NodeKey(kEarlyFailuresKey, node); }

// Whether every node but node 0 is done with node 0's store, which may then close: its newest
// agent closed its connection, or it failed before joining (its error is there).
bool OthersGone(TcpStoreClient& store, int num_nodes) {
  const auto count = [&](const std::string& key) { return store.Add(key, 0).value_or(0); };
  for (int node = 1; node < num_nodes; ++node) {
    if (store.Get(EarlyFailureKey(node), absl::ZeroDuration()).ok()) continue;
    const int incarnation = static_cast<int>(count(NodeKey("agent/incarnation", node)));
    if (incarnation == 0 || count(NodeKey(kClosedKey, node, incarnation)) == 0) return false;
  }
  return true;
}

// Where a restart's workers resume, for its line (under --log-dir only their files said), as
// TrainingCheckpoints::Resume takes it: the newest checkpoint of `dir` that a save completed (the
// trainer also passes over one that does not load, saying so); none where the folder holds only
// checkpoints whose save did not complete (the trainer refuses them all); where it holds none,
// checkpoint.resume's (`resume`) checkpoint, else step 1. Empty without a folder.
std::string ResumePoint(const std::string& dir, const std::string& resume) {
  if (dir.empty()) return "";
  std::error_code error;
  const std::vector<std::string> saved = CheckpointCandidates(dir);
  for (const std::string& step : saved) {
    if (std::filesystem::exists(absl::StrCat(step, "/", kManifestName), error)) {
      return absl::StrCat(" from ", step, ", the newest checkpoint saved");
    }
  }
  if (!saved.empty()) {
    return absl::StrCat(": none of the ", saved.size(), " checkpoint(s) in ", dir,
                        " completed its save, and the workers refuse to start over beside them");
  }
  if (resume != "auto" && resume != "never") {
    return absl::StrCat(" from checkpoint.resume ", resume, " (none saved in ", dir, ")");
  }
  return absl::StrCat(" from step 1: no checkpoint saved in ", dir);
}

// Ignores SIGTERM while it lives: node 0, failing, serves its store for the others to read why,
// and srun's SIGTERM at the first of them to exit (--kill-on-bad-exit) must not end it before it
// prints its error.
class IgnoredSigterm {
 public:
  IgnoredSigterm() {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigaction(SIGTERM, &ignore, &previous_);
  }
  ~IgnoredSigterm() { sigaction(SIGTERM, &previous_, nullptr); }
  IgnoredSigterm(const IgnoredSigterm&) = delete;
  IgnoredSigterm& operator=(const IgnoredSigterm&) = delete;

 private:
  struct sigaction previous_ {};
};

// A worker's exit after the ranks agreed to stop and saved their checkpoint (a stop, not a
// failure; the job is not finished).
bool StoppedAfterCheckpoint(const ExitStatus& status) {
  return status.signal == 0 && status.code == kExitStopped;
}

// The worker exits that every restart would repeat, and why: a wrong recipe or command line, a
// full file system (a checkpoint's or the metrics': a restart trains to the same write and fails
// there again).
constexpr std::pair<int, const char*> kRepeatingExits[] = {
    {kExitUsage, "its recipe, command line or files are wrong"},
    {kExitDiskFull,
     "a file system it writes is full (its error says which: free space there, then launch "
     "again to resume from the newest complete checkpoint)"},
};

// Signals reach the monitor loop through a self-pipe: the handler only writes the number.
int signal_pipe_write_fd = -1;
void ForwardToPipe(int signal) {
  const int saved_errno = errno;
  const unsigned char byte = static_cast<unsigned char>(signal);
  (void)!write(signal_pipe_write_fd, &byte, 1);
  errno = saved_errno;
}

class SignalPipe {
 public:
  SignalPipe() {
    (void)!pipe2(fds_, O_CLOEXEC | O_NONBLOCK);
    signal_pipe_write_fd = fds_[1];
    struct sigaction action {};
    action.sa_handler = ForwardToPipe;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    for (size_t i = 0; i < std::size(kSignals); ++i) {
      sigaction(kSignals[i], nullptr, &previous_[i]);
      // An agent started under nohup keeps ignoring SIGHUP: the user asked to outlive the
      // terminal.
      if (kSignals[i] == SIGHUP && previous_[i].sa_handler == SIG_IGN) continue;
      sigaction(kSignals[i], &action, nullptr);
    }
  }
  ~SignalPipe() {
    for (size_t i = 0; i < std::size(kSignals); ++i) sigaction(kSignals[i], &previous_[i], nullptr);
    signal_pipe_write_fd = -1;
    close(fds_[0]);
    close(fds_[1]);
  }
  int fd() const { return fds_[0]; }
  std::vector<int> Take() {
    std::vector<int> signals;
    unsigned char byte = 0;
    while (read(fds_[0], &byte, 1) == 1) signals.push_back(byte);
    return signals;
  }

 private:
  // SIGHUP (a closed terminal or ssh session) stops the job as SIGTERM does: a checkpoint, not
  // the whole run lost with the agent.
  static constexpr int kSignals[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2, SIGCHLD};
  struct sigaction previous_[std::size(kSignals)] = {};
  int fds_[2] = {-1, -1};
};

std::string EnvName(const std::string& entry) { return entry.substr(0, entry.find('=')); }

// Variables of any launcher that say where a process sits: a worker gets dtrain's own instead.
bool IsRankVariable(const std::string& name) {
  static const char* const kNames[] = {"RANK",
                                       "LOCAL_RANK",
                                       "WORLD_SIZE",
                                       "LOCAL_WORLD_SIZE",
                                       "GROUP_RANK",
                                       "ROLE_RANK",
                                       "MASTER_ADDR",
                                       "MASTER_PORT",
                                       "OMPI_COMM_WORLD_RANK",
                                       "OMPI_COMM_WORLD_SIZE",
                                       "OMPI_COMM_WORLD_LOCAL_RANK",
                                       "PMI_RANK",
                                       "PMI_SIZE"};
  for (const char* rank_name : kNames) {
    if (name == rank_name) return true;
  }
  return absl::StartsWith(name, "DTRAIN_") || absl::StartsWith(name, "TORCHELASTIC_");
}

// The agent's children: in their own process group (a signal reaches everything a worker
// started), gone with the agent (a SIGKILLed agent leaves no worker behind), reading /dev/null,
// writing into pipes that the agent drains.
SubprocessOptions ChildOptions(std::vector<std::string> environment) {
  SubprocessOptions options;
  options.stdin_stream = SubprocessOptions::Stream::kNull;
  options.stdout_stream = SubprocessOptions::Stream::kPipe;
  options.stderr_stream = SubprocessOptions::Stream::kPipe;
  options.nonblocking_pipes = true;
  options.environment = std::move(environment);
  options.own_process_group = true;
  options.parent_death_signal = SIGKILL;
  return options;
}

// A short command of node 0 (scontrol): how it ended within kCommandTimeout, and what it wrote.
struct CommandRun {
  absl::Status started;
  std::optional<ExitStatus> exit;  // none: still running at the timeout (then killed)
  std::string output;
  std::string errors;  // its stderr, which says why it failed
  std::string Describe() const {
    if (!started.ok()) return std::string(started.message());
    std::string text =
        exit ? exit->ToString()
             : absl::StrCat("no answer within ", absl::FormatDuration(kCommandTimeout));
    const absl::string_view said = absl::StripAsciiWhitespace(errors);
    if (!said.empty()) absl::StrAppend(&text, " (", said, ")");
    return text;
  }
};

CommandRun RunCommand(const std::vector<std::string>& argv, std::vector<std::string> environment) {
  CommandRun run;
  absl::StatusOr<std::unique_ptr<Subprocess>> process =
      Subprocess::Spawn(argv, ChildOptions(std::move(environment)));
  run.started = process.status();
  if (!process.ok()) return run;
  // Both pipes, so that neither fills and blocks the command.
  const auto drain = [&process, &run] {
    char buffer[4096];
    for (ssize_t n; (n = ::read((*process)->stdout_fd(), buffer, sizeof(buffer))) > 0;) {
      run.output.append(buffer, static_cast<size_t>(n));
    }
    for (ssize_t n; (n = ::read((*process)->stderr_fd(), buffer, sizeof(buffer))) > 0;) {
      run.errors.append(buffer, static_cast<size_t>(n));
    }
  };
  const absl::Time deadline = absl::Now() + kCommandTimeout;
  while (!run.exit && absl::Now() < deadline) {
    drain();
    run.exit = (*process)->Poll();
    if (!run.exit) absl::SleepFor(absl::Milliseconds(20));
  }
  if (run.exit) drain();
  return run;
}

// "rank 3", or "ranks 3-5".
std::string Ranks(int first, int last) {
  return first == last ? absl::StrCat("rank ", first) : absl::StrCat("ranks ", first, "-", last);
}

std::string ClockTime(absl::Time time) {
  return absl::FormatTime("%H:%M:%E3S", time, absl::LocalTimeZone());
}

// One failed (or stopped) worker as an agent published it for the root cause.
struct FailureRecord {
  int rank = 0;
  int node = 0;
  std::string host;
  std::string exit;
  bool stopped = false;  // ended by its agent
  std::vector<int> blames;
  int64_t time_us = 0;
  std::string stderr_tail;
};

// The records in one node's `failures` value; nullopt when it is not what PublishFailures
// writes (anything that holds the store token can write the key).
std::optional<std::vector<FailureRecord>> ParseFailures(const std::string& text) {
  const nlohmann::json list = nlohmann::json::parse(text, nullptr, false);
  if (!list.is_array()) return std::nullopt;
  std::vector<FailureRecord> records;
  try {
    for (const nlohmann::json& entry : list) {
      records.push_back(
          {entry.at("rank").get<int>(), entry.at("node").get<int>(),
           entry.at("host").get<std::string>(), entry.at("exit").get<std::string>(),
           entry.at("stopped").get<bool>(), entry.at("blames").get<std::vector<int>>(),
           entry.at("time_us").get<int64_t>(), entry.at("stderr").get<std::string>()});
    }
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
  return records;
}

// The first record that a failure (earliest first) blames, and that failure; null if none. A
// record that blames nobody itself comes first (a rank that died, hung, or failed on its own):
// a rank only stuck behind it in another group is blamed too, and blames it in turn.
std::pair<const FailureRecord*, const FailureRecord*> FirstBlamed(
    const std::vector<FailureRecord>& records, const std::vector<const FailureRecord*>& failures) {
  for (const bool blaming_nobody : {true, false}) {
    for (const FailureRecord* failure : failures) {
      for (const int blamed : failure->blames) {
        for (const FailureRecord& record : records) {
          if (record.rank == blamed && (!blaming_nobody || record.blames.empty())) {
            return {&record, failure};
          }
        }
      }
    }
  }
  return {nullptr, nullptr};
}

struct Worker {
  int rank = 0;
  int local_rank = 0;
  std::unique_ptr<Subprocess> process;
  std::string partial[2];  // stdout, stderr: the unfinished last line
  std::deque<std::string> stderr_tail;
  UniqueFd log_fd;  // --log-dir: closed with the worker, so restarts leak none
  absl::Time exited_at;
  bool told_to_stop = false;
  // Exited 0 without having finished its part (ProcessGroup::Leave): its peers still needed it.
  bool left_early = false;
};

// Why Watch returned.
enum class Outcome {
  kSucceeded,  // every local worker exited 0
  kFailed,     // a worker failed here or on another node
  kStopping,   // SIGTERM/SIGINT here or on another node
  kLostStore,  // the store (node 0's agent) is gone: nobody can coordinate a restart
  kLostAgent,  // another node's agent is gone: its workers with it
};

// What the agents do after losing one.
enum class AfterLoss {
  kRestart,  // a restart is left: the next attempt waits for the lost nodes' new agents
  kEnd,      // node 0 printed the lost agent as the root cause; the job exits 1
};

// Another node's agent that left without finishing.
struct LostAgent {
  int node = 0;
  std::string host;
  int incarnation = 1;  // how many agents that node has had, this one included
  std::string error;    // what it failed with (Agent::Fail), if it said; else killed or crashed
};

// The error a worker's stderr ends with, without the "error: " it starts with; empty where it
// ends otherwise (a killed worker's last log line).
std::string EndingError(absl::string_view tail) {
  std::string said;
  for (const absl::string_view line : absl::StrSplit(tail, '\n', absl::SkipEmpty())) {
    said = absl::StartsWith(line, "error: ") ? std::string(line.substr(7)) : "";
  }
  return said;
}

// How a lost agent went: its own error, or what its closed connection suggests.
std::string LostHow(const LostAgent& agent) {
  if (!agent.error.empty()) return absl::StrCat("agent failed: ", agent.error);
  return "agent lost (its connection to the rendezvous store closed before it finished: the "
         "agent was killed or crashed, or its host went down)";
}

class Agent {
 public:
  Agent(const WorldEnvironment& node, const AgentOptions& options)
      : node_(node), options_(options), world_size_(node.num_nodes * options.nproc_per_node) {}

  absl::StatusOr<int> Run();
  // After Run failed: leaves the failure in the store, where the other agents, which see this
  // agent's connection close, name it instead of a crash. Node 0, whose process serves the
  // store, says so and keeps serving it until they have read it and gone (at most kExitTimeout).
  void Fail(const absl::Status& error);

 private:
  std::string Key(int attempt, const std::string& name) const {
    return absl::StrCat("agent/attempt-", attempt, "/", name);
  }
  absl::Status Connect();
  // Every agent arrives before any starts workers (the last arrival opens the gate).
  absl::Status Barrier(const std::string& counter, absl::Duration timeout);
  absl::Status StartWorkers(int attempt);
  Outcome Watch(int attempt);
  // After local success: waits for every node to succeed, or for a failure or stop elsewhere.
  Outcome AwaitOthers(int attempt);
  void StopWorkers(absl::Duration grace);
  void Drain(Worker& worker, int stream);
  // A worker that exited 0 without recording that it finished (a world of one always has).
  bool LeftEarly(int attempt, int rank);
  std::string ExitText(const Worker& worker);
  void EmitLine(Worker& worker, int stream, const std::string& line);
  void HandleSignals();
  absl::StatusOr<int64_t> Counter(const std::string& key) { return store_->Add(key, 0); }
  // A new agent of a node whose last one was lost: waits until node 0 restarts the job with it
  // and returns that attempt; 0 for a node's first agent.
  absl::StatusOr<int> Rejoin();
  // After the first rendezvous: every node starts as many workers as this one (ranks are
  // node rank x nproc + local rank), else an error naming the first node that differs.
  absl::Status CheckWorkerCounts();
  // The other agents whose store connection closed before they finished (none when the store
  // cannot be read: that is kLostStore's to report).
  std::vector<LostAgent> LostAgents();
  // The agents lost in `attempt`: those lost now and those any agent recorded as lost in it (a
  // replacement may have rejoined meanwhile). Records the ones found now.
  std::vector<LostAgent> LostIn(int attempt);
  // With a restart left after `lost`: node 0 invites their replacements to the next attempt.
  void AwaitRejoin(int attempt, const std::vector<LostAgent>& lost);
  // Agents `lost` in `attempt` (not empty): restarts with their replacements while a restart is
  // left and no stop was asked for, else ends with them as the root cause.
  AfterLoss HandleLost(int attempt, const std::vector<LostAgent>& lost);
  // Logs each lost agent once, as the cause of what this node does next.
  void ReportLost(const std::vector<LostAgent>& lost);
  // On SIGTERM/SIGINT here: a stop, unless the store or another agent is gone (a Slurm step
  // torn down because an agent died delivers SIGTERM too).
  Outcome OnStopRequest(int attempt);
  void PrintLostRootCause(int attempt, const std::vector<LostAgent>& lost);
  // Once the workers stopped after SIGTERM: when an agent was lost, node 0 names it as the root
  // cause and the job ends (exit code 1), since a stop was asked for (under Slurm the step is
  // being torn down). nullopt when no agent was lost.
  std::optional<int> FinishIfAgentLost(int attempt);
  // Writes this node's failed workers to the store (a JSON list, possibly empty).
  absl::Status PublishFailures(int attempt);
  void PrintRootCause(int attempt);
  void Requeue();
  // Records that this agent ended on purpose, before its connection closes, so that the close
  // does not count as a lost agent. False when the store is gone.
  bool Settle();
  int Finish(int exit_code);

  WorldEnvironment node_;  // master_port becomes the bound one on a single node
  const AgentOptions options_;
  const int world_size_;
  std::unique_ptr<TcpStoreServer> server_;  // node 0
  std::unique_ptr<TcpStoreClient> store_;
  SignalPipe signals_;
  std::vector<Worker> workers_;
  bool stop_requested_ = false;
  int stop_signal_ = 0;
  int incarnation_ = 1;
  bool joined_ = false;  // this agent holds its incarnation: Fail may write under it
  // Between a restart after lost agents and the next attempt's rendezvous: those agents, whose
  // nodes are expected back, not a reason to give up (unless SIGTERM comes first).
  std::vector<LostAgent> rejoining_;
  std::vector<std::pair<int, int>> reported_lost_;  // (node, incarnation)
  absl::Time started_at_;
  bool reported_rendezvous_ = false;
};

absl::Status Agent::Connect() {
  TcpStoreServerOptions server_options;
  server_options.token = node_.rdzv_token;
  int port = node_.master_port;
  if (node_.node_rank == 0) {
    absl::StatusOr<std::unique_ptr<TcpStoreServer>> server =
        TcpStoreServer::Start("", port, server_options);
    if (!server.ok()) {
      // Where the port came from: one derived from a Slurm job's id comes back on its requeue.
      const auto from = node_.provenance.find("master_port");
      return from == node_.provenance.end() || from->second == "default"
                 ? server.status()
                 : Renamed(server.status(),
                           absl::StrCat(server.status().message(), " (port ", from->second, ")"));
    }
    server_ = *std::move(server);
    port = server_->port();
  }
  TcpStoreClientOptions client_options;
  client_options.token = node_.rdzv_token;
  client_options.connect_timeout = options_.rendezvous_timeout;
  client_options.cancelled = [this] {
    HandleSignals();
    return stop_requested_;
  };
  absl::StatusOr<std::unique_ptr<TcpStoreClient>> client =
      TcpStoreClient::Connect(node_.master_addr, port, client_options);
  if (absl::IsCancelled(client.status())) return client.status();
  if (!client.ok()) {
    const bool unreached = absl::IsUnavailable(client.status()) && node_.node_rank > 0;
    const absl::Status error = absl::Status(
        client.status().code(),
        absl::StrCat("node ", node_.node_rank, " cannot reach the rendezvous store ",
                     "of node 0 at ", node_.master_addr, ":", port, ": ", client.status().message(),
                     unreached ? MasterOnThisHostHint(node_.master_addr) : ""));
    // Another token than the store's: the same at a restart.
    return absl::IsPermissionDenied(error) ? WithExitCode(error, kExitUsage) : error;
  }
  store_ = *std::move(client);
  node_.master_port = port;  // node 0 may have chosen it
  // A second agent for a node must leave the running one alone: checked before this agent
  // becomes the node's newest (whose close the others would then take for the node's loss).
  const int node = node_.node_rank;
  const auto running = [node](absl::string_view where) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "node %d already has a running agent (%s); start one `dtrain launch` per node, each with "
        "its own node rank",
        node, where));
  };
  ASSIGN_OR_RETURN(const int64_t previous, Counter(NodeKey("agent/incarnation", node)));
  if (previous > 0) {
    ASSIGN_OR_RETURN(const int64_t closed, Counter(NodeKey(kClosedKey, node, previous)));
    if (closed == 0) {
      const absl::StatusOr<std::string> host =
          store_->Get(NodeKey("agent/host", node), absl::ZeroDuration());
      return running(absl::StrCat("on host ", host.value_or("?")));
    }
  }
  // Two agents started together both find the same last incarnation: the first to claim the
  // next one goes on (the other became a replacement waiting to rejoin before). A claim is
  // "<where>\n<nonce>", and its holder's connection counts closes under the nonce: a claim whose
  // holder went away before it became the node's agent is taken over, not left to block the node.
  ASSIGN_OR_RETURN(const std::string random, RandomNonce());
  const std::string nonce = absl::BytesToHexString(random.substr(0, 8));
  const std::string claim_key = NodeKey("agent/claim", node, previous + 1);
  const auto holder_closed_key = [&](absl::string_view holder) {
    const size_t newline = holder.find('\n');
    return absl::StrCat(claim_key, "/closed/",
                        newline == absl::string_view::npos ? "" : holder.substr(newline + 1));
  };
  const std::string claim = absl::StrCat("on host ", HostName(), ", pid ", getpid(), "\n", nonce);
  RETURN_IF_ERROR(store_->AddOnClose(holder_closed_key(claim), 1));
  ASSIGN_OR_RETURN(std::string holder, store_->CompareSet(claim_key, "", claim));
  if (holder != claim) {
    ASSIGN_OR_RETURN(const int64_t gone, Counter(holder_closed_key(holder)));
    if (gone > 0) {
      ASSIGN_OR_RETURN(holder, store_->CompareSet(claim_key, holder, claim));
    }
  }
  if (holder != claim) return running(holder.substr(0, holder.find('\n')));
  ASSIGN_OR_RETURN(const int64_t incarnation,
                   store_->Add(NodeKey("agent/incarnation", node_.node_rank), 1));
  incarnation_ = static_cast<int>(incarnation);
  joined_ = true;
  RETURN_IF_ERROR(store_->Set(NodeKey("agent/host", node_.node_rank), HostName()));
  RETURN_IF_ERROR(
      store_->Set(NodeKey("agent/nproc", node_.node_rank), absl::StrCat(options_.nproc_per_node)));
  RETURN_IF_ERROR(store_->AddOnClose(NodeKey(kClosedKey, node_.node_rank, incarnation_), 1));
  RETURN_IF_ERROR(store_->AddOnClose(kClosedKey, 1));
  // Agents that count other numbers of nodes would wait for each other until the rendezvous
  // timeout: node 0's count is the job's, and an agent whose count differs fails at once.
  const std::string count = absl::StrCat(node_.num_nodes);
  if (node == 0) return store_->Set(kNodeCountKey, count);
  // Node 0 sets it as soon as it has started the store; one that does not (an older dtrain) is
  // not checked. The wait ends at a stop, as the others do.
  absl::StatusOr<std::string> job = absl::DeadlineExceededError("");
  for (const absl::Time until = absl::Now() + kNodeCountWait; absl::Now() < until;) {
    job = store_->Get(kNodeCountKey, kBarrierLivenessInterval);
    if (!absl::IsDeadlineExceeded(job.status())) break;
    HandleSignals();
    if (stop_requested_) {
      return absl::CancelledError("stopped while waiting for node 0's count of nodes");
    }
  }
  if (absl::IsDeadlineExceeded(job.status())) return absl::OkStatus();
  RETURN_IF_ERROR(job.status());
  if (*job != count) {
    const absl::StatusOr<std::string> host =
        store_->Get(NodeKey("agent/host", 0), absl::ZeroDuration());
    return WithExitCode(absl::FailedPreconditionError(absl::StrFormat(
                            "node %d (host %s) counts %s nodes, but node 0 (host %s) counts %s: "
                            "give every `dtrain launch` of the job the same --nnodes",
                            node, HostName(), count, host.value_or("?"), *job)),
                        kExitUsage);
  }
  return absl::OkStatus();
}

absl::StatusOr<int> Agent::Rejoin() {
  if (incarnation_ == 1) return 0;
  const int node = node_.node_rank;
  LogInfo(
      "node %d: this node's last agent was lost; waiting up to %s for node 0 to restart the "
      "job with this one",
      node, absl::FormatDuration(options_.rendezvous_timeout));
  const absl::StatusOr<std::string> attempt_text =
      store_->Get(NodeKey("agent/rejoin", node, incarnation_), options_.rendezvous_timeout);
  int attempt = 0;
  if (!attempt_text.ok() || !absl::SimpleAtoi(*attempt_text, &attempt)) {
    // This agent gives up, like one that finished: its close is no new loss of the node.
    (void)Settle();
    return absl::FailedPreconditionError(
        absl::StrCat("node ", node,
                     " cannot rejoin the job: node 0 did not restart it with this node (no "
                     "restart left, see --max-restarts, or the job ended): ",
                     attempt_text.status().message()));
  }
  // Settled only now: until node 0 took this node back, the others must see its last agent lost.
  RETURN_IF_ERROR(store_->Add(kSettledKey, 1).status());
  RETURN_IF_ERROR(store_->Add(kReplacedKey, 1).status());
  LogInfo("node %d: rejoining the job at restart %d of %d", node, attempt, options_.max_restarts);
  return attempt;
}

absl::Status Agent::CheckWorkerCounts() {
  for (int node = 0; node < node_.num_nodes; ++node) {
    // Every agent wrote its count before it arrived (a fake one in tests may not have).
    const absl::StatusOr<std::string> theirs =
        store_->Get(NodeKey("agent/nproc", node), absl::ZeroDuration());
    if (!theirs.ok() || *theirs == absl::StrCat(options_.nproc_per_node)) continue;
    const absl::StatusOr<std::string> host =
        store_->Get(NodeKey("agent/host", node), absl::ZeroDuration());
    // A restart would start the same counts: exit 2, as for another count of nodes.
    return WithExitCode(
        absl::FailedPreconditionError(absl::StrFormat(
            "node %d (host %s) starts %s workers and node %d (host %s) %d: every node must start "
            "the same number (ranks are node rank x workers per node + local rank); give every "
            "`dtrain launch` the same --nproc-per-node (with `gpu`, each node counts the GPUs "
            "its CUDA_VISIBLE_DEVICES leaves)",
            node, host.value_or("?"), *theirs, node_.node_rank, HostName(),
            options_.nproc_per_node)),
        kExitUsage);
  }
  return absl::OkStatus();
}

absl::Status Agent::Barrier(const std::string& counter, absl::Duration timeout) {
  ASSIGN_OR_RETURN(const int64_t arrived, store_->Add(counter, 1));
  if (arrived == node_.num_nodes) return store_->Set(counter + "/open", "1");
  const absl::Time deadline = absl::Now() + timeout;
  absl::Time next_report = absl::Now() + kWaitReportInterval;
  while (true) {
    const absl::Duration left = std::max(deadline - absl::Now(), absl::ZeroDuration());
    absl::Status status =
        store_->Wait({counter + "/open"}, std::min(left, kBarrierLivenessInterval));
    if (!absl::IsDeadlineExceeded(status)) return status;
    if (absl::Now() >= next_report && left > kBarrierLivenessInterval) {
      LogInfo("node %d: %d of %d node agents at '%s', waiting for the others (%s of %s)",
              node_.node_rank, Counter(counter).value_or(-1), node_.num_nodes, counter,
              absl::FormatDuration(absl::Trunc(timeout - left, absl::Seconds(1))),
              absl::FormatDuration(timeout));
      next_report = absl::Now() + kWaitReportInterval;
    }
    // A node that failed its own checks ends the job first: a SIGTERM now is srun's teardown of
    // a step whose task failed (--kill-on-bad-exit), not a preemption to requeue after.
    if (Counter(kEarlyFailuresKey).value_or(0) > 0) {
      for (int node = 0; node < node_.num_nodes; ++node) {
        const absl::StatusOr<std::string> error =
            store_->Get(EarlyFailureKey(node), absl::ZeroDuration());
        if (error.ok()) {
          // Its checks of the recipe and the world: a restart would fail them again.
          return WithExitCode(absl::FailedPreconditionError(absl::StrFormat(
                                  "node %d failed before joining the job: %s", node, *error)),
                              kExitUsage);
        }
      }
    }
    // A stop before any worker started, or while waiting for a lost node, ends the wait; later
    // (between attempts) it waits for the next attempt's workers, which save a checkpoint.
    const bool stoppable = workers_.empty() || !rejoining_.empty();
    if (stoppable) HandleSignals();
    if (stoppable && stop_requested_ && rejoining_.empty()) {
      // Leaving: the arrival is taken back, so that the others do not start without this node,
      // unless the barrier opened with it (the count was whole): then on, to a stop with workers.
      const absl::StatusOr<int64_t> left = store_->Add(counter, -1);
      if (left.ok() && *left == node_.num_nodes - 1) {
        (void)store_->Add(counter, 1);
        return absl::OkStatus();
      }
    }
    if (stoppable && stop_requested_) {
      return absl::CancelledError(
          rejoining_.empty()
              ? absl::StrFormat("stopped while waiting at '%s' for the other nodes", counter)
              : absl::StrFormat(
                    "SIG%s received while waiting at '%s' for node %d to come back: no restart",
                    sigabbrev_np(stop_signal_), counter, rejoining_.front().node));
    }
    if (!rejoining_.empty()) {
      if (left <= kBarrierLivenessInterval) break;
      continue;
    }
    if (const std::vector<LostAgent> lost = LostAgents(); !lost.empty()) {
      ReportLost(lost);
      return absl::UnavailableError(
          absl::StrFormat("node %d (host %s): %s, while the others waited at '%s'",
                          lost.front().node, lost.front().host, LostHow(lost.front()), counter));
    }
    if (left <= kBarrierLivenessInterval) break;
  }
  const int64_t seen = Counter(counter).value_or(-1);
  // The nodes with no agent in the job: where to look.
  std::vector<int> unseen;
  for (int node = 0; node < node_.num_nodes; ++node) {
    if (Counter(NodeKey("agent/incarnation", node)).value_or(1) == 0) unseen.push_back(node);
  }
  return absl::DeadlineExceededError(absl::StrFormat(
      "only %d of %d node agents reached '%s' within %s%s; check that `dtrain launch` runs on "
      "every node of the job (one agent per node) and that they all reach %s:%d",
      seen, node_.num_nodes, counter, absl::FormatDuration(timeout),
      unseen.empty() ? ""
                     : absl::StrCat(" (no agent of node", unseen.size() == 1 ? " " : "s ",
                                    absl::StrJoin(unseen, ", "), " joined)"),
      node_.master_addr, node_.master_port));
}

absl::Status Agent::StartWorkers(int attempt) {
  workers_.clear();
  workers_.resize(options_.nproc_per_node);
  started_at_ = absl::Now();
  reported_rendezvous_ = node_.node_rank != 0;  // node 0 reports it
  for (int local = 0; local < options_.nproc_per_node; ++local) {
    Worker& worker = workers_[local];
    worker.local_rank = local;
    worker.rank = node_.node_rank * options_.nproc_per_node + local;
    if (!options_.log_dir.empty()) {
      const std::string path = absl::StrCat(options_.log_dir, "/rank-", worker.rank, ".log");
      worker.log_fd = UniqueFd(open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
      if (!worker.log_fd.valid()) {
        const int error = errno;
        return FileError(error, absl::StrCat("write the worker log ", path),
                         "point --log-dir at a writable folder");
      }
      // The log holds every attempt of the rank, whose lines carry only the time of day.
      const std::string header = absl::StrCat(
          "=== attempt ", attempt + 1, " of ", options_.max_restarts + 1, ", started ",
          absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::Now(), absl::UTCTimeZone()), " ===\n");
      (void)!write(worker.log_fd.get(), header.data(), header.size());
    }
    absl::StatusOr<std::unique_ptr<Subprocess>> process = Subprocess::Spawn(
        options_.worker_argv, ChildOptions(WorkerEnvironment(node_, options_, local, attempt)));
    if (!process.ok()) {
      return absl::Status(process.status().code(),
                          absl::StrCat(process.status().message(),
                                       "; check that the dtrain binary is at that path on every "
                                       "node"));
    }
    worker.process = *std::move(process);
  }
  LogInfo("node %d: started %s (attempt %d of %d)", node_.node_rank,
          Ranks(workers_.front().rank, workers_.back().rank), attempt + 1,
          options_.max_restarts + 1);
  return absl::OkStatus();
}

void Agent::EmitLine(Worker& worker, int stream, const std::string& line) {
  if (stream == 1) {
    worker.stderr_tail.emplace_back(line);
    if (worker.stderr_tail.size() > kStderrTailLines) worker.stderr_tail.pop_front();
  }
  const std::string text = worker.log_fd.valid()
                               ? absl::StrCat(line, "\n")
                               : absl::StrCat("[rank ", worker.rank, "] ", line, "\n");
  const int fd =
      worker.log_fd.valid() ? worker.log_fd.get() : (stream == 0 ? STDOUT_FILENO : STDERR_FILENO);
  (void)!write(fd, text.data(), text.size());
}

void Agent::Drain(Worker& worker, int stream) {
  const int fd = stream == 0 ? worker.process->stdout_fd() : worker.process->stderr_fd();
  if (fd < 0) return;
  char buffer[65536];
  while (true) {
    const ssize_t got = read(fd, buffer, sizeof(buffer));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      if (got == 0 || errno != EAGAIN) {
        if (!worker.partial[stream].empty()) EmitLine(worker, stream, worker.partial[stream]);
        worker.partial[stream].clear();
        worker.process->CloseOutput(fd);
      }
      return;
    }
    std::string& text = worker.partial[stream];
    text.append(buffer, got);
    size_t begin = 0;
    for (size_t end; (end = text.find('\n', begin)) != std::string::npos; begin = end + 1) {
      EmitLine(worker, stream, text.substr(begin, end - begin));
    }
    text.erase(0, begin);
  }
}

void Agent::HandleSignals() {
  for (const int signal : signals_.Take()) {
    if (signal == SIGCHLD) continue;  // only wakes the loop
    if (signal == SIGUSR1 || signal == SIGUSR2) {
      LogInfo("node %d: forwarding %s to the workers", node_.node_rank, sigabbrev_np(signal));
      for (Worker& worker : workers_) worker.process->Signal(signal);
      continue;
    }
    if (!stop_requested_) stop_signal_ = signal;
    stop_requested_ = true;
  }
}

Outcome Agent::Watch(int attempt) {
  absl::Time next_store_check = absl::Now();
  while (true) {
    std::vector<pollfd> fds = {{signals_.fd(), POLLIN, 0}};
    for (const Worker& worker : workers_) {
      fds.push_back({worker.process->stdout_fd(), POLLIN, 0});
      fds.push_back({worker.process->stderr_fd(), POLLIN, 0});
    }
    const absl::Duration interval = reported_rendezvous_ ? kMonitorInterval : kRendezvousInterval;
    poll(fds.data(), fds.size(), absl::ToInt64Milliseconds(interval));
    HandleSignals();
    for (Worker& worker : workers_) {
      Drain(worker, 0);
      Drain(worker, 1);
    }
    if (stop_requested_) return OnStopRequest(attempt);
    int succeeded = 0;
    for (Worker& worker : workers_) {
      const bool was_running = !worker.process->exit_status().has_value();
      const std::optional<ExitStatus> exit = worker.process->Poll();
      if (!exit) continue;
      if (was_running) {
        worker.exited_at = absl::Now();
        Drain(worker, 0);
        Drain(worker, 1);
      }
      // A worker stops after a checkpoint only when the whole job does (the ranks agree on it):
      // a stop that this node's agent has yet to read from the store, not a failure.
      if (StoppedAfterCheckpoint(*exit)) {
        LogInfo("node %d: rank %d stopped after a checkpoint: the job is stopping", node_.node_rank,
                worker.rank);
        return Outcome::kStopping;
      }
      worker.left_early = exit->ok() && LeftEarly(attempt, worker.rank);
      if (!exit->ok() || worker.left_early) {
        // Its error, which went to its --log-dir file, not here.
        const std::string said =
            worker.log_fd.valid() ? EndingError(absl::StrJoin(worker.stderr_tail, "\n")) : "";
        LogError("node %d: rank %d failed: %s%s", node_.node_rank, worker.rank, ExitText(worker),
                 said.empty() ? "" : absl::StrCat(": ", said));
        (void)store_->Add(Key(attempt, "failed"), 1);
        return Outcome::kFailed;
      }
      ++succeeded;
    }
    if (succeeded == static_cast<int>(workers_.size())) return Outcome::kSucceeded;

    if (absl::Now() < next_store_check) continue;
    next_store_check = absl::Now() + interval;
    const absl::StatusOr<int64_t> failed = Counter(Key(attempt, "failed"));
    const absl::StatusOr<int64_t> stop = Counter(Key(attempt, "stop"));
    if (!failed.ok() || !stop.ok()) {
      LogError(
          "node %d: lost the rendezvous store at %s:%d (%s): node 0's agent was lost (killed, "
          "crashed, or its host went down); stopping the workers",
          node_.node_rank, node_.master_addr, node_.master_port,
          (failed.ok() ? stop.status() : failed.status()).message());
      return Outcome::kLostStore;
    }
    if (const std::vector<LostAgent> lost = LostAgents(); !lost.empty()) {
      ReportLost(lost);
      return Outcome::kLostAgent;
    }
    if (*failed > 0) return Outcome::kFailed;
    if (*stop > 0) {
      LogInfo("node %d: another node was told to stop: stopping the workers", node_.node_rank);
      return Outcome::kStopping;
    }
    if (node_.node_rank == 0 && !reported_rendezvous_) {
      const absl::StatusOr<int64_t> connected = Counter(AgentKey(attempt, "connected"));
      if (connected.ok() && *connected == world_size_) {
        reported_rendezvous_ = true;
        LogInfo("%s past rendezvous %.3f s after %s started",
                world_size_ == 1 ? std::string("the worker")
                                 : absl::StrCat("all ", world_size_, " workers"),
                absl::ToDoubleSeconds(absl::Now() - started_at_),
                world_size_ == 1 ? "it was" : "they were");
      }
    }
  }
}

Outcome Agent::AwaitOthers(int attempt) {
  if (!store_->Add(Key(attempt, "succeeded"), 1).ok()) return Outcome::kLostStore;
  const absl::Time deadline = absl::Now() + options_.rendezvous_timeout;
  while (absl::Now() < deadline) {
    HandleSignals();
    if (stop_requested_) return OnStopRequest(attempt);
    const absl::StatusOr<int64_t> succeeded = Counter(Key(attempt, "succeeded"));
    const absl::StatusOr<int64_t> failed = Counter(Key(attempt, "failed"));
    if (!succeeded.ok() || !failed.ok()) return Outcome::kLostStore;
    if (const std::vector<LostAgent> lost = LostAgents(); !lost.empty()) {
      ReportLost(lost);
      return Outcome::kLostAgent;
    }
    if (*failed > 0) return Outcome::kFailed;
    if (*succeeded == node_.num_nodes) return Outcome::kSucceeded;
    absl::SleepFor(kMonitorInterval);
  }
  LogError("node %d: the other nodes did not finish within %s of this one", node_.node_rank,
           absl::FormatDuration(options_.rendezvous_timeout));
  return Outcome::kFailed;
}

void Agent::StopWorkers(absl::Duration grace) {
  for (Worker& worker : workers_) {
    if (worker.process->Poll()) {
      if (worker.exited_at == absl::Time()) worker.exited_at = absl::Now();
      continue;  // ended by itself: a failure of its own, if it failed
    }
    worker.told_to_stop = true;
    worker.process->Signal(SIGTERM);
  }
  const absl::Time deadline = absl::Now() + grace;
  while (true) {
    bool running = false;
    for (Worker& worker : workers_) {
      Drain(worker, 0);
      Drain(worker, 1);
      const bool was_running = !worker.process->exit_status().has_value();
      if (!worker.process->Poll()) {
        running = true;
      } else if (was_running) {
        worker.exited_at = absl::Now();
      }
    }
    if (!running) return;
    if (absl::Now() >= deadline) break;
    // A SIGTERM now shortens nothing (the grace is already running) but must not be lost: it
    // rules out a restart.
    HandleSignals();
    absl::SleepFor(absl::Milliseconds(20));
  }
  for (Worker& worker : workers_) {
    if (worker.process->exit_status()) continue;
    LogWarn("node %d: rank %d did not stop within %s: SIGKILL", node_.node_rank, worker.rank,
            absl::FormatDuration(grace));
    worker.process->Signal(SIGKILL);
  }
  for (Worker& worker : workers_) {
    // SIGKILL ends a process at once unless it is stuck in the kernel (uninterruptible sleep).
    if (!worker.process->WaitFor(kKillTimeout)) {
      LogError(
          "node %d: rank %d (pid %d) did not end within %s of SIGKILL: it is stuck in the kernel "
          "(a hung file system or device); leaving it behind",
          node_.node_rank, worker.rank, worker.process->pid(), absl::FormatDuration(kKillTimeout));
      worker.process->Abandon();
    }
    if (worker.exited_at == absl::Time()) worker.exited_at = absl::Now();
    Drain(worker, 0);
    Drain(worker, 1);
  }
}

bool Agent::LeftEarly(int attempt, int rank) {
  // A world of one has no peers to leave behind (and no process group to record finishing).
  if (world_size_ == 1) return false;
  const absl::StatusOr<int64_t> finished =
      Counter(AgentKey(attempt, absl::StrCat("finished/", rank)));
  return finished.ok() && *finished == 0;
}

std::string Agent::ExitText(const Worker& worker) {
  if (worker.left_early) return "exit code 0 before the job finished";
  return worker.process->exit_status()->ToString();
}

absl::Status Agent::PublishFailures(int attempt) {
  nlohmann::json failures = nlohmann::json::array();
  const std::string host = HostName();
  for (const Worker& worker : workers_) {
    const std::optional<ExitStatus>& exit = worker.process->exit_status();
    if (!exit || (exit->ok() && !worker.left_early)) continue;
    std::string tail;
    for (const std::string& line : worker.stderr_tail) absl::StrAppend(&tail, line, "\n");
    // The ranks this worker's error blames, for the root cause: a hung rank is blamed by the
    // peers that timed out waiting for it, and only ends when this agent kills it.
    std::vector<int> blames;
    const absl::StatusOr<std::string> blamed =
        store_->Get(AgentKey(attempt, absl::StrCat("blame/", worker.rank)), absl::Milliseconds(1));
    for (const absl::string_view field :
         absl::StrSplit(blamed.value_or(""), ',', absl::SkipEmpty())) {
      if (int rank = 0; absl::SimpleAtoi(field, &rank)) blames.push_back(rank);
    }
    // Stopped: ended by the agent's SIGTERM (its checkpoint's exit) or SIGKILL. A worker told to
    // stop that exits with an error of its own failed, most likely before it was told.
    const bool stopped =
        worker.told_to_stop &&
        (exit->signal == SIGTERM || exit->signal == SIGKILL || StoppedAfterCheckpoint(*exit));
    failures.push_back({{"rank", worker.rank},
                        {"node", node_.node_rank},
                        {"host", host},
                        {"exit", ExitText(worker)},
                        {"stopped", stopped},
                        {"blames", blames},
                        {"time_us", absl::ToUnixMicros(worker.exited_at)},
                        {"stderr", tail}});
  }
  // A worker's stderr may hold any bytes: they travel as U+FFFD rather than throw.
  return store_->Set(Key(attempt, absl::StrCat("failures/node-", node_.node_rank)),
                     failures.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

void Agent::PrintRootCause(int attempt) {
  // Every node's workers that failed, and those its agent had to stop.
  std::vector<FailureRecord> records;
  for (int node = 0; node < node_.num_nodes; ++node) {
    const std::string key = Key(attempt, absl::StrCat("failures/node-", node));
    const absl::StatusOr<std::string> value = store_->Get(key, absl::Seconds(5));
    if (!value.ok()) continue;
    std::optional<std::vector<FailureRecord>> parsed = ParseFailures(*value);
    if (!parsed) {
      LogWarn(
          "ignoring node %d's failed workers: store key '%s' does not hold the JSON list an "
          "agent writes (another program with the job's token wrote it?)",
          node, key);
      continue;
    }
    records.insert(records.end(), parsed->begin(), parsed->end());
  }
  std::sort(records.begin(), records.end(),
            [](const FailureRecord& a, const FailureRecord& b) { return a.time_us < b.time_us; });
  std::vector<const FailureRecord*> failures;
  for (const FailureRecord& record : records) {
    if (!record.stopped) failures.push_back(&record);
  }
  if (failures.empty()) {
    LogError("the job failed but no worker recorded a failure (an agent was lost?)");
    return;
  }
  // The root cause is the first rank a failure blames (one that never started the collective
  // its peers failed in: hung, stopped or gone), preferring one that blames nobody itself, else
  // the first failure the ranks recorded (ProcessGroup::Fail), else the earliest to exit; the
  // others usually follow from it (a dead peer breaks every collective).
  auto [root, blamer] = FirstBlamed(records, failures);
  // A blamed rank that the agent ended after an earlier failure that blames nobody (a death by
  // signal, an error of its own) was stuck behind that failure, not hung: a pipeline stage
  // waiting on a killed neighbour, ended before its own receive could fail and blame it.
  if (root != nullptr && root->stopped && failures.front()->blames.empty() &&
      failures.front()->time_us < root->time_us) {
    root = failures.front();
    blamer = nullptr;
  }
  if (root == nullptr) {
    root = failures.front();
    const absl::StatusOr<std::string> first =
        store_->Get(AgentKey(attempt, "first_failure"), absl::Milliseconds(1));
    int first_rank = -1;
    if (first.ok() && absl::SimpleAtoi(*first, &first_rank)) {
      for (const FailureRecord* failure : failures) {
        if (failure->rank == first_rank) root = failure;
      }
    }
  }
  // The workers' flight-recorder dumps compared, when they wrote any (parallel/comm/
  // flight_recorder_diagnosis.h): which rank never entered which operation, or a desync.
  const std::optional<FlightDiagnosis> flights =
      DiagnosePublishedFlightDumps(*store_, attempt, world_size_);
  // A hung rank blamed may itself only wait behind another in a group of its own, and be ended
  // by the agent before its timeout could blame that one: the earliest operation some rank never
  // entered names the rank it waits for, when that one hung too (ended by the agent, blaming
  // nobody). A rank named there that failed on its own only left before the others entered.
  const FailureRecord* unentered = nullptr;
  if (root->stopped && flights && !absl::c_linear_search(flights->never_entered, root->rank)) {
    for (const FailureRecord& record : records) {
      if (unentered == nullptr && record.stopped && record.blames.empty() &&
          absl::c_linear_search(flights->never_entered, record.rank)) {
        unentered = &record;
      }
    }
  }
  if (unentered != nullptr) {
    root = unentered;
    blamer = nullptr;
  }
  const bool hung = root->stopped;
  if (hung) failures.push_back(root);
  std::string table =
      absl::StrFormat("%-6s %-6s %-20s %-24s %s\n", "rank", "node", "host", "exit", "time");
  for (const FailureRecord* f : failures) {
    absl::StrAppendFormat(&table, "%-6d %-6d %-20s %-24s %s\n", f->rank, f->node, f->host,
                          f->stopped ? "hung: ended by the agent" : f->exit,
                          ClockTime(absl::FromUnixMicros(f->time_us)));
  }
  // The root cause's own words, on its line.
  const std::string said = EndingError(root->stderr_tail);
  const std::string what =
      !hung       ? (said.empty() ? root->exit : absl::StrCat(root->exit, ": ", said))
      : unentered ? absl::StrFormat(
                        "hung: it never entered the operation the flight recorder below names, "
                        "which its peers wait in; the agent then ended it (%s)",
                        root->exit)
                  : absl::StrFormat(
                        "hung: rank %d's error names it as a rank that never started the failed "
                        "collective; the agent then ended it (%s)",
                        blamer->rank, root->exit);
  // Where the root cause sits in a pipelined job's mesh, as its worker recorded it (ProcessGroup::
  // ConnectMesh); none before that or without pipeline stages.
  const absl::StatusOr<std::string> where =
      store_->Get(AgentKey(attempt, absl::StrCat("where/", root->rank)), absl::Milliseconds(1));
  auto tail_of = [](const FailureRecord& record) {
    return absl::StrFormat(
        "Last lines of rank %d's stderr:\n%s", record.rank,
        record.stderr_tail.empty() ? "(nothing on stderr)\n" : record.stderr_tail);
  };
  const std::string report = absl::StrFormat(
      "the job failed (%d restarts used of %d). Root cause: rank %d on node %d (%s%s), %s.\n"
      "%sFailed workers, first failure first:\n%s%s%s",
      attempt, options_.max_restarts, root->rank, root->node, root->host,
      where.ok() ? absl::StrCat(", ", *where) : "", what,
      // Dumps that agree say something of a hang (not a desync), nothing of a rank's own error.
      flights && (flights->found || hung) ? absl::StrCat("Flight recorder: ", flights->text, "\n")
                                          : "",
      table, tail_of(*root), blamer != nullptr && blamer != root ? tail_of(*blamer) : "");
  LogError("%s", absl::StripTrailingAsciiWhitespace(report));
}

void Agent::Requeue() {
  // A job the user cancelled ends; one stopped while it still runs (its time limit's signal, a
  // preemption) comes back. Slurm shows a cancelled job COMPLETING while its processes end, then
  // CANCELLED; a job it requeues itself (`scontrol requeue`, a preemption that requeues) is
  // COMPLETING too, but counts the requeue in Restarts at once.
  if (!options_.job_state_argv.empty()) {
    const CommandRun shown = RunCommand(options_.job_state_argv, options_.environment);
    const auto field = [&](const std::string& name) -> std::string {
      const std::string key = name + "=";
      const std::string::size_type at = shown.output.find(key);
      if (at == std::string::npos) return "";
      const std::string::size_type start = at + key.size();
      return shown.output.substr(start, shown.output.find_first_of(" \n", start) - start);
    };
    const std::string state = field("JobState");
    int restarts = 0;
    if (absl::SimpleAtoi(field("Restarts"), &restarts) && restarts > node_.restart_count) {
      LogInfo(
          "Slurm is requeueing the job itself (JobState=%s, Restarts=%d): it comes back and "
          "resumes from the checkpoint",
          state, restarts);
      return;
    }
    if (state == "COMPLETING" || state == "CANCELLED") {
      LogInfo("the job is ending (JobState=%s: cancelled): not requeued", state);
      return;
    }
    if (state.empty()) {
      LogWarn("could not read the job's state with `%s` (%s); requeueing it",
              absl::StrJoin(options_.job_state_argv, " "), shown.Describe());
    }
  }
  const std::string command = absl::StrJoin(options_.requeue_argv, " ");
  const CommandRun requeue = RunCommand(options_.requeue_argv, options_.environment);
  if (requeue.exit && requeue.exit->ok()) {
    LogInfo("requeued the job: %s", command);
    return;
  }
  // Slurm ends the processes of a job it requeues, the command's own included, with SIGTERM:
  // that often comes before the command returns.
  if (requeue.exit && requeue.exit->signal == SIGTERM) {
    LogInfo("requeued the job: %s (ended by SIGTERM, as Slurm ends the job it requeues)", command);
    return;
  }
  LogError("could not requeue the job with `%s`: %s; resubmit it to resume from the checkpoint",
           command, requeue.Describe());
}

bool Agent::Settle() {
  return store_->Set(NodeKey("agent/exited", node_.node_rank, incarnation_), "1").ok() &&
         store_->Add(kSettledKey, 1).ok();
}

int Agent::Finish(int exit_code) {
  const bool reachable = Settle();
  // Node 0 hosts the store: it stays up until every other agent has read the outcome and gone
  // (a lost one is gone already; a replaced one closed too).
  if (reachable && node_.node_rank == 0) {
    const absl::Time deadline = absl::Now() + kExitTimeout;
    while (absl::Now() < deadline &&
           Counter(kClosedKey).value_or(0) - Counter(kReplacedKey).value_or(0) <
               node_.num_nodes - 1) {
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  return exit_code;
}

std::vector<LostAgent> Agent::LostAgents() {
  const absl::StatusOr<int64_t> closed = Counter(kClosedKey);
  const absl::StatusOr<int64_t> settled = Counter(kSettledKey);
  if (!closed.ok() || !settled.ok() || *closed <= *settled) return {};
  std::vector<LostAgent> lost;
  for (int node = 0; node < node_.num_nodes; ++node) {
    if (node == node_.node_rank) continue;
    const int incarnation =
        static_cast<int>(Counter(NodeKey("agent/incarnation", node)).value_or(0));
    if (Counter(NodeKey(kClosedKey, node, incarnation)).value_or(0) == 0) continue;
    if (store_->Get(NodeKey("agent/exited", node, incarnation), absl::ZeroDuration()).ok()) {
      continue;
    }
    const absl::StatusOr<std::string> host =
        store_->Get(NodeKey("agent/host", node), absl::ZeroDuration());
    const absl::StatusOr<std::string> error =
        store_->Get(NodeKey("agent/error", node, incarnation), absl::ZeroDuration());
    lost.push_back({node, host.ok() ? *host : "?", incarnation, error.value_or("")});
  }
  return lost;
}

void Agent::Fail(const absl::Status& error) {
  // A store that failed the agent would hold its error up to the reply timeout (60 s), past a
  // scheduler's kill: its own error is printed, unrecorded.
  if (!joined_ || absl::IsUnavailable(error) || absl::IsDeadlineExceeded(error)) return;
  if (!store_
           ->Set(NodeKey("agent/error", node_.node_rank, incarnation_),
                 std::string(error.message()))
           .ok() ||
      node_.node_rank != 0 || node_.num_nodes == 1) {
    return;
  }
  workers_.clear();  // killed, as at exit
  store_.reset();    // the close that the others take for this agent's loss
  TcpStoreClientOptions options;
  options.token = node_.rdzv_token;
  absl::StatusOr<std::unique_ptr<TcpStoreClient>> store =
      TcpStoreClient::Connect(node_.master_addr, server_->port(), options);
  if (!store.ok()) return;
  // Said now, not only at the exit after the wait.
  LogError(
      "node 0: %s; keeping the rendezvous store up until the other nodes have read it (at "
      "most %s)",
      error.message(), absl::FormatDuration(kExitTimeout));
  const absl::Time deadline = absl::Now() + kExitTimeout;
  while (absl::Now() < deadline && !OthersGone(**store, node_.num_nodes)) {
    absl::SleepFor(absl::Milliseconds(20));
  }
}

std::vector<LostAgent> Agent::LostIn(int attempt) {
  std::vector<LostAgent> lost = LostAgents();
  const absl::StatusOr<std::string> recorded_text =
      store_->Get(Key(attempt, "lost"), absl::ZeroDuration());
  const nlohmann::json recorded =
      nlohmann::json::parse(recorded_text.value_or("[]"), nullptr, false);
  // Anything that holds the store token can write the key: entries unlike ours are dropped.
  bool rewrite = !recorded.is_array();
  for (const nlohmann::json& entry : recorded.is_array() ? recorded : nlohmann::json::array()) {
    LostAgent agent;
    try {
      agent = {entry.at("node").get<int>(), entry.at("host").get<std::string>(),
               entry.at("incarnation").get<int>()};
    } catch (const nlohmann::json::exception&) {
      rewrite = true;
      continue;
    }
    const bool known = std::any_of(lost.begin(), lost.end(), [&](const LostAgent& a) {
      return a.node == agent.node && a.incarnation == agent.incarnation;
    });
    if (!known) lost.push_back(agent);
  }
  if (rewrite || lost.size() > recorded.size()) {
    nlohmann::json record = nlohmann::json::array();
    for (const LostAgent& agent : lost) {
      record.push_back(
          {{"node", agent.node}, {"host", agent.host}, {"incarnation", agent.incarnation}});
    }
    (void)store_->Set(Key(attempt, "lost"),
                      record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  }
  return lost;
}

void Agent::AwaitRejoin(int attempt, const std::vector<LostAgent>& lost) {
  std::string nodes;
  for (const LostAgent& agent : lost) {
    absl::StrAppend(&nodes, nodes.empty() ? "" : ", ", agent.node);
    if (node_.node_rank == 0) {
      (void)store_->Set(NodeKey("agent/rejoin", agent.node, agent.incarnation + 1),
                        absl::StrCat(attempt + 1));
    }
  }
  (void)store_->Add(Key(attempt, "failed"), 1);  // nodes still watching this attempt stop too
  LogWarn(
      "node %d: restarting the workers (restart %d of %d) once node %s has an agent again: start "
      "`dtrain launch` there as before (waiting up to %s)",
      node_.node_rank, attempt + 1, options_.max_restarts, nodes,
      absl::FormatDuration(options_.rendezvous_timeout));
  rejoining_ = lost;
}

AfterLoss Agent::HandleLost(int attempt, const std::vector<LostAgent>& lost) {
  ReportLost(lost);
  // Node 0's agent failed (one killed takes the store with it, kLostStore): its store goes too.
  const bool store_going =
      std::any_of(lost.begin(), lost.end(), [](const LostAgent& agent) { return agent.node == 0; });
  if (attempt < options_.max_restarts && !stop_requested_ && !store_going) {
    AwaitRejoin(attempt, lost);
    return AfterLoss::kRestart;
  }
  if (store_going && attempt < options_.max_restarts) {
    LogError("node %d: no restart: node 0's agent hosted the rendezvous store", node_.node_rank);
  }
  if (node_.node_rank == 0) PrintLostRootCause(attempt, lost);
  return AfterLoss::kEnd;
}

void Agent::ReportLost(const std::vector<LostAgent>& lost) {
  for (const LostAgent& agent : lost) {
    const std::pair<int, int> id = {agent.node, agent.incarnation};
    if (std::find(reported_lost_.begin(), reported_lost_.end(), id) != reported_lost_.end()) {
      continue;
    }
    reported_lost_.push_back(id);
    LogError("node %d: node %d (host %s): %s", node_.node_rank, agent.node, agent.host,
             LostHow(agent));
  }
}

Outcome Agent::OnStopRequest(int attempt) {
  const char* signal = sigabbrev_np(stop_signal_);
  if (const absl::Status reachable = store_->Ping(); !reachable.ok()) {
    LogError(
        "node %d: SIG%s received and the rendezvous store at %s:%d is gone (%s): node 0's agent "
        "was lost (killed, crashed, or its host went down); stopping the workers",
        node_.node_rank, signal, node_.master_addr, node_.master_port, reachable.message());
    return Outcome::kLostStore;
  }
  if (const std::vector<LostAgent> lost = LostAgents(); !lost.empty()) {
    LogInfo("node %d: SIG%s received after another node's agent was lost: not a preemption",
            node_.node_rank, signal);
    ReportLost(lost);
    return Outcome::kLostAgent;
  }
  (void)store_->Add(Key(attempt, "stop"), 1);
  LogInfo("node %d: SIG%s received: asking the workers to checkpoint and stop (grace %s)",
          node_.node_rank, signal, absl::FormatDuration(options_.stop_grace));
  return Outcome::kStopping;
}

std::optional<int> Agent::FinishIfAgentLost(int attempt) {
  const std::vector<LostAgent> lost = LostAgents();
  if (lost.empty()) return std::nullopt;
  ReportLost(lost);
  if (node_.node_rank == 0) PrintLostRootCause(attempt, lost);
  return Finish(1);
}

void Agent::PrintLostRootCause(int attempt, const std::vector<LostAgent>& lost) {
  std::string others;
  for (size_t i = 1; i < lost.size(); ++i) {
    absl::StrAppendFormat(&others, "%s node %d (host %s)", i == 1 ? "; also lost:" : ",",
                          lost[i].node, lost[i].host);
  }
  const LostAgent& first = lost.front();
  LogError(
      "the job failed (%d restarts used of %d). Root cause: node %d (host %s): %s, and %s with "
      "it%s. Workers that failed after it lost their peers.",
      attempt, options_.max_restarts, first.node, first.host, LostHow(first),
      Ranks(first.node * options_.nproc_per_node, (first.node + 1) * options_.nproc_per_node - 1),
      others);
}

absl::StatusOr<int> Agent::Run() {
  // Told to stop before any worker started (a preemption, Ctrl-C): stopped, nothing to save,
  // requeued as after a stop with workers. Not settled: the other agents take this one for lost
  // at once (its arrival stays counted, and they must not start without it).
  const auto stopped_waiting = [&](const absl::Status& cancelled) {
    LogWarn("node %d: SIG%s received: %s; no worker started", node_.node_rank,
            sigabbrev_np(stop_signal_), cancelled.message());
    if (node_.node_rank == 0 && !options_.requeue_argv.empty()) Requeue();
    return kExitStopped;
  };
  if (const absl::Status connected = Connect(); !connected.ok()) {
    if (absl::IsCancelled(connected)) return stopped_waiting(connected);
    return connected;
  }
  ASSIGN_OR_RETURN(const int first_attempt, Rejoin());
  for (int attempt = first_attempt;; ++attempt) {
    if (const absl::Status arrived = Barrier(Key(attempt, "arrived"), options_.rendezvous_timeout);
        !arrived.ok()) {
      if (absl::IsCancelled(arrived) && rejoining_.empty() && attempt == first_attempt) {
        return stopped_waiting(arrived);
      }
      if (rejoining_.empty()) {
        // An agent lost between attempts (not at the first rendezvous, which only gathers them).
        const std::vector<LostAgent> lost =
            attempt > first_attempt ? LostIn(attempt) : std::vector<LostAgent>();
        if (lost.empty()) return arrived;
        if (HandleLost(attempt, lost) == AfterLoss::kRestart) continue;
        return Finish(1);
      }
      // The lost agents did not come back: they remain the root cause.
      LogError("node %d: %s", node_.node_rank, arrived.message());
      if (node_.node_rank == 0) PrintLostRootCause(attempt - 1, rejoining_);
      return Finish(1);
    }
    rejoining_.clear();
    if (attempt == first_attempt) RETURN_IF_ERROR(CheckWorkerCounts());
    RETURN_IF_ERROR(StartWorkers(attempt));
    Outcome outcome = Watch(attempt);
    if (outcome == Outcome::kSucceeded) outcome = AwaitOthers(attempt);
    switch (outcome) {
      case Outcome::kSucceeded:
        LogInfo("node %d: every worker finished", node_.node_rank);
        return Finish(0);
      case Outcome::kStopping: {
        StopWorkers(options_.stop_grace);
        // The close of a lost agent may reach the store after the SIGTERM that followed it.
        if (const std::optional<int> lost = FinishIfAgentLost(attempt)) return *lost;
        // A worker that saved its checkpoint and stopped exits kExitStopped; one that had just
        // finished its last step, 0; one still starting, before it takes SIGTERM itself (it does
        // so before its first step), is ended by it with nothing to save.
        bool clean = true, stopped = false, repeating = false;
        std::string unclean;
        for (const Worker& worker : workers_) {
          const ExitStatus status = *worker.process->exit_status();
          const bool honoured = StoppedAfterCheckpoint(status) || status.signal == SIGTERM;
          // One that did not stop in time was named as it was killed (StopWorkers).
          if (!status.ok() && !honoured && !(worker.told_to_stop && status.signal == SIGKILL)) {
            absl::StrAppend(&unclean, unclean.empty() ? ": " : ", ", "rank ", worker.rank, " ",
                            ExitText(worker));
          }
          clean = clean && (status.ok() || honoured);
          stopped = stopped || honoured;
          repeating = repeating || absl::c_any_of(kRepeatingExits, [&](const auto& exit) {
                        return status.signal == 0 && status.code == exit.first;
                      });
        }
        if (clean && !stopped) {
          LogInfo("node %d: every worker finished before the stop", node_.node_rank);
          return Finish(0);
        }
        if (clean) {
          LogInfo("node %d: workers stopped cleanly", node_.node_rank);
        } else {
          // Its checkpoint may not have been saved: a resume takes the newest complete one.
          LogWarn("node %d: workers stopped, not all cleanly%s (see the worker logs)",
                  node_.node_rank, unclean);
        }
        // Node 0 requeues; the others wait for that before they exit, since the exit of one
        // (srun --kill-on-bad-exit) ends the step and with it a requeue command still running.
        if (!options_.requeue_argv.empty()) {
          const std::string requeued = Key(attempt, "requeue_done");
          if (node_.node_rank == 0) {
            if (repeating) {
              LogError(
                  "node 0: not requeued: a worker exited as every run would again (a full disk at "
                  "its save, a wrong recipe)");
            } else {
              Requeue();
            }
            (void)store_->Set(requeued, "1");
          } else {
            (void)store_->Wait({requeued}, kExitTimeout);
          }
        }
        // Stopped is not finished: a scheduler must run the job again to resume it.
        return Finish(clean ? kExitStopped : 1);
      }
      case Outcome::kLostStore:
        StopWorkers(options_.failure_grace);
        return 1;
      case Outcome::kLostAgent:
      case Outcome::kFailed:
        break;
    }
    StopWorkers(options_.failure_grace);
    // Workers fail when an agent is lost (their peers die with it): it is the cause. The lost
    // node cannot reach this attempt's barriers; the next attempt's rendezvous waits for it.
    if (const std::vector<LostAgent> lost = LostIn(attempt); !lost.empty()) {
      if (HandleLost(attempt, lost) == AfterLoss::kRestart) continue;
      return Finish(1);
    }
    RETURN_IF_ERROR(PublishFailures(attempt));
    // Counted before the barrier below, after which every agent reads them to decide on a
    // restart.
    for (const auto& [code, why] : kRepeatingExits) {
      if (std::any_of(workers_.begin(), workers_.end(), [code](const Worker& worker) {
            const ExitStatus status = *worker.process->exit_status();
            return status.signal == 0 && status.code == code;
          })) {
        RETURN_IF_ERROR(store_->Add(Key(attempt, absl::StrCat("repeats/", code)), 1).status());
      }
    }
    // A lost host may show up only here: its workers' peers time out in Gloo before the store
    // notices that the host stopped answering.
    if (const absl::Status stopped = Barrier(Key(attempt, "stopped"), options_.rendezvous_timeout);
        !stopped.ok()) {
      const std::vector<LostAgent> lost = LostIn(attempt);
      if (lost.empty()) return stopped;
      if (HandleLost(attempt, lost) == AfterLoss::kRestart) continue;
      return Finish(1);
    }
    std::optional<int> repeating;
    for (const auto& [code, why] : kRepeatingExits) {
      const absl::StatusOr<int64_t> count = Counter(Key(attempt, absl::StrCat("repeats/", code)));
      if (!count.ok() || *count == 0) continue;
      repeating = code;
      LogError(
          "node %d: a worker exited with code %d: %s, and a restart would fail the same way; "
          "not restarting",
          node_.node_rank, code, why);
      break;
    }
    if (!repeating && attempt < options_.max_restarts) {
      LogWarn("node %d: restarting the workers (restart %d of %d)%s", node_.node_rank, attempt + 1,
              options_.max_restarts,
              node_.node_rank == 0
                  ? ResumePoint(options_.checkpoint_dir, options_.checkpoint_resume)
                  : "");
      continue;
    }
    if (node_.node_rank == 0) PrintRootCause(attempt);
    return Finish(repeating.value_or(1));
  }
}

}  // namespace

std::vector<std::string> WorkerEnvironment(const WorldEnvironment& node,
                                           const AgentOptions& options, int local_rank,
                                           int attempt) {
  std::vector<std::string> environment;
  bool has_omp_threads = false;
  for (const std::string& entry : options.environment) {
    const std::string name = EnvName(entry);
    if (IsRankVariable(name)) continue;
    has_omp_threads |= name == "OMP_NUM_THREADS";
    environment.push_back(entry);
  }
  const int rank = node.node_rank * options.nproc_per_node + local_rank;
  const int world_size = node.num_nodes * options.nproc_per_node;
  std::vector<std::pair<std::string, std::string>> values = {
      {"RANK", std::to_string(rank)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", std::to_string(world_size)},
      {"LOCAL_WORLD_SIZE", std::to_string(options.nproc_per_node)},
      {"NODE_RANK", std::to_string(node.node_rank)},
      {"NUM_NODES", std::to_string(node.num_nodes)},
      {"MASTER_ADDR", node.master_addr},
      {"MASTER_PORT", std::to_string(node.master_port)},
      {"RESTART_COUNT", std::to_string(attempt)},
      {"MAX_RESTARTS", std::to_string(options.max_restarts)},
  };
  // Without one (a standalone launch), the worker's run is its run.name (the metrics' job label).
  if (!node.run_id.empty()) values.push_back({"RUN_ID", node.run_id});
  for (const auto& [name, value] : values) {
    environment.push_back(absl::StrCat("DTRAIN_", name, "=", value));
  }
  // torchrun's contract too, for anything in the worker that reads it.
  for (const auto& [name, value] : values) {
    if (name == "NODE_RANK") {
      environment.push_back(absl::StrCat("GROUP_RANK=", value));
    } else if (name == "RUN_ID" || name == "RESTART_COUNT" || name == "MAX_RESTARTS") {
      environment.push_back(absl::StrCat("TORCHELASTIC_", name, "=", value));
    } else if (name != "NUM_NODES") {
      environment.push_back(absl::StrCat(name, "=", value));
    }
  }
  environment.push_back("DTRAIN_AGENT_STORE=1");
  if (!node.rdzv_token.empty()) {
    environment.push_back(absl::StrCat("DTRAIN_RDZV_TOKEN=", node.rdzv_token));
  }
  if (!has_omp_threads && options.nproc_per_node > 1) environment.push_back("OMP_NUM_THREADS=1");
  return environment;
}

void ReportFailureBeforeJoining(const WorldEnvironment& node, const absl::Status& error,
                                absl::Duration timeout) {
  if (node.num_nodes < 2) return;
  // Node 0 serves the store the others wait on for as long as they take to read the failure.
  std::optional<IgnoredSigterm> ignored;
  std::unique_ptr<TcpStoreServer> server;
  if (node.node_rank == 0) {
    ignored.emplace();
    TcpStoreServerOptions server_options;
    server_options.token = node.rdzv_token;
    absl::StatusOr<std::unique_ptr<TcpStoreServer>> started =
        TcpStoreServer::Start("", node.master_port, server_options);
    if (!started.ok()) return;  // the others wait out their own timeout
    server = *std::move(started);
  }
  const absl::Time deadline = absl::Now() + timeout;
  TcpStoreClientOptions options;
  options.token = node.rdzv_token;
  options.connect_timeout = timeout;
  absl::StatusOr<std::unique_ptr<TcpStoreClient>> store =
      TcpStoreClient::Connect(node.master_addr, node.master_port, options);
  if (!store.ok()) return;  // node 0 waits out its own timeout, as before
  const std::string message = absl::StrFormat("(host %s) %s", HostName(), error.message());
  if (!(*store)->Set(EarlyFailureKey(node.node_rank), message).ok() ||
      !(*store)->Add(kEarlyFailuresKey, 1).ok() || node.node_rank != 0 ||
      !(*store)->Set(kNodeCountKey, absl::StrCat(node.num_nodes)).ok()) {
    return;
  }
  // Each of the others reads it at its rendezvous and leaves, or failed its own checks too.
  while (absl::Now() < deadline && !OthersGone(**store, node.num_nodes)) {
    absl::SleepFor(absl::Milliseconds(20));
  }
}

absl::StatusOr<int> RunAgent(const WorldEnvironment& node, const AgentOptions& options) {
  if (options.nproc_per_node < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nproc-per-node ", options.nproc_per_node, " must be at least 1"));
  }
  Agent agent(node, options);
  absl::StatusOr<int> exit_code = agent.Run();
  if (!exit_code.ok()) agent.Fail(exit_code.status());
  return exit_code;
}

}  // namespace dtrain
