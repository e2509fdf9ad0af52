#include "core/util/files.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iterator>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "core/util/exit_codes.h"
#include "core/util/status.h"

namespace dtrain {
namespace {

constexpr char kFileSystemFullUrl[] = "dtrain/file-system-full";

// An open descriptor of `path` that is not a folder's.
absl::StatusOr<int> OpenFileDescriptor(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return FileError(errno, absl::StrCat("open ", path));
  struct stat info;
  if (::fstat(fd, &info) == 0 && S_ISDIR(info.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is a folder, not a file"));
  }
  return fd;
}

// Why a write failed with EFBIG: the file-size limit (SIGXFSZ is ignored, so the write fails
// instead of killing the process), or else the file system's largest file.
std::string FileTooLargeReason() {
  struct rlimit limit;
  if (::getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    return absl::StrCat("; this process's file-size limit (ulimit -f) stops files at ",
                        limit.rlim_cur, " bytes: raise it (ulimit -f unlimited)");
  }
  return "; the file would be larger than its file system allows: write it to another one";
}

// What the file `info` describes is, for a message.
const char* FileKind(const struct stat& info) {
  if (S_ISDIR(info.st_mode)) return "a folder";
  if (S_ISCHR(info.st_mode)) return "a character device";
  if (S_ISBLK(info.st_mode)) return "a block device";
  if (S_ISFIFO(info.st_mode)) return "a FIFO";
  if (S_ISSOCK(info.st_mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

bool IsSameOrInside(const std::string& path, const std::string& folder) {
  std::error_code error;
  const auto resolved = [&](const std::string& p) {
    return std::filesystem::weakly_canonical(std::filesystem::absolute(p, error), error);
  };
  const std::filesystem::path inner = resolved(path);
  if (error) return false;
  const std::filesystem::path outer = resolved(folder);
  if (error) return false;
  // weakly_canonical keeps a trailing separator as an empty last element.
  const auto end = [](const std::filesystem::path& p) {
    auto last = p.end();
    return !p.empty() && !p.has_filename() && last != p.begin() ? std::prev(last) : last;
  };
  const auto inner_end = end(inner), outer_end = end(outer);
  return std::mismatch(outer.begin(), outer_end, inner.begin(), inner_end).first == outer_end;
}

absl::Status FileError(int error, absl::string_view what, absl::string_view fix) {
  absl::Status status = absl::ErrnoToStatus(error, what);
  if (error == EFBIG || !fix.empty()) {
    status =
        Renamed(status, absl::StrCat(status.message(), error == EFBIG ? FileTooLargeReason() : "",
                                     fix.empty() ? "" : "; ", fix));
  }
  if (IsFileSystemFullError(error)) status.SetPayload(kFileSystemFullUrl, absl::Cord());
  if (const std::optional<int> exit_code = FileErrorExitCode(error)) {
    SetExitCode(status, *exit_code);
  }
  return status;
}

std::optional<int> FileErrorExitCode(int error) {
  switch (error) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return kExitDiskFull;
    case EACCES:
    case EPERM:
    case EROFS:
    case ENOTDIR:
    case EEXIST:
    case ENAMETOOLONG:
      return kExitUsage;
    default:
      return std::nullopt;
  }
}

bool IsFileSystemFullError(int error) { return error == ENOSPC || error == EDQUOT; }

bool IsFileSystemFull(const absl::Status& status) {
  return status.GetPayload(kFileSystemFullUrl).has_value();
}

absl::StatusOr<std::ifstream> OpenInputFile(const std::string& path) {
  struct stat info;
  if (::stat(path.c_str(), &info) != 0) {
    return FileError(errno, absl::StrCat("open ", path));
  }
  if (S_ISDIR(info.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is a folder, not a file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::PermissionDeniedError(absl::StrCat("cannot open ", path));
  return in;
}

std::optional<std::string> RegularFileHead(const std::string& path, size_t max_bytes) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string head(max_bytes, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  if (in.bad()) return std::nullopt;
  head.resize(static_cast<size_t>(in.gcount()));
  return head;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path, size_t max_bytes) {
  absl::StatusOr<int> fd = OpenFileDescriptor(path);
  if (!fd.ok()) return fd.status();
  std::string text;
  char block[1 << 16];
  for (;;) {
    const ssize_t n = ::read(*fd, block, sizeof block);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(*fd);
      return FileError(error, absl::StrCat("read ", path));
    }
    if (n == 0) break;
    text.append(block, static_cast<size_t>(n));
    if (text.size() > max_bytes) {
      ::close(*fd);
      return absl::FailedPreconditionError(
          absl::StrCat(path, " holds more than ", max_bytes, " bytes"));
    }
  }
  ::close(*fd);
  return text;
}

namespace {

// Creates the first free name of "<path>.replaced-<unix time>[-N]" with `create` (0, or an
// errno); the name, or FileError naming `what` it failed at.
absl::StatusOr<std::string> CreateAside(const std::string& path, const std::string& what,
                                        const std::function<int(const std::string&)>& create) {
  const std::string stem = absl::StrCat(path, ".replaced-", absl::ToUnixSeconds(absl::Now()));
  for (int copy = 1;; ++copy) {
    const std::string aside = copy == 1 ? stem : absl::StrCat(stem, "-", copy);
    const int error = create(aside);
    if (error == 0) return aside;
    if (error != EEXIST) return FileError(error, absl::StrCat(what, " ", aside));
  }
}

}  // namespace

absl::StatusOr<std::string> LinkAside(const std::string& path) {
  return CreateAside(path, absl::StrCat("link ", path, " to"), [&](const std::string& aside) {
    return ::link(path.c_str(), aside.c_str()) == 0 ? 0 : errno;
  });
}

absl::StatusOr<std::string> LinkFolderAside(const std::string& dir,
                                            const std::function<bool(absl::string_view)>& keep) {
  namespace fs = std::filesystem;
  std::error_code error;
  fs::directory_iterator entries(dir, error);
  if (error) return FileError(error.value(), absl::StrCat("list ", dir));
  ASSIGN_OR_RETURN(const std::string aside,
                   CreateAside(dir, "create", [](const std::string& folder) {
                     return ::mkdir(folder.c_str(), 0755) == 0 ? 0 : errno;
                   }));
  for (; !error && entries != fs::directory_iterator(); entries.increment(error)) {
    const fs::directory_entry& entry = *entries;
    const std::string name = entry.path().filename().string();
    if (entry.is_symlink(error) || !entry.is_regular_file(error) || !keep(name)) continue;
    const std::string to = absl::StrCat(aside, "/", name);
    if (::link(entry.path().c_str(), to.c_str()) != 0) error.assign(errno, std::generic_category());
  }
  if (error) {
    // Links only: removing them removes no file's last name.
    const absl::Status failed =
        FileError(error.value(), absl::StrCat("link the files of ", dir, " into ", aside));
    fs::remove_all(aside, error);
    return failed;
  }
  return aside;
}

std::vector<std::filesystem::path> MissingFolders(const std::string& path) {
  namespace fs = std::filesystem;
  std::vector<fs::path> missing;
  std::error_code error;
  // "out/" names the folder "out" (whose parent_path() would be "out" again).
  for (fs::path folder = std::string(absl::StripSuffix(path, "/"));
       !folder.empty() && fs::symlink_status(folder, error).type() == fs::file_type::not_found;
       folder = folder.parent_path()) {
    missing.push_back(folder);
  }
  return missing;
}

void RemoveEmptyFolders(const std::vector<std::filesystem::path>& folders) {
  std::error_code error;
  for (const std::filesystem::path& folder : folders) {
    if (!std::filesystem::is_empty(folder, error) || error) return;
    std::filesystem::remove(folder, error);
  }
}

int FileCreationError(const std::string& folder) {
  std::string probe = folder + "/.dtrain-probe-XXXXXX";
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) return errno;
  ::close(fd);
  ::unlink(probe.c_str());
  return 0;
}

absl::Status WriteAll(int fd, const void* data, size_t bytes, const std::string& path) {
  const char* next = static_cast<const char*>(data);
  while (bytes > 0) {
    // Linux writes at most ~2 GiB per call.
    const ssize_t n = ::write(fd, next, std::min<size_t>(bytes, size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return FileError(n < 0 ? errno : EIO, absl::StrCat("write ", path));
    next += n;
    bytes -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status FsyncDirectory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return FileError(errno, absl::StrCat("open folder ", path));
  const int result = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  // EINVAL and EBADF say the file system has no fsync for folders, not that a rename was lost:
  // PostgreSQL ignores them for folders too (fsync_fname_ext).
  if (result != 0 && error != EINVAL && error != EBADF) {
    return FileError(error, absl::StrCat("fsync folder ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ResolveOutputFile(const std::string& path) {
  std::filesystem::path target = path;
  struct stat info;
  // Linux follows at most 40 links in a path before ELOOP; so does this.
  for (int links = 0; ::lstat(target.c_str(), &info) == 0 && S_ISLNK(info.st_mode); ++links) {
    if (links == 40) return FileError(ELOOP, absl::StrCat("resolve ", path));
    std::error_code error;
    const std::filesystem::path next = std::filesystem::read_symlink(target, error);
    if (error) return FileError(error.value(), absl::StrCat("read the link ", target.string()));
    target = next.is_absolute() ? next : target.parent_path() / next;
  }
  if (::lstat(target.c_str(), &info) == 0 && !S_ISREG(info.st_mode)) {
    return WithExitCode(absl::InvalidArgumentError(absl::StrCat(
                            path, target == path ? "" : absl::StrCat(" (", target.string(), ")"),
                            " is ", FileKind(info),
                            ", not a regular file, and a file written there would replace it: "
                            "give the path of a regular file")),
                        kExitUsage);
  }
  return target.string();
}

absl::Status WriteFileDurably(const std::string& path, const std::string& contents) {
  return WriteFileDurably(path, [&](int fd, const std::string& tmp) {
    return WriteAll(fd, contents.data(), contents.size(), tmp);
  });
}

absl::Status WriteFileDurably(
    const std::string& path,
    const std::function<absl::Status(int fd, const std::string& tmp_path)>& write) {
  ASSIGN_OR_RETURN(const std::string target, ResolveOutputFile(path));
  const std::string tmp = target + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return FileError(errno, absl::StrCat("create ", tmp));
  absl::Status status = write(fd, tmp);
  if (status.ok() && ::fsync(fd) != 0) {
    status = FileError(errno, absl::StrCat("fsync ", tmp));
  }
  ::close(fd);
  if (status.ok() && std::rename(tmp.c_str(), target.c_str()) != 0) {
    status = FileError(errno, absl::StrCat("rename ", tmp, " to ", target));
  }
  if (!status.ok()) {
    ::unlink(tmp.c_str());  // a full disk gets its space back
    return status;
  }
  return FsyncParentDirectory(target);
}

absl::Status FsyncParentDirectory(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return FsyncDirectory(slash == std::string::npos ? "."
                        : slash == 0               ? "/"
                                                   : path.substr(0, slash));
}

}  // namespace dtrain
