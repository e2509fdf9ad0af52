// `dtrain doctor` across two "nodes": this host's network namespace (node 0, which hosts the
// store) and a second namespace joined to it by a veth pair. The doctor runs as two processes,
// as `srun dtrain doctor` would start them: with the link up node 0 summarises both nodes; with
// the second namespace's link down its node is named by node 0 and by itself, within the
// timeout; with a private folder mounted over the checkpoint folder on the second node, the
// shared-folder check names that node. Needs root and `ip netns`; skipped otherwise.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/free_port.h"
#include "tests/testing/run_dtrain.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;

constexpr char kNamespace[] = "dtrain-doctor-test";
constexpr char kNodeZeroAddress[] = "10.213.9.1";
constexpr char kNodeOneAddress[] = "10.213.9.2";

int Shell(const std::string& command) { return system(command.c_str()); }

// ctest runs each test of this suite as its own process, two at a time: the namespace, the veth
// pair and the addresses are one per machine, so a test holds this lock while they exist.
class MachineLock {
 public:
  MachineLock() : fd_(open("/tmp/dtrain-doctor-netns.lock", O_CREAT | O_RDWR, 0644)) {
    if (fd_ >= 0) flock(fd_, LOCK_EX);
  }
  ~MachineLock() {
    if (fd_ >= 0) close(fd_);
  }
  MachineLock(const MachineLock&) = delete;
  MachineLock& operator=(const MachineLock&) = delete;

 private:
  int fd_;
};

class SecondNode {
 public:
  SecondNode() {
    Remove();
    ok_ = Shell(absl::StrCat(
              "ip netns add ", kNamespace,
              " && ip link add dtrain-dr0 type veth peer name dtrain-dr1",
              " && ip link set dtrain-dr1 netns ", kNamespace, " && ip addr add ", kNodeZeroAddress,
              "/24 dev dtrain-dr0 && ip link set dtrain-dr0 up", " && ip -n ", kNamespace,
              " addr add ", kNodeOneAddress, "/24 dev dtrain-dr1 && ip -n ", kNamespace,
              " link set dtrain-dr1 up && ip -n ", kNamespace, " link set lo up")) == 0;
  }
  ~SecondNode() { Remove(); }
  bool ok() const { return ok_; }
  bool CutOff() {
    return Shell(absl::StrCat("ip -n ", kNamespace, " link set dtrain-dr1 down")) == 0;
  }

 private:
  static void Remove() {
    Shell(absl::StrCat("ip netns del ", kNamespace,
                       " 2>/dev/null; ip link del dtrain-dr0 2>/dev/null"));
  }
  bool ok_ = false;
};

struct ShellRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

ShellRun RunShell(const std::string& command) {
  ShellRun run;
  FILE* pipe = popen(absl::StrCat(command, " 2>&1").c_str(), "r");
  if (pipe == nullptr) return run;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) run.output.append(buffer, n);
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

class DoctorNetnsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0 || Shell("ip netns list >/dev/null 2>&1") != 0) {
      GTEST_SKIP() << "needs root and ip netns";
    }
    ASSERT_TRUE(node_.ok()) << "could not set up the network namespace " << kNamespace;
    out_dir_ = testing::FreshTempDir("doctor_netns_out");
    std::filesystem::create_directories(out_dir_);
    port_ = testing::FreeTcpPort();
  }

  // `dtrain doctor` as rank `rank` of 2, node 1 inside the namespace; `before` runs first there.
  std::string Command(int rank, const std::string& before = "") const {
    const std::string env =
        absl::StrCat("env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin SLURMD_NODENAME=node", rank,
                     " DTRAIN_RANK=", rank, " DTRAIN_WORLD_SIZE=2 DTRAIN_LOCAL_RANK=0",
                     " DTRAIN_LOCAL_WORLD_SIZE=1 DTRAIN_NODE_RANK=", rank,
                     " DTRAIN_NUM_NODES=2 DTRAIN_MASTER_ADDR=", kNodeZeroAddress,
                     " DTRAIN_MASTER_PORT=", port_, " DTRAIN_RDZV_TOKEN=doctor-netns-test");
    const std::string doctor =
        absl::StrCat(env, " ", DTRAIN_BINARY, " doctor ", DTRAIN_SOURCE_DIR,
                     "/configs/tiny.yaml --set ", "run.out_dir=", out_dir_,
                     " --timeout 5 --hostname ", rank == 0 ? kNodeZeroAddress : kNodeOneAddress);
    if (rank == 0) return doctor;
    return absl::StrCat("ip netns exec ", kNamespace, " sh -c '", before, doctor, "'");
  }

  // Both ranks at once; node 0's run and node 1's.
  std::pair<ShellRun, ShellRun> RunBoth(const std::string& node_one_before = "") {
    std::future<ShellRun> node_one =
        std::async(std::launch::async, RunShell, Command(1, node_one_before));
    ShellRun node_zero = RunShell(Command(0));
    return {node_zero, node_one.get()};
  }

  MachineLock lock_;  // before node_: held from before it is made until after it is removed
  SecondNode node_;
  std::string out_dir_;
  int port_ = 0;
};

