// Local files, pipes and memory as ByteSources; http(s) lives in http_source.cc.
#include "core/data/shard_source.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/data/http_source.h"

extern char** environ;

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

// CMD runs under /bin/sh with its stdout on a pipe; stdin and stderr are the trainer's.
class PipeSource final : public ByteSource {
 public:
  PipeSource(pid_t pid, int fd, std::string url) : pid_(pid), fd_(fd), url_(std::move(url)) {}
  ~PipeSource() override {
    if (pid_ > 0) {
      // Abandoned early (an error elsewhere): stop the command rather than leave it blocked.
      ::kill(pid_, SIGTERM);
      (void)Wait();
    }
    if (fd_ >= 0) ::close(fd_);
  }

  absl::StatusOr<size_t> Read(char* buffer, size_t n) override {
    return ReadFd(fd_, buffer, n, url_);
  }
  absl::StatusOr<size_t> ReadWithTail(char* buffer, size_t n, char* tail, size_t tail_n) override {
    return ReadFdWithTail(fd_, buffer, n, tail, tail_n, url_);
  }

  absl::Status Close() override {
    ::close(fd_);
    fd_ = -1;
    return Wait();
  }
  const std::string& url() const override { return url_; }

 private:
  absl::Status Wait() {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
    const std::string how = WIFSIGNALED(status)
                                ? absl::StrCat("was killed by signal ", WTERMSIG(status))
                                : absl::StrCat("exited with status ", WEXITSTATUS(status));
    return absl::DataLossError(absl::StrCat("shard command '", url_.substr(5), "' ", how,
                                            "; run it in a shell to see why"));
  }

  pid_t pid_;
  int fd_;
  std::string url_;
};

absl::StatusOr<std::unique_ptr<ByteSource>> OpenPipe(const std::string& url) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat(url, ": pipe failed: ", strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  // The command gets SIGPIPE's default action even where this process ignores it (a trainer's
  // communicator does): a command whose reader closed early ends as in a shell pipeline, not
  // with "Broken pipe" errors.
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t default_signals;
  sigemptyset(&default_signals);
  sigaddset(&default_signals, SIGPIPE);
  posix_spawnattr_setsigdefault(&attributes, &default_signals);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGDEF);
  const std::string command = url.substr(5);
  char* argv[] = {const_cast<char*>("sh"), const_cast<char*>("-c"),
                  const_cast<char*>(command.c_str()), nullptr};
  pid_t pid = 0;
  const int error = ::posix_spawn(&pid, "/bin/sh", &actions, &attributes, argv, environ);
  posix_spawnattr_destroy(&attributes);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (error != 0) {
    ::close(fds[0]);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot start shard command '", command, "': ", strerror(error)));
  }
  return std::unique_ptr<ByteSource>(new PipeSource(pid, fds[0], url));
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

absl::StatusOr<std::unique_ptr<ByteSource>> OpenShard(const std::string& url,
                                                      const ShardSourceOptions& options) {
  if (absl::StartsWith(url, "pipe:")) return OpenPipe(url);
  if (absl::StartsWith(url, "http://") || absl::StartsWith(url, "https://")) {
    return OpenHttp(url, options);
  }
  const std::string path = absl::StartsWith(url, "file:") ? url.substr(5) : url;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot open shard ", url, ": ", strerror(errno), "; check data.shards"));
  }
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  return std::unique_ptr<ByteSource>(new FileSource(fd, url));
}

std::unique_ptr<ByteSource> MemorySource(std::string data, std::string name) {
  return std::make_unique<MemoryByteSource>(std::move(data), std::move(name));
}

}  // namespace dtrain
