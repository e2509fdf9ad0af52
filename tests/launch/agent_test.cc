// `dtrain launch` standalone (the agent on this machine, real worker processes on loopback):
// training end to end, worker failure with and without restarts, the root-cause report, the
// agent's death taking its workers with it, and two pods' agents losing each other (a lost agent
// as the root cause, its replacement rejoining while a restart is left, a lost store).
#include "launch/agent.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "core/util/exit_codes.h"
#include "core/util/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launch/environment.h"
#include "launch/gpus.h"
#include "parallel/store/tcp_store_client.h"
#include "tests/testing/multi_process.h"
#include "tests/testing/run_dtrain.h"

namespace dtrain {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

// A recipe small enough for a few ranks on two cores; `steps` sets how long it runs.
std::string Recipe(const std::string& name, int steps) {
  std::string text;
  for (int i = 0; i < 300; ++i) absl::StrAppend(&text, "Pack my box with ", i % 7, " jugs.\n");
  const std::string data = testing::WriteTempFile("agent_text.txt", text);
  return testing::WriteTempFile(
      name + ".yaml",
      absl::StrCat(R"(
run: {name: agent, seed: 5, threads: 1}
model: {n_layer: 2, n_head: 2, d_model: 32, max_seq_len: 32}
data: {train: [)",
                   data, R"(]}
train: {steps: )",
                   steps, R"(, batch_size: 8, micro_batch: 2, seq_len: 16, warmup_steps: 1,
        eval_every: 0, export_to: ""}
parallel: {bucket_mb: 0.01, timeout_s: 20}
logging: {sample_tokens: 0}
)"));
}

std::string OutDir(const std::string& name) { return testing::FreshTempDir("agent_" + name); }

std::vector<double> Losses(const std::string& out_dir) {
  return testing::MetricsLosses(out_dir + "/agent/metrics.jsonl");
}

std::vector<std::string> Environment() {
  std::vector<std::string> entries;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    // The test may itself run under a launcher; the agent must see a plain machine.
    if (absl::StartsWith(*entry, "SLURM_") || absl::StartsWith(*entry, "RANK=") ||
        absl::StartsWith(*entry, "WORLD_SIZE=") || absl::StartsWith(*entry, "MASTER_")) {
      continue;
    }
    entries.push_back(*entry);
  }
  return entries;
}

// `dtrain launch ...` running in the background, after `wrapper` (a command that runs its
// arguments, e.g. nohup); its output is collected by Pump.
class Launch {
 public:
  explicit Launch(const std::vector<std::string>& args,
                  const std::vector<std::string>& extra_environment = {},
                  const std::vector<std::string>& wrapper = {},
                  const std::string& binary = DTRAIN_BINARY) {
    std::vector<std::string> argv = wrapper;
    argv.insert(argv.end(), {binary, "launch"});
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<std::string> environment = Environment();
    environment.insert(environment.end(), extra_environment.begin(), extra_environment.end());
    SubprocessOptions options;
    options.stdout_stream = SubprocessOptions::Stream::kPipe;
    options.stderr_stream = SubprocessOptions::Stream::kPipe;
    options.nonblocking_pipes = true;
    options.environment = std::move(environment);
    options.parent_death_signal = SIGKILL;
    absl::StatusOr<std::unique_ptr<Subprocess>> process = Subprocess::Spawn(argv, options);
    EXPECT_TRUE(process.ok()) << process.status();
    if (process.ok()) process_ = *std::move(process);
  }

  // Reads output until `done` holds or the agent exits, for at most `timeout`.
  bool Pump(
      absl::Duration timeout, const std::function<bool()>& done = [] { return false; }) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      Read(process_->stdout_fd());
      Read(process_->stderr_fd());
      if (done()) return true;
      if (process_->Poll()) {
        Read(process_->stdout_fd());
        Read(process_->stderr_fd());
        return true;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

  // Runs to the end; the exit code, or -1 after `timeout` (then the agent is killed).
  int Wait(absl::Duration timeout) {
    if (!Pump(timeout) || !process_->exit_status()) return -1;
    const ExitStatus exit = *process_->exit_status();
    return exit.signal ? 128 + exit.signal : exit.code;
  }

  // The agent's worker processes: its children, by rank.
  std::vector<std::pair<int, pid_t>> Workers() const {
    std::vector<std::pair<int, pid_t>> workers;
    std::ifstream children(
        absl::StrCat("/proc/", process_->pid(), "/task/", process_->pid(), "/children"));
    for (pid_t pid; children >> pid;) {
      std::ifstream environ_file(absl::StrCat("/proc/", pid, "/environ"));
      std::string environment((std::istreambuf_iterator<char>(environ_file)), {});
      for (const absl::string_view entry : absl::StrSplit(environment, '\0')) {
        if (absl::StartsWith(entry, "DTRAIN_RANK=")) {
          workers.push_back({std::stoi(std::string(entry.substr(12))), pid});
        }
      }
    }
    std::sort(workers.begin(), workers.end());
    return workers;
  }

  Subprocess& process() { return *process_; }
  const std::string& output() const { return output_; }

 private:
  void Read(int fd) {
    if (fd < 0) return;
    char buffer[4096];
    for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) output_.append(buffer, n);
  }

