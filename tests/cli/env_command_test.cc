// Runs `dtrain env` in a controlled environment (env -i, so the test machine's own variables do
// not leak in) and checks the printed values, their provenance and the JSON form.
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/run_dtrain.h"

namespace dtrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;
using testing::Outcome;

// `env -i <assignments> dtrain <args>`: only the given variables reach the binary.
Outcome RunDtrainInEnvironment(const std::string& assignments, const std::string& args) {
  return testing::RunDtrain(args, "env -i " + assignments);
}

constexpr char kSlurmTask[] =
    "SLURM_JOB_ID=77 SLURM_STEP_ID=0 SLURM_PROCID=5 SLURM_LOCALID=1 SLURM_NODEID=1 "
    "SLURM_NTASKS=8 SLURM_NNODES=2 'SLURM_STEP_NODELIST=gpu[07-08]' "
    "'SLURM_STEP_TASKS_PER_NODE=4(x2)' SLURM_LAUNCH_NODE_IPADDR=10.0.0.1 "
    "DTRAIN_RDZV_TOKEN=topsecret";

TEST(EnvCommandTest, PrintsEachFieldWithItsProvenance) {
  const Outcome outcome = RunDtrainInEnvironment(kSlurmTask, "env");
  ASSERT_EQ(outcome.exit_code, 0) << outcome.stderr_text;
  const std::string& text = outcome.stdout_text;
  EXPECT_THAT(text, HasSubstr("source: slurm\n"));
  EXPECT_THAT(text, MatchesRegex("(.|\n)*\nrank +5 +SLURM_PROCID=5\n(.|\n)*"));
  EXPECT_THAT(text, MatchesRegex("(.|\n)*\nworld_size +8 +SLURM_NTASKS=8\n(.|\n)*"));
  EXPECT_THAT(text,
              MatchesRegex("(.|\n)*\nlocal_world_size +4 +SLURM_STEP_TASKS_PER_NODE=4\\(x2\\) "
                           "at SLURM_NODEID=1\n(.|\n)*"));
  EXPECT_THAT(text, MatchesRegex("(.|\n)*\nmaster_addr +gpu07 +first host of "
                                 "SLURM_STEP_NODELIST=gpu\\[07-08\\]\n(.|\n)*"));
  EXPECT_THAT(text, MatchesRegex("(.|\n)*\nmaster_port +[0-9]+ +derived from SLURM_JOB_ID=77,"
                                 "SLURM_STEP_ID=0\n(.|\n)*"));
  EXPECT_THAT(text, MatchesRegex("(.|\n)*\nrun_id +77\\.0 +derived from (.|\n)*"));
  EXPECT_THAT(text, MatchesRegex("(.|\n)*\nrdzv_token +\\(set\\) +DTRAIN_RDZV_TOKEN \\(set, 9 "
                                 "characters\\)\n(.|\n)*"));
  EXPECT_THAT(text, Not(HasSubstr("topsecret")));
  EXPECT_THAT(text, Not(HasSubstr("10.0.0.1")));
}

TEST(EnvCommandTest, JsonHasValuesSourceAndProvenance) {
  const Outcome outcome = RunDtrainInEnvironment(kSlurmTask, "env --json");
  ASSERT_EQ(outcome.exit_code, 0) << outcome.stderr_text;
  const nlohmann::json json = nlohmann::json::parse(outcome.stdout_text);
  EXPECT_EQ(json["source"], "slurm");
  EXPECT_EQ(json["rank"], 5);
  EXPECT_EQ(json["world_size"], 8);
  EXPECT_EQ(json["master_addr"], "gpu07");
  EXPECT_EQ(json["run_id"], "77.0");
  EXPECT_EQ(json["slurm_batch_shell"], false);
  EXPECT_EQ(json["provenance"]["rank"], "SLURM_PROCID=5");
  EXPECT_EQ(json["provenance"]["master_addr"], "first host of SLURM_STEP_NODELIST=gpu[07-08]");
  EXPECT_THAT(outcome.stdout_text, Not(HasSubstr("topsecret")));
}

