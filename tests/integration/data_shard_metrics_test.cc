// dtrain_data_shards_read_total and dtrain_data_shards_skipped_total of a running `dtrain train`
// over WebDataset shards of which one is corrupt (data.on_error: skip_shard), scraped from its
// /metrics while it trains.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/core/data/tar_test_util.h"
#include "tests/testing/free_port.h"
#include "tests/testing/run_dtrain.h"

namespace dtrain {
namespace {

// The value of the series of `name` in the exposition `text` (one series per name here); -1 when
// absent.
double SeriesValue(const std::string& text, const std::string& name) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, absl::StrCat(name, "{"))) continue;
    double value = -1;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value)) return value;
  }
  return -1;
}

TEST(DataShardMetricsTest, ReadAndSkippedShardsAreCounted) {
  const std::string shards = testing::FreshTempDir("shard_metrics_shards");
  std::string inputs;
  for (int d = 0; d < 8; ++d) {
    std::string text;
    for (int line = 0; line < 60; ++line) {
      absl::StrAppend(&text, "Document ", d, " line ", line, ": sphinx of black quartz.\n");
    }
    absl::StrAppend(&inputs, " ",
                    testing::WriteTempFile(absl::StrCat("shard_metrics_doc", d, ".txt"), text));
  }
  const testing::Outcome pack = testing::RunDtrain(
      absl::StrCat("data pack", inputs, " --out ", shards, " --shard-size 4KiB"));
  ASSERT_EQ(pack.exit_code, 0) << pack.stderr_text;
  std::vector<std::string> tars;
  for (const auto& entry : std::filesystem::directory_iterator(shards)) {
    if (entry.path().extension() == ".tar") tars.push_back(entry.path().string());
  }
  std::sort(tars.begin(), tars.end());
  ASSERT_GE(tars.size(), 3u) << pack.stdout_text;
  // The second shard cut inside its first member's data: its tar reading fails.
  std::string cut = testing::ReadFile(tars[1]);
  cut.resize(700);
  testing::WriteFile(tars[1], cut);
  const int good = static_cast<int>(tars.size()) - 1;

  const int port = testing::FreeTcpPort();
  const std::string recipe = testing::WriteTempFile("shard_metrics.yaml", R"(
run: {name: shards, seed: 3, threads: 1}
model: {n_layer: 1, n_head: 2, d_model: 32, max_seq_len: 32}
data: {format: webdataset, train: [], streams: 1, shuffle_buffer: 4, on_error: skip_shard}
train: {steps: 1000000, batch_size: 2, micro_batch: 2, seq_len: 16, warmup_steps: 1,
        eval_every: 0}
checkpoint: {interval: 0}
logging: {sample_tokens: 0}
)");
  const std::string log = testing::TempPath("shard_metrics.log");
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string out = "run.out_dir=" + testing::FreshTempDir("shard_metrics_out");
    const std::string shard_list = "data.shards=" + absl::StrJoin(tars, "::");
    const std::string metrics = absl::StrCat("logging.metrics_port=", port);
    freopen(log.c_str(), "w", stderr);
    freopen("/dev/null", "w", stdout);
    execl(DTRAIN_BINARY, DTRAIN_BINARY, "train", recipe.c_str(), "--set", out.c_str(), "--set",
          shard_list.c_str(), "--set", metrics.c_str(), "--set",
          "logging.metrics_address=127.0.0.1", nullptr);
    _exit(127);
  }
  // Each pass over the shards reads the good ones and skips the cut one; the loader reads ahead,
  // so a scrape may fall inside a pass. A safety cap, not a measurement: a pass takes well under
  // a second.
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  double read = -1, skipped = -1;
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(1);
  while (absl::Now() < deadline && !(read >= good && skipped >= 1)) {
    absl::SleepFor(absl::Milliseconds(200));
    const httplib::Result response = client.Get("/metrics");
    if (!response || response->status != 200) continue;
    read = SeriesValue(response->body, "dtrain_data_shards_read_total");
    skipped = SeriesValue(response->body, "dtrain_data_shards_skipped_total");
    // A pass never skips more than the one cut shard: at most one skip per pass begun.
    EXPECT_LE(skipped, read / good + 1) << response->body;
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  EXPECT_GE(read, good) << testing::ReadFile(log);
  EXPECT_GE(skipped, 1) << testing::ReadFile(log);
  EXPECT_NE(testing::ReadFile(log).find("skip_shard: skipping shard " + tars[1]),
            std::string::npos);
}

}  // namespace
}  // namespace dtrain