  std::unique_ptr<Subprocess> process_;
  std::string output_;
};

bool Alive(pid_t pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return false;
  // "pid (comm) S ...": a zombie (Z) has already died.
  const size_t state = line.rfind(')') + 2;
  return state < line.size() && line[state] != 'Z';
}

// `dtrain launch` arguments of node `node_rank` of `nodes` that meet at `master`:`port`, with
// `extra` before Recipe(name, 3) trained into OutDir(name).
std::vector<std::string> NodeArgs(int node_rank, int nodes, const std::string& master, int port,
                                  const std::string& name,
                                  const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {
      absl::StrCat("--node-rank=", node_rank), absl::StrCat("--nnodes=", nodes),
      absl::StrCat("--master-addr=", master), absl::StrCat("--master-port=", port)};
  args.insert(args.end(), extra.begin(), extra.end());
  args.insert(args.end(), {Recipe(name, 3), "--set", "run.out_dir=" + OutDir(name)});
  return args;
}

// Lines of metrics.jsonl written so far.
int StepsLogged(const std::string& out_dir) { return static_cast<int>(Losses(out_dir).size()); }

TEST(AgentTest, WorkerEnvironmentReplacesLauncherRanks) {
  WorldEnvironment node;
  node.node_rank = 1;
  node.num_nodes = 2;
  node.master_addr = "n1";
  node.master_port = 23456;
  node.run_id = "77.0";
  node.rdzv_token = "secret";
  AgentOptions options;
  options.nproc_per_node = 2;
  options.max_restarts = 3;
  options.environment = {"PATH=/bin",
                         "RANK=9",
                         "SLURM_PROCID=1",
                         "DTRAIN_RANK=7",
                         "CUDA_VISIBLE_DEVICES=4,5",
                         "TORCHELASTIC_RUN_ID=old"};
  const std::vector<std::string> env = WorkerEnvironment(node, options, 1, 2);
  for (const char* expected : {"PATH=/bin",
                               "SLURM_PROCID=1",
                               "DTRAIN_RANK=3",
                               "RANK=3",
                               "DTRAIN_LOCAL_RANK=1",
                               "LOCAL_RANK=1",
                               "DTRAIN_WORLD_SIZE=4",
                               "WORLD_SIZE=4",
                               "LOCAL_WORLD_SIZE=2",
                               "DTRAIN_NODE_RANK=1",
                               "GROUP_RANK=1",
                               "DTRAIN_NUM_NODES=2",
                               "MASTER_ADDR=n1",
                               "DTRAIN_MASTER_PORT=23456",
                               "DTRAIN_RUN_ID=77.0",
                               "TORCHELASTIC_RUN_ID=77.0",
                               "DTRAIN_RESTART_COUNT=2",
                               "TORCHELASTIC_RESTART_COUNT=2",
                               "TORCHELASTIC_MAX_RESTARTS=3",
                               "DTRAIN_AGENT_STORE=1",
                               "DTRAIN_RDZV_TOKEN=secret",
                               "CUDA_VISIBLE_DEVICES=4,5",
                               "OMP_NUM_THREADS=1"}) {
    EXPECT_THAT(env, Contains(std::string(expected)));
  }
  for (const char* stale : {"RANK=9", "DTRAIN_RANK=7", "TORCHELASTIC_RUN_ID=old"}) {
    EXPECT_THAT(env, Not(Contains(std::string(stale))));
  }
  node.run_id.clear();  // a standalone launch: the workers' run is their run.name
  for (const std::string& entry : WorkerEnvironment(node, options, 0, 0)) {
    EXPECT_FALSE(absl::StrContains(entry, "RUN_ID=")) << entry;
  }
  options.environment.push_back("OMP_NUM_THREADS=4");  // the user's choice is kept
  EXPECT_THAT(WorkerEnvironment(node, options, 0, 0), Contains(std::string("OMP_NUM_THREADS=4")));
  EXPECT_THAT(WorkerEnvironment(node, options, 0, 0),
              Not(Contains(std::string("OMP_NUM_THREADS=1"))));
}

TEST(AgentTest, StandaloneLaunchTrainsLikeOneProcess) {
  const std::string single = OutDir("single");
  const testing::Outcome one =
      testing::RunDtrain(absl::StrCat("train ", Recipe("one", 6), " --set run.out_dir=", single));
  ASSERT_EQ(one.exit_code, 0) << one.stderr_text;

  const std::string out = OutDir("two");
  // A key that only warns: the agent prints the recipe's warnings once, not rank 0 again.
  Launch launch({Recipe("two", 6), "--nproc-per-node=2", "--set", "run.out_dir=" + out, "--set",
                 "parallel.sequence_parallel=true"});
  ASSERT_EQ(launch.Wait(absl::Seconds(120)), 0) << launch.output();
  EXPECT_THAT(launch.output(), HasSubstr("all 2 workers past rendezvous"));
  EXPECT_THAT(launch.output(), HasSubstr("[rank 0] "));
  const std::vector<std::string> warned =
      absl::StrSplit(launch.output(), "has no effect with parallel.tp: 1");
  EXPECT_EQ(warned.size(), 2u) << launch.output();
  const std::vector<double> reference = Losses(single), losses = Losses(out);
  ASSERT_EQ(losses.size(), reference.size());
  for (size_t i = 0; i < losses.size(); ++i) {
    EXPECT_NEAR(losses[i], reference[i], 1e-5 * reference[i]) << "step " << i + 1;
  }
}

// Two pods of a Kubeflow TrainJob (PET_* variables) on one machine: each `dtrain launch` is its
// node's agent, they meet at node 0's store, and the four ranks train as one process would.
TEST(AgentTest, TwoKubeflowPodsTrainTogether) {
  const std::string single = OutDir("pods_single");
  const testing::Outcome one = testing::RunDtrain(
      absl::StrCat("train ", Recipe("pods_one", 4), " --set run.out_dir=", single));
  ASSERT_EQ(one.exit_code, 0) << one.stderr_text;

  const std::string out = OutDir("pods");
  const std::string recipe = Recipe("pods", 4);
  const int port = testing::FreeTcpPort();
  std::vector<std::unique_ptr<Launch>> pods;
  for (int pod = 0; pod < 2; ++pod) {
    pods.push_back(std::make_unique<Launch>(
        std::vector<std::string>{recipe, "--set", "run.out_dir=" + out},
        std::vector<std::string>{"PET_NNODES=2", "PET_NPROC_PER_NODE=2",
                                 absl::StrCat("PET_NODE_RANK=", pod), "PET_MASTER_ADDR=127.0.0.1",
                                 absl::StrCat("PET_MASTER_PORT=", port),
                                 "DTRAIN_RDZV_TOKEN=pods-test-token"}));
  }
  for (int pod = 1; pod >= 0; --pod) {
    EXPECT_EQ(pods[pod]->Wait(absl::Seconds(120)), 0) << pods[pod]->output();
  }
  EXPECT_THAT(pods[1]->output(), HasSubstr("node 1 of 2 (trainer-v2): 2 workers"));
  EXPECT_THAT(pods[0]->output(), HasSubstr("all 4 workers past rendezvous"));
  const std::vector<double> reference = Losses(single), losses = Losses(out);
  ASSERT_EQ(losses.size(), reference.size());
  for (size_t i = 0; i < losses.size(); ++i) {
    EXPECT_NEAR(losses[i], reference[i], 1e-5 * reference[i]) << "step " << i + 1;
  }
}

// A PyTorchJob pod's nprocPerNode "auto" (the operator's default): one worker per visible GPU,
// one without a GPU; --nproc-per-node wins over it; "cpu" is one worker. Each ended the launch
// with "'auto' is not an integer".
TEST(AgentTest, APyTorchJobsNprocPerNodeAutoIsAWorkerPerGpu) {
  const int gpus = std::max(1, FindGpus(ProcessEnvironment()).visible);
  const std::tuple<std::string, std::string, int> cases[] = {{"auto", "", gpus},
                                                             {"auto", "--nproc-per-node=2", 2},
                                                             {"cpu", "", 1},
                                                             {"2", "--nproc-per-node=cpu", 1}};
  for (const auto& [kind, flag, workers] : cases) {
    SCOPED_TRACE(kind + " " + flag);
    const std::string out = OutDir("pet_auto");
    std::vector<std::string> args = {Recipe("pet_auto", 2), "--set", "run.out_dir=" + out};
    if (!flag.empty()) args.push_back(flag);
    Launch launch(args,
                  {"PET_NNODES=1", "PET_NODE_RANK=0", "PET_NPROC_PER_NODE=" + kind,
                   "MASTER_ADDR=127.0.0.1", absl::StrCat("MASTER_PORT=", testing::FreeTcpPort())});
    EXPECT_EQ(launch.Wait(absl::Seconds(120)), 0) << launch.output();
    EXPECT_THAT(launch.output(), HasSubstr(absl::StrCat("(pytorchjob): ", workers,
                                                        workers == 1 ? " worker," : " workers,")));
  }
}

// A pod's master name that resolves only after its agent started (a Kubernetes pod's DNS record
// appears once that pod runs): the agent asks again until it does, within the rendezvous
// timeout, where it failed at once. Node 1's agent (a Trainer v2 pod) reads an /etc/hosts of its
// own, bound over the file in a mount namespace, which gains the name once it said it waits.
TEST(AgentTest, APodsMasterNameThatResolvesLateIsWaitedFor) {
  if (geteuid() != 0 || std::system("unshare -m true 2>/dev/null") != 0) {
    GTEST_SKIP() << "needs root and unshare -m (an /etc/hosts of node 1's own)";
  }
  const std::string hosts = testing::WriteTempFile("late_hosts", "127.0.0.1 localhost\n");
  const int port = testing::FreeTcpPort();
  const std::string out = OutDir("late_master");
  const std::string recipe = Recipe("late_master", 3);
  std::future<testing::Outcome> node_one = std::async(std::launch::async, [&] {
    return testing::RunDtrain(
        absl::StrCat("launch --rdzv-timeout-s=60 ", recipe, " --set run.out_dir=", out),
        absl::StrCat("env DTRAIN_RDZV_TOKEN=late-token PET_NNODES=2 PET_NODE_RANK=1 ",
                     "PET_NPROC_PER_NODE=1 PET_MASTER_ADDR=late-master PET_MASTER_PORT=", port,
                     " unshare -m sh -c 'mount --bind ", hosts,
                     " /etc/hosts && exec \"$0\" \"$@\"'"));
  });
  // RunDtrain's stderr file, read as it grows.
  const std::string stderr_path = testing::TempPath("dtrain_stderr.txt");
  const auto waiting = [&] {
    std::ifstream in(stderr_path);
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    return absl::StrContains(text, "master address 'late-master' does not resolve yet");
  };
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (!waiting() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(waiting()) << "node 1 never said it waits for its master's name";
  std::ofstream(hosts, std::ios::app) << "127.0.0.1 late-master\n";
  Launch node_zero({"--node-rank=0", "--nnodes=2", "--master-addr=127.0.0.1",
                    absl::StrCat("--master-port=", port), "--rdzv-timeout-s=60", recipe, "--set",
                    "run.out_dir=" + out},
                   {"DTRAIN_RDZV_TOKEN=late-token"});
  EXPECT_EQ(node_zero.Wait(absl::Seconds(120)), 0) << node_zero.output();
  const testing::Outcome one = node_one.get();
  EXPECT_EQ(one.exit_code, 0) << one.stderr_text;
}

// A master name that does not resolve fails at once on one node too (outside pods, where a name
// may resolve late), where the agent waited out the rendezvous timeout; exit 2, as a restart
// would not resolve it either.
TEST(AgentTest, AMasterNameThatDoesNotResolveFailsAtOnce) {
  const absl::Time start = absl::Now();
  Launch launch({"--master-addr=no-such-host.invalid", "--rdzv-timeout-s=60",
                 Recipe("no_master", 3), "--set", "run.out_dir=" + OutDir("no_master")});
  EXPECT_EQ(launch.Wait(absl::Seconds(60)), 2) << launch.output();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  EXPECT_THAT(launch.output(),
              HasSubstr("master address 'no-such-host.invalid' (flag --master-addr "
                        "no-such-host.invalid) does not resolve"));
}

// Node 0's store port taken by another process: the error says where the port came from (a port
// derived from a Slurm job's id would come back on its requeue).
TEST(AgentTest, ATakenStorePortSaysWhereItCameFrom) {
  const int port = testing::FreeTcpPort();
  const int taken = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  ASSERT_EQ(::bind(taken, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(taken, 1), 0);
  Launch node_zero(NodeArgs(0, 2, "127.0.0.1", port, "taken_port"),
                   {"DTRAIN_RDZV_TOKEN=taken-port-token"});
  EXPECT_EQ(node_zero.Wait(absl::Seconds(60)), 1) << node_zero.output();
  ::close(taken);
  EXPECT_THAT(node_zero.output(),
              AllOf(HasSubstr("address already in use"),
                    HasSubstr(absl::StrCat("(port flag --master-port ", port, ")"))));
}

// Node 1 whose MASTER_ADDR is its own loopback (a single-node script reused) finds no store
// there: its error says that address is its own.
TEST(AgentTest, ANodeWhoseMasterIsItsOwnLoopbackIsTold) {
  Launch node_one(
      NodeArgs(1, 2, "localhost", testing::FreeTcpPort(), "own_loopback", {"--rdzv-timeout-s=1"}),
      {"DTRAIN_RDZV_TOKEN=own-loopback-token"});
  EXPECT_EQ(node_one.Wait(absl::Seconds(60)), 1) << node_one.output();
  EXPECT_THAT(node_one.output(), HasSubstr("node 1 cannot reach the rendezvous store of node 0"));
  EXPECT_THAT(node_one.output(),
              HasSubstr("is an address of this host: unless node 0 runs here too (then its "
                        "store is not up), set it to node 0's host name"));
}

// A node that never starts its agent: node 0's rendezvous times out naming it (it said only how
// many agents came).
TEST(AgentTest, ARendezvousTimeoutNamesTheNodesThatNeverCame) {
  Launch node_zero(
      NodeArgs(0, 4, "127.0.0.1", testing::FreeTcpPort(), "never_came", {"--rdzv-timeout-s=2"}),
      {"DTRAIN_RDZV_TOKEN=never-came-token"});
  EXPECT_EQ(node_zero.Wait(absl::Seconds(60)), 1) << node_zero.output();
  EXPECT_THAT(node_zero.output(),
              HasSubstr("only 1 of 4 node agents reached 'agent/attempt-0/arrived' within 2s (no "
                        "agent of nodes 1, 2, 3 joined)"));
}

// Node 1 with another rendezvous token than node 0's is refused by its store: exit 2, the same at
// any restart (it exited 1, which a Kubernetes restart policy retries).
TEST(AgentTest, AnotherTokenThanTheStoresIsAUsageError) {
  const int port = testing::FreeTcpPort();
  const std::vector<std::string> args = {"--nnodes=2",
                                         "--master-addr=127.0.0.1",
                                         absl::StrCat("--master-port=", port),
                                         "--rdzv-timeout-s=30",
                                         Recipe("other_token", 3),
                                         "--set",
                                         "run.out_dir=" + OutDir("other_token")};
  std::vector<std::string> zero = args, one = args;
  zero.insert(zero.begin(), "--node-rank=0");
  one.insert(one.begin(), "--node-rank=1");
  Launch node_zero(zero, {"DTRAIN_RDZV_TOKEN=token-a"});
  Launch node_one(one, {"DTRAIN_RDZV_TOKEN=token-b"});
  EXPECT_EQ(node_one.Wait(absl::Seconds(60)), 2) << node_one.output();
  EXPECT_THAT(node_one.output(),
              HasSubstr("rejected the token: DTRAIN_RDZV_TOKEN differs from the job's"));
  kill(node_zero.process().pid(), SIGTERM);
  node_zero.Wait(absl::Seconds(60));
}

// Two pods of `dtrain launch` (node 0 hosts the store, one worker each); the tests below kill
// one agent after two steps and watch the other.
struct TwoPods {
  static constexpr char kToken[] = "lost-agent-test-token";

  // Starts both pods and waits for the job's second step; with `started` false, neither.
  TwoPods(const std::string& name, int steps, std::vector<std::string> flags = {},
          bool started = true)
      : out(OutDir(name)), port(testing::FreeTcpPort()) {
    args = {Recipe(name, steps), "--set", "run.out_dir=" + out};
    args.insert(args.end(), flags.begin(), flags.end());
    if (!started) return;
    for (int pod = 0; pod < 2; ++pod) pods.push_back(Start(pod));
    EXPECT_TRUE(pods[0]->Pump(absl::Seconds(60), [&] { return StepsLogged(out) >= 2; }))
        << pods[0]->output();
  }
  // A client of node 0's store (its agent must be started), as another agent would connect.
  absl::StatusOr<std::unique_ptr<TcpStoreClient>> Store() const {
    TcpStoreClientOptions options;
    options.connect_timeout = absl::Seconds(60);
    options.token = kToken;
    return TcpStoreClient::Connect("127.0.0.1", port, options);
  }
  // Pod `pod`'s agent, as its first start or after a restart of the pod; `nnodes` and `nproc`
  // as its job spec says them (another pod's may differ), run from `binary`.
  std::unique_ptr<Launch> Start(int pod, int nnodes = 2, int nproc = 1,
                                const std::string& binary = DTRAIN_BINARY) const {
    return std::make_unique<Launch>(
        args,
        std::vector<std::string>{
            absl::StrCat("PET_NNODES=", nnodes), absl::StrCat("PET_NPROC_PER_NODE=", nproc),
            absl::StrCat("PET_NODE_RANK=", pod), "PET_MASTER_ADDR=127.0.0.1",
            absl::StrCat("PET_MASTER_PORT=", port), absl::StrCat("DTRAIN_RDZV_TOKEN=", kToken)},
        std::vector<std::string>(), binary);
  }

  std::string out;
  int port;
  std::vector<std::string> args;
  std::vector<std::unique_ptr<Launch>> pods;
};

void KillAgent(Launch& pod) {
  const pid_t pid = pod.process().pid();
  kill(pid, SIGKILL);
  pod.Wait(absl::Seconds(30));  // reaped: its connections are closed
}

// Node 1's agent dies (its workers with it): node 0 names it as the root cause and ends, rather
// than failing its own workers and waiting for node 1 at the next rendezvous.
TEST(AgentTest, LostAgentIsTheRootCause) {
  TwoPods job("lost", 100000);
  std::vector<std::unique_ptr<Launch>>& pods = job.pods;
  KillAgent(*pods[1]);
  EXPECT_EQ(pods[0]->Wait(absl::Seconds(60)), 1) << pods[0]->output();
  EXPECT_THAT(pods[0]->output(), HasSubstr("Root cause: node 1 (host "));
  EXPECT_THAT(pods[0]->output(), HasSubstr("agent lost (its connection to the rendezvous store "
                                           "closed before it finished"));
}

// Node 1 counts another number of nodes than node 0: it fails at once (exit 2) naming both
// counts, and node 0, seeing its connection close, names node 1's error instead of a crash;
// neither waits out the rendezvous timeout (5 minutes), where they waited for each other.
TEST(AgentTest, AgentsThatCountOtherNodesFailAtOnceNamingBoth) {
  // A batch that splits over 2 ranks and 3 alike: node 1's own checks pass.
  TwoPods job("nnodes", 4, {"--set", "train.batch_size=12"}, /*started=*/false);
  std::unique_ptr<Launch> node_zero = job.Start(0);
  const std::unique_ptr<Launch> node_one = job.Start(1, /*nnodes=*/3, /*nproc=*/1);
  EXPECT_EQ(node_one->Wait(absl::Seconds(60)), 2) << node_one->output();
  EXPECT_THAT(node_one->output(),
              AllOf(HasSubstr("node 1 (host "), HasSubstr("counts 3 nodes, but node 0 (host "),
                    HasSubstr("counts 2: give every `dtrain launch`")));
  EXPECT_EQ(node_zero->Wait(absl::Seconds(60)), 1) << node_zero->output();
  EXPECT_THAT(node_zero->output(), HasSubstr("agent failed: node 1 (host "));
  EXPECT_THAT(node_zero->output(), Not(HasSubstr("started rank")));
}

// Node 1 fails its own check of the world (its 3 workers make a world of 6, which the batch does
// not split over) before joining: node 0 ends the rendezvous at once naming node 1's error
// (exit 2), where it waited out its timeout (5 minutes) in silence.
TEST(AgentTest, ANodeThatFailsBeforeJoiningIsNamedAtOnce) {
  TwoPods job("early", 4, {}, /*started=*/false);
  std::unique_ptr<Launch> node_zero = job.Start(0);
  const std::unique_ptr<Launch> node_one = job.Start(1, /*nnodes=*/2, /*nproc=*/3);
  EXPECT_EQ(node_one->Wait(absl::Seconds(60)), 2) << node_one->output();
  EXPECT_THAT(node_one->output(), HasSubstr("does not split into 6 data-parallel ranks"));
  // As srun ends the step at once (--kill-on-bad-exit): that SIGTERM is no preemption (it was
  // taken for one, exit 143, and a --requeue job came back to fail again).
  kill(node_zero->process().pid(), SIGTERM);
  const absl::Time killed = absl::Now();
  EXPECT_EQ(node_zero->Wait(absl::Seconds(60)), 2) << node_zero->output();
  // Nor does it wait for node 1's agent to leave the store (it never joined) for 30 s.
  EXPECT_LT(absl::Now() - killed, absl::Seconds(20));
  EXPECT_THAT(node_zero->output(), AllOf(HasSubstr("node 1 failed before joining the job: (host "),
                                         HasSubstr("does not split into 6 data-parallel ranks")));
}

// The same failure of node 0, which hosts the store: it serves the store until node 1 has read
// its error, and node 1 ends at once naming it, where it waited out its rendezvous timeout
// (5 minutes) and then said that it could not reach node 0.
TEST(AgentTest, NodeZeroThatFailsBeforeJoiningIsNamedAtOnce) {
  TwoPods job("early_zero", 4, {}, /*started=*/false);
  const std::unique_ptr<Launch> node_zero = job.Start(0, /*nnodes=*/2, /*nproc=*/3);
  std::unique_ptr<Launch> node_one = job.Start(1);
  EXPECT_EQ(node_zero->Wait(absl::Seconds(60)), 2) << node_zero->output();
  EXPECT_THAT(node_zero->output(), HasSubstr("does not split into 6 data-parallel ranks"));
  EXPECT_EQ(node_one->Wait(absl::Seconds(60)), 2) << node_one->output();
  EXPECT_THAT(node_one->output(), AllOf(HasSubstr("node 0 failed before joining the job: (host "),
                                        HasSubstr("does not split into 6 data-parallel ranks")));
}

// Node 0's agent fails after the job started (its dtrain binary was removed, and the first restart
// cannot start its worker): node 1 names node 0's error and ends without the restart it has left,
// where it said that node 0's agent was killed or crashed.
TEST(AgentTest, NodeZeroAgentThatFailsIsNamedByTheOthers) {
  TwoPods job("failed_zero", 100000, {"--max-restarts=2"}, /*started=*/false);
  std::string binary = testing::TempPath("failed_zero_dtrain");
  std::filesystem::remove(binary);
  ASSERT_TRUE(std::filesystem::copy_file(DTRAIN_BINARY, binary));
  binary = std::filesystem::canonical(binary);  // as the agent names itself
  std::unique_ptr<Launch> node_zero = job.Start(0, 2, 1, binary);
  std::unique_ptr<Launch> node_one = job.Start(1);
  ASSERT_TRUE(node_zero->Pump(absl::Seconds(60), [&] { return StepsLogged(job.out) >= 2; }))
      << node_zero->output();
  std::filesystem::remove(binary);
  const std::vector<std::pair<int, pid_t>> workers = node_one->Workers();
  ASSERT_EQ(workers.size(), 1u);
  kill(workers[0].second, SIGKILL);
  EXPECT_EQ(node_zero->Wait(absl::Seconds(60)), 1) << node_zero->output();
  EXPECT_THAT(node_zero->output(),
              HasSubstr("; keeping the rendezvous store up until the other nodes have read it"));
  EXPECT_THAT(node_zero->output(), HasSubstr("cannot run " + binary));
  EXPECT_EQ(node_one->Wait(absl::Seconds(60)), 1) << node_one->output();
  EXPECT_THAT(node_one->output(),
              AllOf(HasSubstr("node 0 (host "), HasSubstr("agent failed: cannot run " + binary),
                    HasSubstr("no restart: node 0's agent hosted the rendezvous store")));
  EXPECT_THAT(node_one->output(), Not(HasSubstr("lost the rendezvous store")));
}

// SIGTERM to node 0's agent stops the job on both nodes, each agent exiting 143: node 1's worker
// may stop (exit 143, after the save every rank agreed on) before its agent reads the stop from
// the store, which is a stop, not a failure of rank 1.
TEST(AgentTest, SigtermToOneNodeStopsBothNodes) {
  TwoPods job("term_two", 100000);
  kill(job.pods[0]->process().pid(), SIGTERM);
  for (const std::unique_ptr<Launch>& pod : job.pods) {
    EXPECT_EQ(pod->Wait(absl::Seconds(60)), kExitStopped) << pod->output();
    EXPECT_THAT(pod->output(), Not(HasSubstr("failed")));
  }
  EXPECT_THAT(job.pods[0]->output(), HasSubstr("stopped by SIGTERM at step"));
}

// As a Slurm step is torn down after one task died: node 1's agent is killed, then node 0's
// gets SIGTERM. That is not a preemption: no checkpoint is asked for, the lost agent is named.
TEST(AgentTest, SigtermAfterALostAgentIsNotAPreemption) {
  TwoPods job("lost_term", 100000);
  std::vector<std::unique_ptr<Launch>>& pods = job.pods;
  KillAgent(*pods[1]);
  kill(pods[0]->process().pid(), SIGTERM);
  EXPECT_EQ(pods[0]->Wait(absl::Seconds(60)), 1) << pods[0]->output();
  EXPECT_THAT(pods[0]->output(), Not(HasSubstr("asking the workers to checkpoint")));
  EXPECT_THAT(pods[0]->output(), HasSubstr("Root cause: node 1 (host "));
}

// With a restart left, node 0 waits for node 1 to have an agent again (a pod restarted by
// Kubernetes), and the job restarts with it and completes.
TEST(AgentTest, LostAgentRejoinsAndTheGroupRestarts) {
  TwoPods job("rejoin", 30, {"--max-restarts=1"});
  KillAgent(*job.pods[1]);
  ASSERT_TRUE(job.pods[0]->Pump(absl::Seconds(60), [&] {
    return absl::StrContains(job.pods[0]->output(), "once node 1 has an agent again");
  })) << job.pods[0]->output();
  std::unique_ptr<Launch> replacement = job.Start(1);
  EXPECT_EQ(job.pods[0]->Wait(absl::Seconds(120)), 0) << job.pods[0]->output();
  EXPECT_EQ(replacement->Wait(absl::Seconds(60)), 0) << replacement->output();
  EXPECT_THAT(replacement->output(), HasSubstr("rejoining the job at restart 1 of 1"));
  EXPECT_THAT(job.pods[0]->output(), HasSubstr("step 30/30"));
  EXPECT_THAT(job.pods[0]->output(), HasSubstr("every worker finished"));
}

// SIGTERM while node 0 waits for the lost node (a Slurm step being torn down): the job ends at
// once, naming the lost agent, instead of waiting out the rendezvous timeout.
TEST(AgentTest, SigtermWhileWaitingForALostNodeEndsTheJob) {
  TwoPods job("rejoin_term", 100000, {"--max-restarts=1"});
  KillAgent(*job.pods[1]);
  ASSERT_TRUE(job.pods[0]->Pump(absl::Seconds(60), [&] {
    return absl::StrContains(job.pods[0]->output(), "once node 1 has an agent again");
  })) << job.pods[0]->output();
  kill(job.pods[0]->process().pid(), SIGTERM);
  EXPECT_EQ(job.pods[0]->Wait(absl::Seconds(60)), 1) << job.pods[0]->output();
  EXPECT_THAT(job.pods[0]->output(), HasSubstr("SIGTERM received while waiting"));
  EXPECT_THAT(job.pods[0]->output(), HasSubstr("Root cause: node 1 (host "));
}

// Node 0's agent (the store) dies: node 1 stops its workers and says so.
TEST(AgentTest, LostStoreStopsTheOtherNodes) {
  TwoPods job("lost_store", 100000);
  std::vector<std::unique_ptr<Launch>>& pods = job.pods;
  const std::vector<std::pair<int, pid_t>> workers = pods[1]->Workers();
  KillAgent(*pods[0]);
  kill(pods[1]->process().pid(), SIGTERM);
  EXPECT_EQ(pods[1]->Wait(absl::Seconds(60)), 1) << pods[1]->output();
  EXPECT_THAT(pods[1]->output(), HasSubstr("node 0's agent was lost"));
  EXPECT_THAT(pods[1]->output(), Not(HasSubstr("asking the workers to checkpoint")));
  for (const auto& [rank, pid] : workers) EXPECT_FALSE(Alive(pid)) << "rank " << rank;
}

TEST(AgentTest, LogDirHoldsOneFilePerRank) {
  const std::string out = OutDir("logs");
  const std::string logs = out + "/logs";
  Launch launch({Recipe("logs", 3), "--nproc-per-node=2", "--log-dir=" + logs, "--set",
                 "run.out_dir=" + out});
  ASSERT_EQ(launch.Wait(absl::Seconds(120)), 0) << launch.output();
  EXPECT_THAT(launch.output(), Not(HasSubstr("[rank 0] ")));
  std::ifstream rank0(logs + "/rank-0.log");
  const std::string text((std::istreambuf_iterator<char>(rank0)), {});
  EXPECT_THAT(text, HasSubstr("step 3/3"));
  // Each attempt starts with its number and date: the lines carry the time of day only.
  EXPECT_THAT(text, ::testing::ContainsRegex("^=== attempt 1 of 1, started "
                                             "20[0-9][0-9]-[0-9][0-9]-[0-9][0-9] "
                                             "[0-9][0-9]:[0-9][0-9]:[0-9][0-9] UTC ===\n"));
  // Rank 1's file holds rank 1's lines only (it logs no steps; rank 0 does).
  ASSERT_TRUE(std::filesystem::exists(logs + "/rank-1.log"));
  std::ifstream rank1(logs + "/rank-1.log");
  const std::string text1((std::istreambuf_iterator<char>(rank1)), {});
  EXPECT_THAT(text1, Not(HasSubstr("step 3/3")));
}

// With --log-dir the workers' errors go to their files: the agent's line for a failed rank says
// its error too, which the console otherwise never showed before the restart (rank 1 hung here,
// and rank 0 failed "exit code 1").
TEST(AgentTest, AFailedRanksLineSaysItsErrorWhenItsLogIsAFile) {
  const std::string out = OutDir("logs_failed");
  Launch launch({Recipe("logs_failed", 100000), "--nproc-per-node=2", "--log-dir=" + out + "/logs",
                 "--max-restarts=1", "--set", "run.out_dir=" + out, "--set",
                 "parallel.timeout_s=3"});
  ASSERT_TRUE(launch.Pump(absl::Seconds(60), [&] { return StepsLogged(out) >= 2; }))
      << launch.output();
  const std::vector<std::pair<int, pid_t>> workers = launch.Workers();
  ASSERT_EQ(workers.size(), 2u);
  kill(workers[1].second, SIGSTOP);
  ASSERT_TRUE(launch.Pump(absl::Seconds(60), [&] {
    return absl::StrContains(launch.output(), "restarting the workers");
  })) << launch.output();
  EXPECT_THAT(launch.output(),
              ::testing::ContainsRegex("rank 0 failed: exit code 1: [^\n]*rank 1"));
  kill(launch.process().pid(), SIGKILL);
}

// A --log-dir where no file can be written is a usage error (exit 2), which no restart mends.
TEST(AgentTest, AnUnwritableLogDirIsAUsageError) {
  const std::string out = OutDir("bad_logs");
  const std::string file = out + "/file";
  std::filesystem::create_directories(out);
  std::ofstream(file) << "x";
  Launch launch({Recipe("bad_logs", 3), "--nproc-per-node=1", "--log-dir=" + file + "/logs",
                 "--set", "run.out_dir=" + out});
  EXPECT_EQ(launch.Wait(absl::Seconds(120)), 2) << launch.output();
  EXPECT_THAT(launch.output(), HasSubstr("point --log-dir at a writable folder"));
  // Found before the rendezvous, where it failed the first worker's start.
  EXPECT_THAT(launch.output(), Not(HasSubstr("rendezvous store listening")));
  // A folder that cannot be made (ENOENT under /proc) is the flag's to fix too (it exited 1).
  Launch proc({Recipe("bad_logs", 3), "--nproc-per-node=1", "--log-dir=/proc/no-such/logs", "--set",
               "run.out_dir=" + out});
  EXPECT_EQ(proc.Wait(absl::Seconds(120)), 2) << proc.output();
  EXPECT_THAT(proc.output(), HasSubstr("point --log-dir at a writable folder"));
}

// Rank 1 of a two-worker launch gets `signal` mid-training: the launch exits 1 with rank 1 as the
// root cause, its report saying each of `causes`, and leaves no worker alive.
// A launch of `nproc` workers on one node, with `sets`; once 2 steps are logged, rank `rank` gets
// `signal`. The launch exits 1 naming that rank as the root cause, with each of `causes`, and
// leaves no worker behind.
void ExpectSignalledRankIsTheRootCause(const std::string& name, int signal, int nproc, int rank,
                                       const std::vector<std::string>& sets,
                                       const std::vector<std::string>& causes) {
  const std::string out = OutDir(name);
  std::vector<std::string> args = {Recipe(name, 100000), absl::StrCat("--nproc-per-node=", nproc),
                                   "--set", "run.out_dir=" + out};
  for (const std::string& set : sets) args.insert(args.end(), {"--set", set});
  Launch launch(args);
  ASSERT_TRUE(launch.Pump(absl::Seconds(60), [&] { return StepsLogged(out) >= 2; }))
      << launch.output();
  const auto workers = launch.Workers();
  ASSERT_EQ(workers.size(), static_cast<size_t>(nproc)) << launch.output();
  kill(workers[rank].second, signal);
  EXPECT_EQ(launch.Wait(absl::Seconds(60)), 1) << launch.output();
  EXPECT_THAT(launch.output(), HasSubstr(absl::StrCat("Root cause: rank ", rank, " on node 0")));
  for (const std::string& cause : causes)
    EXPECT_THAT(launch.output(), HasSubstr(cause)) << launch.output();
  for (const auto& [r, pid] : workers) EXPECT_FALSE(Alive(pid)) << "rank " << r;
}

void ExpectSignalledRank1IsTheRootCause(const std::string& name, int signal,
                                        const std::vector<std::string>& sets,
                                        const std::vector<std::string>& causes) {
  ExpectSignalledRankIsTheRootCause(name, signal, 2, 1, sets, causes);
}

TEST(AgentTest, KilledWorkerWithoutRestartsEndsWithTheRootCause) {
  ExpectSignalledRank1IsTheRootCause("fail", SIGKILL, {}, {"signal 9 (SIGKILL)"});
}

TEST(AgentTest, KilledWorkerRestartsTheGroup) {
  const std::string out = OutDir("restart");
  Launch launch({Recipe("restart", 40), "--nproc-per-node=2", "--max-restarts=1", "--set",
                 "run.out_dir=" + out});
  ASSERT_TRUE(launch.Pump(absl::Seconds(60), [&] { return StepsLogged(out) >= 2; }))
      << launch.output();
  const auto first = launch.Workers();
  ASSERT_EQ(first.size(), 2u);
  kill(first[0].second, SIGKILL);
  EXPECT_EQ(launch.Wait(absl::Seconds(180)), 0) << launch.output();
  EXPECT_THAT(launch.output(),
              HasSubstr("restarting the workers (restart 1 of 1) from step 1: no checkpoint "
                        "saved in " +
                        out + "/agent/checkpoints"));
  EXPECT_THAT(launch.output(), HasSubstr("every worker finished"));
  EXPECT_THAT(launch.output(), HasSubstr("step 40/40"));
  // Without checkpoint.interval the restart trains from step 1 again: said at the start and at
  // the restart.
  EXPECT_THAT(launch.output(), HasSubstr("--max-restarts 1 restarts failed workers from the newest "
                                         "checkpoint, and checkpoint.interval is 0"));
  EXPECT_THAT(launch.output(),
              HasSubstr("restart 1: no checkpoint in " + out +
                        "/agent/checkpoints, so training starts over from step 1"));
}

// A checkpoint folder that holds only a save that did not complete: the restart's workers refuse
// to start over beside it (exit 2, no further restart), and the agent's restart line says so
// rather than promising step 1.
TEST(AgentTest, ARestartOverIncompleteCheckpointsSaysTheWorkersRefuse) {
  const std::string out = OutDir("restart_incomplete");
  Launch launch({Recipe("restart_incomplete", 100000), "--nproc-per-node=2", "--max-restarts=2",
                 "--set", "run.out_dir=" + out});
  ASSERT_TRUE(launch.Pump(absl::Seconds(60), [&] { return StepsLogged(out) >= 2; }))
      << launch.output();
  std::filesystem::create_directories(out + "/agent/checkpoints/step-7");  // no manifest
  const auto workers = launch.Workers();
  ASSERT_EQ(workers.size(), 2u);
  kill(workers[1].second, SIGKILL);
  EXPECT_EQ(launch.Wait(absl::Seconds(120)), 2) << launch.output();
  EXPECT_THAT(
      launch.output(),
      HasSubstr("restarting the workers (restart 1 of 2): none of the 1 checkpoint(s) in " + out +
                "/agent/checkpoints completed its save, and the workers refuse to start "
                "over beside them"));
  EXPECT_THAT(launch.output(),
              HasSubstr("none of the 1 checkpoint(s) in " + out + "/agent/checkpoints loads"));
  EXPECT_THAT(launch.output(), Not(HasSubstr("restart 2 of 2")));
}

// A restart resumes what the earlier attempt saved even under checkpoint.resume: never, which
// applies to the first attempt: each restart started over, setting the run's own checkpoints
// aside (and piling them up on disk).
TEST(AgentTest, ARestartResumesTheFirstAttemptsCheckpointsUnderResumeNever) {
  const std::string out = OutDir("restart_never");
  Launch launch({Recipe("restart_never", 60), "--nproc-per-node=2", "--max-restarts=1", "--set",
                 "run.out_dir=" + out, "--set", "checkpoint.resume=never", "--set",
                 "checkpoint.interval=4"});
  ASSERT_TRUE(launch.Pump(absl::Seconds(60), [&] {
    return std::filesystem::exists(out + "/agent/checkpoints/latest") && StepsLogged(out) >= 6;
  })) << launch.output();
  const auto first = launch.Workers();
  ASSERT_EQ(first.size(), 2u);
  kill(first[1].second, SIGKILL);
  EXPECT_EQ(launch.Wait(absl::Seconds(180)), 0) << launch.output();
  EXPECT_THAT(launch.output(), HasSubstr("restart 1: resuming what the earlier attempts saved in " +
                                         out + "/agent/checkpoints (checkpoint.resume: never"));
  // The agent's own line names it, for a console without the workers' lines (--log-dir).
  EXPECT_THAT(launch.output(), HasSubstr("restarting the workers (restart 1 of 1) from " + out +
                                         "/agent/checkpoints/step-"));
  EXPECT_THAT(launch.output(), HasSubstr("resumed from " + out + "/agent/checkpoints/step-"));
  for (const auto& entry : std::filesystem::directory_iterator(out + "/agent/checkpoints")) {
    EXPECT_EQ(entry.path().filename().string().find("replaced"), std::string::npos) << entry.path();
  }
}

// pp 2 x dp 2 (world ranks 0 1 stage 0, 2 3 stage 1), checkpointing every 4 steps, with
// parallel.timeout_s `timeout_s`: rank 3, the last stage's second replica, gets `signal` once a
// checkpoint exists (SIGSTOP: a hung stage, which its peers time out on). The group restarts from
// the newest checkpoint and ends where an uninterrupted launch ends, every loss bit for bit (the
// same code on the same values in the same order; metrics.jsonl drops the lines of the steps
// redone).
void ExpectPipelineRestartEndsBitIdentically(const std::string& name, int signal, int timeout_s) {
  const std::string straight = OutDir(name + "_straight");
  std::vector<std::string> args = {Recipe(name, 30), "--nproc-per-node=4", "--max-restarts=1",
                                   "--set", "run.out_dir=" + straight};
  const std::vector<std::string> sets = {"parallel.pp=2", "checkpoint.interval=4",
                                         absl::StrCat("parallel.timeout_s=", timeout_s)};
  for (const std::string& set : sets) args.insert(args.end(), {"--set", set});
  Launch uninterrupted(args);
  ASSERT_EQ(uninterrupted.Wait(absl::Seconds(180)), 0) << uninterrupted.output();

  const std::string out = OutDir(name);
  args[4] = "run.out_dir=" + out;
  Launch launch(args);
  ASSERT_TRUE(launch.Pump(absl::Seconds(60), [&] {
    return std::filesystem::exists(out + "/agent/checkpoints/latest") && StepsLogged(out) >= 6;
  })) << launch.output();
  const auto first = launch.Workers();
  ASSERT_EQ(first.size(), 4u);
  kill(first[3].second, signal);
  EXPECT_EQ(launch.Wait(absl::Seconds(180)), 0) << launch.output();
  EXPECT_THAT(launch.output(), HasSubstr("restarting the workers (restart 1 of 1)"));
  EXPECT_THAT(launch.output(), HasSubstr("resumed from " + out + "/agent/checkpoints/step-"));

  const std::vector<double> reference = Losses(straight), losses = Losses(out);
  ASSERT_EQ(reference.size(), 30u);
  ASSERT_EQ(losses.size(), reference.size());
  for (size_t i = 0; i < losses.size(); ++i) EXPECT_EQ(losses[i], reference[i]) << "step " << i + 1;
}

TEST(AgentTest, KilledPipelineStageRestartsAndEndsBitIdentically) {
  ExpectPipelineRestartEndsBitIdentically("pp_killed", SIGKILL, /*timeout_s=*/20);
}

TEST(AgentTest, HungPipelineStageRestartsAndEndsBitIdentically) {
  ExpectPipelineRestartEndsBitIdentically("pp_hung", SIGSTOP, /*timeout_s=*/5);
}

TEST(AgentTest, SigkilledAgentLeavesNoWorkerBehind) {
  const std::string out = OutDir("orphans");
  Launch launch({Recipe("orphans", 100000), "--nproc-per-node=2", "--set", "run.out_dir=" + out});
  ASSERT_TRUE(launch.Pump(absl::Seconds(60), [&] { return launch.Workers().size() == 2; }))
      << launch.output();
  const auto workers = launch.Workers();
  kill(launch.process().pid(), SIGKILL);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  for (const auto& [rank, pid] : workers) {
    while (Alive(pid) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
    EXPECT_FALSE(Alive(pid)) << "rank " << rank << " (pid " << pid << ") outlived its agent";
  }
}

TEST(AgentTest, SigtermCheckpointsAndStopsCleanly) {
  const std::string out = OutDir("term");
  Launch launch({Recipe("term", 100000), "--nproc-per-node=2", "--set", "run.out_dir=" + out});
  ASSERT_TRUE(launch.Pump(absl::Seconds(60), [&] { return StepsLogged(out) >= 2; }))
      << launch.output();
  // SIGUSR1 is forwarded without teardown: a checkpoint, and training goes on.
  kill(launch.process().pid(), SIGUSR1);
  ASSERT_TRUE(launch.Pump(absl::Seconds(60), [&] {
    return std::filesystem::exists(out + "/agent/checkpoints/latest");
  })) << launch.output();
  const int steps_at_usr1 = StepsLogged(out);
  ASSERT_TRUE(launch.Pump(absl::Seconds(60), [&] { return StepsLogged(out) > steps_at_usr1 + 1; }))
      << launch.output();
  EXPECT_THAT(launch.output(), HasSubstr("forwarding USR1 to the workers"));

  // Stopped is not finished: the agent exits 143 so that a scheduler runs the job again.
  kill(launch.process().pid(), SIGTERM);
  EXPECT_EQ(launch.Wait(absl::Seconds(60)), kExitStopped) << launch.output();
  EXPECT_THAT(launch.output(), HasSubstr("stopped by SIGTERM at step"));
  EXPECT_THAT(launch.output(), HasSubstr("workers stopped cleanly"));
  std::ifstream latest(out + "/agent/checkpoints/latest");
  std::string step_dir;
  latest >> step_dir;
  EXPECT_EQ(step_dir, absl::StrCat("step-", StepsLogged(out))) << launch.output();
}

// A worker that does not stop within --stop-grace-s (hung: SIGSTOP) is killed and named, and the
// stop exits 1, not all workers having stopped cleanly (with --requeue the job is requeued all the
// same, to resume from the newest complete checkpoint: it was not).
TEST(AgentTest, AWorkerThatDoesNotStopIsNamed) {
  const std::string out = OutDir("term_hung");
  Launch launch({Recipe("term_hung", 100000), "--nproc-per-node=2", "--stop-grace-s=2", "--set",
                 "run.out_dir=" + out});
  ASSERT_TRUE(launch.Pump(absl::Seconds(60), [&] { return StepsLogged(out) >= 2; }))
      << launch.output();
  const std::vector<std::pair<int, pid_t>> workers = launch.Workers();
  ASSERT_EQ(workers.size(), 2u);
  kill(workers[1].second, SIGSTOP);
  kill(launch.process().pid(), SIGTERM);
  EXPECT_EQ(launch.Wait(absl::Seconds(60)), 1) << launch.output();
  EXPECT_THAT(launch.output(),
              AllOf(HasSubstr("rank 1 did not stop within 2s: SIGKILL"),
                    HasSubstr("workers stopped, not all cleanly (see the worker logs)")));
}

// SIGHUP (a closed terminal or ssh session) stops the job as SIGTERM does, with a checkpoint; it
// ended the agent at once (exit 129), and its workers with it, losing the run.
TEST(AgentTest, SighupCheckpointsAndStopsAsSigtermDoes) {
  const std::string out = OutDir("hup");
  Launch launch({Recipe("hup", 100000), "--nproc-per-node=2", "--set", "run.out_dir=" + out});
  ASSERT_TRUE(launch.Pump(absl::Seconds(60), [&] { return StepsLogged(out) >= 2; }))
      << launch.output();
  kill(launch.process().pid(), SIGHUP);
  EXPECT_EQ(launch.Wait(absl::Seconds(60)), kExitStopped) << launch.output();
  EXPECT_THAT(launch.output(), HasSubstr("workers stopped cleanly"));
  EXPECT_TRUE(std::filesystem::exists(out + "/agent/checkpoints/latest")) << launch.output();
}

// SIGTERM as soon as the workers are started: a worker still starting is ended by it (it takes
// SIGTERM itself only once it is set up) or stops before its first step; either way the stop is
// clean, 143, as a preemption is at any other time.
TEST(AgentTest, ATermWhileTheWorkersStartIsACleanStop) {
  const std::string out = OutDir("early_term");
  Launch launch(
      {Recipe("early_term", 100000), "--nproc-per-node=2", "--set", "run.out_dir=" + out});
  ASSERT_TRUE(launch.Pump(absl::Seconds(60), [&] {
    return absl::StrContains(launch.output(), "started ranks 0-1");
  })) << launch.output();
  kill(launch.process().pid(), SIGTERM);
  EXPECT_EQ(launch.Wait(absl::Seconds(60)), kExitStopped) << launch.output();
  EXPECT_THAT(launch.output(), HasSubstr("workers stopped cleanly"));
}

// Under nohup SIGHUP stays ignored: the user asked the run to outlive the terminal.
TEST(AgentTest, UnderNohupSighupIsIgnored) {
  const std::string out = OutDir("nohup");
  Launch launch({Recipe("nohup", 100000), "--nproc-per-node=2", "--set", "run.out_dir=" + out}, {},
                {"/usr/bin/nohup"});
  ASSERT_TRUE(launch.Pump(absl::Seconds(60), [&] { return StepsLogged(out) >= 2; }))
      << launch.output();
  kill(launch.process().pid(), SIGHUP);
  const int steps_at_hup = StepsLogged(out);
  ASSERT_TRUE(launch.Pump(absl::Seconds(60), [&] { return StepsLogged(out) > steps_at_hup + 2; }))
      << launch.output();
  EXPECT_THAT(launch.output(), Not(HasSubstr("SIGHUP")));
  kill(launch.process().pid(), SIGTERM);
  EXPECT_EQ(launch.Wait(absl::Seconds(60)), kExitStopped) << launch.output();
}

// A node told to stop while the others gather takes its arrival back and leaves as a lost agent:
// the others must not start without it. Node 1 of 3 is stopped after it arrived, and node 2
// comes after: node 0 fails naming node 1 and no worker starts, where the barrier opened with
// node 1's stale arrival and the ranks waited for node 1's until their timeout.
TEST(AgentTest, ANodeStoppedWhileTheOthersGatherIsLostNotAwaited) {
  const int port = testing::FreeTcpPort();
  const auto node = [&](int rank) {
    return std::make_unique<Launch>(
        std::vector<std::string>{Recipe("gather_stop", 3), "--set", "train.batch_size=6",
                                 "--nnodes=3", absl::StrCat("--node-rank=", rank),
                                 "--master-addr=127.0.0.1", absl::StrCat("--master-port=", port),
                                 "--rdzv-timeout-s=30"},
        std::vector<std::string>{"DTRAIN_RDZV_TOKEN=gather-stop-token"});
  };
  std::unique_ptr<Launch> zero = node(0);
  ASSERT_TRUE(zero->Pump(absl::Seconds(30), [&] {
    return absl::StrContains(zero->output(), "rendezvous store listening");
  })) << zero->output();
  std::unique_ptr<Launch> one = node(1);
  ASSERT_TRUE(one->Pump(absl::Seconds(30), [&] {
    return absl::StrContains(one->output(), "node 1 of 3");
  })) << one->output();
  absl::SleepFor(absl::Seconds(1));  // connected and arrived: a store call after the log line
  kill(one->process().pid(), SIGTERM);
  EXPECT_EQ(one->Wait(absl::Seconds(30)), kExitStopped) << one->output();
  std::unique_ptr<Launch> two = node(2);
  EXPECT_EQ(zero->Wait(absl::Seconds(60)), 1) << zero->output();
  EXPECT_THAT(zero->output(), HasSubstr("node 1 (host "));
  EXPECT_THAT(zero->output(), Not(HasSubstr("started rank")));
  EXPECT_NE(two->Wait(absl::Seconds(60)), 0) << two->output();
  EXPECT_THAT(two->output(), Not(HasSubstr("started rank")));
}

// Told to stop before the other nodes arrive (a preemption, Ctrl-C), an agent stops at once with
// 143, on node 0 (the store's) and on a node still waiting for node 0's store; both waited out
// the rendezvous timeout, deaf to the signal.
TEST(AgentTest, AStopWhileWaitingForTheOtherNodesEndsAtOnce) {
  const int port = testing::FreeTcpPort();
  const std::vector<std::string> args = {
      Recipe("wait_stop", 3), "--nnodes=2", "--master-addr=127.0.0.1",
      absl::StrCat("--master-port=", port), "--rdzv-timeout-s=120"};
  for (const int node : {0, 1}) {
    SCOPED_TRACE(absl::StrCat("node ", node));
    std::vector<std::string> node_args = args;
    node_args.push_back(absl::StrCat("--node-rank=", node));
    Launch launch(node_args, {"DTRAIN_RDZV_TOKEN=wait-stop-token"});
    ASSERT_TRUE(launch.Pump(absl::Seconds(30), [&] {
      return absl::StrContains(launch.output(), absl::StrCat("node ", node, " of 2"));
    })) << launch.output();
    kill(launch.process().pid(), node == 0 ? SIGTERM : SIGINT);
    const absl::Time start = absl::Now();
    EXPECT_EQ(launch.Wait(absl::Seconds(60)), kExitStopped) << launch.output();
    EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << launch.output();
    EXPECT_THAT(launch.output(), HasSubstr(node == 0 ? "SIGTERM received: stopped while waiting "
                                                       "at 'agent/attempt-0/arrived'"
                                                     : "SIGINT received: stopped while waiting "
                                                       "for the rendezvous store"));
    EXPECT_THAT(launch.output(), HasSubstr("no worker started"));
  }
}

// A reader of the agent's output that goes away (`| head`, a dead log shipper) costs the output,
// not the job: the agent died of SIGPIPE at its next line, and its workers with it.
TEST(AgentTest, AClosedOutputPipeDoesNotEndTheJob) {
  const std::string out = OutDir("pipe");
  const int status =
      std::system(absl::StrCat("bash -c '", DTRAIN_BINARY, " launch --nproc-per-node=2 ",
                               Recipe("pipe", 20), " --set run.out_dir=", out,
                               " --set logging.every=1 2>&1 | head -c 1 > /dev/null; ",
                               "exit ${PIPESTATUS[0]}'")
                      .c_str());
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(Losses(out).size(), 20u);
}

// WebDataset shards of a few small documents (`dtrain data pack`); returns their brace pattern,
// DIR/shard-{000000..00000K}.tar, with at least two shards.
std::string PackShards(const std::string& dir) {
  std::string inputs;
  for (int document = 0; document < 8; ++document) {
    std::string text;
    for (int line = 0; line < 100; ++line) {
      absl::StrAppend(&text, "Document ", document, ": jugs.\n");
    }
    absl::StrAppend(&inputs, " ",
                    testing::WriteTempFile(absl::StrCat("agent_doc", document, ".txt"), text));
  }
  const testing::Outcome pack =
      testing::RunDtrain(absl::StrCat("data pack", inputs, " --out ", dir, " --shard-size 8KB"));
  EXPECT_EQ(pack.exit_code, 0) << pack.stderr_text;
  const size_t at = pack.stdout_text.find(dir + "/shard-{");
  if (at == std::string::npos) return "";
  return pack.stdout_text.substr(at, pack.stdout_text.find(".tar", at) + 4 - at);
}

// A shard only rank 1 reads is cut short: rank 1 fails at its first batch and must not wait for
// its peers (what rank 0 then reports is checked without an agent, in
// train_multi_process_test.cc: here the agent may end rank 0 first). The default timeout (300 s)
// stays: the 30 s cap only allows for start-up on a loaded machine.
TEST(AgentTest, OneRanksErrorEndsTheJobAtOnceNamingIt) {
  const std::string out = OutDir("missing_shard");
  const std::string shards = PackShards(out + "/shards");
  ASSERT_FALSE(shards.empty());
  // Two streams, unshuffled: stream 1, which only rank 1 reads, starts with shard 1. (A missing
  // shard is refused at start, by every rank.)
  const std::string missing = out + "/shards/shard-000001.tar";
  std::filesystem::resize_file(missing, 700);
  const absl::Time start = absl::Now();
  Launch launch({Recipe("missing_shard", 100000), "--nproc-per-node=2", "--set",
                 "run.out_dir=" + out, "--set", "parallel.timeout_s=300", "--set",
                 "data.format=webdataset", "--set", "data.shards=" + shards, "--set",
                 "data.train=[]", "--set", "data.streams=2", "--set", "data.shard_shuffle=false"});
  EXPECT_EQ(launch.Wait(absl::Seconds(30)), 1) << launch.output();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  EXPECT_THAT(launch.output(), HasSubstr("Root cause: rank 1 on node 0"));
  EXPECT_THAT(launch.output(), HasSubstr("shard " + missing + ", byte "));
}

// Node 0's agent in this process: of a job of `num_nodes` (the others are FakeAgents of the
// test; port 0: a single node), running `worker_argv` for 2 ranks, without restarts.
struct NodeZero {
  NodeZero(const std::vector<std::string>& worker_argv, int num_nodes = 1, int port = 0) {
    node.node_rank = 0;
    node.num_nodes = num_nodes;
    node.master_addr = "127.0.0.1";
    node.master_port = port;
    options.worker_argv = worker_argv;
    options.nproc_per_node = 2;
    options.environment = Environment();
  }
  // Runs it to the end; returns what it wrote to stderr (its log and the workers' stderr lines).
  std::string Run(absl::StatusOr<int>* result) const {
    ::testing::internal::CaptureStderr();
    *result = RunAgent(node, options);
    return ::testing::internal::GetCapturedStderr();
  }
  // Runs it to the end while `beside` runs on a thread (another node, a signal sender); its exit
  // code goes to `exit_code` (-1 when RunAgent failed, which fails the test).
  std::string RunBeside(const std::function<void()>& beside, int* exit_code) const {
    std::thread thread(beside);
    absl::StatusOr<int> result;
    const std::string output = Run(&result);
    thread.join();
    EXPECT_TRUE(result.ok()) << result.status() << "\n" << output;
    *exit_code = result.value_or(-1);
    return output;
  }

  WorldEnvironment node;
  AgentOptions options;
};

std::string RunAgentCapturingStderr(const std::vector<std::string>& worker_argv, int* exit_code) {
  absl::StatusOr<int> code;
  const std::string text = NodeZero(worker_argv).Run(&code);
  EXPECT_TRUE(code.ok()) << code.status();
  *exit_code = code.value_or(-1);
  return text;
}

// Another node's agent as node 0's store sees it (the keys Agent::Connect and Agent::Barrier
// write), driven step by step by the test.
class FakeAgent {
 public:
  FakeAgent(int port, int node) : node_(node) {
    TcpStoreClientOptions options;
    options.connect_timeout = absl::Seconds(60);
    absl::StatusOr<std::unique_ptr<TcpStoreClient>> client =
        TcpStoreClient::Connect("127.0.0.1", port, options);
    EXPECT_TRUE(client.ok()) << client.status();
    if (!client.ok()) return;
    store_ = *std::move(client);
    EXPECT_EQ(store_->Add(absl::StrCat("agent/incarnation/node-", node), 1).value_or(0), 1);
    EXPECT_TRUE(store_->Set(absl::StrCat("agent/host/node-", node), "fake-host").ok());
    EXPECT_TRUE(store_->AddOnClose(absl::StrCat("agent/closed/node-", node, "/1"), 1).ok());
    EXPECT_TRUE(store_->AddOnClose("agent/closed", 1).ok());
  }
  bool connected() const { return store_ != nullptr; }
  TcpStoreClient& store() { return *store_; }
  // Arrives at barrier `name` of `attempt`, without waiting for the others.
  void Arrive(int attempt, const std::string& name, int num_nodes) {
    const std::string counter = absl::StrCat("agent/attempt-", attempt, "/", name);
    if (store_->Add(counter, 1).value_or(0) == num_nodes) {
      EXPECT_TRUE(store_->Set(counter + "/open", "1").ok());
    }
  }
  // Waits until node 0 wrote `key` (what it does right before a barrier).
  void AwaitKey(const std::string& key) {
    EXPECT_TRUE(store_->Get(key, absl::Seconds(60)).ok()) << key;
  }
  // Ends as an agent that finished (its close is settled), or as a lost one.
  void Finish() {
    EXPECT_TRUE(store_->Set(absl::StrCat("agent/exited/node-", node_, "/1"), "1").ok());
    EXPECT_TRUE(store_->Add("agent/settled", 1).ok());
    store_.reset();
  }
  void Lose() { store_.reset(); }

 private:
  int node_;
  std::unique_ptr<TcpStoreClient> store_;
};

// Node 1 starts 1 worker where node 0 starts 2: both would compute ranks from their own count
// (two rank 1s, or worlds of 4 and 2), which failed with a store error or timed out; node 0
// stops at the rendezvous naming both counts.
TEST(AgentTest, NodesWithOtherWorkerCountsStopAtTheRendezvous) {
  const int port = testing::FreeTcpPort();
  NodeZero agent({"/bin/sh", "-c", "sleep 30"}, 2, port);
  absl::StatusOr<int> result;
  std::thread node_one([port] {
    FakeAgent fake(port, 1);
    if (!fake.connected()) return;
    EXPECT_TRUE(fake.store().Set("agent/nproc/node-1", "1").ok());
    fake.Arrive(0, "arrived", 2);
  });
  const std::string output = agent.Run(&result);
  node_one.join();
  ASSERT_FALSE(result.ok()) << output;
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("node 1 (host fake-host) starts 1 workers and node 0 (host "));
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("the same --nproc-per-node"));
  EXPECT_EQ(ExitCodeOf(result.status()), kExitUsage);  // no restart starts other counts
  EXPECT_THAT(output, Not(HasSubstr("started rank")));
}

// Node 1 was given another --set: its rank differs from rank 0's recipe, and both ranks fail at
// once. Rank 0 may well end first, yet the root cause is rank 1, which rank 0's error blames.
// A usage error (exit 2): the restarts are not spent on it.
TEST(AgentTest, ARankWithAnotherRecipeIsTheRootCause) {
  const std::string recipe = Recipe("differs", 4);
  const std::string out = OutDir("differs");
  const int port = testing::FreeTcpPort();
  std::vector<std::unique_ptr<Launch>> pods;
  for (int pod = 0; pod < 2; ++pod) {
    std::vector<std::string> args = {recipe, "--set", "run.out_dir=" + out, "--max-restarts=2"};
    if (pod == 1) args.insert(args.end(), {"--set", "model.n_layer=3"});
    pods.push_back(std::make_unique<Launch>(
        args, std::vector<std::string>{
                  "PET_NNODES=2", "PET_NPROC_PER_NODE=1", absl::StrCat("PET_NODE_RANK=", pod),
                  "PET_MASTER_ADDR=127.0.0.1", absl::StrCat("PET_MASTER_PORT=", port),
                  "DTRAIN_RDZV_TOKEN=differs-test-token"}));
  }
  for (int pod = 1; pod >= 0; --pod) EXPECT_EQ(pods[pod]->Wait(absl::Seconds(120)), 2);
  EXPECT_THAT(pods[0]->output(), HasSubstr("Root cause: rank 1 on node 1"));
  EXPECT_THAT(pods[0]->output(),
              HasSubstr("`model.n_layer: 3` there, `model.n_layer: 2` on rank 0"));
  EXPECT_THAT(pods[0]->output(), Not(HasSubstr("restarting the workers")));
}

// Rank 1 exits 0 at once, before the job is done; rank 0 would wait for it in rendezvous and
// time out. The early exit is the root cause, not rank 0's timeout.
TEST(AgentTest, AnEarlyExitZeroIsTheRootCause) {
  const std::string script = absl::StrCat(
      "if [ \"$RANK\" = 1 ]; then exit 0; fi; exec ", DTRAIN_BINARY, " train ", Recipe("early", 3),
      " --set run.out_dir=", OutDir("early"), " --set parallel.timeout_s=3");
  int exit_code = -1;
  const std::string output = RunAgentCapturingStderr({"/bin/sh", "-c", script}, &exit_code);
  EXPECT_EQ(exit_code, 1) << output;
  EXPECT_THAT(output, HasSubstr("Root cause: rank 1 on node 0"));
  EXPECT_THAT(output, HasSubstr("exit code 0 before the job finished"));
}

// A worker's stderr is any bytes: a tail that is not UTF-8 still reaches the root cause (it aborted
// the agent while it published the failures).
TEST(AgentTest, StderrThatIsNotUtf8StillGivesTheRootCause) {
  int exit_code = -1;
  const std::string output = RunAgentCapturingStderr(
      {"/bin/sh", "-c", "printf 'bad byte \\377 here\\n' >&2; exit 7"}, &exit_code);
  EXPECT_EQ(exit_code, 1) << output;
  EXPECT_THAT(output, HasSubstr("Root cause: rank "));
  EXPECT_THAT(output, HasSubstr("exit code 7"));
  EXPECT_THAT(output, HasSubstr("bad byte"));
}

// Rank 1 is stopped (SIGSTOP) mid-training: rank 0's all-reduce times out naming rank 1 as the
// rank that never started it, the agent then kills rank 1, and the headline names rank 1. The
// flight recorder's comparison, from rank 0's dump and rank 1's missing one, says the same.
TEST(AgentTest, AHungRankIsTheRootCause) {
  ExpectSignalledRank1IsTheRootCause(
      "hung", SIGSTOP, {"parallel.timeout_s=3"},
      {"hung", "Flight recorder: rank 1 never entered ", "which rank 0 entered and wait in",
       "/agent/flight_recorder/rank-0.jsonl, rank 1 (no dump"});
}

// The same at tp 2, where rank 0 mostly waits in the model's tensor-parallel all-reduces: the
// error the trainer reports from them must still blame rank 1.
TEST(AgentTest, AHungTensorParallelRankIsTheRootCause) {
  ExpectSignalledRank1IsTheRootCause("hung_tp", SIGSTOP, {"parallel.timeout_s=3", "parallel.tp=2"},
                                     {"hung"});
}

// The same at pp 2: rank 0, stage 0, waits on stage 1 in the schedule's receives; the headline
// and rank 0's error say which stage the hung rank is.
TEST(AgentTest, AHungPipelineStageIsTheRootCause) {
  ExpectSignalledRank1IsTheRootCause(
      "hung_pp", SIGSTOP, {"parallel.timeout_s=3", "parallel.pp=2"},
      {"hung", ", pipeline stage 1 of 2), hung:", "(rank 1: pipeline stage 1 of 2)"});
}

// At pp 2 x tp 2 the first error (rank 0's, stage 0) blames rank 2 of stage 1, which only waits
// in a tp all-reduce for the hung rank 3 and is stopped by the agent before its own timeout can
// blame rank 3: the flight recorder's earliest collective that a rank never entered names rank 3.
TEST(AgentTest, AHungRankBehindAnotherGroupIsTheRootCause) {
  ExpectSignalledRankIsTheRootCause("hung_pp_tp", SIGSTOP, 4, 3,
                                    {"parallel.timeout_s=3", "parallel.pp=2", "parallel.tp=2"},
                                    {"hung", ", pipeline stage 1 of 2, tp rank 1"});
}

// Node 1's agent is lost while node 0 waits for it to stop its workers (a vanished host: the
// workers' peers time out before the store notices, so the loss shows up only in that barrier).
// Node 0 names it as the root cause and exits 1, rather than returning the barrier's error.
TEST(AgentTest, AgentLostInTheStoppedBarrierIsTheRootCause) {
  const int port = testing::FreeTcpPort();
  NodeZero agent({"/bin/sh", "-c", "exit 7"}, 2, port);
  agent.options.nproc_per_node = 1;
  int exit_code = -1;
  const std::string output = agent.RunBeside(
      [port] {
        FakeAgent fake(port, 1);
        if (!fake.connected()) return;
        fake.Arrive(0, "arrived", 2);
        fake.AwaitKey("agent/attempt-0/failures/node-0");
        fake.Lose();
      },
      &exit_code);
  EXPECT_EQ(exit_code, 1) << output;
  EXPECT_THAT(output, HasSubstr("Root cause: node 1 (host fake-host): agent lost"));
}

// The same between attempts: node 1's agent is lost after the first attempt failed, while node 0
// waits at the second attempt's rendezvous; the restart is used up, so the lost agent is named.
TEST(AgentTest, AgentLostBeforeARestartIsTheRootCause) {
  const int port = testing::FreeTcpPort();
  NodeZero agent({"/bin/sh", "-c", "exit 7"}, 2, port);
  agent.options.nproc_per_node = 1;
  agent.options.max_restarts = 1;
  int exit_code = -1;
  const std::string output = agent.RunBeside(
      [port] {
        FakeAgent fake(port, 1);
        if (!fake.connected()) return;
        fake.Arrive(0, "arrived", 2);
        fake.AwaitKey("agent/attempt-0/failures/node-0");
        EXPECT_TRUE(fake.store().Set("agent/attempt-0/failures/node-1", "[]").ok());
        fake.Arrive(0, "stopped", 2);
        fake.AwaitKey("agent/attempt-1/arrived");
        fake.Lose();
      },
      &exit_code);
  EXPECT_EQ(exit_code, 1) << output;
  EXPECT_THAT(output, HasSubstr("the job failed (1 restarts used of 1). Root cause: node 1 (host "
                                "fake-host): agent lost"));
}

// Runs `agent`, node 0 of 1 + failures.size() nodes, beside fake agents for the others, which it
// must be set up for (`port`, one worker a node). Fake node n runs `before(n, its store)`,
// arrives, waits for node 0's failures, publishes failures[n - 1] as its own, stops and
// finishes. Returns node 0's output; its result goes to `result`.
std::string RunBesideFakeNodesThatFail(
    const NodeZero& agent, int port, const std::vector<std::string>& failures,
    const std::function<void(int node, TcpStoreClient& store)>& before,
    absl::StatusOr<int>* result) {
  const int nodes = static_cast<int>(failures.size()) + 1;
  std::vector<std::thread> others;
  for (int node = 1; node < nodes; ++node) {
    others.emplace_back([&, node] {
      FakeAgent fake(port, node);
      if (!fake.connected()) return;
      before(node, fake.store());
      fake.Arrive(0, "arrived", nodes);
      fake.AwaitKey("agent/attempt-0/failures/node-0");
      EXPECT_TRUE(fake.store()
                      .Set(absl::StrCat("agent/attempt-0/failures/node-", node), failures[node - 1])
                      .ok());
      fake.Arrive(0, "stopped", nodes);
      fake.Finish();
    });
  }
  const std::string output = agent.Run(result);
  for (std::thread& other : others) other.join();
  return output;
}

// The agent's report when node 0's worker (rank 0) exits 1 after a second, blaming rank 2, while
// node 1's rank 1 was killed (SIGKILL) first and node 2's rank 2 ended as `rank_two` (a JSON
// record's "exit", "stopped", "blames" and "time_us" fields).
std::string ReportWithRankOneKilledAndRankTwoBlamed(const std::string& rank_two) {
  const int port = testing::FreeTcpPort();
  NodeZero agent({"/bin/sh", "-c", "sleep 1; exit 1"}, 3, port);
  agent.options.nproc_per_node = 1;
  const std::vector<std::string> records = {
      R"([{"rank": 1, "node": 1, "host": "fake-host", "exit": "killed by signal 9",
           "stopped": false, "blames": [], "time_us": 1000, "stderr": ""}])",
      absl::StrCat(R"([{"rank": 2, "node": 2, "host": "fake-host", )", rank_two,
                   R"(, "stderr": ""}])")};
  absl::StatusOr<int> result;
  const std::string output = RunBesideFakeNodesThatFail(
      agent, port, records,
      [](int node, TcpStoreClient& store) {
        // Once node 1 has recorded its failure, as a trainer's process group would.
        if (node == 1) {
          EXPECT_TRUE(store.Set("workers/attempt-0/blame/0", "2").ok());
        }
      },
      &result);
  EXPECT_TRUE(result.ok()) << result.status() << "\n" << output;
  EXPECT_EQ(result.value_or(-1), 1) << output;
  return output;
}

