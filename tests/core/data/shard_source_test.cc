#include "core/data/shard_source.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/util/exit_codes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/core/data/http_test_server.h"
#include "tests/core/data/tar_test_util.h"

namespace dtrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// All bytes of `url` (through small reads), or the error of Read or Close.
absl::StatusOr<std::string> ReadAll(const std::string& url, const ShardSourceOptions& options) {
  absl::StatusOr<std::unique_ptr<ByteSource>> source = OpenShard(url, options);
  if (!source.ok()) return source.status();
  std::string data;
  char buffer[10000];
  while (true) {
    absl::StatusOr<size_t> got = (*source)->Read(buffer, sizeof(buffer));
    if (!got.ok()) return got.status();
    if (*got == 0) break;
    data.append(buffer, *got);
  }
  if (absl::Status closed = (*source)->Close(); !closed.ok()) return closed;
  return data;
}

std::string Pattern(size_t size) {
  std::string data(size, '\0');
  for (size_t i = 0; i < size; ++i) data[i] = static_cast<char>((i * 7919) >> 3);
  return data;
}

ShardSourceOptions FastOptions() {
  ShardSourceOptions options;
  options.http_timeout_s = 10;
  options.http_retry_backoff_ms = 10;
  options.http_buffer_bytes = 64 << 10;  // far below the shard: the transfer must pause
  return options;
}

TEST(ShardSourceTest, ReadsFilesAndFileUrls) {
  testing::TempDir dir;
  const std::string data = Pattern(100000);
  testing::WriteFile(dir / "a.tar", data);
  EXPECT_EQ(*ReadAll(dir / "a.tar", FastOptions()), data);
  EXPECT_EQ(*ReadAll("file:" + (dir / "a.tar"), FastOptions()), data);
  absl::StatusOr<std::string> missing = ReadAll(dir / "none.tar", FastOptions());
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(absl::StrContains(missing.status().message(), dir / "none.tar"));
}

TEST(ShardSourceTest, PipesReadStdoutAndReportTheExitStatus) {
  EXPECT_EQ(*ReadAll("pipe:printf 'a b'", FastOptions()), "a b");
  absl::StatusOr<std::string> failed = ReadAll("pipe:printf x; exit 3", FastOptions());
  ASSERT_FALSE(failed.ok());
  EXPECT_TRUE(
      absl::StrContains(failed.status().message(), "'printf x; exit 3' ended with exit code 3"))
      << failed.status();
}

// A source abandoned mid-stream ends its command, even one that ignores SIGTERM while it blocks
// writing into the full pipe (its destructor waited for it forever). `timeout` caps the command
// at 60 s so that a regression fails instead of hanging; `--foreground` keeps it in the command's
// process group (without it, timeout leads a group of its own, which the kill of the command's
// group misses, and its child holds ctest's output open for the 60 s).
TEST(ShardSourceTest, AnAbandonedPipeEndsACommandThatIgnoresSigterm) {
  absl::StatusOr<std::unique_ptr<ByteSource>> source =
      OpenShard("pipe:trap '' TERM; exec timeout --foreground -s KILL 60 yes", FastOptions());
  ASSERT_TRUE(source.ok()) << source.status();
  char buffer[4096];
  ASSERT_TRUE((*source)->Read(buffer, sizeof(buffer)).ok());
  const absl::Time start = absl::Now();
  source->reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "the command outlived its reader";
}

