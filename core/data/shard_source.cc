// Local files, pipes and memory as ByteSources; http(s) lives in http_source.cc.
#include "core/data/shard_source.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/data/http_source.h"
#include "core/util/status.h"
#include "core/util/subprocess.h"

namespace dtrain {
namespace {

// read(2) until it returns without EINTR.
absl::StatusOr<size_t> ReadFd(int fd, char* buffer, size_t n, const std::string& url) {
  while (true) {
    const ssize_t got = ::read(fd, buffer, n);
    if (got >= 0) return static_cast<size_t>(got);
    if (errno != EINTR) {
      return absl::DataLossError(absl::StrCat(url, ": read failed: ", strerror(errno)));
    }
  }
}

// readv(2) of `buffer` then `tail`, until it returns without EINTR.
absl::StatusOr<size_t> ReadFdWithTail(int fd, char* buffer, size_t n, char* tail, size_t tail_n,
                                      const std::string& url) {
  iovec parts[2] = {{.iov_base = buffer, .iov_len = n}, {.iov_base = tail, .iov_len = tail_n}};
  while (true) {
    const ssize_t got = ::readv(fd, parts, 2);
    if (got >= 0) return static_cast<size_t>(got);
    if (errno != EINTR) {
      return absl::DataLossError(absl::StrCat(url, ": read failed: ", strerror(errno)));
    }
  }
}

class FileSource final : public ByteSource {
 public:
  FileSource(int fd, std::string url) : fd_(fd), url_(std::move(url)) {}
  ~FileSource() override { ::close(fd_); }

  absl::StatusOr<size_t> Read(char* buffer, size_t n) override {
    return ReadFd(fd_, buffer, n, url_);
  }
  absl::StatusOr<size_t> ReadWithTail(char* buffer, size_t n, char* tail, size_t tail_n) override {
    return ReadFdWithTail(fd_, buffer, n, tail, tail_n, url_);
  }
  absl::Status Close() override { return absl::OkStatus(); }
  const std::string& url() const override { return url_; }

 private:
  int fd_;
  std::string url_;
};

// How long a shard command may run on after its reader closed the pipe (at its end, or on
// abandoning it after SIGTERM) before it is killed: it has nothing left to do.
constexpr absl::Duration kPipeExitGrace = absl::Seconds(10);

// CMD runs under /bin/sh with its stdout on a pipe, stderr the trainer's and stdin /dev/null. It
// gets SIGPIPE's default action (Subprocess does that), so a command whose reader closed early
// ends as in a shell pipeline, not with "Broken pipe" errors. Its shell leads a process group
// (kPipeLeader), so stopping it stops what it started (`sleep 60; cat x`, `curl ... | zstd -d`),
// and what it leaves behind is killed.
class PipeSource final : public ByteSource {
 public:
  PipeSource(std::unique_ptr<Subprocess> process, std::string url,
             const ShardSourceOptions& options)
      : process_(std::move(process)), url_(std::move(url)), options_(options) {}
  ~PipeSource() override {
    // Abandoned early (an error elsewhere): stop the command rather than leave it blocked. The
    // pipe closes first, so a command that ignores SIGTERM while it writes ends by SIGPIPE.
    process_->CloseOutput(process_->stdout_fd());
    process_->Signal(SIGTERM);
    if (!process_->WaitFor(kPipeExitGrace)) process_->Signal(SIGKILL);
  }

  absl::StatusOr<size_t> Read(char* buffer, size_t n) override {
    RETURN_IF_ERROR(WaitForOutput());
    return Counted(ReadFd(process_->stdout_fd(), buffer, n, url_));
  }
  absl::StatusOr<size_t> ReadWithTail(char* buffer, size_t n, char* tail, size_t tail_n) override {
    RETURN_IF_ERROR(WaitForOutput());
    return Counted(ReadFdWithTail(process_->stdout_fd(), buffer, n, tail, tail_n, url_));
  }
  bool ended() const override { return ended_; }

  absl::Status Close() override {
    process_->CloseOutput(process_->stdout_fd());
    const std::optional<ExitStatus> exit = process_->WaitFor(kPipeExitGrace);
    if (!exit) {
      process_->Signal(SIGKILL);
      return absl::DataLossError(absl::StrCat(
          "shard command '", url_.substr(5), "' still ran ", absl::FormatDuration(kPipeExitGrace),
          " after it closed its output; killed it (a command must exit once it wrote the shard)"));
    }
    if (exit->ok()) return absl::OkStatus();
    return absl::DataLossError(absl::StrCat("shard command '", url_.substr(5), "' ended with ",
                                            exit->ToString(), "; run it in a shell to see why"));
  }
  const std::string& url() const override { return url_; }

 private:
  absl::StatusOr<size_t> Counted(absl::StatusOr<size_t> read) {
    ended_ = ended_ || (read.ok() && *read == 0);
    return read;
  }

