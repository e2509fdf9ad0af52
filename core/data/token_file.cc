#include "core/data/token_file.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/data/compressed_format.h"
#include "core/data/tar_reader.h"
#include "core/util/exit_codes.h"
#include "core/util/files.h"
#include "core/util/log.h"
#include "core/util/status.h"

namespace dtrain {
namespace {

constexpr int32_t kLlmcMagic = 20240520;
constexpr int32_t kLlmcVersion = 1;  // uint16 tokens
constexpr size_t kLlmcHeaderInts = 256;
constexpr size_t kLlmcHeaderBytes = kLlmcHeaderInts * sizeof(int32_t);

using File = std::unique_ptr<std::FILE, int (*)(std::FILE*)>;

absl::StatusOr<File> OpenFile(const std::string& path, uint64_t* bytes) {
  // O_NONBLOCK: opening a FIFO waits for a writer, which may never come; it is refused below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return FileError(errno, absl::StrCat("opening data file ", path));
  File file(::fdopen(fd, "rb"), &std::fclose);
  if (file == nullptr) {
    ::close(fd);
    return FileError(errno, absl::StrCat("opening data file ", path));
  }
  // The size comes from fstat, not from seeking to the end: a directory opens too, and ext4
  // answers a seek to its end with 2^63 - 1.
  struct stat info;
  if (::fstat(fd, &info) != 0) {
    return FileError(errno, absl::StrCat("sizing data file ", path));
  }
  // Files a restart would find the same: exit 2, which the agent does not restart.
  if (S_ISDIR(info.st_mode)) {
    return WithExitCode(
        absl::InvalidArgumentError(absl::StrCat(
            "data file ", path,
            " is a directory; name the files inside it in data.train or data.val (a glob such as ",
            path, "/* works)")),
        kExitUsage);
  }
  if (!S_ISREG(info.st_mode)) {
    return WithExitCode(
        absl::InvalidArgumentError(absl::StrCat(
            "data file ", path,
            " is not a regular file (a device, FIFO or socket), whose bytes may never end; name "
            "files of text or tokens in data.train or data.val")),
        kExitUsage);
  }
  *bytes = static_cast<uint64_t>(info.st_size);
  return file;
}

absl::Status ReadExactly(std::FILE* file, void* out, size_t bytes, const std::string& path) {
  if (std::fread(out, 1, bytes, file) != bytes) {
    return absl::DataLossError(
        absl::StrCat("data file ", path, ": short read (file changed while reading?)"));
  }
  return absl::OkStatus();
}

// A data file that does not fit the recipe: exit 2, since a restart reads the same.
absl::Status BadDataFile(const std::string& path, absl::string_view what) {
  return WithExitCode(absl::InvalidArgumentError(absl::StrCat("data file ", path, ": ", what)),
                      kExitUsage);
}

// Appends `values` to `tokens`, checking each against the vocabulary.
template <typename T>
absl::Status AppendChecked(const std::vector<T>& values, int vocab_size, const std::string& path,
                           std::vector<int32_t>* tokens) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (static_cast<int64_t>(values[i]) >= vocab_size) {
      return BadDataFile(
          path,
          absl::StrCat(
              "token ", values[i], " at position ", i, " is outside model.vocab_size ", vocab_size,
              "; set model.vocab_size to the tokenizer's vocabulary, or check data.format"));
    }
  }
  tokens->insert(tokens->end(), values.begin(), values.end());
  return absl::OkStatus();
}

// Bytes data.format text would train on as tokens that no one means to: a compressed file, or a
// tar archive (WebDataset shards named in data.train). Exit 2: a restart reads the same.
absl::Status CheckIsNoArchive(const std::string& path, std::string_view head) {
  if (const std::optional<CompressedFormat> format = CompressedFormatOf(head)) {
    return WithExitCode(
        absl::InvalidArgumentError(absl::StrCat(
            "data file ", path, " is a ", format->name,
            " archive, whose bytes data.format text would train on as tokens: unpack it first",
            *format->unpack == '\0' ? "" : absl::StrCat(" (", format->unpack, ")"))),
        kExitUsage);
  }
  if (IsTarHeader(head)) {
    return WithExitCode(
        absl::InvalidArgumentError(absl::StrCat(
            "data file ", path,
            " is a tar archive, whose headers data.format text would train on as tokens: for "
            "WebDataset shards (`dtrain data pack` writes them), set data.format: webdataset and "
            "name them in data.shards")),
        kExitUsage);
  }
  return absl::OkStatus();
}

absl::Status AppendTextFile(const std::string& path, int vocab_size, std::vector<int32_t>* tokens) {
  uint64_t bytes = 0;
  ASSIGN_OR_RETURN(File file, OpenFile(path, &bytes));
  // The first bytes (a tar header's) are checked before the rest is read: an archive of gigabytes
  // is refused, not read whole first.
  std::vector<uint8_t> text(std::min<uint64_t>(bytes, kTarBlockBytes));
  RETURN_IF_ERROR(ReadExactly(file.get(), text.data(), text.size(), path));
  RETURN_IF_ERROR(CheckIsNoArchive(
      path, std::string_view(reinterpret_cast<const char*>(text.data()), text.size())));
  const size_t head = text.size();
  text.resize(bytes);
  RETURN_IF_ERROR(ReadExactly(file.get(), text.data() + head, text.size() - head, path));
  return AppendChecked(text, vocab_size, path, tokens);
}

