#include "core/util/folder_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/util/exit_codes.h"
#include "core/util/files.h"
#include "core/util/host_name.h"
#include "core/util/log.h"

namespace dtrain {

FolderLock& FolderLock::operator=(FolderLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

FolderLock::~FolderLock() {
  if (fd_ >= 0) ::close(fd_);
}

const FolderLock::Role FolderLock::kRunFolder = {
    .name = "run folder", .key = "run.out_dir", .other_keys = "run.name or run.out_dir"};
const FolderLock::Role FolderLock::kCheckpointFolder = {
    .name = "checkpoint folder", .key = "checkpoint.dir", .other_keys = "checkpoint.dir"};

absl::StatusOr<FolderLock> FolderLock::Acquire(const std::string& folder, const Role& role) {
  return AcquireAs(folder, role,
                   absl::StrFormat("pid %d on host %s since %s", getpid(), HostName(),
                                   absl::FormatTime(absl::Now())));
}

absl::StatusOr<FolderLock> FolderLock::AcquireAs(const std::string& folder, const Role& role,
                                                 const std::string& owner) {
  std::error_code error;
  std::filesystem::create_directories(folder, error);
  const std::string fix = absl::StrCat("set ", role.key, " to a writable folder");
  if (error) {
    return FileError(error.value(), absl::StrCat("cannot create the ", role.name, " ", folder),
                     fix);
  }
  const std::string path = folder + "/.lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return FileError(errno, absl::StrCat("cannot open ", path), fix);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int failure = errno;
    if (failure != EWOULDBLOCK) {
      LogWarn("cannot lock the %s %s (%s): nothing stops another run from writing it", role.name,
              folder, std::strerror(failure));
      ::close(fd);
      return FolderLock(-1);
    }
    char holder[512] = {};
    const ssize_t n = ::pread(fd, holder, sizeof(holder) - 1, 0);
    ::close(fd);
    // Not the agent's to restart (exit 2): the other run holds the folder until it ends.
    return WithExitCode(
        absl::FailedPreconditionError(absl::StrCat(
            "the ", role.name, " ", folder, " is in use by another run (",
            n > 0 ? absl::StripAsciiWhitespace(std::string(holder, static_cast<size_t>(n)))
                  : std::string("its holder is unknown"),
            "); give this run another ", role.other_keys, ", or end that one")),
        kExitUsage);
  }
  const std::string text = owner + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) < 0) {
    LogWarn("cannot write the holder into %s: %s", path, std::strerror(errno));
  }
  return FolderLock(fd);
}

}  // namespace dtrain
