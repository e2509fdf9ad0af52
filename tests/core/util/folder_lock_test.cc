#include "core/util/folder_lock.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "core/util/exit_codes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/run_dtrain.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A folder held by one lock is refused to another, naming the holder, and free once it is let go.
TEST(FolderLockTest, AHeldFolderIsRefusedNamingItsHolderUntilLetGo) {
  const std::string folder = testing::FreshTempDir("lock_held");
  {
    absl::StatusOr<FolderLock> held =
        FolderLock::AcquireAs(folder, FolderLock::kRunFolder, "pid 4242 on host h");
    ASSERT_TRUE(held.ok()) << held.status();
    const absl::StatusOr<FolderLock> second = FolderLock::Acquire(folder, FolderLock::kRunFolder);
    ASSERT_FALSE(second.ok());
    EXPECT_EQ(ExitCodeOf(second.status()), kExitUsage);
    EXPECT_THAT(second.status().message(),
                HasSubstr("the run folder " + folder +
                          " is in use by another run (pid 4242 on host h); give this run another "
                          "run.name or run.out_dir, or end that one"));
    // A moved lock is still held; the moved-from one lets nothing go when it ends.
    std::optional<FolderLock> moved_from = *std::move(held);
    const FolderLock moved = std::move(*moved_from);
    moved_from.reset();
    EXPECT_TRUE(moved.held());
    EXPECT_FALSE(FolderLock::Acquire(folder, FolderLock::kRunFolder).ok());
  }
  EXPECT_TRUE(FolderLock::Acquire(folder, FolderLock::kRunFolder).ok());
}

// A run that abandons a folder that holds nothing else (its start failed) leaves it as it was
// found, without the lock file; one with anything else in it keeps its lock file, as does a
// folder let go of at the end of a run.
TEST(FolderLockTest, AnAbandonedFolderWithNothingButTheLockIsLeftWithoutIt) {
  const std::string empty = testing::FreshTempDir("lock_empty");
  absl::StatusOr<FolderLock> held = FolderLock::Acquire(empty, FolderLock::kRunFolder);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_TRUE(fs::exists(empty + "/.lock"));
  held->Abandon();
  EXPECT_FALSE(held->held());
  EXPECT_TRUE(fs::is_directory(empty));
  EXPECT_TRUE(fs::is_empty(empty));

  const std::string used = testing::FreshTempDir("lock_used");
  held = FolderLock::Acquire(used, FolderLock::kRunFolder);
  ASSERT_TRUE(held.ok()) << held.status();
  std::ofstream(used + "/metrics.jsonl") << "{}\n";
  held->Abandon();
  EXPECT_TRUE(fs::exists(used + "/.lock"));

  const std::string ended = testing::FreshTempDir("lock_ended");
  { ASSERT_TRUE(FolderLock::Acquire(ended, FolderLock::kRunFolder).ok()); }
  EXPECT_TRUE(fs::exists(ended + "/.lock"));
}

// Two processes taking and abandoning one folder as fast as they can are never both inside it,
// though each abandon removes the lock file: a process that opened the file just before it was
// removed must not hold the removed file while the other holds the folder's new one.
TEST(FolderLockTest, RemovingTheLockFileNeverLetsTwoHoldersIn) {
  const std::string folder = testing::FreshTempDir("lock_race");
  fs::create_directories(folder);
  const std::string inside = folder + "/holder";
  constexpr int kRounds = 3000;
  std::vector<pid_t> children;
  for (int child = 0; child < 2; ++child) {
    const pid_t pid = fork();
    if (pid == 0) {
      int both_inside = 0;
      for (int round = 0; round < kRounds; ++round) {
        absl::StatusOr<FolderLock> held = FolderLock::Acquire(folder, FolderLock::kRunFolder);
        if (!held.ok()) continue;  // the other one holds it
        const int fd = ::open(inside.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
        if (fd < 0) {
          ++both_inside;
          continue;
        }
        ::close(fd);
        ::unlink(inside.c_str());
        held->Abandon();
      }
      _exit(both_inside > 0 ? 1 : 0);
    }
    children.push_back(pid);
  }
  for (const pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "both processes held " << folder << " at once";
  }
}

}  // namespace
}  // namespace dtrain
