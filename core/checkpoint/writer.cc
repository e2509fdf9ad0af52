#include "core/checkpoint/writer.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/checkpoint/crc32c.h"
#include "core/util/exit_codes.h"
#include "core/util/files.h"
#include "core/util/log.h"
#include "core/util/status.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;

uint64_t ChunkBytes(const ChunkSource& chunk) {
  return static_cast<uint64_t>(BoxNumel(chunk.box)) * DataTypeBytes(chunk.dtype);
}

std::string StageDir(const SaveRequest& r) {
  return absl::StrFormat("%s/.%s.%016x", r.dir, StepDirName(r.step), r.nonce);
}

// The longest path a save of a step up to `last_step` writes: the stage folder's manifest or
// rank index as WriteFileDurably's ".tmp" (its rank file, the moved-aside step folder and latest
// are shorter).
std::string LongestSavePath(const std::string& dir, int64_t last_step, int rank) {
  SaveRequest longest;
  longest.dir = dir;
  longest.step = last_step;
  longest.nonce = ~uint64_t{0};
  std::string file = RankIndexName(rank);
  if (file.size() < std::strlen(kManifestName)) file = kManifestName;
  return absl::StrCat(StageDir(longest), "/", file, ".tmp");
}

// This rank's file and index in the stage folder.
absl::Status WriteRankFiles(const SaveRequest& r, const std::string& stage) {
  const std::string file = RankFileName(r.rank);
  const std::string path = stage + "/" + file;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return FileError(errno, absl::StrCat("create ", path));
  RankIndex index{r.nonce, r.step, r.rank, file, 0, {}, r.data};
  absl::Status status;
  for (const ChunkSource& chunk : r.chunks) {
    const uint64_t bytes = ChunkBytes(chunk);
    index.chunks.push_back(ChunkRecord{chunk.tensor, chunk.box, chunk.dtype, file, index.file_bytes,
                                       bytes, Crc32c(0, chunk.values, bytes)});
    status = WriteAll(fd, chunk.values, bytes, path);
    if (!status.ok()) break;
    index.file_bytes += bytes;
  }
  if (status.ok() && ::fsync(fd) != 0) status = FileError(errno, "fsync " + path);
  ::close(fd);
  RETURN_IF_ERROR(status);
  return WriteFileDurably(stage + "/" + RankIndexName(r.rank), RankIndexToJson(index));
}

// Rank 0: every rank's index of this attempt, waiting for them up to the timeout.
absl::StatusOr<std::vector<RankIndex>> CollectIndexes(const SaveRequest& r,
                                                      const std::string& stage) {
  std::vector<RankIndex> indexes(r.world);
  std::vector<bool> found(r.world, false);
  const absl::Time deadline = absl::Now() + absl::Seconds(r.timeout_s);
  for (;;) {
    std::vector<int> missing;
    for (int rank = 0; rank < r.world; ++rank) {
      if (found[rank]) continue;
      const std::string path = stage + "/" + RankIndexName(rank);
      absl::StatusOr<std::string> text = ReadWholeFile(path);
      if (text.ok()) {
        absl::StatusOr<RankIndex> index = RankIndexFromJson(*text, path);
        if (index.ok() && index->nonce == r.nonce && index->step == r.step) {
          indexes[rank] = *std::move(index);
          found[rank] = true;
          continue;
        }
      }
      missing.push_back(rank);
    }
    if (missing.empty()) return indexes;
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "rank(s) ", absl::StrJoin(missing, ", "), " did not report their files in ", stage,
          " within ", r.timeout_s,
          "s (parallel.timeout_s); is checkpoint.dir on a filesystem all ranks share?"));
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
}

// The complete checkpoints in `dir` (those with a manifest), oldest first.
std::vector<int64_t> CompleteSteps(const std::string& dir) {
  std::vector<int64_t> steps;
  std::error_code error;
  for (const auto& [step, path] : StepFolders(dir)) {
    if (fs::exists(fs::path(path) / kManifestName, error)) steps.push_back(step);
  }
  return steps;
}