// A command that closed its output but runs on (and ignores SIGTERM) is killed after a grace of
// 10 s: at the shard's end, where that is an error naming it; on abandoning it, quietly. Before,
// either waited for the command forever (here 60 s, `timeout`'s cap).
TEST(ShardSourceTest, APipeCommandThatOutlivesItsOutputIsKilled) {
  const std::string lingering =
      "pipe:trap '' TERM; printf x; exec timeout --foreground -s KILL 60 sleep 60 >&-";
  absl::Time start = absl::Now();
  absl::StatusOr<std::string> read = ReadAll(lingering, FastOptions());
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  ASSERT_FALSE(read.ok());
  EXPECT_TRUE(
      absl::StrContains(read.status().message(), "still ran 10s after it closed its output"))
      << read.status();

  absl::StatusOr<std::unique_ptr<ByteSource>> source = OpenShard(lingering, FastOptions());
  ASSERT_TRUE(source.ok()) << source.status();
  char buffer[16];
  ASSERT_TRUE((*source)->Read(buffer, sizeof(buffer)).ok());
  start = absl::Now();
  source->reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "the command outlived its reader";
}

// A command that writes nothing for pipe_timeout_s fails its shard, naming itself and the key;
// before, the read waited on it without end (here `timeout` caps the command at 60 s). The limit
// is per wait: a command that writes slowly but steadily is not cut off.
TEST(ShardSourceTest, APipeCommandThatWritesNothingForTheTimeoutFails) {
  ShardSourceOptions options = FastOptions();
  options.pipe_timeout_s = 1;
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> stalled =
      ReadAll("pipe:printf x; exec timeout --foreground -s KILL 60 sleep 60", options);
  EXPECT_LT(absl::Now() - start, absl::Seconds(20)) << "the read waited out the command";
  ASSERT_FALSE(stalled.ok());
  EXPECT_TRUE(absl::StrContains(
      stalled.status().message(),
      "shard command 'printf x; exec timeout --foreground -s KILL 60 sleep 60' wrote "
      "nothing for 1 s (data.pipe_timeout_s)"))
      << stalled.status();

  absl::StatusOr<std::string> steady =
      ReadAll("pipe:for i in 1 2 3 4; do sleep 0.4; printf x; done", options);
  ASSERT_TRUE(steady.ok()) << steady.status();
  EXPECT_EQ(*steady, "xxxx");
}

// Reads `url` once on this thread while another sets options.stop after 300 ms: the read must
// end with Cancelled within seconds (a loader's stop waited out the stalled source).
void ExpectAStopEndsTheRead(const std::string& url) {
  std::atomic<bool> stop{false};
  ShardSourceOptions options = FastOptions();
  options.stop = &stop;
  absl::StatusOr<std::unique_ptr<ByteSource>> source = OpenShard(url, options);
  ASSERT_TRUE(source.ok()) << source.status();
  std::thread stopper([&stop] {
    absl::SleepFor(absl::Milliseconds(300));
    stop = true;
  });
  const absl::Time start = absl::Now();
  char buffer[16];
  const absl::StatusOr<size_t> read = (*source)->Read(buffer, sizeof(buffer));
  const absl::Duration waited = absl::Now() - start;
  stopper.join();
  EXPECT_TRUE(absl::IsCancelled(read.status())) << read.status();
  EXPECT_LT(waited, absl::Seconds(5)) << url;
}

TEST(ShardSourceTest, AStopEndsAReadWaitingOnAQuietCommand) {
  ExpectAStopEndsTheRead("pipe:exec timeout --foreground -s KILL 60 sleep 60");
}

// The server is a listening socket that never accepts: the kernel completes the connection and
// takes the request, and no answer comes (FastOptions waits 10 s for one).
TEST(ShardSourceTest, AStopEndsAReadWaitingOnAQuietServer) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), length), 0);
  ASSERT_EQ(listen(listener, 4), 0);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
  ExpectAStopEndsTheRead(absl::StrCat("http://127.0.0.1:", ntohs(address.sin_port), "/s.tar"));
  close(listener);
}

