#include "core/checkpoint/reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "core/checkpoint/crc32c.h"
#include "core/util/files.h"
#include "core/util/status.h"

namespace dtrain {
namespace {

std::string Describe(const ChunkRecord& c) {
  return absl::StrCat("chunk ", c.tensor, BoxToString(c.box), " in ", c.file, " at byte ",
                      c.offset);
}

}  // namespace

std::vector<std::string> CheckpointCandidates(const std::string& dir) {
  std::vector<std::string> paths;
  for (auto& [step, path] : StepFolders(dir)) paths.push_back(std::move(path));
  std::reverse(paths.begin(), paths.end());
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
  if (absl::IsNotFound(text.status())) {
    return absl::NotFoundError(
        absl::StrCat(step_dir, " has no ", kManifestName, ": the save did not complete"));
  }
  if (!text.ok()) return text.status();
  ASSIGN_OR_RETURN(Manifest manifest, ManifestFromJson(*text, manifest_path));
  // A folder renamed or a manifest edited would resume at another step than its state's.
  const std::string folder = step_dir.substr(0, step_dir.find_last_not_of('/') + 1);
  const std::optional<int64_t> folder_step =
      StepOfDirName(folder.substr(folder.find_last_of('/') + 1));
  if (folder_step && *folder_step != manifest.step) {
    return absl::DataLossError(absl::StrCat(manifest_path, " is of step ", manifest.step,
                                            ", not of its folder's step ", *folder_step,
                                            "; the manifest is damaged or the folder renamed"));
  }
  CheckpointReader reader(step_dir, std::move(manifest));
  const Manifest& m = reader.manifest_;
  for (size_t i = 0; i < m.chunks.size(); ++i) reader.chunks_of_[m.chunks[i].tensor].push_back(i);
  reader.extents_.resize(m.chunks.size());
  for (const TensorRecord& tensor : m.tensors) {
    const std::vector<int64_t> shape = ChunkShape(m, tensor);
    int64_t numel = 1;
    bool valid_shape = true;
    for (const int64_t n : shape) {
      valid_shape = valid_shape && n >= 0 && !__builtin_mul_overflow(numel, n, &numel);
    }
    if (!valid_shape || numel != tensor.numel) {
      return absl::DataLossError(absl::StrCat(manifest_path, ": tensor ", tensor.name,
                                              " has shape ", BoxToString(WholeBox(shape)), " but ",
                                              tensor.numel, " elements; the manifest is damaged"));
    }
    std::vector<size_t>& list = reader.chunks_of_[tensor.name];
    int64_t covered = 0;
    for (const size_t i : list) {
      const ChunkRecord& c = m.chunks[i];
      if (!BoxInShape(c.box, shape) || c.dtype != tensor.dtype ||
          c.bytes != static_cast<uint64_t>(BoxNumel(c.box)) * DataTypeBytes(c.dtype)) {
        return absl::DataLossError(
            absl::StrCat(manifest_path, ": ", Describe(c), " does not fit tensor ", tensor.name,
                         " of shape ", BoxToString(WholeBox(shape)), " and type ",
                         DataTypeName(tensor.dtype), "; the manifest is damaged"));
      }
      reader.extents_[i] = {FlatIndexOfFirst(c.box, shape), FlatIndexOfLast(c.box, shape)};
      // Each box fits the tensor, so stopping at more than the tensor keeps the sum in int64.
      if (BoxNumel(c.box) > tensor.numel - covered) {
        return absl::DataLossError(absl::StrCat(manifest_path, ": the chunks of tensor ",
                                                tensor.name, " hold more than its ", tensor.numel,
                                                " elements; the manifest is damaged"));
      }
      covered += BoxNumel(c.box);
    }
    std::sort(list.begin(), list.end(),
              [&](size_t a, size_t b) { return reader.extents_[a] < reader.extents_[b]; });
    // Only chunks whose flat extents overlap can share an element: for the flat ranges of a
    // data-parallel save this compares each chunk with its successor only.
    for (size_t a = 0; a < list.size(); ++a) {
      for (size_t b = a + 1;
           b < list.size() && reader.extents_[list[b]].first <= reader.extents_[list[a]].second;
           ++b) {
        if (IntersectBoxes(m.chunks[list[a]].box, m.chunks[list[b]].box)) {
          return absl::DataLossError(absl::StrCat(manifest_path, ": ", Describe(m.chunks[list[a]]),
                                                  " overlaps ", Describe(m.chunks[list[b]]),
                                                  "; the manifest is damaged"));
        }
      }
    }
    if (covered != tensor.numel) {
      return absl::DataLossError(absl::StrCat(manifest_path, ": the chunks of tensor ", tensor.name,
                                              " cover ", covered, " of its ", tensor.numel,
                                              " elements; the manifest is damaged"));
    }
  }
  if (reader.chunks_of_.size() != m.tensors.size()) {
    return absl::DataLossError(
        absl::StrCat(manifest_path, ": chunks name tensors the manifest does not list"));
  }
  // Every chunk lies inside a file of the step folder that the manifest lists.
  std::map<std::string, uint64_t> file_bytes;
  for (const Manifest::File& file : m.files) {
    if (file.name.empty() || file.name.find('/') != std::string::npos || file.name == "." ||
        file.name == "..") {
      return absl::DataLossError(absl::StrCat(manifest_path, ": file \"", file.name,
                                              "\" is not a name in the step folder; the manifest "
                                              "is damaged"));
    }
    file_bytes[file.name] = file.bytes;
  }
  for (const ChunkRecord& c : m.chunks) {
    const auto file = file_bytes.find(c.file);
    if (file == file_bytes.end() || c.offset > file->second || c.bytes > file->second - c.offset) {
      return absl::DataLossError(absl::StrCat(manifest_path, ": ", Describe(c), " (", c.bytes,
                                              " bytes) lies outside the files the "
                                              "manifest lists; the manifest is damaged"));
    }
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
    // A read the system failed is no damage of the data (it may read the next time).
    if (n < 0)
      return absl::ErrnoToStatus(errno, absl::StrCat(dir_, ": ", Describe(chunk), ": read"));
    if (n == 0) {
      return absl::DataLossError(
          absl::StrCat(dir_, ": ", Describe(chunk), ": read ended early (truncated file)"));
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
  const std::vector<Box> boxes = FlatRangeToBoxes(ChunkShape(manifest_, *record), begin, end);
  std::vector<float*> outs;
  for (const Box& box : boxes) {
    outs.push_back(out);
    out += BoxNumel(box);
  }
  return ReadBoxes(*record, boxes, outs);
}

absl::Status CheckpointReader::ReadBox(const std::string& tensor, const Box& box, float* out) {
  return ReadBoxes(tensor, {box}, {out});
}

absl::Status CheckpointReader::ReadBoxes(const std::string& tensor, const std::vector<Box>& boxes,
                                         const std::vector<float*>& outs) {
  const TensorRecord* record = manifest_.FindTensor(tensor);
  if (record == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(dir_, " has no tensor ", tensor, "; it was saved from a different model"));
  }
  const std::vector<int64_t> shape = ChunkShape(manifest_, *record);
  for (size_t k = 0; k < boxes.size(); ++k) {
    if (!BoxInShape(boxes[k], shape)) {
      return absl::InvalidArgumentError(absl::StrCat(dir_, ": box ", BoxToString(boxes[k]), " of ",
                                                     tensor, " is outside its shape ",
                                                     BoxToString(WholeBox(shape))));
    }
    if (k > 0 && FlatIndexOfFirst(boxes[k], shape) <= FlatIndexOfLast(boxes[k - 1], shape)) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir_, ": boxes of ", tensor, " out of flat order: ", BoxToString(boxes[k]),
                       " starts before ", BoxToString(boxes[k - 1]), " ends"));
    }
  }
  if (outs.size() != boxes.size()) {
    return absl::InvalidArgumentError(absl::StrCat(dir_, ": ", boxes.size(), " boxes of ", tensor,
                                                   " but ", outs.size(), " destinations"));
  }
  return ReadBoxes(*record, boxes, outs);
}