  // Until the pipe holds data or its end, at most options_.pipe_timeout_s: a command that hangs
  // (a stalled download, a prompt for a password) fails its shard instead of the whole run
  // waiting on it without end.
  absl::Status WaitForOutput() {
    const absl::Time deadline = absl::Now() + absl::Seconds(options_.pipe_timeout_s);
    pollfd output = {.fd = process_->stdout_fd(), .events = POLLIN, .revents = 0};
    while (true) {
      RETURN_IF_ERROR(CheckNotStopped(options_, url_));
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        return absl::DeadlineExceededError(absl::StrCat(
            "shard command '", url_.substr(5), "' wrote nothing for ", options_.pipe_timeout_s,
            " s (data.pipe_timeout_s); run it in a shell to see what it waits for, or raise "
            "data.pipe_timeout_s"));
      }
      const int wait_ms = static_cast<int>(std::min<int64_t>(
          kStopCheckMs, absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1)))));
      const int ready = ::poll(&output, 1, wait_ms);
      if (ready > 0) return absl::OkStatus();  // data, the end, or an error read(2) reports
      if (ready < 0 && errno != EINTR) {
        return absl::DataLossError(absl::StrCat(url_, ": poll failed: ", strerror(errno)));
      }
    }
  }

  std::unique_ptr<Subprocess> process_;
  std::string url_;
  ShardSourceOptions options_;
  bool ended_ = false;
};

// The shell that leads a command's process group: it runs the command ($1) with the pipe as its
// stdout, keeping none itself (the pipe ends when the command closes it), and exits with its
// status; on SIGTERM, ours or the one it gets when the trainer dies (even by SIGKILL, whose
// process group the agent kills: not this one), it ends the whole group.
constexpr char kPipeLeader[] = R"(trap 'trap - TERM; kill -TERM 0' TERM
exec 3>&1 >/dev/null
eval "$1" >&3 3>&- &
exec 3>&-
wait $!)";

absl::StatusOr<std::unique_ptr<ByteSource>> OpenPipe(const std::string& url,
                                                     const ShardSourceOptions& options) {
  const std::string command = url.substr(5);
  SubprocessOptions spawn;
  spawn.stdout_stream = SubprocessOptions::Stream::kPipe;
  spawn.own_process_group = true;
  spawn.parent_death_signal = SIGTERM;
  absl::StatusOr<std::unique_ptr<Subprocess>> process =
      Subprocess::Spawn({"/bin/sh", "-c", kPipeLeader, "sh", command}, spawn);
  if (!process.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot start shard command '", command, "': ", process.status().message()));
  }
  return std::unique_ptr<ByteSource>(new PipeSource(*std::move(process), url, options));
}

class MemoryByteSource final : public ByteSource {
 public:
  MemoryByteSource(std::string data, std::string name)
      : data_(std::move(data)), name_(std::move(name)) {}

  absl::StatusOr<size_t> Read(char* buffer, size_t n) override { return Copy(buffer, n); }
  // Like readv(2), so tests go through the reader's tail path as files do.
  absl::StatusOr<size_t> ReadWithTail(char* buffer, size_t n, char* tail, size_t tail_n) override {
    const size_t count = Copy(buffer, n);
    return count < n ? count : count + Copy(tail, tail_n);
  }
  absl::Status Close() override { return absl::OkStatus(); }
  const std::string& url() const override { return name_; }

 private:
  size_t Copy(char* buffer, size_t n) {
    const size_t count = std::min(n, data_.size() - position_);
    std::copy_n(data_.data() + position_, count, buffer);
    position_ += count;
    return count;
  }

  std::string data_;
  std::string name_;
  size_t position_ = 0;
};

}  // namespace

std::optional<std::string> LocalShardPath(const std::string& url) {
  if (absl::StartsWith(url, "pipe:") || absl::StartsWith(url, "http://") ||
      absl::StartsWith(url, "https://")) {
    return std::nullopt;
  }
  return absl::StartsWith(url, "file:") ? url.substr(5) : url;
}

absl::StatusOr<std::unique_ptr<ByteSource>> OpenShard(const std::string& url,
                                                      const ShardSourceOptions& options) {
  const std::optional<std::string> path = LocalShardPath(url);
  if (!path) {
    return absl::StartsWith(url, "pipe:") ? OpenPipe(url, options) : OpenHttp(url, options);
  }
  const int fd = ::open(path->c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot open shard ", url, ": ", strerror(errno), "; check data.shards"));
  }
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  return std::unique_ptr<ByteSource>(new FileSource(fd, url));
}

absl::Status WithSourceCause(ByteSource& source, const absl::Status& error) {
  const absl::Status closed = source.ended() ? source.Close() : absl::OkStatus();
  if (closed.ok()) return error;
  return absl::Status(closed.code(), absl::StrCat(closed.message(),
                                                  " (reading its archive: ", error.message(), ")"));
}

absl::Status CheckNotStopped(const ShardSourceOptions& options, const std::string& url) {
  if (options.stop == nullptr || !options.stop->load(std::memory_order_relaxed)) {
    return absl::OkStatus();
  }
  return absl::CancelledError(absl::StrCat(url, ": the data reader stopped"));
}

std::unique_ptr<ByteSource> MemorySource(std::string data, std::string name) {
  return std::make_unique<MemoryByteSource>(std::move(data), std::move(name));
}

}  // namespace dtrain
