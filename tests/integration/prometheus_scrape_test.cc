// logging.metrics_port against the real Prometheus server (Debian's `prometheus`): a 2-process
// `dtrain train` serves /metrics per worker, Prometheus scrapes both and answers queries for them
// through its HTTP API; a busy port warns and the run still finishes.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/util/exit_codes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tests/testing/multi_process.h"
#include "tests/testing/run_dtrain.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string RecipeFile() {
  std::string text;
  for (int i = 0; i < 500; ++i) {
    absl::StrAppend(&text, "How vexingly quick daft zebras jump ", i % 9, "!\n");
  }
  const std::string data = testing::WriteTempFile("prom_text.txt", text);
  return testing::WriteTempFile("prom.yaml", absl::StrCat(R"(
run: {name: prom, seed: 11, threads: 1}
model: {n_layer: 2, n_head: 2, d_model: 32, max_seq_len: 32}
data: {train: [)",
                                                          data, R"(]}
train: {steps: 4, batch_size: 4, micro_batch: 1, seq_len: 16, warmup_steps: 2, eval_every: 0}
parallel: {timeout_s: 30}
checkpoint: {interval: 0}
)"));
}

std::vector<std::string> TrainArgs(const std::vector<std::string>& sets) {
  // The workers' /metrics on loopback only.
  std::vector<std::string> argv = {DTRAIN_BINARY,
                                   "train",
                                   RecipeFile(),
                                   "--set",
                                   "run.out_dir=" + testing::FreshTempDir("prom_out"),
                                   "--set",
                                   "logging.metrics_address=127.0.0.1"};
  for (const std::string& set : sets) argv.insert(argv.end(), {"--set", set});
  return argv;
}

// `prometheus` scraping `targets` every second, on a free loopback port, its data in a fresh
// folder; killed when destroyed.
class PrometheusServer {
 public:
  explicit PrometheusServer(const std::vector<std::string>& targets)
      : port_(testing::FreeTcpPort()), log_(testing::TempPath("prometheus.log")) {
    std::string quoted;
    for (const std::string& target : targets) {
      absl::StrAppend(&quoted, quoted.empty() ? "" : ", ", "'", target, "'");
    }
    // honor_labels: the workers' own `job` label (the run) is kept instead of being renamed
    // exported_job, as scripts/prometheus/prometheus.yml does.
    const std::string config = testing::WriteTempFile(
        "prometheus.yml", absl::StrCat("global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
                                       "scrape_configs:\n"
                                       "  - job_name: dtrain\n"
                                       "    honor_labels: true\n"
                                       "    static_configs: [{targets: [",
                                       quoted, "]}]\n"));
    const std::vector<std::string> argv = {
        "prometheus", "--config.file=" + config,
        "--storage.tsdb.path=" + testing::FreshTempDir("prometheus_data"),
        absl::StrCat("--web.listen-address=127.0.0.1:", port_)};
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      std::vector<char*> args;
      for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
      args.push_back(nullptr);
      execvp(args[0], args.data());
      _exit(127);
    }
  }
  ~PrometheusServer() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }

  // The result vector of an instant query (empty while Prometheus is not up or has no sample).
  nlohmann::json Query(const std::string& promql) const {
    httplib::Client client("127.0.0.1", port_);
    client.set_connection_timeout(1);
    client.set_read_timeout(5);
    const httplib::Result response =
        client.Get("/api/v1/query", httplib::Params{{"query", promql}}, httplib::Headers{});
    if (!response || response->status != 200) return nlohmann::json::array();
    const nlohmann::json body = nlohmann::json::parse(response->body, nullptr, false);
    if (!body.is_object() || body.value("status", "") != "success") return nlohmann::json::array();
    return body["data"]["result"];
  }

  std::string Log() const {
    std::ifstream in(log_);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  int port_;
  std::string log_;
  pid_t pid_ = -1;
};

// Each result's value by its rank label.
std::map<std::string, double> ByRank(const nlohmann::json& results) {
  std::map<std::string, double> values;
  for (const nlohmann::json& result : results) {
    values[result["metric"].value("rank", "?")] = std::stod(result["value"][1].get<std::string>());
  }
  return values;
}