// Rank 1 (node 1) was killed; rank 2 (node 2) failed waiting for it and blames it; rank 0 (node
// 0) failed waiting for rank 2, stuck behind rank 1 in another group, and blames rank 2 only. The
// root cause is rank 1, which blames nobody, not rank 2, which the first error blames.
TEST(AgentTest, TheRootCauseIsABlamedRankThatBlamesNobody) {
  EXPECT_THAT(ReportWithRankOneKilledAndRankTwoBlamed(
                  R"("exit": "exit code 1", "stopped": false, "blames": [1], )"
                  R"("time_us": 9000000000000000)"),
              HasSubstr("Root cause: rank 1 on node 1 (fake-host), killed by signal 9."));
}

// Rank 1 is killed; rank 2, a pipeline stage waiting on it, is ended by the agent before its
// receive fails; rank 0's error then blames rank 2, which never started its collective. The root
// cause is rank 1's death, not rank 2 as a hung rank (4 of 27 tries named rank 2, found by a
// tester).
TEST(AgentTest, ARankEndedAfterAnEarlierDeathIsNotTheHungRootCause) {
  const std::string output = ReportWithRankOneKilledAndRankTwoBlamed(
      R"("exit": "signal 15", "stopped": true, "blames": [], "time_us": 2000)");
  EXPECT_THAT(output, HasSubstr("Root cause: rank 1 on node 1 (fake-host), killed by signal 9."));
  EXPECT_THAT(output, ::testing::Not(HasSubstr("Root cause: rank 2")));
}