absl::Status CheckpointReader::ReadBoxes(const TensorRecord& tensor, const std::vector<Box>& boxes,
                                         const std::vector<float*>& outs) {
  if (tensor.dtype != DataType::kF32) {
    return absl::UnimplementedError(absl::StrCat(dir_, ": tensor ", tensor.name, " is stored as ",
                                                 DataTypeName(tensor.dtype),
                                                 "; this dtrain loads f32 tensors only"));
  }
  if (boxes.empty()) return absl::OkStatus();
  const std::vector<int64_t> shape = ChunkShape(manifest_, tensor);
  const int64_t first = FlatIndexOfFirst(boxes.front(), shape);
  const int64_t last = FlatIndexOfLast(boxes.back(), shape);
  std::vector<std::optional<Box>> regions(boxes.size());
  for (const size_t i : chunks_of_[tensor.name]) {
    if (extents_[i].first > last) break;
    if (extents_[i].second < first) continue;
    const ChunkRecord& c = manifest_.chunks[i];
    bool needed = false;
    size_t home = boxes.size();  // a requested box the chunk is one run of
    for (size_t k = 0; k < boxes.size(); ++k) {
      regions[k] = IntersectBoxes(c.box, boxes[k]);
      needed = needed || regions[k].has_value();
      if (regions[k] == c.box && ContiguousInBox(c.box, boxes[k])) home = k;
    }
    if (home < boxes.size()) {
      RETURN_IF_ERROR(ReadChunk(c, outs[home] + PositionInBox(c.box.offsets, boxes[home])));
      continue;
    }
    if (!needed) continue;
    scratch_.resize(static_cast<size_t>(BoxNumel(c.box)));
    RETURN_IF_ERROR(ReadChunk(c, scratch_.data()));
    for (size_t k = 0; k < boxes.size(); ++k) {
      if (regions[k]) {
        CopyBoxRegion(*regions[k], c.box, scratch_.data(), boxes[k], outs[k], sizeof(float));
      }
    }
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