TEST(EnvCommandTest, FlagsOverrideTheEnvironment) {
  const Outcome outcome =
      RunDtrainInEnvironment("DTRAIN_MAX_RESTARTS=2",
                             "env --json --nproc-per-node 4 --master-port 31000 --max-restarts 3");
  ASSERT_EQ(outcome.exit_code, 0) << outcome.stderr_text;
  const nlohmann::json json = nlohmann::json::parse(outcome.stdout_text);
  EXPECT_EQ(json["source"], "single");
  EXPECT_EQ(json["world_size"], 4);
  EXPECT_EQ(json["master_port"], 31000);
  EXPECT_EQ(json["max_restarts"], 3);
  EXPECT_EQ(json["provenance"]["local_world_size"], "flag --nproc-per-node 4");
  EXPECT_EQ(json["provenance"]["master_port"], "flag --master-port 31000");
  EXPECT_EQ(json["provenance"]["max_restarts"], "flag --max-restarts 3");
}

TEST(EnvCommandTest, OneProcessByDefault) {
  const Outcome outcome = RunDtrainInEnvironment("", "env");
  ASSERT_EQ(outcome.exit_code, 0) << outcome.stderr_text;
  EXPECT_THAT(outcome.stdout_text, HasSubstr("source: single\n"));
  EXPECT_THAT(
      outcome.stdout_text,
      MatchesRegex("(.|\n)*\nmaster_addr +127\\.0\\.0\\.1 +default \\(one process\\)\n(.|\n)*"));
  EXPECT_THAT(outcome.stdout_text, Not(HasSubstr("MASTER_ADDR")));
  // A MASTER_ADDR without a world beside it is said to be unused (it was passed over without a
  // word), but not in a batch shell, whose ranks srun starts with it.
  const Outcome alone = RunDtrainInEnvironment("MASTER_ADDR=bogus.invalid", "env");
  ASSERT_EQ(alone.exit_code, 0) << alone.stderr_text;
  EXPECT_THAT(alone.stdout_text, HasSubstr("note: MASTER_ADDR=bogus.invalid is set and unused: no "
                                           "rank or world size is set beside it\n"));
  const Outcome batch = RunDtrainInEnvironment(
      "SLURM_JOB_ID=77 SLURM_NTASKS=8 SLURM_JOB_NUM_NODES=2 MASTER_ADDR=gpu07", "env");
  EXPECT_THAT(batch.stdout_text, Not(HasSubstr("unused")));
}

TEST(EnvCommandTest, BatchShellSaysItIsNotARank) {
  const Outcome outcome = RunDtrainInEnvironment(
      "SLURM_JOB_ID=77 SLURM_NTASKS=8 'SLURM_JOB_NODELIST=gpu[07-08]' SLURM_JOB_NUM_NODES=2",
      "env");
  ASSERT_EQ(outcome.exit_code, 0) << outcome.stderr_text;
  EXPECT_THAT(outcome.stdout_text, MatchesRegex("(.|\n)*\nslurm_batch_shell +true +(.|\n)*"));
  EXPECT_THAT(outcome.stdout_text, HasSubstr("note: this is a Slurm batch shell, not a rank"));
}

TEST(EnvCommandTest, InconsistentEnvironmentExits2WithTheMessage) {
  const Outcome outcome = RunDtrainInEnvironment("RANK=1 WORLD_SIZE=2", "env");
  EXPECT_EQ(outcome.exit_code, 2);
  EXPECT_THAT(outcome.stderr_text, HasSubstr("error: world size 2 (WORLD_SIZE=2) but MASTER_ADDR "
                                             "is not set"));
  EXPECT_EQ(outcome.stdout_text, "");
}

// JSON cannot carry the byte 0xff: the variable is named instead of aborting in the writer.
TEST(EnvCommandTest, JsonOfAVariableThatIsNotUtf8NamesIt) {
  const Outcome outcome =
      RunDtrainInEnvironment("MASTER_ADDR=\"$(printf 'host\\377')\"", "env --json");
  EXPECT_EQ(outcome.exit_code, 2);
  EXPECT_THAT(outcome.stderr_text, AllOf(HasSubstr("master_addr 'host\\xff' (from MASTER_ADDR"),
                                         HasSubstr("is not UTF-8 text")));
  EXPECT_EQ(outcome.stdout_text, "");
}

TEST(EnvCommandTest, CheckMasterReportsAnUnresolvableHost) {
  const Outcome outcome = RunDtrainInEnvironment(
      "RANK=0 WORLD_SIZE=2 MASTER_ADDR=no-such-host.invalid", "env --check-master");
  EXPECT_EQ(outcome.exit_code, 2);  // as for any wrong setting: asking again does not mend it
  EXPECT_THAT(outcome.stderr_text,
              HasSubstr("master address 'no-such-host.invalid' (MASTER_ADDR=no-such-host.invalid) "
                        "does not resolve"));
}

}  // namespace
}  // namespace dtrain
