#include "core/util/folder_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
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

FolderLock::FolderLock(FolderLock&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

FolderLock& FolderLock::operator=(FolderLock&& other) noexcept {
  if (this != &other) {
    Release();
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

namespace {

// Whether `file` is the only entry of its folder.
bool IsAlone(const std::filesystem::path& file) {
  std::error_code error;
  int entries = 0;
  for (std::filesystem::directory_iterator entry(file.parent_path(), error), end;
       !error && entry != end; entry.increment(error)) {
    if (++entries > 1 || entry->path().filename() != file.filename()) return false;
  }
  return !error && entries == 1;
}

}  // namespace

void FolderLock::Release() {
  if (fd_ >= 0) ::close(std::exchange(fd_, -1));
}

void FolderLock::Abandon() {
  if (held() && IsAlone(path_)) ::unlink(path_.c_str());
  Release();
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
  // A holder that abandons an otherwise empty folder removes the lock file: the file this
  // process locked may be gone from the folder by then, and another run may hold the file that
  // replaced it. Tried again while that happens, a few times at most.
  constexpr int kAttempts = 16;
  for (int attempt = 1;; ++attempt) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return FileError(errno, absl::StrCat("cannot open ", path), fix);
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int failure = errno;
      if (failure != EWOULDBLOCK) {
        LogWarn("cannot lock the %s %s (%s): nothing stops another run from writing it", role.name,
                folder, std::strerror(failure));
        ::close(fd);
        return FolderLock(-1, path);
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
    struct stat locked {};
    struct stat named {};
    if (::fstat(fd, &locked) == 0 && ::stat(path.c_str(), &named) == 0 &&
        locked.st_dev == named.st_dev && locked.st_ino == named.st_ino) {
      const std::string text = owner + "\n";
      if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) < 0) {
        LogWarn("cannot write the holder into %s: %s", path, std::strerror(errno));
      }
      return FolderLock(fd, path);
    }
    ::close(fd);
    if (attempt == kAttempts) {
      return WithExitCode(
          absl::FailedPreconditionError(absl::StrCat(
              "the ", role.name, " ", folder, "'s lock file ", path, " was replaced ", kAttempts,
              " times while this run took it: other runs are starting in it; give this run "
              "another ",
              role.other_keys, ", or end them")),
          kExitUsage);
    }
  }
}

}  // namespace dtrain