TEST_F(DoctorNetnsTest, NodeZeroSummarisesBothNodes) {
  const auto [zero, one] = RunBoth();
  EXPECT_THAT(zero.output, HasSubstr("== node1 (rank 1)\n"));
  EXPECT_THAT(zero.output,
              ::testing::ContainsRegex("ok +cluster.reach +reached the master 10.213.9.1:"));
  EXPECT_THAT(zero.output,
              ::testing::ContainsRegex("ok +cluster.clock +node1 \\(rank 1\\)'s clock"));
  // The checkpoint folder does not exist yet: its nearest existing parent is checked.
  EXPECT_THAT(zero.output, HasSubstr(absl::StrCat(out_dir_, " is node 0's folder here too")));
  EXPECT_THAT(zero.output, HasSubstr("all-reduce of 64 MiB over 2 nodes (Gloo): bus bandwidth"));
  EXPECT_THAT(zero.output, HasSubstr("== verdict per node\n"));
  // Node 1 reached node 0, so the summary holds its report and it prints nothing of its own.
  EXPECT_EQ(one.output.find("== node1"), std::string::npos) << one.output;
}

TEST_F(DoctorNetnsTest, NodeThatCannotReachTheMasterIsNamedWithinTheTimeout) {
  ASSERT_TRUE(node_.CutOff());
  const auto start = std::chrono::steady_clock::now();
  const auto [zero, one] = RunBoth();
  // A safety cap, far above the 5 s timeout: the point is that neither side hangs.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
  EXPECT_EQ(zero.exit_code, 1) << zero.output;
  EXPECT_THAT(
      zero.output,
      HasSubstr(absl::StrCat("rank 1 did not reach the master 10.213.9.1:", port_, " within 5s")));
  EXPECT_THAT(zero.output, HasSubstr(absl::StrCat("nc -zv 10.213.9.1 ", port_)));
  EXPECT_THAT(zero.output, ::testing::ContainsRegex("fail +rank 1\n"));
  EXPECT_EQ(one.exit_code, 1) << one.output;
  EXPECT_THAT(one.output,
              HasSubstr(absl::StrCat("node1 (rank 1) cannot reach the master 10.213.9.1:", port_)));
}

TEST_F(DoctorNetnsTest, CheckpointFolderThatIsNotSharedNamesTheNode) {
  // The namespace's process has its own mount namespace (ip netns exec): a tmpfs over the
  // folder there is that node's own folder, as a node-local disk would be.
  const auto [zero, one] = RunBoth(absl::StrCat("mount -t tmpfs none ", out_dir_, " && "));
  EXPECT_EQ(zero.exit_code, 1) << zero.output;
  EXPECT_THAT(zero.output, ::testing::ContainsRegex("fail +cluster.checkpoint_shared +node1 "
                                                    "\\(rank 1\\) does not see the file"));
  EXPECT_THAT(zero.output, HasSubstr("checkpoint.dir is not shared"));
  EXPECT_THAT(zero.output, ::testing::ContainsRegex("fail +node1 \\(rank 1\\)\n"));
}

}  // namespace
}  // namespace dtrain