// A trainer ignores SIGPIPE once its communicator exists; the commands it starts must not inherit
// that (their reader closing early ends them, as in a shell pipeline).
TEST(ShardSourceTest, PipeCommandsGetTheDefaultSigpipe) {
  struct sigaction ignore = {}, previous = {};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(sigaction(SIGPIPE, &ignore, &previous), 0);
  absl::StatusOr<std::string> status = ReadAll("pipe:grep SigIgn /proc/self/status", FastOptions());
  sigaction(SIGPIPE, &previous, nullptr);
  ASSERT_TRUE(status.ok()) << status.status();
  const std::vector<std::string> fields = absl::StrSplit(*status, '\t');
  ASSERT_EQ(fields.size(), 2u) << *status;
  const uint64_t ignored = std::stoull(fields[1], nullptr, 16);
  EXPECT_EQ(ignored & (uint64_t{1} << (SIGPIPE - 1)), 0u) << "SigIgn " << fields[1];
}

TEST(ShardSourceTest, StreamsHttpThroughABoundedBuffer) {
  testing::TempDir dir;
  const std::string data = Pattern(3 << 20);
  testing::WriteFile(dir / "s.tar", data);
  testing::HttpTestServer server(dir.path());
  ASSERT_NE(server.port(), 0);
  absl::StatusOr<std::string> got = ReadAll(server.Url("s.tar"), FastOptions());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == data);
}

TEST(ShardSourceTest, ResumesADroppedHttpTransferWithARangeRequest) {
  testing::TempDir dir;
  const std::string data = Pattern(3 << 20);
  testing::WriteFile(dir / "s.tar", data);
  testing::HttpTestServer server(dir.path(), {"--drop-after", "1000000", "--log", dir / "log"});
  ASSERT_NE(server.port(), 0);
  absl::StatusOr<std::string> got = ReadAll(server.Url("s.tar"), FastOptions());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == data);
  // The first request lost the connection after 1000000 bytes; the second asked for the rest.
  EXPECT_EQ(testing::ReadFile(dir / "log"), "/s.tar -\n/s.tar bytes=1000000-\n");
}

// Each request is cut after 1100000 bytes: three attempts bring the shard, each with a good part
// of it (1 MiB or more), with one retry allowed after a failure. A server that cuts every request
// short of that runs out of retries as before.
TEST(ShardSourceTest, RetriesCountFailuresInARowNotPerShard) {
  testing::TempDir dir;
  const std::string data = Pattern(3 << 20);
  testing::WriteFile(dir / "s.tar", data);
  ShardSourceOptions options = FastOptions();
  options.http_retries = 1;
  {
    testing::HttpTestServer server(dir.path(), {"--drop-every", "1100000", "--log", dir / "log"});
    ASSERT_NE(server.port(), 0);
    absl::StatusOr<std::string> got = ReadAll(server.Url("s.tar"), options);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(*got == data);
    EXPECT_EQ(testing::ReadFile(dir / "log"),
              "/s.tar -\n/s.tar bytes=1100000-\n/s.tar bytes=2200000-\n");
  }
  testing::HttpTestServer trickle(dir.path(), {"--drop-every", "1000"});
  ASSERT_NE(trickle.port(), 0);
  absl::StatusOr<std::string> cut = ReadAll(trickle.Url("s.tar"), options);
  ASSERT_FALSE(cut.ok());
  EXPECT_TRUE(absl::StrContains(cut.status().message(), "failed after 2 attempts, 2000 bytes"))
      << cut.status();
}

