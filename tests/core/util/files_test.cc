#include "core/util/files.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/util/exit_codes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// /dev/full answers every write with ENOSPC, as a full file system does.
TEST(FilesTest, AWriteToAFullFileSystemIsMarkedFull) {
  const int fd = ::open("/dev/full", O_WRONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << "/dev/full: " << strerror(errno);
  const std::string bytes(4096, 'x');
  const absl::Status written = WriteAll(fd, bytes.data(), bytes.size(), "/dev/full");
  ::close(fd);
  EXPECT_EQ(written.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(written.message(), HasSubstr("write /dev/full"));
  EXPECT_TRUE(IsFileSystemFull(written));
}

// absl maps too many open files and no memory to ResourceExhausted as well; only a full file
// system (or quota) is marked.
TEST(FilesTest, OnlyNoSpaceAndQuotaAreAFullFileSystem) {
  EXPECT_TRUE(IsFileSystemFull(FileError(ENOSPC, "write a")));
  EXPECT_TRUE(IsFileSystemFull(FileError(EDQUOT, "write a")));
  for (const int error : {EMFILE, ENFILE, ENOMEM, EACCES, EIO}) {
    const absl::Status status = FileError(error, "open a");
    EXPECT_FALSE(status.ok());
    EXPECT_FALSE(IsFileSystemFull(status)) << status;
  }
  EXPECT_EQ(FileError(EMFILE, "open a").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(IsFileSystemFull(absl::ResourceExhaustedError("out of memory")));
}

// A restart meets a full disk, a file-size limit or a path it may not write again: the agent
// does not restart those; an I/O error may pass.
TEST(FilesTest, PermanentFileErrorsAskForAnExitCodeThatIsNotRestarted) {
  for (const int error : {ENOSPC, EDQUOT, EFBIG}) {
    EXPECT_EQ(ExitCodeOf(FileError(error, "write a")), kExitDiskFull) << error;
  }
  for (const int error : {EACCES, EPERM, EROFS, ENOTDIR, EEXIST, ENAMETOOLONG}) {
    EXPECT_EQ(ExitCodeOf(FileError(error, "create a")), kExitUsage) << error;
  }
  for (const int error : {EIO, ESTALE, ENOENT, EMFILE}) {
    EXPECT_EQ(ExitCodeOf(FileError(error, "read a")), std::nullopt) << error;
  }
}

// Under `ulimit -f` a write past the limit fails with EFBIG (SIGXFSZ ignored), which says what
// stops it.
TEST(FilesTest, AFileTooLargeNamesTheFileSizeLimit) {
  struct rlimit saved;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  struct rlimit limited = saved;
  limited.rlim_cur = 1 << 20;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limited), 0);
  const absl::Status status = FileError(EFBIG, "write a");
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &saved), 0);
  EXPECT_THAT(status.message(),
              HasSubstr("file-size limit (ulimit -f) stops files at 1048576 bytes: raise it"));
  EXPECT_FALSE(IsFileSystemFull(status));
}

// procfs has no fsync for its folders (EINVAL), as some FUSE, SMB and 9p mounts have none.
TEST(FilesTest, AFolderThatCannotBeFsyncedIsAsDurableAsItGets) {
  if (!std::filesystem::is_directory("/proc/self")) GTEST_SKIP() << "no /proc";
  EXPECT_TRUE(FsyncDirectory("/proc").ok());
  EXPECT_FALSE(FsyncDirectory("/no/such/folder").ok());
}

class ResolveOutputFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/resolve_output_" + std::to_string(getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ + "/real");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(ResolveOutputFileTest, AFileOrANewPathIsItself) {
  std::ofstream(dir_ + "/file") << "x";
  EXPECT_EQ(ResolveOutputFile(dir_ + "/file").value(), dir_ + "/file");
  EXPECT_EQ(ResolveOutputFile(dir_ + "/new").value(), dir_ + "/new");
}