// Ranks that fail on their own end in any order: with no error blaming another rank, the root
// cause is the first failure the ranks recorded (rank 1 on node 1), not the first to exit (rank 0,
// whose own error came later but whose process ended first; 2 of 3 tries named it, found by a
// tester).
// The agent's report when node 0's worker (rank 0) exits 1 after a second and node 1's rank 1,
// which recorded the first failure, failed with `stderr` (JSON-escaped) on it.
std::string ReportOfAFirstFailureOnNodeOne(const std::string& stderr_json) {
  const int port = testing::FreeTcpPort();
  NodeZero agent({"/bin/sh", "-c", "sleep 1; exit 1"}, 2, port);
  agent.options.nproc_per_node = 1;
  const std::vector<std::string> records = {absl::StrCat(
      R"([{"rank": 1, "node": 1, "host": "fake-host", "exit": "exit code 1", "stopped": false,
           "blames": [], "time_us": 9000000000000000, "stderr": ")",
      stderr_json, R"("}])")};
  absl::StatusOr<int> result;
  const std::string output = RunBesideFakeNodesThatFail(
      agent, port, records,
      [](int, TcpStoreClient& store) {
        EXPECT_TRUE(store.Set("workers/attempt-0/first_failure", "1").ok());
      },
      &result);
  EXPECT_TRUE(result.ok()) << result.status() << "\n" << output;
  EXPECT_EQ(result.value_or(-1), 1) << output;
  return output;
}

