// ResolveWorld over every launcher's environment: torchrun, Slurm (step task and batch shell),
// Kubeflow PyTorchJob and Trainer v2, Indexed Job, JobSet, LeaderWorkerSet, Open MPI, PMI; the
// precedence between them, the provenance of each field and every inconsistency message.
#include "launch/environment.h"

#include <string>

#include "core/util/exit_codes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

WorldEnvironment Resolve(const EnvironmentMap& env, const WorldOverrides& flags = {}) {
  absl::StatusOr<WorldEnvironment> world = ResolveWorld(env, flags);
  EXPECT_TRUE(world.ok()) << world.status();
  return world.ok() ? *world : WorldEnvironment{};
}

std::string Error(const EnvironmentMap& env, const WorldOverrides& flags = {}) {
  absl::StatusOr<WorldEnvironment> world = ResolveWorld(env, flags);
  EXPECT_FALSE(world.ok()) << "resolved to rank " << world->rank << " of " << world->world_size;
  return world.ok() ? "" : std::string(world.status().message());
}

// The environment of rank 5 in `srun -N2 -n8` (4 tasks per node), job 1234 step 0.
EnvironmentMap SlurmStepTask() {
  return {{"SLURM_JOB_ID", "1234"},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_PROCID", "5"},
          {"SLURM_LOCALID", "1"},
          {"SLURM_NODEID", "1"},
          {"SLURM_NTASKS", "8"},
          {"SLURM_NNODES", "2"},
          {"SLURM_STEP_NUM_NODES", "2"},
          {"SLURM_JOB_NUM_NODES", "2"},
          {"SLURM_STEP_NODELIST", "gpu[07-08]"},
          {"SLURM_JOB_NODELIST", "gpu[07-08]"},
          {"SLURM_STEP_TASKS_PER_NODE", "4(x2)"},
          {"SLURM_TASKS_PER_NODE", "4(x2)"},
          {"SLURM_LAUNCH_NODE_IPADDR", "10.0.0.1"},
          {"SLURM_SRUN_COMM_HOST", "10.0.0.1"}};
}

TEST(EnvironmentTest, EmptyEnvironmentIsOneProcess) {
  const WorldEnvironment world = Resolve({});
  EXPECT_EQ(world.source, WorldSource::kSingle);
  EXPECT_EQ(world.rank, 0);
  EXPECT_EQ(world.world_size, 1);
  EXPECT_EQ(world.local_world_size, 1);
  EXPECT_EQ(world.num_nodes, 1);
  EXPECT_EQ(world.master_addr, "127.0.0.1");
  EXPECT_EQ(world.master_port, 29500);
  EXPECT_EQ(world.run_id, "");
  EXPECT_EQ(world.restart_count, 0);
  EXPECT_EQ(world.max_restarts, 0);
  EXPECT_FALSE(world.agent_hosts_store);
  EXPECT_FALSE(world.in_slurm_allocation);
  EXPECT_EQ(world.visible_gpus, -1);
  EXPECT_EQ(world.provenance.at("rank"), "default");
  EXPECT_EQ(world.provenance.at("master_addr"), "default (one process)");
  EXPECT_EQ(world.provenance.at("master_port"), "default");
  EXPECT_STREQ(WorldSourceName(world.source), "single");
}

TEST(EnvironmentTest, TorchrunWorker) {
  const WorldEnvironment world = Resolve({{"RANK", "5"},
                                          {"LOCAL_RANK", "1"},
                                          {"WORLD_SIZE", "8"},
                                          {"LOCAL_WORLD_SIZE", "4"},
                                          {"GROUP_RANK", "1"},
                                          {"MASTER_ADDR", "node0"},
                                          {"MASTER_PORT", "29600"},
                                          {"TORCHELASTIC_RESTART_COUNT", "2"},
                                          {"TORCHELASTIC_MAX_RESTARTS", "3"},
                                          {"TORCHELASTIC_RUN_ID", "job7"}});
  EXPECT_EQ(world.source, WorldSource::kTorchrun);
  EXPECT_EQ(world.rank, 5);
  EXPECT_EQ(world.world_size, 8);
  EXPECT_EQ(world.local_rank, 1);
  EXPECT_EQ(world.local_world_size, 4);
  EXPECT_EQ(world.node_rank, 1);
  EXPECT_EQ(world.num_nodes, 2);
  EXPECT_EQ(world.master_addr, "node0");
  EXPECT_EQ(world.master_port, 29600);
  EXPECT_EQ(world.run_id, "job7");
  EXPECT_EQ(world.restart_count, 2);
  EXPECT_EQ(world.max_restarts, 3);
  EXPECT_EQ(world.provenance.at("rank"), "RANK=5");
  EXPECT_EQ(world.provenance.at("node_rank"), "GROUP_RANK=1");
  EXPECT_EQ(world.provenance.at("num_nodes"), "derived from world_size / local_world_size");
  EXPECT_EQ(world.provenance.at("master_addr"), "MASTER_ADDR=node0");
  EXPECT_EQ(world.provenance.at("max_restarts"), "TORCHELASTIC_MAX_RESTARTS=3");
}

