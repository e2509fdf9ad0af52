#include "core/checkpoint/reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "core/checkpoint/crc32c.h"
#include "core/util/status.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;

std::string Describe(const ChunkRecord& c) {
  return absl::StrCat("chunk ", c.tensor, "[", c.begin, ":", c.end, ") in ", c.file, " at byte ",
                      c.offset);
}

}  // namespace

std::vector<std::string> CheckpointCandidates(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) != 0 || !entry.is_directory(error)) continue;
    const std::string digits = name.substr(5);
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    found.emplace_back(std::stoll(digits), entry.path().string());
  }
  std::sort(found.rbegin(), found.rend());
  std::vector<std::string> paths;
  for (auto& [step, path] : found) paths.push_back(std::move(path));
  return paths;
}

std::string LatestName(const std::string& dir) {
  absl::StatusOr<std::string> text = ReadWholeFile(dir + "/" + kLatestName);
  if (!text.ok()) return "";
  return std::string(absl::StripTrailingAsciiWhitespace(*text));
}

CheckpointReader::CheckpointReader(std::string dir, Manifest manifest)
    : dir_(std::move(dir)), manifest_(std::move(manifest)) {}

CheckpointReader::~CheckpointReader() {
  for (const auto& [name, fd] : fds_) ::close(fd);
}

absl::StatusOr<CheckpointReader> CheckpointReader::Open(const std::string& step_dir) {
  const std::string manifest_path = step_dir + "/" + kManifestName;
  absl::StatusOr<std::string> text = ReadWholeFile(manifest_path);
  if (!text.ok()) {
    return absl::NotFoundError(
        absl::StrCat(step_dir, " has no ", kManifestName, ": the save did not complete"));
  }
  ASSIGN_OR_RETURN(Manifest manifest, ManifestFromJson(*text, manifest_path));
  CheckpointReader reader(step_dir, std::move(manifest));
  const Manifest& m = reader.manifest_;
  for (size_t i = 0; i < m.chunks.size(); ++i) reader.chunks_of_[m.chunks[i].tensor].push_back(i);
  for (const TensorRecord& tensor : m.tensors) {
    std::vector<size_t>& list = reader.chunks_of_[tensor.name];
    std::sort(list.begin(), list.end(),
              [&](size_t a, size_t b) { return m.chunks[a].begin < m.chunks[b].begin; });
    int64_t covered = 0;
    for (const size_t i : list) {
      const ChunkRecord& c = m.chunks[i];
      if (c.begin != covered || c.end <= c.begin ||
          c.bytes != static_cast<uint64_t>(c.end - c.begin) * sizeof(float)) {
        return absl::DataLossError(absl::StrCat(manifest_path, ": ", Describe(c),
                                                " does not continue the tensor at element ",
                                                covered, "; the manifest is damaged"));
      }
      covered = c.end;
    }
    if (covered != tensor.numel) {
      return absl::DataLossError(absl::StrCat(manifest_path, ": tensor ", tensor.name,
                                              " is covered up to element ", covered, " of ",
                                              tensor.numel, "; the manifest is damaged"));
    }
  }
  if (reader.chunks_of_.size() != m.tensors.size()) {
    return absl::DataLossError(
        absl::StrCat(manifest_path, ": chunks name tensors the manifest does not list"));
  }
  for (const Manifest::File& file : m.files) {
    const std::string path = step_dir + "/" + file.name;
    struct stat info;
    if (::stat(path.c_str(), &info) != 0) {
      return absl::DataLossError(absl::StrCat(path, " is missing"));
    }
    if (static_cast<uint64_t>(info.st_size) != file.bytes) {
      return absl::DataLossError(
          absl::StrCat(path, " holds ", info.st_size, " bytes, the manifest says ", file.bytes,
                       (static_cast<uint64_t>(info.st_size) < file.bytes ? " (truncated)" : "")));
    }
  }
  return reader;
}

absl::StatusOr<int> CheckpointReader::FileFd(const std::string& name) {
  const auto it = fds_.find(name);
  if (it != fds_.end()) return it->second;
  const std::string path = dir_ + "/" + name;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("open ", path));
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);  // a larger read-ahead window
  fds_[name] = fd;
  return fd;
}

absl::Status CheckpointReader::ReadChunk(const ChunkRecord& chunk, float* out) {
  // Small enough to stay in L2/L3 between the read and the checksum.
  constexpr uint64_t kBlockBytes = 4u << 20;
  ASSIGN_OR_RETURN(const int fd, FileFd(chunk.file));
  if (out == nullptr) check_block_.resize(kBlockBytes);
  uint32_t crc = 0;
  uint64_t done = 0;
  while (done < chunk.bytes) {
    char* block = out == nullptr ? check_block_.data() : reinterpret_cast<char*>(out) + done;
    const ssize_t n = ::pread(fd, block, std::min(chunk.bytes - done, kBlockBytes),
                              static_cast<off_t>(chunk.offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::DataLossError(
          absl::StrCat(dir_, ": ", Describe(chunk), ": read ",
                       n == 0 ? "ended early (truncated file)" : std::string(strerror(errno))));
    }
    crc = Crc32c(crc, block, static_cast<size_t>(n));
    done += static_cast<uint64_t>(n);
  }
  if (crc != chunk.crc32c) {
    return absl::DataLossError(
        absl::StrFormat("%s: %s: checksum %08x, the manifest says %08x (the file is damaged)", dir_,
                        Describe(chunk), crc, chunk.crc32c));
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::Read(const std::string& tensor, int64_t begin, int64_t end,
                                    float* out) {
  const TensorRecord* record = manifest_.FindTensor(tensor);
  if (record == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(dir_, " has no tensor ", tensor, "; it was saved from a different model"));
  }
  if (begin < 0 || end > record->numel || begin > end) {
    return absl::InvalidArgumentError(absl::StrCat(dir_, ": elements [", begin, ", ", end, ") of ",
                                                   tensor, " are outside its ", record->numel));
  }
  for (const size_t i : chunks_of_[tensor]) {
    const ChunkRecord& c = manifest_.chunks[i];
    if (c.end <= begin || c.begin >= end) continue;
    if (c.begin >= begin && c.end <= end) {
      RETURN_IF_ERROR(ReadChunk(c, out + (c.begin - begin)));
      continue;
    }
    scratch_.resize(static_cast<size_t>(c.end - c.begin));
    RETURN_IF_ERROR(ReadChunk(c, scratch_.data()));
    const int64_t lo = std::max(begin, c.begin);
    const int64_t hi = std::min(end, c.end);
    std::copy(scratch_.begin() + (lo - c.begin), scratch_.begin() + (hi - c.begin),
              out + (lo - begin));
  }
  return absl::OkStatus();
}

std::vector<std::string> CheckpointReader::VerifyAll() {
  std::vector<std::string> problems;
  for (const ChunkRecord& chunk : manifest_.chunks) {
    if (absl::Status status = ReadChunk(chunk, nullptr); !status.ok()) {
      problems.emplace_back(status.message());
    }
  }
  return problems;
}

}  // namespace dtrain