// A resumed transfer goes on only where the server's answer continues the same bytes: a 206
// that starts elsewhere (its samples were read twice) or a shard whose ETag changed (two versions
// spliced) fails the shard, naming what the server said, without a retry.
TEST(ShardSourceTest, AResumeThatWouldNotContinueTheShardFailsIt) {
  testing::TempDir dir;
  struct Case {
    std::vector<std::string> flags;
    std::string said;
  };
  for (const Case& server_case : std::vector<Case>{
           {{"--range-from-zero"},
            "answered 206 with Content-Range 'bytes 0-3145727/3145728': its bytes would not "
            "continue the shard"},
           {{"--new-etag-each-request"},
            "the shard changed on the server after 1000000 bytes (ETag '\"v1-3145728\"', now "
            "'\"v2-3145728\"')"},
           // Without validators, the size still tells a shard that was being written.
           {{"--grow-each-request", "--no-etag"},
            "the shard changed on the server after 1000000 bytes (size '3145728', now "
            "'3145729')"}}) {
    testing::WriteFile(dir / "s.tar", Pattern(3 << 20));
    std::filesystem::remove(dir / "log");
    std::vector<std::string> flags = {"--drop-after", "1000000", "--log", dir / "log"};
    flags.insert(flags.end(), server_case.flags.begin(), server_case.flags.end());
    testing::HttpTestServer server(dir.path(), flags);
    ASSERT_NE(server.port(), 0);
    absl::StatusOr<std::string> got = ReadAll(server.Url("s.tar"), FastOptions());
    ASSERT_FALSE(got.ok()) << server_case.flags[0];
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
    EXPECT_TRUE(absl::StrContains(got.status().message(), server_case.said)) << got.status();
    EXPECT_EQ(testing::ReadFile(dir / "log"), "/s.tar -\n/s.tar bytes=1000000-\n")
        << server_case.flags[0];
  }
}

TEST(ShardSourceTest, HttpErrorsNameTheUrl) {
  testing::TempDir dir;
  testing::WriteFile(dir / "s.tar", Pattern(3 << 20));
  testing::HttpTestServer server(dir.path(), {"--drop-after", "1000"});
  ASSERT_NE(server.port(), 0);

  absl::StatusOr<std::string> missing = ReadAll(server.Url("missing.tar"), FastOptions());
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(absl::StrContains(missing.status().message(), server.Url("missing.tar") +
                                                                ": HTTP "
                                                                "status 404"))
      << missing.status();

  ShardSourceOptions no_retries = FastOptions();
  no_retries.http_retries = 0;
  absl::StatusOr<std::string> dropped = ReadAll(server.Url("s.tar"), no_retries);
  ASSERT_FALSE(dropped.ok());
  EXPECT_TRUE(absl::StrContains(dropped.status().message(),
                                server.Url("s.tar") + ": failed after 1 attempt, 1000 bytes"))
      << dropped.status();
}

TEST(ShardSourceTest, HttpGivesUpAfterTheLastRetry) {
  ShardSourceOptions options = FastOptions();
  options.http_retries = 2;
  // Port 9 on loopback (discard) has no listener here: every connect is refused at once.
  absl::StatusOr<std::string> refused = ReadAll("http://127.0.0.1:9/x.tar", options);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::StrContains(refused.status().message(),
                                "http://127.0.0.1:9/x.tar: failed after 3 attempts"))
      << refused.status();
  // libcurl's summary, which its detail may repeat, is said once.
  const std::string message(refused.status().message());
  const size_t said = message.find("Couldn't connect to server");
  ASSERT_NE(said, std::string::npos) << message;
  EXPECT_EQ(message.find("Couldn't connect to server", said + 1), std::string::npos) << message;
}

// A URL libcurl cannot send (a space in it) fails at once, a usage error saying how to write it,
// where it was retried as a server's failure and the fix named the server.
TEST(ShardSourceTest, AMalformedUrlIsNotRetried) {
  ShardSourceOptions options = FastOptions();
  options.http_retries = 2;
  absl::StatusOr<std::string> malformed = ReadAll("http://127.0.0.1:9/a b.tar", options);
  ASSERT_FALSE(malformed.ok());
  EXPECT_EQ(malformed.status().code(), absl::StatusCode::kInvalidArgument) << malformed.status();
  EXPECT_EQ(ExitCodeOf(malformed.status()).value_or(0), kExitUsage);
  EXPECT_THAT(std::string(malformed.status().message()),
              AllOf(HasSubstr("http://127.0.0.1:9/a b.tar: URL using bad/illegal format"),
                    HasSubstr("percent-encoded, e.g. %20"), Not(HasSubstr("attempts"))));
}

}  // namespace
}  // namespace dtrain