TEST(AgentTest, TheRootCauseIsTheFirstRecordedFailureWhenNoneIsBlamed) {
  EXPECT_THAT(ReportOfAFirstFailureOnNodeOne(""),
              HasSubstr("Root cause: rank 1 on node 1 (fake-host), exit code 1."));
}

// The root cause's line carries its error, the line its stderr ends with, when it ends with one;
// a worker whose stderr ends in a log line (killed mid-step) gets none.
TEST(AgentTest, TheRootCauseLineCarriesTheRanksError) {
  EXPECT_THAT(ReportOfAFirstFailureOnNodeOne(
                  R"(W 12:00:00 a warning\nerror: data.train: no file; check it\n)"),
              HasSubstr("(fake-host), exit code 1: data.train: no file; check it.\n"));
  EXPECT_THAT(ReportOfAFirstFailureOnNodeOne(R"(I 12:00:00 step 5/9 | loss 2.5\n)"),
              HasSubstr("(fake-host), exit code 1.\n"));
}

// Anything with the store token can write the agents' records: failure lists and lost-agent
// records that are not what an agent writes are skipped (they aborted node 0's agent), and the
// root cause still comes from node 0's own record.
TEST(AgentTest, MalformedRecordsInTheStoreDoNotAbortTheAgent) {
  const int port = testing::FreeTcpPort();
  NodeZero agent({"/bin/sh", "-c", "exit 7"}, 4, port);
  agent.options.nproc_per_node = 1;
  absl::StatusOr<int> result;
  const std::string output = RunBesideFakeNodesThatFail(
      agent, port, {"not json", R"({"rank": 1})", R"([7, {"rank": "one"}, {}])"},
      [](int node, TcpStoreClient& store) {
        if (node == 1) {
          EXPECT_TRUE(store.Set("agent/attempt-0/lost", R"([7, {"node": "x"}])").ok());
        }
      },
      &result);
  ASSERT_TRUE(result.ok()) << result.status() << "\n" << output;
  EXPECT_EQ(*result, 1) << output;
  EXPECT_THAT(output, HasSubstr("Root cause: rank 0 on node 0"));
  EXPECT_THAT(output, HasSubstr("exit code 7"));
  for (int node = 1; node <= 3; ++node) {
    EXPECT_THAT(output, HasSubstr(absl::StrCat("ignoring node ", node, "'s failed workers")));
  }
}