absl::Status Commit(const SaveRequest& r, const std::string& stage) {
  ASSIGN_OR_RETURN(std::vector<RankIndex> indexes, CollectIndexes(r, stage));
  Manifest manifest = r.manifest;
  manifest.step = r.step;
  manifest.chunks.clear();
  manifest.files.clear();
  manifest.data.clear();
  for (RankIndex& index : indexes) {
    manifest.files.push_back({index.file, index.file_bytes});
    manifest.data.push_back(index.data);
    for (ChunkRecord& chunk : index.chunks) manifest.chunks.push_back(std::move(chunk));
  }
  RETURN_IF_ERROR(WriteFileDurably(stage + "/" + kManifestName, ManifestToJson(manifest)));

  const std::string final_dir = r.dir + "/" + StepDirName(r.step);
  std::error_code error;
  if (fs::exists(final_dir, error)) {
    // Never overwrite: an earlier step-<N> (a damaged one that resume skipped, or one of another
    // run) moves aside and stays for inspection.
    const std::string aside = AsideName(final_dir, r.nonce);
    fs::rename(final_dir, aside, error);
    if (error) {
      return absl::InternalError(absl::StrCat("cannot move the existing ", final_dir, " aside to ",
                                              aside, ": ", error.message()));
    }
    LogWarn("checkpoint: %s existed and was moved to %s", final_dir, aside);
  }
  fs::rename(stage, final_dir, error);
  if (error) {
    return absl::InternalError(
        absl::StrCat("cannot rename ", stage, " to ", final_dir, ": ", error.message()));
  }
  RETURN_IF_ERROR(FsyncDirectory(r.dir));
  // The checkpoint is complete now; `latest` only names the newest, and a resume that finds it
  // stale takes the newest complete one anyway.
  if (absl::Status latest = WriteFileDurably(r.dir + "/" + kLatestName, StepDirName(r.step) + "\n");
      !latest.ok()) {
    return Renamed(latest, absl::StrCat(final_dir, " is complete (a resume finds it), but ",
                                        kLatestName, " could not name it: ", latest.message()));
  }

  // Older complete checkpoints beyond keep_last go only now that this one is complete. Each is
  // renamed to a stage folder's name first, at once: a kill during the removal leaves no
  // step-<N> without its manifest, and the next save's RemoveOtherAttemptsStages ends it.
  if (r.keep_last > 0) {
    std::vector<int64_t> steps = CompleteSteps(r.dir);
    steps.erase(std::remove_if(steps.begin(), steps.end(), [&](int64_t s) { return s > r.step; }),
                steps.end());
    for (size_t i = 0; i + r.keep_last < steps.size(); ++i) {
      const std::string pruned = absl::StrCat(r.dir, "/.", StepDirName(steps[i]), ".pruned");
      fs::rename(r.dir + "/" + StepDirName(steps[i]), pruned, error);
      if (!error) fs::remove_all(pruned, error);
    }
  }
  return absl::OkStatus();
}

// Stage folders of earlier attempts (killed, or out of space, while saving) and pruned
// checkpoints whose removal a kill cut short are garbage, removed before this save writes: on a
// full disk they would hold the space it needs.
void RemoveOtherAttemptsStages(const SaveRequest& r) {
  const std::string own_suffix = absl::StrFormat(".%016x", r.nonce);
  std::error_code error;
  std::vector<fs::path> garbage;
  for (fs::directory_iterator it(r.dir, error); !error && it != fs::directory_iterator();
       it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (name.starts_with(".step-") && !name.ends_with(own_suffix)) garbage.push_back(it->path());
  }
  for (const fs::path& path : garbage) fs::remove_all(path, error);
}

// The error of a save that failed with `cause`, naming the checkpoint and the rank. A full file
// system says how full, what to do, and asks the command to exit kExitDiskFull: a restart would
// fail at the same save.
absl::Status SaveFailed(const SaveRequest& request, const absl::Status& cause) {
  const std::string message = absl::StrCat("checkpoint ", StepDirName(request.step), ", rank ",
                                           request.rank, ": ", cause.message());
  if (!IsFileSystemFull(cause)) return Renamed(cause, message);
  uint64_t part = 0;
  for (const ChunkSource& chunk : request.chunks) part += ChunkBytes(chunk);
  struct statvfs space = {};
  const bool known = ::statvfs(request.dir.c_str(), &space) == 0;
  const double free_mib =
      known ? space.f_bavail * static_cast<double>(space.f_frsize) / 1048576.0 : 0.0;
  // ENOSPC with bytes to spare: the file system has no inode left for a new file (a file system
  // with no fixed count, as btrfs, reports f_files 0).
  const bool no_inodes = known && space.f_files > 0 && space.f_favail == 0;
  const std::string full =
      no_inodes ? absl::StrFormat(
                      "has no free inodes (files) left (%.1f MiB free, but no new "
                      "file can be made)",
                      free_mib)
                : absl::StrFormat("is full (%.1f MiB free, this rank's part is %.1f MiB)", free_mib,
                                  part / 1048576.0);
  // Fewer checkpoints than one is none.
  const std::string fewer = request.keep_last > 1
                                ? absl::StrCat(", keep fewer checkpoints (checkpoint.keep_last is ",
                                               request.keep_last, ")")
                                : "";
  return WithExitCode(
      Renamed(cause,
              absl::StrFormat("%s; the checkpoint folder's file system %s: %s there%s, or set "
                              "checkpoint.dir to a larger file system",
                              message, full, no_inodes ? "remove files" : "free space", fewer)),
      kExitDiskFull);
}

}  // namespace