// Under torchrun's static rendezvous, and c10d's since PyTorch 2.4, its agent serves a PyTorch
// TCPStore on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True): dtrain's store takes the next
// port, where rank 1 once met torchrun's store and failed its handshake.
TEST(EnvironmentTest, TorchrunsAgentStoreKeepsMasterPortAndDtrainTakesTheNext) {
  EnvironmentMap env = {{"RANK", "1"},
                        {"LOCAL_RANK", "1"},
                        {"WORLD_SIZE", "2"},
                        {"LOCAL_WORLD_SIZE", "2"},
                        {"MASTER_ADDR", "n0"},
                        {"MASTER_PORT", "29654"},
                        {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
  const WorldEnvironment shared = Resolve(env);
  EXPECT_EQ(shared.master_port, 29655);
  EXPECT_EQ(shared.provenance.at("master_port"),
            "derived from MASTER_PORT=29654 + 1: torchrun's agent serves its own store on "
            "MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True)");
  env["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  EXPECT_EQ(Resolve(env).master_port, 29654);
  // No port after 65535: an error, where dtrain's store took torchrun's own port.
  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  env["MASTER_PORT"] = "65535";
  EXPECT_THAT(Error(env), ::testing::HasSubstr("MASTER_PORT=65535 leaves no port after it"));
}

// torchrun numbers its workers node by node; a RANK off that count (a stale export) would put two
// processes on one local rank.
TEST(EnvironmentTest, TorchrunRankOffItsNodesCountIsAnError) {
  EXPECT_EQ(Error({{"RANK", "2"},
                   {"LOCAL_RANK", "1"},
                   {"WORLD_SIZE", "8"},
                   {"LOCAL_WORLD_SIZE", "4"},
                   {"GROUP_RANK", "1"},
                   {"MASTER_ADDR", "node0"}}),
            "rank 2 (RANK=2) is not node rank 1 (GROUP_RANK=1) x local world size 4 "
            "(LOCAL_WORLD_SIZE=4) + local rank 1 (LOCAL_RANK=1); set them consistently (a stale "
            "variable from another launcher?)");
}

TEST(EnvironmentTest, HandStartedRankAndWorldSizeKeepTheOldMeaning) {
  // As README's two-terminal example: no LOCAL_* variables, every rank on one node.
  const WorldEnvironment world = Resolve(
      {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1234"}});
  EXPECT_EQ(world.source, WorldSource::kTorchrun);
  EXPECT_EQ(world.rank, 1);
  EXPECT_EQ(world.local_rank, 1);
  EXPECT_EQ(world.local_world_size, 2);
  EXPECT_EQ(world.num_nodes, 1);
  EXPECT_EQ(world.master_port, 1234);
  EXPECT_THAT(world.provenance.at("local_rank"), HasSubstr("derived from rank"));
}

TEST(EnvironmentTest, MultiProcessWorldNeedsAMasterAddress) {
  EXPECT_THAT(Error({{"RANK", "1"}, {"WORLD_SIZE", "2"}}),
              HasSubstr("world size 2 (WORLD_SIZE=2) but MASTER_ADDR is not set: set "
                        "MASTER_ADDR (or DTRAIN_MASTER_ADDR, or --master-addr)"));
  EXPECT_THAT(Error({{"RANK", "1"}, {"WORLD_SIZE", "2"}}),
              HasSubstr("dtrain never guesses localhost for a multi-process job"));
}

TEST(EnvironmentTest, AMasterAddressWithAPortSaysWhereThePortGoes) {
  EXPECT_EQ(Error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "node0:29500"}}),
            "MASTER_ADDR='node0:29500' is not a bare host name or address: set "
            "MASTER_ADDR=node0 and MASTER_PORT=29500");
  EXPECT_EQ(Error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "[fe80::1]:29500"}}),
            "MASTER_ADDR='[fe80::1]:29500' is not a bare host name or address: set "
            "MASTER_ADDR=fe80::1 and MASTER_PORT=29500");
  EXPECT_EQ(Error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "tcp://node0"}}),
            "MASTER_ADDR='tcp://node0' is not a bare host name or address: set "
            "MASTER_ADDR=node0 and MASTER_PORT=<port>");
  WorldOverrides flags;
  flags.master_addr = "head:1234";
  EXPECT_EQ(Error({}, flags),
            "flag --master-addr head:1234 is not a bare host name or address: set "
            "--master-addr=head and --master-port=1234");
  EXPECT_EQ(Error({{"DTRAIN_MASTER_ADDR", "head:1234"}}),
            "DTRAIN_MASTER_ADDR='head:1234' is not a bare host name or address: set "
            "DTRAIN_MASTER_ADDR=head and DTRAIN_MASTER_PORT=1234");
  // A bare IPv6 address is a host, colons and all.
  EXPECT_EQ(Resolve({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "fe80::1"}}).master_addr,
            "fe80::1");
}

TEST(EnvironmentTest, MalformedIntegersNameTheVariable) {
  EXPECT_EQ(Error({{"RANK", "one"}, {"WORLD_SIZE", "2"}}),
            "RANK='one' is not an integer; set it to a whole number");
  EXPECT_EQ(Error({{"DTRAIN_WORLD_SIZE", "2x"}}),
            "DTRAIN_WORLD_SIZE='2x' is not an integer; set it to a whole number");
  EXPECT_EQ(Error({{"MASTER_PORT", "http"}}),
            "MASTER_PORT='http' is not an integer; set it to a whole number");
}

TEST(EnvironmentTest, MalformedValueOfALosingSourceIsIgnored) {
  EnvironmentMap env = SlurmStepTask();
  env["SLURM_PROCID"] = "garbage";
  env.emplace("DTRAIN_RANK", "3");
  EXPECT_EQ(Resolve(env).rank, 3);
}

TEST(EnvironmentTest, PortOutOfRange) {
  EXPECT_EQ(Error({{"MASTER_PORT", "70000"}}),
            "MASTER_PORT=70000: 70000 is not a TCP port (1-65535)");
  EXPECT_EQ(Error({{"DTRAIN_MASTER_PORT", "0"}}),
            "DTRAIN_MASTER_PORT=0: 0 is not a TCP port (1-65535)");
  WorldOverrides flags;
  flags.master_port = -1;
  EXPECT_EQ(Error({}, flags), "flag --master-port -1: -1 is not a TCP port (1-65535)");
}