// A second `dtrain launch` for a node whose agent runs is turned away before it registers, and
// the job goes on: its exit looked like the loss of the running agent, which ended the job (at
// once: more steps than fit into the agents' 100 ms check interval).
TEST(AgentTest, SecondAgentForARunningNodeLeavesTheJobAlone) {
  TwoPods job("duplicate", 100000);
  std::unique_ptr<Launch> duplicate = job.Start(1);
  EXPECT_NE(duplicate->Wait(absl::Seconds(60)), 0) << duplicate->output();
  EXPECT_THAT(duplicate->output(), HasSubstr("node 1 already has a running agent (on host "));
  const int steps = StepsLogged(job.out);
  ASSERT_TRUE(job.pods[0]->Pump(absl::Seconds(60), [&] {
    job.pods[1]->Pump(absl::Milliseconds(1));  // its output must not fill the pipe and stall it
    return StepsLogged(job.out) > steps + 10;
  })) << job.pods[0]->output();
  for (const auto& pod : job.pods) EXPECT_FALSE(pod->process().Poll()) << pod->output();
  EXPECT_THAT(job.pods[0]->output(), Not(HasSubstr("agent lost")));
  for (const auto& pod : job.pods) KillAgent(*pod);
}

// Two agents started together for one node both find no agent of it running: the first to claim
// the node's next incarnation goes on and the other is turned away naming it (it took itself for
// a replacement of the first and waited to rejoin). Here the claim of a node 1 that is not
// started yet is the store's before node 1's agent asks.
TEST(AgentTest, OfTwoAgentsStartingForOneNodeTheSecondToClaimItIsTurnedAway) {
  TwoPods job("claimed", 100000, {}, /*started=*/false);
  job.pods.push_back(job.Start(0));
  absl::StatusOr<std::unique_ptr<TcpStoreClient>> store = job.Store();
  ASSERT_TRUE(store.ok()) << store.status();
  const std::string first = "on host other-host, pid 1";
  ASSERT_EQ((*store)->CompareSet("agent/claim/node-1/1", "", first).value_or(""), first);
  std::unique_ptr<Launch> second = job.Start(1);
  EXPECT_NE(second->Wait(absl::Seconds(60)), 0) << second->output();
  EXPECT_THAT(second->output(),
              HasSubstr("node 1 already has a running agent (on host other-host, pid 1)"));
  EXPECT_THAT(second->output(), Not(HasSubstr("last agent was lost")));
  KillAgent(*job.pods[0]);
}