// The link stays, its file is replaced: relative and absolute links, chains, a file yet to be.
TEST_F(ResolveOutputFileTest, ALinkLeadsToItsFile) {
  std::ofstream(dir_ + "/real/model") << "x";
  std::filesystem::create_symlink("real/model", dir_ + "/relative");
  std::filesystem::create_symlink(dir_ + "/relative", dir_ + "/chained");
  std::filesystem::create_symlink("real/later", dir_ + "/dangling");
  EXPECT_EQ(ResolveOutputFile(dir_ + "/relative").value(), dir_ + "/real/model");
  EXPECT_EQ(ResolveOutputFile(dir_ + "/chained").value(), dir_ + "/real/model");
  EXPECT_EQ(ResolveOutputFile(dir_ + "/dangling").value(), dir_ + "/real/later");
  std::filesystem::create_symlink("loop", dir_ + "/loop");
  EXPECT_FALSE(ResolveOutputFile(dir_ + "/loop").ok());
}

// A durable write goes where a link leads, and refuses to replace what is not a regular file.
TEST_F(ResolveOutputFileTest, DurableWritesFollowLinksAndReplaceOnlyFiles) {
  std::filesystem::create_symlink("real/metrics", dir_ + "/link");
  ASSERT_TRUE(WriteFileDurably(dir_ + "/link", "line\n").ok());
  EXPECT_TRUE(std::filesystem::is_symlink(dir_ + "/link"));
  EXPECT_EQ(ReadWholeFile(dir_ + "/real/metrics").value(), "line\n");
  ASSERT_EQ(::mkfifo((dir_ + "/fifo").c_str(), 0644), 0) << strerror(errno);
  const absl::Status fifo = WriteFileDurably(dir_ + "/fifo", "line\n");
  EXPECT_THAT(fifo.message(), HasSubstr("is a FIFO, not a regular file"));
  EXPECT_FALSE(std::filesystem::is_regular_file(dir_ + "/fifo"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/fifo.tmp"));
}

// A device that never ends (/dev/zero) is read up to the bound, not into all the memory.
// What lies where an output goes, read without waiting: a regular file's first bytes (all of a
// shorter one); none for what is no regular file (a FIFO whose open would wait for a writer, a
// device, a folder) or nothing at all.
TEST_F(ResolveOutputFileTest, TheHeadOfARegularFileOnly) {
  std::ofstream(dir_ + "/file") << "<!DOCTYPE html>\n<html>";
  EXPECT_EQ(RegularFileHead(dir_ + "/file", 15), "<!DOCTYPE html>");
  EXPECT_EQ(RegularFileHead(dir_ + "/file", 100), "<!DOCTYPE html>\n<html>");
  std::ofstream(dir_ + "/empty") << "";
  EXPECT_EQ(RegularFileHead(dir_ + "/empty", 15), "");
  ASSERT_EQ(::mkfifo((dir_ + "/fifo").c_str(), 0644), 0) << strerror(errno);
  for (const std::string& path :
       {dir_ + "/fifo", std::string("/dev/zero"), dir_ + "/real", dir_ + "/absent"}) {
    EXPECT_EQ(RegularFileHead(path, 15), std::nullopt) << path;
  }
}

// Each keep of a file gets a name of its own, the second in the same second too (a rename over
// the first name lost it), and keeps the file as it was when a durable write then replaces it.
TEST_F(ResolveOutputFileTest, LinkAsideKeepsEachVersionUnderItsOwnName) {
  const std::string file = dir_ + "/model.safetensors";
  std::ofstream(file) << "first";
  const absl::StatusOr<std::string> first = LinkAside(file);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(WriteFileDurably(file, "second").ok());
  const absl::StatusOr<std::string> second = LinkAside(file);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(*first, *second);
  EXPECT_THAT(*first, ::testing::StartsWith(file + ".replaced-"));
  EXPECT_EQ(*ReadWholeFile(*first), "first");
  EXPECT_EQ(*ReadWholeFile(*second), "second");
  EXPECT_EQ(LinkAside(dir_ + "/none").status().code(), absl::StatusCode::kNotFound);
}

// A folder's files that `keep` takes are kept as hard links in a new folder beside it, each keep
// in a folder of its own; its subfolders, links and other files are not.
TEST_F(ResolveOutputFileTest, LinkFolderAsideKeepsTheFilesItTakes) {
  namespace fs = std::filesystem;
  const std::string folder = dir_ + "/model";
  fs::create_directories(folder + "/sub");
  std::ofstream(folder + "/model.safetensors") << "weights";
  std::ofstream(folder + "/config.json") << "{}";
  std::ofstream(folder + "/notes.txt") << "mine";
  fs::create_symlink(folder + "/config.json", folder + "/link.json");
  const auto keep = [](absl::string_view name) { return name != "notes.txt"; };
  const absl::StatusOr<std::string> first = LinkFolderAside(folder, keep);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_THAT(*first, ::testing::StartsWith(folder + ".replaced-"));
  ASSERT_TRUE(WriteFileDurably(folder + "/model.safetensors", "newer").ok());
  EXPECT_EQ(*ReadWholeFile(*first + "/model.safetensors"), "weights");
  EXPECT_EQ(*ReadWholeFile(*first + "/config.json"), "{}");
  std::vector<std::string> names;
  for (const fs::directory_entry& entry : fs::directory_iterator(*first)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  EXPECT_THAT(names, ::testing::ElementsAre("config.json", "model.safetensors"));
  const absl::StatusOr<std::string> second = LinkFolderAside(folder, keep);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(*first, *second);
  EXPECT_EQ(*ReadWholeFile(*second + "/model.safetensors"), "newer");
  EXPECT_EQ(LinkFolderAside(dir_ + "/none", keep).status().code(), absl::StatusCode::kNotFound);
}

// The folders create_directories makes, deepest first, and no link (dangling or not) among them:
// removing them as empty ones undoes a failed write that made them, and nothing else.
TEST_F(ResolveOutputFileTest, MissingFoldersAreTheOnesThatWouldBeMade) {
  namespace fs = std::filesystem;
  const std::string base = dir_ + "/base";
  EXPECT_EQ(MissingFolders(base + "/a/b/"),
            (std::vector<fs::path>{base + "/a/b", base + "/a", base}));
  fs::create_symlink(dir_ + "/nowhere", dir_ + "/link");
  EXPECT_EQ(MissingFolders(dir_ + "/link"), std::vector<fs::path>{});
  const std::vector<fs::path> made = MissingFolders(base + "/a/b");
  fs::create_directories(base + "/a/b");
  std::ofstream(base + "/kept") << "x";
  RemoveEmptyFolders(made);
  EXPECT_FALSE(fs::exists(base + "/a"));
  EXPECT_TRUE(fs::exists(base + "/kept"));
}

TEST(FilesTest, ReadingStopsPastTheBound) {
  const absl::StatusOr<std::string> zeros = ReadWholeFile("/dev/zero", 1 << 20);
  EXPECT_EQ(zeros.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(zeros.status().message(), "/dev/zero holds more than 1048576 bytes");
}

// A rename over /dev/null, a FIFO or a link to one would replace the node with a file.
TEST_F(ResolveOutputFileTest, WhatIsNotARegularFileIsRefusedNamingIt) {
  ASSERT_EQ(::mkfifo((dir_ + "/fifo").c_str(), 0644), 0) << strerror(errno);
  std::filesystem::create_symlink("/dev/null", dir_ + "/null");
  const struct {
    std::string path, named;
  } cases[] = {
      {"/dev/null", "/dev/null is a character device, not a regular file"},
      {dir_ + "/fifo", dir_ + "/fifo is a FIFO"},
      {dir_ + "/null", dir_ + "/null (/dev/null) is a character device"},
      {dir_ + "/real", dir_ + "/real is a folder"},
  };
  for (const auto& [path, named] : cases) {
    const absl::StatusOr<std::string> resolved = ResolveOutputFile(path);
    ASSERT_FALSE(resolved.ok()) << path;
    EXPECT_EQ(resolved.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(resolved.status().message(),
                AllOf(HasSubstr(named), HasSubstr("give the path of a regular file")));
    EXPECT_EQ(ExitCodeOf(resolved.status()), kExitUsage);
  }
}

}  // namespace
}  // namespace dtrain