TEST(PrometheusScrapeTest, PrometheusScrapesBothRanksOfARunningJob) {
  if (std::system("command -v prometheus >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "the prometheus server is not installed (apt-get install prometheus)";
  }
  // Worker local rank r serves metrics_port + r: two free ports.
  const int metrics_port = testing::FreeTcpPorts(2);
  const PrometheusServer prometheus(
      {absl::StrCat("127.0.0.1:", metrics_port), absl::StrCat("127.0.0.1:", metrics_port + 1)});
  nlohmann::json steps, sent, step_counts;
  absl::Time next_query = absl::Now();
  const absl::Time give_up = absl::Now() + absl::Seconds(150);
  bool stopped = false;
  // Trains until Prometheus has scraped both ranks, then SIGTERM stops the job (every rank saves
  // and exits 0); the queries run while the workers still serve, since Prometheus marks the
  // series of a target that went away stale.
  const std::vector<testing::RankResult> ranks = testing::RunLocalProcesses(
      TrainArgs({"train.steps=1000000", absl::StrCat("logging.metrics_port=", metrics_port),
                 "logging.every=1000"}),
      2, testing::FreeTcpPort(), absl::Seconds(240), [&](const std::vector<pid_t>& pids) {
        if (stopped || absl::Now() < next_query) return;
        next_query = absl::Now() + absl::Milliseconds(500);
        steps = prometheus.Query("dtrain_step");
        const std::map<std::string, double> by_rank = ByRank(steps);
        const bool scraped =
            by_rank.size() == 2 && by_rank.begin()->second >= 1 && by_rank.rbegin()->second >= 1;
        if (scraped) {
          sent = prometheus.Query("dtrain_sent_bytes_total{group=\"dp\"}");
          step_counts = prometheus.Query("dtrain_step_seconds_count");
        }
        if (scraped || absl::Now() > give_up) {
          for (const pid_t pid : pids) {
            if (pid > 0) kill(pid, SIGTERM);
          }
          stopped = true;
        }
      });
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_EQ(ranks[rank].exit_code, kExitStopped) << "rank " << rank << ":\n"
                                                   << ranks[rank].output;
  }
  ASSERT_EQ(steps.size(), 2u) << steps.dump() << "\nprometheus:\n" << prometheus.Log();
  for (const nlohmann::json& result : steps) {
    const nlohmann::json& labels = result["metric"];
    EXPECT_EQ(labels.value("job", ""), "prom") << labels.dump();
    EXPECT_EQ(labels.value("node", ""), "0") << labels.dump();
  }
  const std::map<std::string, double> step_by_rank = ByRank(steps);
  ASSERT_EQ(step_by_rank.size(), 2u) << steps.dump();
  EXPECT_GE(step_by_rank.at("0"), 1);
  EXPECT_GE(step_by_rank.at("1"), 1);
  // Both ranks take part in every step's gradient all-reduce, so each has sent data-parallel
  // bytes and timed steps by the time it reports one.
  const std::map<std::string, double> sent_by_rank = ByRank(sent);
  ASSERT_EQ(sent_by_rank.size(), 2u) << sent.dump();
  EXPECT_GT(sent_by_rank.at("0"), 0);
  EXPECT_GT(sent_by_rank.at("1"), 0);
  const std::map<std::string, double> counts_by_rank = ByRank(step_counts);
  ASSERT_EQ(counts_by_rank.size(), 2u) << step_counts.dump();
  EXPECT_GE(counts_by_rank.at("0"), 1);
  EXPECT_GE(counts_by_rank.at("1"), 1);
}

// Rank 1 listens on the held port + 1, which must stay free: both come from below the ephemeral
// range, where no other test's outgoing connection lands.
TEST(PrometheusScrapeTest, ABusyMetricsPortWarnsAndTrainingFinishes) {
  const testing::HeldTcpPort held(testing::FreeTcpPorts(2));
  ASSERT_GT(held.port(), 0) << "no free pair of ports below the ephemeral range";
  ASSERT_TRUE(held.bound());
  // Rank 0 finds its port (metrics_port + 0) taken; rank 1 serves on the next one.
  const std::vector<testing::RankResult> ranks =
      testing::RunLocalProcesses(TrainArgs({absl::StrCat("logging.metrics_port=", held.port())}), 2,
                                 testing::FreeTcpPort(), absl::Seconds(240));
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_EQ(ranks[rank].exit_code, 0) << "rank " << rank << ":\n" << ranks[rank].output;
  }
  EXPECT_THAT(ranks[0].output,
              HasSubstr(absl::StrCat("logging.metrics_port: cannot listen on 127.0.0.1 port ",
                                     held.port())));
  EXPECT_THAT(ranks[0].output, HasSubstr("training goes on"));
  EXPECT_THAT(ranks[0].output, HasSubstr("step 4/4"));
  EXPECT_THAT(ranks[1].output, Not(HasSubstr("logging.metrics_port")));
}

}  // namespace
}  // namespace dtrain