absl::Status AppendLlmcFile(const std::string& path, int vocab_size, std::vector<int32_t>* tokens) {
  uint64_t bytes = 0;
  ASSIGN_OR_RETURN(File file, OpenFile(path, &bytes));
  const std::string fix =
      "; regenerate it with llm.c's data scripts, or set data.format: text for raw text";
  if (bytes < kLlmcHeaderBytes) {
    return BadDataFile(path, absl::StrCat(bytes, " bytes is shorter than the ", kLlmcHeaderBytes,
                                          "-byte llm.c header", fix));
  }
  int32_t header[kLlmcHeaderInts];
  RETURN_IF_ERROR(ReadExactly(file.get(), header, sizeof(header), path));
  if (header[0] != kLlmcMagic) {
    return BadDataFile(path, absl::StrCat("header[0] = ", header[0], ", not the llm.c magic ",
                                          kLlmcMagic, "; not an llm.c token shard", fix));
  }
  if (header[1] != kLlmcVersion) {
    return BadDataFile(path, absl::StrCat("llm.c shard version ", header[1], ", expected ",
                                          kLlmcVersion, " (uint16 tokens)", fix));
  }
  const uint64_t payload = bytes - kLlmcHeaderBytes;
  if (header[2] < 0 || payload != 2 * static_cast<uint64_t>(header[2])) {
    return BadDataFile(
        path, absl::StrCat("header says ", header[2], " tokens (",
                           2 * static_cast<int64_t>(header[2]), " bytes) but ", payload,
                           " bytes follow the header; the shard is truncated or corrupt, download "
                           "or regenerate it"));
  }
  std::vector<uint16_t> values(static_cast<size_t>(header[2]));
  RETURN_IF_ERROR(ReadExactly(file.get(), values.data(), payload, path));
  return AppendChecked(values, vocab_size, path, tokens);
}

// The folders the current glob could not read, "<folder>: <strerror>": glob's error callback
// takes no context.
thread_local std::vector<std::string> unreadable_folders;

int NoteUnreadableFolder(const char* folder, int error) {
  unreadable_folders.push_back(absl::StrCat(folder, ": ", std::strerror(error)));
  return 0;  // go on with the other folders
}

}  // namespace

absl::StatusOr<TokenFormat> ParseTokenFormat(const std::string& name) {
  if (name == "text") return TokenFormat::kText;
  if (name == "llmc") return TokenFormat::kLlmc;
  return absl::InvalidArgumentError(
      absl::StrCat("data.format '", name, "' is unknown; use text or llmc"));
}

absl::StatusOr<std::vector<std::string>> ExpandFilePatterns(
    const std::vector<std::string>& patterns) {
  std::vector<std::string> files;
  for (const std::string& pattern : patterns) {
    // As a shell's, the pattern skips folders it cannot read (corpus/*/*.txt past a mode 700
    // corpus/lost+found) and takes what the others hold; they are named in a warning, or in the
    // error when nothing matches.
    unreadable_folders.clear();
    glob_t matches{};
    const int rc = ::glob(pattern.c_str(), 0, &NoteUnreadableFolder, &matches);
    std::vector<std::string> found(matches.gl_pathv, matches.gl_pathv + matches.gl_pathc);
    ::globfree(&matches);
    if (rc == GLOB_NOMATCH && (absl::StrContains(pattern, "://") || pattern.starts_with("pipe:"))) {
      return WithExitCode(
          absl::InvalidArgumentError(absl::StrCat(
              "file pattern '", pattern,
              "' is a URL or a command, but data.format text, llmc and sft read local files whole: "
              "copy the data here (SFT shards must be), or stream pretraining shards from URLs and "
              "commands with data.format: webdataset and data.shards")),
          kExitUsage);
    }
    if (rc == GLOB_NOMATCH) {
      // A relative path is the current folder's, not the recipe's: say which folder that is.
      std::error_code error;
      const std::string here = std::filesystem::current_path(error).string();
      // A restart would find no file either: the agent does not restart exit 2.
      return WithExitCode(
          absl::NotFoundError(absl::StrCat(
              "file pattern '", pattern, "' matches no file",
              pattern.starts_with('/') || error
                  ? ""
                  : absl::StrCat(" (relative to the current folder ", here, ")"),
              unreadable_folders.empty() ? ""
                                         : absl::StrCat(", and these folders could not be read: ",
                                                        absl::StrJoin(unreadable_folders, ", ")),
              "; check the path")),
          kExitUsage);
    }
    if (rc != 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("file pattern '", pattern, "': out of memory expanding it"));
    }
    // What a skipped folder holds is not trained on: said, in case it is data.
    if (!unreadable_folders.empty()) {
      LogWarn("file pattern '%s' skips the folders it cannot read: %s", pattern,
              absl::StrJoin(unreadable_folders, ", "));
    }
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

absl::StatusOr<std::vector<int32_t>> LoadTokenFiles(const std::vector<std::string>& files,
                                                    TokenFormat format, int vocab_size) {
  std::vector<int32_t> tokens;
  for (const std::string& path : files) {
    RETURN_IF_ERROR(format == TokenFormat::kText ? AppendTextFile(path, vocab_size, &tokens)
                                                 : AppendLlmcFile(path, vocab_size, &tokens));
  }
  return tokens;
}

}  // namespace dtrain
