#include "core/util/read_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace {

// An open descriptor of `path` that is not a folder's.
absl::StatusOr<int> OpenFileDescriptor(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("open ", path));
  struct stat info;
  if (::fstat(fd, &info) == 0 && S_ISDIR(info.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is a folder, not a file"));
  }
  return fd;
}

}  // namespace

absl::StatusOr<std::ifstream> OpenInputFile(const std::string& path) {
  absl::StatusOr<int> fd = OpenFileDescriptor(path);
  if (!fd.ok()) return fd.status();
  ::close(*fd);
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::ErrnoToStatus(errno, absl::StrCat("open ", path));
  return in;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
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
      return absl::ErrnoToStatus(error, absl::StrCat("read ", path));
    }
    if (n == 0) break;
    text.append(block, static_cast<size_t>(n));
  }
  ::close(*fd);
  return text;
}

}  // namespace dtrain
