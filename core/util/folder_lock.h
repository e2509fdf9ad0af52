// An exclusive claim on a folder for the life of a process: two runs writing one run folder
// would interleave their metrics and checkpoints. A flock(2) on `<folder>/.lock`, which the
// kernel drops when the process ends however it ends, so a killed run never leaves it held.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace dtrain {

class FolderLock {
 public:
  // Creates `folder` if missing and takes its lock, writing `owner` (who holds it, for the
  // message another process gets) into the lock file. FailedPrecondition naming the holder when
  // another process has it; FileError where the folder or its lock file cannot be made. Where the
  // filesystem has no locks, a warning and an empty lock.
  static absl::StatusOr<FolderLock> Acquire(const std::string& folder, const std::string& owner);

  FolderLock(FolderLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  FolderLock& operator=(FolderLock&& other) noexcept;
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;
  ~FolderLock();

 private:
  explicit FolderLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace dtrain