TEST(EnvironmentTest, RankOutsideWorld) {
  EXPECT_EQ(Error({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}),
            "rank 2 (RANK=2) is outside world size 2 (WORLD_SIZE=2); set both, with 0 <= rank < "
            "world size");
  EXPECT_THAT(Error({{"RANK", "-1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}),
              HasSubstr("rank -1 (RANK=-1) is outside world size 2"));
  EXPECT_EQ(Error({{"WORLD_SIZE", "0"}}), "world size 0 (WORLD_SIZE=0) must be at least 1");
}

TEST(EnvironmentTest, LocalRankOutsideLocalWorld) {
  EXPECT_EQ(Error({{"RANK", "3"},
                   {"WORLD_SIZE", "4"},
                   {"LOCAL_RANK", "3"},
                   {"LOCAL_WORLD_SIZE", "2"},
                   {"MASTER_ADDR", "h"}}),
            "local rank 3 (LOCAL_RANK=3) is outside local world size 2 (LOCAL_WORLD_SIZE=2); set "
            "both, with 0 <= local rank < local world size");
}

TEST(EnvironmentTest, NodeRankOutsideNodes) {
  WorldOverrides flags;
  flags.node_rank = 2;
  flags.num_nodes = 2;
  flags.master_addr = "h";
  EXPECT_EQ(Error({}, flags),
            "node rank 2 (flag --node-rank 2) is outside nodes 2 (flag --nnodes 2); set both, "
            "with 0 <= node rank < nodes");
}

TEST(EnvironmentTest, WorldThatIsNotNodesTimesLocalWorld) {
  EXPECT_EQ(Error({{"DTRAIN_RANK", "0"},
                   {"DTRAIN_WORLD_SIZE", "6"},
                   {"DTRAIN_NUM_NODES", "2"},
                   {"DTRAIN_LOCAL_WORLD_SIZE", "4"},
                   {"DTRAIN_MASTER_ADDR", "h"}}),
            "world size 6 (DTRAIN_WORLD_SIZE=6) is not nodes 2 (DTRAIN_NUM_NODES=2) x local world "
            "size 4 (DTRAIN_LOCAL_WORLD_SIZE=4); set them consistently");
  EXPECT_THAT(
      Error({{"DTRAIN_WORLD_SIZE", "5"}, {"DTRAIN_NUM_NODES", "2"}, {"DTRAIN_MASTER_ADDR", "h"}}),
      HasSubstr("world size 5 (DTRAIN_WORLD_SIZE=5) does not split evenly over nodes 2"));
}

TEST(EnvironmentTest, SlurmStepTask) {
  const WorldEnvironment world = Resolve(SlurmStepTask());
  EXPECT_EQ(world.source, WorldSource::kSlurm);
  EXPECT_EQ(world.rank, 5);
  EXPECT_EQ(world.world_size, 8);
  EXPECT_EQ(world.local_rank, 1);
  EXPECT_EQ(world.local_world_size, 4);
  EXPECT_EQ(world.node_rank, 1);
  EXPECT_EQ(world.num_nodes, 2);
  EXPECT_EQ(world.master_addr, "gpu07");  // never SLURM_LAUNCH_NODE_IPADDR
  EXPECT_EQ(world.run_id, "1234.0");
  EXPECT_TRUE(world.in_slurm_allocation);
  EXPECT_FALSE(world.slurm_batch_shell);
  EXPECT_EQ(world.slurm_job_id, "1234");
  EXPECT_EQ(world.slurm_job_num_nodes, 2);
  EXPECT_EQ(world.provenance.at("rank"), "SLURM_PROCID=5");
  EXPECT_EQ(world.provenance.at("world_size"), "SLURM_NTASKS=8");
  EXPECT_EQ(world.provenance.at("local_world_size"),
            "SLURM_STEP_TASKS_PER_NODE=4(x2) at SLURM_NODEID=1");
  EXPECT_EQ(world.provenance.at("master_addr"), "first host of SLURM_STEP_NODELIST=gpu[07-08]");
  EXPECT_EQ(world.provenance.at("run_id"), "derived from SLURM_JOB_ID=1234,SLURM_STEP_ID=0");
}

TEST(EnvironmentTest, SlurmFallbackVariables) {
  EnvironmentMap env = SlurmStepTask();
  env.erase("SLURM_NTASKS");
  env.erase("SLURM_STEP_NUM_NODES");
  env.erase("SLURM_STEP_NODELIST");
  env.erase("SLURM_STEP_TASKS_PER_NODE");
  env["SLURM_NPROCS"] = "8";
  env["SLURM_JOB_NODELIST"] = "a[1-2]";
  env["SLURM_RESTART_COUNT"] = "1";
  const WorldEnvironment world = Resolve(env);
  EXPECT_EQ(world.world_size, 8);
  EXPECT_EQ(world.master_addr, "a1");
  EXPECT_EQ(world.restart_count, 1);
  EXPECT_EQ(world.provenance.at("num_nodes"), "SLURM_NNODES=2");
  EXPECT_EQ(world.provenance.at("local_world_size"),
            "SLURM_TASKS_PER_NODE=4(x2) at SLURM_NODEID=1");
  EXPECT_EQ(world.provenance.at("restart_count"), "SLURM_RESTART_COUNT=1");
}

TEST(EnvironmentTest, SlurmUnevenTasksPerNodeIndexedByNodeId) {
  EnvironmentMap env = SlurmStepTask();
  env["SLURM_STEP_TASKS_PER_NODE"] = "3,1";
  env["SLURM_NTASKS"] = "4";
  env["SLURM_PROCID"] = "3";
  env["SLURM_LOCALID"] = "0";
  const WorldEnvironment world = Resolve(env);
  EXPECT_EQ(world.local_world_size, 1);
  EXPECT_EQ(world.world_size, 4);
}

TEST(EnvironmentTest, SlurmTasksPerNodeWithoutNodeIdUsesTheRanksOwnNode) {
  // Rank 6 of `2(x3),1` is the one task of the last node; node 0 runs two.
  EnvironmentMap env = SlurmStepTask();
  env.erase("SLURM_NODEID");
  env.erase("SLURM_STEP_TASKS_PER_NODE");
  env["SLURM_TASKS_PER_NODE"] = "2(x3),1";
  env["SLURM_STEP_NUM_NODES"] = "4";
  env["SLURM_NTASKS"] = "7";
  env["SLURM_PROCID"] = "6";
  env["SLURM_LOCALID"] = "0";
  const WorldEnvironment world = Resolve(env);
  EXPECT_EQ(world.local_world_size, 1);
  EXPECT_EQ(world.node_rank, 3);
  EXPECT_EQ(world.provenance.at("local_world_size"),
            "SLURM_TASKS_PER_NODE=2(x3),1 at the node of SLURM_PROCID=6 (block distribution)");
  EXPECT_EQ(world.provenance.at("node_rank"), "the node of SLURM_PROCID=6 (block distribution)");

  env["SLURM_PROCID"] = "3";  // the second task of node 1
  env["SLURM_LOCALID"] = "1";
  EXPECT_EQ(Resolve(env).local_world_size, 2);
  EXPECT_EQ(Resolve(env).node_rank, 1);

  env["SLURM_DISTRIBUTION"] = "cyclic";  // rank 3 is on node 3 then: not derived, an error
  EXPECT_THAT(Error(env), HasSubstr("SLURM_NODEID is unset and SLURM_DISTRIBUTION=cyclic places "
                                    "ranks across nodes in an order not derived here: this "
                                    "node's entry in SLURM_TASKS_PER_NODE=2(x3),1 is unknown; set "
                                    "SLURM_NODEID"));
}

TEST(EnvironmentTest, SlurmWorldThatDiffersFromTasksPerNode) {
  EnvironmentMap env = SlurmStepTask();
  env["SLURM_NTASKS"] = "16";
  EXPECT_EQ(Error(env),
            "world size 16 (SLURM_NTASKS=16) differs from the 8 tasks of "
            "SLURM_STEP_TASKS_PER_NODE=4(x2): a stale SLURM_NTASKS (exported by the batch script, "
            "or srun -n differing from the allocation); start the step with srun and matching -n "
            "/ --ntasks-per-node");
}

TEST(EnvironmentTest, SlurmBadNodeListNamesTheVariable) {
  EnvironmentMap env = SlurmStepTask();
  env["SLURM_STEP_NODELIST"] = "gpu[08-07]";
  EXPECT_THAT(Error(env), HasSubstr("SLURM_STEP_NODELIST: hostlist token 'gpu[08-07]': range "
                                    "'08-07' has lo > hi"));
  env["MASTER_ADDR"] = "head";  // a master given higher up makes the node list irrelevant
  EXPECT_EQ(Resolve(env).master_addr, "head");
}

TEST(EnvironmentTest, SlurmBadTasksPerNodeNamesTheVariable) {
  EnvironmentMap env = SlurmStepTask();
  env["SLURM_STEP_TASKS_PER_NODE"] = "4(x2";
  EXPECT_THAT(Error(env), HasSubstr("SLURM_STEP_TASKS_PER_NODE: tasks per node '4(x2'"));
}

TEST(EnvironmentTest, SlurmBatchShellIsNotARank) {
  EnvironmentMap env = SlurmStepTask();
  for (const char* step_only :
       {"SLURM_STEP_ID", "SLURM_STEP_NODELIST", "SLURM_STEP_NUM_NODES", "SLURM_STEP_TASKS_PER_NODE",
        "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_LAUNCH_NODE_IPADDR",
        "SLURM_SRUN_COMM_HOST"}) {
    env.erase(step_only);
  }
  const WorldEnvironment world = Resolve(env);
  EXPECT_EQ(world.source, WorldSource::kSingle);
  EXPECT_EQ(world.world_size, 1);
  EXPECT_TRUE(world.in_slurm_allocation);
  EXPECT_TRUE(world.slurm_batch_shell);
  EXPECT_EQ(world.slurm_job_num_nodes, 2);
  EXPECT_EQ(world.master_port, 29500);  // no step, no derived port
  EXPECT_THAT(world.provenance.at("slurm_batch_shell"), HasSubstr("SLURM_STEP_ID unset"));
}

TEST(EnvironmentTest, SlurmPortIsDerivedDeterministicallyAndInRange) {
  const WorldEnvironment world = Resolve(SlurmStepTask());
  EXPECT_EQ(world.master_port, SlurmDerivedPort("1234", "0"));
  EXPECT_EQ(world.provenance.at("master_port"), "derived from SLURM_JOB_ID=1234,SLURM_STEP_ID=0");
  // Every node derives the same port: a fixed function of the ids (64-bit FNV-1a of
  // "dtrain/1234.0", computed apart in Python), not of the process or the build.
  EXPECT_EQ(SlurmDerivedPort("1234", "0"), 24006);
  EXPECT_NE(SlurmDerivedPort("1234", "0"), SlurmDerivedPort("1234", "1"));
  for (int job = 0; job < 5000; ++job) {
    const int port = SlurmDerivedPort(std::to_string(job), "0");
    EXPECT_GE(port, 20000);
    EXPECT_LE(port, 29999);
    EXPECT_NE(port, 29500);
    EXPECT_NE(port, 29400);
  }
  EnvironmentMap env = SlurmStepTask();
  env["MASTER_PORT"] = "31000";  // an explicit port wins
  EXPECT_EQ(Resolve(env).master_port, 31000);
}

TEST(EnvironmentTest, MasterFromAHigherSourceWhileRanksComeFromSlurm) {
  EnvironmentMap env = SlurmStepTask();
  env["MASTER_ADDR"] = "10.1.2.3";
  const WorldEnvironment world = Resolve(env);
  EXPECT_EQ(world.source, WorldSource::kSlurm);
  EXPECT_EQ(world.rank, 5);
  EXPECT_EQ(world.master_addr, "10.1.2.3");
  EXPECT_EQ(world.provenance.at("master_addr"), "MASTER_ADDR=10.1.2.3");
}

TEST(EnvironmentTest, TorchrunUnderSlurmWinsForTheShape) {
  // srun -N2 --ntasks-per-node=1 torchrun --nproc-per-node=4: workers inherit the step.
  EnvironmentMap env = SlurmStepTask();
  env["SLURM_NTASKS"] = "2";
  env["SLURM_STEP_TASKS_PER_NODE"] = "1(x2)";
  env["SLURM_PROCID"] = "1";
  env["SLURM_LOCALID"] = "0";
  env.insert({{"RANK", "6"},
              {"LOCAL_RANK", "2"},
              {"WORLD_SIZE", "8"},
              {"LOCAL_WORLD_SIZE", "4"},
              {"GROUP_RANK", "1"},
              {"MASTER_ADDR", "gpu07"},
              {"MASTER_PORT", "29500"}});
  const WorldEnvironment world = Resolve(env);
  EXPECT_EQ(world.source, WorldSource::kTorchrun);
  EXPECT_EQ(world.rank, 6);
  EXPECT_EQ(world.local_world_size, 4);
  EXPECT_EQ(world.num_nodes, 2);
  EXPECT_EQ(world.run_id, "1234.0");  // torchrun names no run here: Slurm's id is next
}

// Half of torchrun's pair in a Slurm step (a batch script's `export WORLD_SIZE=$SLURM_NTASKS`, or
// `export RANK=$SLURM_PROCID`, the same in every task) placed every task at rank 0, or each in a
// world of one: an error naming the variable and Slurm's ranks as the fix.
TEST(EnvironmentTest, HalfOfTorchrunsPairIsAnError) {
  EnvironmentMap world_only = SlurmStepTask();
  world_only["WORLD_SIZE"] = "8";
  EXPECT_THAT(Error(world_only),
              AllOf(HasSubstr("world size 8 (WORLD_SIZE=8) without RANK would make every "
                              "process rank 0"),
                    HasSubstr("or unset WORLD_SIZE so that slurm's ranks apply")));
  EnvironmentMap rank_only = SlurmStepTask();
  rank_only["RANK"] = "0";
  EXPECT_THAT(Error(rank_only),
              AllOf(HasSubstr("rank 0 (RANK=0) without WORLD_SIZE would make each process a "
                              "world of one"),
                    HasSubstr("or unset RANK so that slurm's ranks apply")));
  // Alone, or over a one-task step, RANK=0 is a one-process world as before; WORLD_SIZE > 1
  // alone still is not.
  EXPECT_EQ(Resolve({{"RANK", "0"}}).world_size, 1);
  EnvironmentMap one_task = {{"SLURM_JOB_ID", "7"},
                             {"SLURM_STEP_ID", "0"},
                             {"SLURM_PROCID", "0"},
                             {"SLURM_LOCALID", "0"},
                             {"SLURM_NODEID", "0"},
                             {"SLURM_NTASKS", "1"},
                             {"SLURM_STEP_NUM_NODES", "1"},
                             {"SLURM_STEP_NODELIST", "n1"},
                             {"SLURM_STEP_TASKS_PER_NODE", "1"},
                             {"RANK", "0"}};
  EXPECT_EQ(Resolve(one_task).world_size, 1);
  EXPECT_THAT(Error({{"WORLD_SIZE", "2"}}), HasSubstr("without RANK"));
}

TEST(EnvironmentTest, DtrainVariablesWinOverEverything) {
  // A worker of the dtrain agent inside a Slurm step, with torchrun's variables mirrored.
  EnvironmentMap env = SlurmStepTask();
  env.insert({{"DTRAIN_RANK", "13"},
              {"DTRAIN_WORLD_SIZE", "16"},
              {"DTRAIN_LOCAL_RANK", "5"},
              {"DTRAIN_LOCAL_WORLD_SIZE", "8"},
              {"DTRAIN_NODE_RANK", "1"},
              {"DTRAIN_NUM_NODES", "2"},
              {"DTRAIN_MASTER_ADDR", "gpu07"},
              {"DTRAIN_MASTER_PORT", "40000"},
              {"DTRAIN_RUN_ID", "r1"},
              {"DTRAIN_RESTART_COUNT", "4"},
              {"DTRAIN_MAX_RESTARTS", "5"},
              {"DTRAIN_AGENT_STORE", "1"},
              {"DTRAIN_RDZV_TOKEN", "s3cret"},
              {"RANK", "13"},
              {"WORLD_SIZE", "16"},
              {"TORCHELASTIC_RESTART_COUNT", "9"},
              {"TORCHELASTIC_MAX_RESTARTS", "9"}});
  const WorldEnvironment world = Resolve(env);
  EXPECT_EQ(world.source, WorldSource::kDtrain);
  EXPECT_EQ(world.rank, 13);
  EXPECT_EQ(world.world_size, 16);
  EXPECT_EQ(world.local_rank, 5);
  EXPECT_EQ(world.local_world_size, 8);
  EXPECT_EQ(world.node_rank, 1);
  EXPECT_EQ(world.num_nodes, 2);
  EXPECT_EQ(world.master_port, 40000);
  EXPECT_EQ(world.run_id, "r1");
  EXPECT_EQ(world.restart_count, 4);
  EXPECT_EQ(world.max_restarts, 5);
  EXPECT_TRUE(world.agent_hosts_store);
  EXPECT_EQ(world.rdzv_token, "s3cret");
  EXPECT_EQ(world.provenance.at("rdzv_token"), "DTRAIN_RDZV_TOKEN (set, 6 characters)");
  for (const auto& [field, from] : world.provenance) {
    EXPECT_THAT(from, ::testing::Not(HasSubstr("s3cret"))) << field;
  }
  EXPECT_STREQ(WorldSourceName(world.source), "dtrain");
  // The agent counts its restarts from 0 in each run of a Slurm job: the job's restarts add the
  // requeues before it. A Slurm task's own count is the job's.
  EXPECT_EQ(world.job_restarts, 4);
  env["SLURM_RESTART_COUNT"] = "2";
  EXPECT_EQ(Resolve(env).restart_count, 4);
  EXPECT_EQ(Resolve(env).job_restarts, 6);
  EnvironmentMap task = SlurmStepTask();
  task["SLURM_RESTART_COUNT"] = "2";
  EXPECT_EQ(Resolve(task).job_restarts, 2);
}

TEST(EnvironmentTest, FlagsWinOverDtrainVariables) {
  WorldOverrides flags;
  flags.rank = 1;
  flags.world_size = 2;
  flags.master_addr = "flaghost";
  flags.master_port = 1234;
  flags.run_id = "mine";
  const WorldEnvironment world = Resolve({{"DTRAIN_RANK", "0"},
                                          {"DTRAIN_WORLD_SIZE", "4"},
                                          {"DTRAIN_MASTER_ADDR", "envhost"},
                                          {"DTRAIN_RUN_ID", "theirs"}},
                                         flags);
  EXPECT_EQ(world.source, WorldSource::kFlags);
  EXPECT_EQ(world.rank, 1);
  EXPECT_EQ(world.world_size, 2);
  EXPECT_EQ(world.master_addr, "flaghost");
  EXPECT_EQ(world.master_port, 1234);
  EXPECT_EQ(world.run_id, "mine");
  EXPECT_EQ(world.provenance.at("rank"), "flag --rank 1");
  EXPECT_EQ(world.provenance.at("master_addr"), "flag --master-addr flaghost");
}

TEST(EnvironmentTest, AgentStoreMustBeZeroOrOne) {
  EXPECT_EQ(Error({{"DTRAIN_AGENT_STORE", "yes"}}), "DTRAIN_AGENT_STORE='yes' must be 0 or 1");
  EXPECT_FALSE(Resolve({{"DTRAIN_AGENT_STORE", "0"}}).agent_hosts_store);
}

TEST(EnvironmentTest, NegativeRestartCountIsAnError) {
  EXPECT_EQ(Error({{"DTRAIN_MAX_RESTARTS", "-1"}}),
            "DTRAIN_MAX_RESTARTS=-1 is negative; it counts restarts");
}

TEST(EnvironmentTest, NprocPerNodeMakesAProcessLauncherNodeLevel) {
  // `srun --ntasks-per-node=1 dtrain launch --nproc-per-node 4` on node 1 of 2.
  EnvironmentMap env = SlurmStepTask();
  env["SLURM_NTASKS"] = "2";
  env["SLURM_STEP_TASKS_PER_NODE"] = "1(x2)";
  env["SLURM_PROCID"] = "1";
  env["SLURM_LOCALID"] = "0";
  WorldOverrides flags;
  flags.nproc_per_node = 4;
  const WorldEnvironment world = Resolve(env, flags);
  EXPECT_EQ(world.source, WorldSource::kSlurm);
  EXPECT_EQ(world.node_rank, 1);
  EXPECT_EQ(world.num_nodes, 2);
  EXPECT_EQ(world.local_world_size, 4);
  EXPECT_EQ(world.world_size, 8);
  EXPECT_EQ(world.rank, 4);
  EXPECT_EQ(world.local_rank, 0);
  EXPECT_EQ(world.provenance.at("local_world_size"), "flag --nproc-per-node 4");
  EXPECT_EQ(world.provenance.at("world_size"), "derived from num_nodes x local_world_size");
  EXPECT_EQ(world.provenance.at("rank"), "derived from node_rank x local_world_size + local_rank");
}

TEST(EnvironmentTest, NprocPerNodeAloneIsOneLocalNode) {
  WorldOverrides flags;
  flags.nproc_per_node = 4;
  const WorldEnvironment world = Resolve({}, flags);
  EXPECT_EQ(world.source, WorldSource::kSingle);
  EXPECT_EQ(world.world_size, 4);
  EXPECT_EQ(world.num_nodes, 1);
  EXPECT_EQ(world.master_addr, "127.0.0.1");
  EXPECT_EQ(world.provenance.at("master_addr"), "default (one node: num_nodes 1)");
}

TEST(EnvironmentTest, PyTorchJobV1PrefersPetVariables) {
  const WorldEnvironment world = Resolve({{"MASTER_ADDR", "train-master-0"},
                                          {"MASTER_PORT", "23456"},
                                          {"RANK", "2"},
                                          {"WORLD_SIZE", "3"},
                                          {"PET_NNODES", "3"},
                                          {"PET_NPROC_PER_NODE", "4"},
                                          {"PET_NODE_RANK", "2"}});
  EXPECT_EQ(world.source, WorldSource::kPyTorchJob);
  EXPECT_EQ(world.node_rank, 2);
  EXPECT_EQ(world.num_nodes, 3);
  EXPECT_EQ(world.local_world_size, 4);
  EXPECT_EQ(world.world_size, 12);
  EXPECT_EQ(world.rank, 8);  // RANK=2 is the pod index, not the worker rank
  EXPECT_EQ(world.master_addr, "train-master-0");
  EXPECT_EQ(world.master_port, 23456);
  EXPECT_EQ(world.provenance.at("node_rank"), "PET_NODE_RANK=2");
  EXPECT_STREQ(WorldSourceName(world.source), "pytorchjob");
}

TEST(EnvironmentTest, PyTorchJobV1WithoutPetNodeRankUsesRank) {
  const WorldEnvironment world = Resolve({{"MASTER_ADDR", "train-master-0"},
                                          {"RANK", "1"},
                                          {"WORLD_SIZE", "2"},
                                          {"PET_NPROC_PER_NODE", "2"}});
  EXPECT_EQ(world.node_rank, 1);
  EXPECT_EQ(world.num_nodes, 2);
  EXPECT_EQ(world.rank, 2);
  EXPECT_EQ(world.provenance.at("node_rank"), "RANK=1");
}

// A pod's RANK and WORLD_SIZE with nothing naming the node, at node level (dtrain launch): an
// error, where each pod became a job of one node.
TEST(EnvironmentTest, NodeLevelProcessVariablesWithoutTheNodeAreAnError) {
  WorldOverrides launch;
  launch.nproc_per_node = 1;
  EXPECT_THAT(Error({{"MASTER_ADDR", "m"}, {"RANK", "1"}, {"WORLD_SIZE", "2"}}, launch),
              HasSubstr("RANK=1 and WORLD_SIZE=2 place one process of a larger world, but dtrain "
                        "launch starts the processes of a node itself"));
  EXPECT_EQ(Resolve({{"RANK", "0"}, {"WORLD_SIZE", "1"}}, launch).num_nodes, 1);
  // A WORLD_SIZE of this node's own processes is no other node's.
  launch.nproc_per_node = 8;
  EXPECT_EQ(Resolve({{"WORLD_SIZE", "8"}}, launch).world_size, 8);
  EXPECT_THAT(Error({{"MASTER_ADDR", "m"}, {"WORLD_SIZE", "16"}}, launch),
              HasSubstr("RANK=(unset) and WORLD_SIZE=16 place one process"));
  launch.num_nodes = 2;
  launch.node_rank = 1;
  EXPECT_EQ(Resolve({{"MASTER_ADDR", "m"}, {"RANK", "1"}, {"WORLD_SIZE", "2"}}, launch).node_rank,
            1);
}

TEST(EnvironmentTest, TrainerV2) {
  const WorldEnvironment world = Resolve({{"PET_NNODES", "2"},
                                          {"PET_NPROC_PER_NODE", "8"},
                                          {"PET_NODE_RANK", "1"},
                                          {"PET_MASTER_ADDR", "tj-node-0-0.tj"},
                                          {"PET_MASTER_PORT", "29500"}});
  EXPECT_EQ(world.source, WorldSource::kTrainerV2);
  EXPECT_EQ(world.rank, 8);
  EXPECT_EQ(world.world_size, 16);
  EXPECT_EQ(world.master_addr, "tj-node-0-0.tj");
  EXPECT_EQ(world.provenance.at("master_addr"), "PET_MASTER_ADDR=tj-node-0-0.tj");
  EXPECT_STREQ(WorldSourceName(world.source), "trainer-v2");
}

TEST(EnvironmentTest, TrainerV2ElasticNodeRange) {
  EXPECT_EQ(
      Resolve({{"PET_NNODES", "2:2"}, {"PET_NODE_RANK", "0"}, {"PET_MASTER_ADDR", "m"}}).num_nodes,
      2);
  EXPECT_EQ(Error({{"PET_NNODES", "1:4"}, {"PET_NODE_RANK", "0"}, {"PET_MASTER_ADDR", "m"}}),
            "PET_NNODES=1:4 is an elastic range; dtrain needs a fixed node count: set "
            "DTRAIN_NUM_NODES or --nnodes");
}

TEST(EnvironmentTest, TorchrunInsideATrainerV2Pod) {
  const WorldEnvironment world = Resolve({{"PET_NNODES", "2"},
                                          {"PET_NPROC_PER_NODE", "2"},
                                          {"PET_NODE_RANK", "1"},
                                          {"PET_MASTER_ADDR", "m"},
                                          {"RANK", "3"},
                                          {"LOCAL_RANK", "1"},
                                          {"WORLD_SIZE", "4"},
                                          {"LOCAL_WORLD_SIZE", "2"},
                                          {"MASTER_ADDR", "m"},
                                          {"MASTER_PORT", "29500"}});
  EXPECT_EQ(world.source, WorldSource::kTorchrun);
  EXPECT_EQ(world.rank, 3);
}

TEST(EnvironmentTest, IndexedJob) {
  const WorldEnvironment world = Resolve({{"JOB_COMPLETION_INDEX", "3"},
                                          {"DTRAIN_NUM_NODES", "4"},
                                          {"DTRAIN_MASTER_ADDR", "train-0.svc"}});
  EXPECT_EQ(world.source, WorldSource::kIndexedJob);
  EXPECT_EQ(world.node_rank, 3);
  EXPECT_EQ(world.num_nodes, 4);
  EXPECT_EQ(world.rank, 3);
  EXPECT_EQ(world.world_size, 4);
  EXPECT_EQ(world.master_addr, "train-0.svc");
  EXPECT_STREQ(WorldSourceName(world.source), "indexed-job");
}

TEST(EnvironmentTest, IndexedJobNeedsMasterAndNodeCount) {
  EXPECT_EQ(Error({{"JOB_COMPLETION_INDEX", "0"}}),
            "indexed-job: node rank 0 (JOB_COMPLETION_INDEX=0) but no node count: set "
            "DTRAIN_NUM_NODES (or --nnodes) to the number of pods");
  EXPECT_THAT(Error({{"JOB_COMPLETION_INDEX", "0"}, {"DTRAIN_NUM_NODES", "2"}}),
              HasSubstr("set DTRAIN_MASTER_ADDR=<job>-0.<subdomain>"));
}

TEST(EnvironmentTest, JobSet) {
  const WorldEnvironment world = Resolve({{"JOBSET_JOB_INDEX", "1"},
                                          {"DTRAIN_PODS_PER_JOB", "2"},
                                          {"JOB_COMPLETION_INDEX", "1"},
                                          {"JOBSET_RESTART_ATTEMPT", "2"},
                                          {"DTRAIN_NUM_NODES", "4"},
                                          {"DTRAIN_LOCAL_WORLD_SIZE", "2"},
                                          {"DTRAIN_MASTER_ADDR", "js-workers-0-0.js"}});
  EXPECT_EQ(world.source, WorldSource::kJobSet);
  EXPECT_EQ(world.node_rank, 3);
  EXPECT_EQ(world.num_nodes, 4);
  EXPECT_EQ(world.rank, 6);
  EXPECT_EQ(world.world_size, 8);
  EXPECT_EQ(world.restart_count, 2);
  EXPECT_EQ(world.provenance.at("node_rank"),
            "derived from JOBSET_JOB_INDEX=1 x DTRAIN_PODS_PER_JOB=2 + JOB_COMPLETION_INDEX=1");
  EXPECT_STREQ(WorldSourceName(world.source), "jobset");
}

TEST(EnvironmentTest, JobSetErrors) {
  EXPECT_THAT(Error({{"JOBSET_JOB_INDEX", "1"}, {"DTRAIN_NUM_NODES", "2"}}),
              HasSubstr("set DTRAIN_MASTER_ADDR=<jobset>-<replicated-job>-0-0.<subdomain>"));
  EXPECT_THAT(Error({{"JOBSET_JOB_INDEX", "0"},
                     {"JOB_COMPLETION_INDEX", "2"},
                     {"DTRAIN_PODS_PER_JOB", "2"},
                     {"DTRAIN_NUM_NODES", "4"},
                     {"DTRAIN_MASTER_ADDR", "m"}}),
              HasSubstr("JOB_COMPLETION_INDEX=2 must be below DTRAIN_PODS_PER_JOB=2"));
  EXPECT_EQ(Error({{"JOBSET_JOB_INDEX", "x"}, {"DTRAIN_NUM_NODES", "2"}}),
            "JOBSET_JOB_INDEX='x' is not an integer; set it to a whole number");
  EXPECT_THAT(Error({{"JOBSET_JOB_INDEX", "0"}}), HasSubstr("jobset: node rank 0"));
}

TEST(EnvironmentTest, LeaderWorkerSet) {
  const WorldEnvironment world = Resolve(
      {{"LWS_LEADER_ADDRESS", "lws-0.lws"}, {"LWS_GROUP_SIZE", "4"}, {"LWS_WORKER_INDEX", "2"}});
  EXPECT_EQ(world.source, WorldSource::kLeaderWorkerSet);
  EXPECT_EQ(world.node_rank, 2);
  EXPECT_EQ(world.num_nodes, 4);
  EXPECT_EQ(world.rank, 2);
  EXPECT_EQ(world.master_addr, "lws-0.lws");
  EXPECT_EQ(world.provenance.at("num_nodes"), "LWS_GROUP_SIZE=4");
  EXPECT_STREQ(WorldSourceName(world.source), "leaderworkerset");
}

TEST(EnvironmentTest, PodLevelSourceWithWorkersPerNodeFlag) {
  WorldOverrides flags;
  flags.nproc_per_node = 8;
  const WorldEnvironment world = Resolve(
      {{"LWS_LEADER_ADDRESS", "l"}, {"LWS_GROUP_SIZE", "2"}, {"LWS_WORKER_INDEX", "1"}}, flags);
  EXPECT_EQ(world.source, WorldSource::kLeaderWorkerSet);
  EXPECT_EQ(world.world_size, 16);
  EXPECT_EQ(world.rank, 8);
}

TEST(EnvironmentTest, OpenMpi) {
  const WorldEnvironment world = Resolve({{"OMPI_COMM_WORLD_RANK", "3"},
                                          {"OMPI_COMM_WORLD_SIZE", "4"},
                                          {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                          {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                          {"MASTER_ADDR", "head"}});
  EXPECT_EQ(world.source, WorldSource::kOpenMpi);
  EXPECT_EQ(world.rank, 3);
  EXPECT_EQ(world.local_rank, 1);
  EXPECT_EQ(world.node_rank, 1);
  EXPECT_EQ(world.num_nodes, 2);
  EXPECT_STREQ(WorldSourceName(world.source), "openmpi");
}

TEST(EnvironmentTest, MpiNeedsAMasterFromElsewhere) {
  EXPECT_THAT(Error({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}}),
              HasSubstr("MPI publishes no master address: export it to every rank, e.g. mpirun -x "
                        "MASTER_ADDR=$(hostname)"));
  EXPECT_EQ(Resolve({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}}).master_addr,
            "127.0.0.1");
}

TEST(EnvironmentTest, Pmi) {
  const WorldEnvironment world =
      Resolve({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"DTRAIN_MASTER_ADDR", "head"}});
  EXPECT_EQ(world.source, WorldSource::kPmi);
  EXPECT_EQ(world.rank, 1);
  EXPECT_EQ(world.world_size, 2);
  EXPECT_EQ(world.master_addr, "head");
  EXPECT_THAT(Error({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}}), HasSubstr("MPI publishes no master"));
  EXPECT_STREQ(WorldSourceName(world.source), "pmi");
}

TEST(EnvironmentTest, SlurmWinsOverMpiAndKubernetes) {
  EnvironmentMap env = SlurmStepTask();
  env["PMI_RANK"] = "0";
  env["PMI_SIZE"] = "1";
  env["JOB_COMPLETION_INDEX"] = "0";
  EXPECT_EQ(Resolve(env).source, WorldSource::kSlurm);
}

TEST(EnvironmentTest, MoreLocalProcessesThanGpus) {
  EnvironmentMap env = SlurmStepTask();
  env["SLURM_GPUS_ON_NODE"] = "2";
  WorldOverrides flags;
  EXPECT_EQ(Resolve(env, flags).visible_gpus, 2);  // not checked unless the process uses GPUs
  flags.uses_gpus = true;
  EXPECT_EQ(Error(env, flags),
            "local world size 4 (SLURM_STEP_TASKS_PER_NODE=4(x2) at SLURM_NODEID=1) is more than "
            "the 2 GPUs on this node (SLURM_GPUS_ON_NODE=2): start at most one process per GPU "
            "(--nproc-per-node, srun --ntasks-per-node)");
  env["SLURM_GPUS_ON_NODE"] = "4";
  EXPECT_TRUE(ResolveWorld(env, flags).ok());
}

TEST(EnvironmentTest, VisibleDevicesCountGpus) {
  WorldOverrides flags;
  flags.uses_gpus = true;
  flags.nproc_per_node = 4;
  EXPECT_THAT(Error({{"CUDA_VISIBLE_DEVICES", "0,1"}}, flags),
              HasSubstr("is more than the 2 GPUs on this node (CUDA_VISIBLE_DEVICES=0,1)"));
  EXPECT_EQ(Resolve({{"CUDA_VISIBLE_DEVICES", "0,1,2,3"}}, flags).visible_gpus, 4);
  EXPECT_EQ(Resolve({{"CUDA_VISIBLE_DEVICES", "GPU-aa,GPU-bb,-1,3"}}).visible_gpus, 2);
  // CUDA stops at a repeated index, as dtrain launch --nproc-per-node gpu counts (FindGpus).
  EXPECT_EQ(Resolve({{"CUDA_VISIBLE_DEVICES", "0,0,1"}}).visible_gpus, 1);
  // One visible GPU: the launcher bound this process to its own device.
  EXPECT_TRUE(ResolveWorld({{"CUDA_VISIBLE_DEVICES", "3"}}, flags).ok());
  EXPECT_THAT(Error({{"CUDA_VISIBLE_DEVICES", ""}}, flags),
              HasSubstr("no GPU is visible to this process (CUDA_VISIBLE_DEVICES=)"));
}

TEST(EnvironmentTest, WorldFromEnvironmentReadsTheProcess) {
  setenv("DTRAIN_TEST_ONLY_VARIABLE", "x", 1);
  EXPECT_EQ(ProcessEnvironment().at("DTRAIN_TEST_ONLY_VARIABLE"), "x");
  unsetenv("DTRAIN_TEST_ONLY_VARIABLE");
  EXPECT_TRUE(WorldFromEnvironment().ok());
}

// A stale MASTER_ADDR=localhost (a single-node export) in a Slurm job of two nodes overrides
// its node list: refused at once (exit 2), naming the job's first node, where the other node
// waited out its rendezvous timeout. A MASTER_ADDR of another host is the user's choice.
TEST(EnvironmentTest, ALoopbackMasterOverSlurmsNodesIsRefused) {
  EnvironmentMap env = SlurmStepTask();
  env["MASTER_ADDR"] = "localhost";
  const WorldEnvironment world = Resolve(env);
  EXPECT_EQ(world.slurm_first_host, "gpu07");
  const absl::Status status = CheckMasterResolves(world);
  EXPECT_EQ(ExitCodeOf(status), kExitUsage);
  EXPECT_THAT(status.message(),
              HasSubstr("master address 'localhost' (MASTER_ADDR=localhost) is a loopback "
                        "address, but this Slurm job spans 2 nodes, the first of them gpu07: the "
                        "other nodes cannot reach a store there; unset MASTER_ADDR"));
  env["MASTER_ADDR"] = "10.1.2.3";
  EXPECT_TRUE(CheckMasterResolves(Resolve(env)).ok());
  env.erase("MASTER_ADDR");
  EXPECT_EQ(Resolve(env).slurm_first_host, "");
}

TEST(EnvironmentTest, CheckMasterResolvesNamesHostAndSource) {
  WorldEnvironment world;
  world.master_addr = "127.0.0.1";
  EXPECT_TRUE(CheckMasterResolves(world).ok());
  world.master_addr = "no-such-host.invalid";
  world.provenance["master_addr"] = "MASTER_ADDR=no-such-host.invalid";
  const absl::Status status = CheckMasterResolves(world);
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(status.message(),
              HasSubstr("master address 'no-such-host.invalid' (MASTER_ADDR=no-such-host.invalid) "
                        "does not resolve"));
  // Asked again for the wait, then the same error, saying how long it waited.
  EXPECT_THAT(CheckMasterResolves(world, absl::Seconds(1.5)).message(),
              HasSubstr("does not resolve within 1.5s: "));
}

}  // namespace
}  // namespace dtrain