void AppendFlatRangeChunks(const std::string& tensor, const std::vector<int64_t>& shape,
                           int64_t begin, int64_t end, const float* values,
                           std::vector<ChunkSource>& chunks) {
  for (Box& box : FlatRangeToBoxes(shape, begin, end)) {
    const int64_t numel = BoxNumel(box);
    chunks.push_back(ChunkSource{tensor, std::move(box), values});
    values += numel;
  }
}

absl::Status WriteCheckpoint(const SaveRequest& request) {
  if (request.rank == 0) RemoveOtherAttemptsStages(request);
  const std::string stage = StageDir(request);
  std::error_code error;
  fs::create_directories(stage, error);
  if (error) {
    const absl::Status created = FileError(error.value(), absl::StrCat("create ", stage));
    if (IsFileSystemFull(created)) return SaveFailed(request, created);
    return absl::FailedPreconditionError(absl::StrCat("cannot create the checkpoint folder ", stage,
                                                      ": ", error.message(),
                                                      "; set checkpoint.dir to a writable folder"));
  }
  if (absl::Status written = WriteRankFiles(request, stage); !written.ok()) {
    // Judged as the write found the file system (out of inodes, say), before this rank's file
    // goes: what it wrote of an incomplete save is of no use, and its space goes back at once.
    const absl::Status failed = SaveFailed(request, written);
    fs::remove(stage + "/" + RankFileName(request.rank), error);
    return failed;
  }
  if (request.rank != 0) return absl::OkStatus();
  const absl::Status committed = Commit(request, stage);
  return committed.ok() ? committed : SaveFailed(request, committed);
}

absl::Status CheckCheckpointFolder(const std::string& dir, int rank, int64_t last_step) {
  // A restart finds a folder that is read-only, not permitted or not a folder so again, and a
  // full one full: the command exits kExitUsage or kExitDiskFull, which the agent does not
  // restart. Other errors (EIO, ESTALE of a network file system) may pass: exit 1, restarted.
  const auto unusable = [&](const std::string& why, int error_number) {
    absl::Status status = absl::FailedPreconditionError(
        absl::StrCat("checkpoint.dir ", dir, " cannot hold this run's checkpoints: ", why,
                     "; set checkpoint.dir ",
                     error_number == ENAMETOOLONG ? "to a shorter path" : "to a writable folder"));
    if (const std::optional<int> exit_code = FileErrorExitCode(error_number)) {
      SetExitCode(status, *exit_code);
    }
    return status;
  };
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) {
    absl::Status status =
        unusable(absl::StrCat("cannot create it: ", error.message()), error.value());
    // Its parents created first, a folder the file system still says does not exist is one it
    // cannot hold (under /proc): no restart creates it either.
    if (error.value() == ENOENT) SetExitCode(status, kExitUsage);
    return status;
  }
  // A save's paths are longer than the probe's: their length is checked here, not found too long
  // at the first save, after the training.
  const std::string longest = LongestSavePath(dir, last_step, rank);
  const long path_max = ::pathconf(dir.c_str(), _PC_PATH_MAX);
  if (path_max > 0 && longest.size() >= static_cast<size_t>(path_max)) {
    return unusable(absl::StrCat("a save writes paths of up to ", longest.size(),
                                 " characters there, and the system takes at most ", path_max - 1),
                    ENAMETOOLONG);
  }
  if (const int failure = FileCreationError(dir); failure != 0) {
    return unusable(absl::StrCat("cannot write a file there: ", std::strerror(failure)), failure);
  }
  return absl::OkStatus();
}

CheckpointWriter::~CheckpointWriter() { (void)Wait(); }

absl::StatusOr<float*> CheckpointWriter::Stage(size_t floats) {
  RETURN_IF_ERROR(Wait());
  if (staging_.size() < floats) staging_.resize(floats);
  return staging_.data();
}

absl::Status CheckpointWriter::Save(SaveRequest request) {
  RETURN_IF_ERROR(Wait());
  if (!async_) return WriteCheckpoint(request);
  finished_ = false;
  thread_ = std::thread([this, request = std::move(request)] {
    result_ = WriteCheckpoint(request);
    finished_ = true;
  });
  return absl::OkStatus();
}

absl::Status CheckpointWriter::Poll() {
  if (!thread_.joinable() || !finished_) return absl::OkStatus();
  return Wait();
}

absl::Status CheckpointWriter::Wait() {
  if (thread_.joinable()) thread_.join();
  absl::Status result = result_;
  result_ = absl::OkStatus();
  return result;
}

}  // namespace dtrain