// A claim whose holder's connection closed before it became the node's agent (it died between
// the two) is taken over: the node's next agent joins the job rather than being turned away for
// good in the name of a dead process.
TEST(AgentTest, AClaimLeftByAnAgentThatDiedIsTakenOver) {
  TwoPods job("claim_left", 100000, {}, /*started=*/false);
  job.pods.push_back(job.Start(0));
  const std::string closed = "agent/claim/node-1/1/closed/0123abcd";
  {
    absl::StatusOr<std::unique_ptr<TcpStoreClient>> holder = job.Store();
    ASSERT_TRUE(holder.ok()) << holder.status();
    ASSERT_TRUE((*holder)->AddOnClose(closed, 1).ok());
    const std::string dead = "on host gone-host, pid 7\n0123abcd";
    ASSERT_EQ((*holder)->CompareSet("agent/claim/node-1/1", "", dead).value_or(""), dead);
  }  // the holder's connection closes
  absl::StatusOr<std::unique_ptr<TcpStoreClient>> store = job.Store();
  ASSERT_TRUE(store.ok()) << store.status();
  for (int i = 0; i < 200 && (*store)->Add(closed, 0).value_or(0) == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_EQ((*store)->Add(closed, 0).value_or(0), 1) << "the store never saw the holder close";
  job.pods.push_back(job.Start(1));
  EXPECT_TRUE(job.pods[0]->Pump(absl::Seconds(60),
                                [&] {
                                  job.pods[1]->Pump(absl::Milliseconds(1));
                                  return StepsLogged(job.out) >= 2;
                                }))
      << job.pods[0]->output() << job.pods[1]->output();
  EXPECT_THAT(job.pods[1]->output(), Not(HasSubstr("already has a running agent")));
  for (const auto& pod : job.pods) KillAgent(*pod);
}

// The worker logs of every attempt are closed (each restart leaked one fd per worker).
TEST(AgentTest, RestartsLeakNoLogFile) {
  const std::string logs = OutDir("log_fds");
  std::filesystem::create_directories(logs);
  NodeZero agent({"/bin/sh", "-c", "exit 7"});
  agent.options.log_dir = logs;
  agent.options.max_restarts = 2;
  absl::StatusOr<int> result;
  const std::string output = agent.Run(&result);
  ASSERT_TRUE(result.ok()) << result.status() << "\n" << output;
  EXPECT_EQ(*result, 1) << output;
  EXPECT_TRUE(std::filesystem::exists(logs + "/rank-1.log"));
  const std::string dir = std::filesystem::canonical(logs).string();  // as /proc names it
  for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    const std::filesystem::path target = std::filesystem::read_symlink(fd.path(), error);
    EXPECT_FALSE(absl::StartsWith(target.string(), dir)) << target << " is still open";
  }
}

