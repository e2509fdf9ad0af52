// Files read and written whole, with errors that say why and name the file.
#pragma once

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {

// The error of a file system call that set errno `error`: "<what>: <strerror>[; <fix>]", where
// `what` names the call and the file ("write /ckpt/rank-0.bin"). It asks for FileErrorExitCode's
// exit code, and EFBIG names the file-size limit. A full file system (ENOSPC, EDQUOT) is marked
// for IsFileSystemFull: absl's ResourceExhausted also stands for too many open files or no memory.
absl::Status FileError(int error, absl::string_view what, absl::string_view fix = {});
// The exit code of a file error that a restart would meet again, so that the agent does not
// restart it: kExitDiskFull for a full file system or the file-size limit (ENOSPC, EDQUOT,
// EFBIG), kExitUsage for a path this process may never write or that cannot be (EACCES, EPERM,
// EROFS, ENOTDIR, EEXIST, ENAMETOOLONG); none for the others (EIO, ESTALE), which may pass.
std::optional<int> FileErrorExitCode(int error);
// Whether errno `error` says the file system is full (ENOSPC, EDQUOT).
bool IsFileSystemFullError(int error);
// Whether `status` is a FileError of a full file system.
bool IsFileSystemFull(const absl::Status& status);

// A folder opens as a stream and fails at its first read (std::istreambuf_iterator throws), so
// it is refused before.

// `path` opened for reading: NotFound when it does not exist, InvalidArgument when it is a folder,
// otherwise the error of open(2) with its errno; each names `path`.
absl::StatusOr<std::ifstream> OpenInputFile(const std::string& path);

// The bytes of the file at `path`: OpenInputFile's errors, or the read's with its errno;
// FailedPrecondition past `max_bytes` (a device such as /dev/zero never ends).
absl::StatusOr<std::string> ReadWholeFile(const std::string& path,
                                          size_t max_bytes = std::string::npos);

// The first bytes of the regular file at `path`, at most `max_bytes` (fewer when it is shorter);
// none when no regular file is there or it cannot be read. What lies at a path an output is about
// to replace: a FIFO or device is never opened, since its open or read may wait for ever.
std::optional<std::string> RegularFileHead(const std::string& path, size_t max_bytes);

// Whether `path` is `folder` or lies inside it, links and ".." resolved as far as the paths exist
// (neither needs to): what an output must not be when it would overwrite an input.
bool IsSameOrInside(const std::string& path, const std::string& folder);

// 0 when a file can be made in the folder `folder`: one is, under a name no other process uses,
// and removed. Else the errno of its creation. access(W_OK) is no answer: root passes it where
// no file can be made (under /proc).
int FileCreationError(const std::string& folder);

// Keeps the file at `path` as it is now under a second name beside it, a hard link
// "<path>.replaced-<unix time>" ("...-2", "-3", ... where that is taken): a writer that then
// replaces `path` (a file written whole and renamed over it) leaves it there. The name, or
// FileError (NotFound when there is no file).
absl::StatusOr<std::string> LinkAside(const std::string& path);
// LinkAside for the files of the folder `dir` that `keep` takes by name (not its subfolders,
// links or devices): a new folder "<dir>.replaced-<unix time>" ("...-2", ... where taken) of hard
// links to them. The new folder's name, or FileError (NotFound when there is no folder).
absl::StatusOr<std::string> LinkFolderAside(const std::string& dir,
                                            const std::function<bool(absl::string_view)>& keep);

// The folders on the way to the folder `path` that are not there (not even as a link, dangling or
// not), `path` first: those that create_directories(path) makes, for RemoveEmptyFolders to undo.
std::vector<std::filesystem::path> MissingFolders(const std::string& path);
// Removes `folders` in their order (deepest first) up to the first that is not empty.
void RemoveEmptyFolders(const std::vector<std::filesystem::path>& folders);

// Writes all of [data, data + bytes) to `fd`, retrying short writes; `path` names it in errors.
absl::Status WriteAll(int fd, const void* data, size_t bytes, const std::string& path);

// Where a file written as "<path>.tmp" and renamed over `path` goes: `path`, or the file its
// symbolic links lead to (existing or not), so that a link stays a link. When that exists and is
// not a regular file (a device such as /dev/null, a FIFO, a socket, a folder) the rename would
// replace it: InvalidArgument naming `path`, asking for kExitUsage.
absl::StatusOr<std::string> ResolveOutputFile(const std::string& path);

// Durable small files: writes "<path>.tmp", fsyncs it, renames it to `path` and fsyncs the
// folder, so `path` holds either its old or its new contents after a crash; on an error the
// ".tmp" is removed. `path` is where ResolveOutputFile leads, which refuses a device or folder.
absl::Status WriteFileDurably(const std::string& path, const std::string& contents);
// The same for contents too large to hold at once: `write` writes them into the open ".tmp"
// (through WriteAll, say), given its descriptor and path.
absl::Status WriteFileDurably(
    const std::string& path,
    const std::function<absl::Status(int fd, const std::string& tmp_path)>& write);
// Makes a rename or a new file in the folder `path` durable. A file system that cannot fsync a
// folder (EINVAL, EBADF: some FUSE, SMB and 9p mounts) makes it as durable as it can: OK.
absl::Status FsyncDirectory(const std::string& path);
// FsyncDirectory of the folder holding the file `path`.
absl::Status FsyncParentDirectory(const std::string& path);

}  // namespace dtrain
