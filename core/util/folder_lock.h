// An exclusive claim on a folder for the life of a process: two runs writing one run folder
// would interleave their metrics and checkpoints, and two saving into one checkpoint folder
// would set aside or remove each other's saves. A flock(2) on `<folder>/.lock`, which the kernel
// drops when the process ends however it ends, so a killed run never leaves it held. The lock
// file stays for the next holder, unless a run that wrote nothing there abandons the folder.
#pragma once

#include <string>
#include <utility>

#include "absl/status/statusor.h"

namespace dtrain {

class FolderLock {
 public:
  // What the folder is to the run, for its messages.
  struct Role {
    std::string name;        // "run folder"
    std::string key;         // the recipe key that places it: "run.out_dir"
    std::string other_keys;  // what gives a run another one: "run.name or run.out_dir"
  };
  static const Role kRunFolder;
  static const Role kCheckpointFolder;

  // Creates `folder` if missing and takes its lock, writing this process (pid, host, since when:
  // for the message another process gets) into the lock file. FailedPrecondition naming the
  // holder when another process has it; FileError where the folder or its lock file cannot be
  // made. Where the filesystem has no locks, a warning and an empty lock.
  static absl::StatusOr<FolderLock> Acquire(const std::string& folder, const Role& role);
  // As Acquire, with `owner` written for this process.
  static absl::StatusOr<FolderLock> AcquireAs(const std::string& folder, const Role& role,
                                              const std::string& owner);

  FolderLock(FolderLock&& other) noexcept;
  FolderLock& operator=(FolderLock&& other) noexcept;
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;
  ~FolderLock() { Release(); }

  // Whether the folder is held: false where the filesystem has no locks, and once let go.
  bool held() const { return fd_ >= 0; }
  // Lets go of a folder this run wrote nothing into (its start failed), taking the lock file
  // along where the folder holds nothing else, so that it is as it was found. Removed while
  // still held: a run that opened the file meanwhile finds, once it has the lock, that the file
  // is no longer the folder's, and takes the folder's new one (AcquireAs).
  void Abandon();

 private:
  FolderLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  void Release();

  int fd_ = -1;
  std::string path_;  // the lock file
};

}  // namespace dtrain