// Node 0's agent stopped by SIGTERM, as from Slurm, once both workers started, with
// `requeue_argv` for its requeue command: what it printed, and its exit code. The workers exit
// `worker_exit` on SIGTERM: 143 as dtrain's do after their checkpoint, 0 as one that finished.
std::string StoppedWithRequeue(const std::string& name, std::vector<std::string> requeue_argv,
                               int* exit_code, int worker_exit = kExitStopped) {
  const std::string dir = OutDir(name);
  std::filesystem::create_directories(dir);
  const std::string started = dir + "/started";
  NodeZero agent({"/bin/sh", "-c",
                  absl::StrCat("trap 'exit ", worker_exit, "' TERM; touch ", started, "-$RANK; ",
                               "while :; do sleep 0.1; done")});
  agent.options.requeue_argv = std::move(requeue_argv);
  return agent.RunBeside(
      [&] {
        const absl::Time deadline = absl::Now() + absl::Seconds(60);
        while (
            !(std::filesystem::exists(started + "-0") && std::filesystem::exists(started + "-1")) &&
            absl::Now() < deadline) {
          absl::SleepFor(absl::Milliseconds(20));
        }
        kill(getpid(), SIGTERM);  // the agent's handler takes it: a stop, as from Slurm
      },
      exit_code);
}

// The requeue command fails: the message says how.
TEST(AgentTest, FailedRequeueSaysWhy) {
  int exit_code = -1;
  const std::string output = StoppedWithRequeue(
      "requeue", {"/bin/sh", "-c", "echo 'Requested operation is disabled' >&2; exit 4"},
      &exit_code);
  EXPECT_EQ(exit_code, kExitStopped) << output;
  EXPECT_THAT(output, HasSubstr("could not requeue the job with `/bin/sh -c echo 'Requested "
                                "operation is disabled' >&2; exit 4`: exit code 4 (Requested "
                                "operation is disabled)"));
}

// Slurm ends a job it requeues with SIGTERM, the requeue command included, often before that
// returns: the requeue went through.
TEST(AgentTest, RequeueEndedBySigtermIsTheRequeue) {
  int exit_code = -1;
  const std::string output =
      StoppedWithRequeue("requeue-sigterm", {"/bin/sh", "-c", "kill -TERM $$"}, &exit_code);
  EXPECT_EQ(exit_code, kExitStopped) << output;
  EXPECT_THAT(output, HasSubstr("requeued the job: /bin/sh -c kill -TERM $$ (ended by SIGTERM"));
  EXPECT_THAT(output, Not(HasSubstr("could not requeue")));
}

// Workers that did not stop cleanly (exit 1 at the stop: a save that failed, a worker killed at the
// grace) leave a job to requeue all the same, which resumes from the newest complete checkpoint (it
// was left unrequeued); one that exited as every run would again (a full disk) does not.
TEST(AgentTest, AStopThatIsNotCleanIsRequeuedUnlessItWouldRepeat) {
  int exit_code = -1;
  const std::string output =
      StoppedWithRequeue("requeue-unclean", {"/bin/true"}, &exit_code, /*worker_exit=*/1);
  EXPECT_EQ(exit_code, 1) << output;
  EXPECT_THAT(output, AllOf(HasSubstr("workers stopped, not all cleanly: rank 0 exit code 1"),
                            HasSubstr("requeued the job: /bin/true")));
  const std::string full = StoppedWithRequeue("requeue-full", {"/bin/true"}, &exit_code,
                                              /*worker_exit=*/kExitDiskFull);
  EXPECT_EQ(exit_code, 1) << full;
  EXPECT_THAT(full, AllOf(HasSubstr("node 0: not requeued: a worker exited as every run would"),
                          Not(HasSubstr("requeued the job"))));
}

// Workers that had finished as the stop came (exit 0): the job is done, exit 0, no requeue.
TEST(AgentTest, AStopAfterEveryWorkerFinishedIsNoRequeue) {
  int exit_code = -1;
  const std::string output =
      StoppedWithRequeue("requeue-finished", {"/bin/true"}, &exit_code, /*worker_exit=*/0);
  EXPECT_EQ(exit_code, 0) << output;
  EXPECT_THAT(output, HasSubstr("every worker finished before the stop"));
  EXPECT_THAT(output, Not(HasSubstr("requeue")));
}

// A worker that exits 2 (kExitUsage: its recipe, command line or files are wrong) would fail the
// same way on every restart: the job ends at once with exit 2, the restarts unspent, naming that
// rank.
TEST(AgentTest, AWorkersUsageErrorIsNotRestarted) {
  NodeZero agent(
      {"/bin/sh", "-c",
       absl::StrCat("if [ \"$RANK\" = 1 ]; then echo 'error: data.streams is wrong' >&2; "
                    "exit ",
                    kExitUsage, "; fi; exec sleep 30")});
  agent.options.max_restarts = 2;
  absl::StatusOr<int> exit_code;
  const std::string output = agent.Run(&exit_code);
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  EXPECT_EQ(*exit_code, kExitUsage) << output;
  EXPECT_THAT(output, HasSubstr("a restart would fail the same way; not restarting"));
  EXPECT_THAT(output, HasSubstr("(0 restarts used of 2). Root cause: rank 1"));
  EXPECT_THAT(output, HasSubstr("error: data.streams is wrong"));
  EXPECT_THAT(output, Not(HasSubstr("restarting the workers")));
}

// So would a worker whose checkpoint found its file system full (kExitDiskFull): each restart
// would train to the same save and fail there again. Real workers, saving into a 64 KiB tmpfs in
// a mount namespace of the launch's own.
TEST(AgentTest, AFullCheckpointFileSystemIsNotRestarted) {
  const std::string small = testing::FreshTempDir("agent_full_checkpoints");
  const std::string prefix = testing::SmallFileSystemPrefix(small, 64);
  if (prefix.empty()) GTEST_SKIP() << "needs root and unshare -m (a tmpfs in a mount namespace)";
  const testing::Outcome outcome = testing::RunDtrain(
      absl::StrCat("launch --nproc-per-node=2 --max-restarts=2 ", Recipe("full", 3),
                   " --set run.out_dir=", OutDir("full"), " --set checkpoint.dir=", small),
      prefix);
  const std::string output = outcome.stdout_text + outcome.stderr_text;
  EXPECT_EQ(outcome.exit_code, kExitDiskFull) << output;
  EXPECT_THAT(output, HasSubstr("a file system it writes is full (its error says which"));
  EXPECT_THAT(output, HasSubstr("a restart would fail the same way; not restarting"));
  EXPECT_THAT(output, HasSubstr("(0 restarts used of 2)"));
  EXPECT_THAT(output, HasSubstr("the checkpoint folder's file system is full"));
  EXPECT_THAT(output, Not(HasSubstr("restarting the workers")));
}

TEST(AgentTest, BadRecipeFailsBeforeAnyWorkerStarts) {
  const testing::Outcome outcome =
      testing::RunDtrain("launch --nproc-per-node=2 --set train.stepz=3");
  EXPECT_EQ(outcome.exit_code, 2);
  EXPECT_THAT(outcome.stderr_text, HasSubstr("train.stepz"));
}

// parallel.tp must divide the world the launch makes (nodes x --nproc-per-node): exit 2 before
// any worker starts, naming the key and the sizes that fit.
TEST(AgentTest, TensorParallelSizeThatDoesNotDivideTheWorldFailsBeforeAnyWorkerStarts) {
  const testing::Outcome outcome =
      testing::RunDtrain("launch --nproc-per-node=3 --set parallel.tp=2");
  EXPECT_EQ(outcome.exit_code, 2);
  EXPECT_THAT(outcome.stderr_text, HasSubstr("parallel.tp = 2 x parallel.pp = 1 does not divide "
                                             "the world of 3 ranks"));
  // tp 3 divides the world but not the built-in recipe's 4 heads: not offered.
  EXPECT_THAT(outcome.stderr_text, HasSubstr("set parallel.tp: 1, or run 2 x k ranks"));
  EXPECT_THAT(outcome.stderr_text, Not(HasSubstr("workers")));
}

// So must the batch split into the world's data-parallel ranks: the built-in recipe's batch of
// 16 in micro-batches of 16 does not fit 2 ranks, found before any worker starts (where each
// worker found it, exited 1, and the agent restarted them to find it again).
TEST(AgentTest, ABatchThatDoesNotSplitOverTheWorldFailsBeforeAnyWorkerStarts) {
  const testing::Outcome outcome =
      testing::RunDtrain("launch --nproc-per-node=2 --max-restarts=2 --set train.micro_batch=16");
  EXPECT_EQ(outcome.exit_code, 2);
  EXPECT_THAT(outcome.stderr_text,
              HasSubstr("train.batch_size 16 does not split into 2 data-parallel ranks"));
  EXPECT_THAT(outcome.stderr_text, Not(HasSubstr("workers")));
}

// A data file that does not exist fails before any worker starts with one line, where both
// workers failed after their rendezvous and the report ran to 15 lines (one of them at times cut
// short by the agent's stop of the rank that had not yet printed its error).
TEST(AgentTest, AMissingDataFileFailsBeforeAnyWorkerStartsInOneLine) {
  const testing::Outcome outcome = testing::RunDtrain(
      "launch --nproc-per-node=2 --set train.micro_batch=8 --set "
      "data.train=[/nonexistent/text.txt]");
  EXPECT_EQ(outcome.exit_code, 2);
  EXPECT_EQ(outcome.stderr_text,
            "error: data.train: file pattern '/nonexistent/text.txt' matches no file; check the "
            "path\n");
  EXPECT_EQ(outcome.stdout_text, "");
}

}  // namespace
}  // namespace dtrain
