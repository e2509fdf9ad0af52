#include "core/data/token_file.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "core/util/exit_codes.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace {

::testing::AssertionResult HasText(absl::string_view message, absl::string_view part) {
  if (absl::StrContains(message, part)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << message << "\" lacks \"" << part << "\"";
}

class TokenFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "token_file_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  std::string WriteText(const std::string& name, const std::string& text) const {
    std::ofstream(Path(name), std::ios::binary) << text;
    return Path(name);
  }

  // An llm.c shard; `declared` overrides the header's token count when >= 0.
  std::string WriteLlmc(const std::string& name, const std::vector<uint16_t>& tokens,
                        int32_t magic = 20240520, int32_t version = 1,
                        int32_t declared = -1) const {
    std::vector<int32_t> header(256, 0);
    header[0] = magic;
    header[1] = version;
    header[2] = declared >= 0 ? declared : static_cast<int32_t>(tokens.size());
    std::ofstream out(Path(name), std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), 1024);
    out.write(reinterpret_cast<const char*>(tokens.data()),
              static_cast<std::streamsize>(2 * tokens.size()));
    return Path(name);
  }

  std::filesystem::path dir_;
};

TEST_F(TokenFileTest, ExpandsGlobsSortedPerPatternInPatternOrder) {
  WriteText("b.txt", "b");
  WriteText("a.txt", "a");
  WriteText("z.dat", "z");
  absl::StatusOr<std::vector<std::string>> files =
      ExpandFilePatterns({Path("z.dat"), Path("*.txt")});
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(*files, (std::vector<std::string>{Path("z.dat"), Path("a.txt"), Path("b.txt")}));
}

TEST_F(TokenFileTest, PatternWithoutMatchIsAnError) {
  const absl::Status status = ExpandFilePatterns({Path("*.nothing")}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(HasText(status.message(), Path("*.nothing")));
  EXPECT_FALSE(HasText(status.message(), "relative to"));
  // A relative pattern is the current folder's, which the error names.
  const absl::Status relative = ExpandFilePatterns({"data/no_such_file.txt"}).status();
  EXPECT_TRUE(HasText(relative.message(), "(relative to the current folder " +
                                              std::filesystem::current_path().string() + ")"))
      << relative;
}

// As a shell's glob, corpus/*/*.txt skips a folder it cannot read (a mode 700 lost+found)
// and takes the others' files, warning that it skipped it; a pattern that then matches nothing
// names the folder.
TEST_F(TokenFileTest, APatternSkipsFoldersItCannotReadAndNamesThem) {
  std::filesystem::create_directories(Path("corpus/a"));
  std::filesystem::create_directories(Path("corpus/lost+found"));
  WriteText("corpus/a/x.txt", "x");
  WriteText("corpus/lost+found/y.txt", "y");
  std::filesystem::permissions(dir_, std::filesystem::perms(0755));
  std::filesystem::permissions(Path("corpus/lost+found"), std::filesystem::perms(0700));
  // Root reads every folder: the check runs as nobody in a child process, whose exit code
  // tells.
  const auto check = [&] {
    ::testing::internal::CaptureStderr();
    const absl::StatusOr<std::vector<std::string>> some =
        ExpandFilePatterns({Path("corpus/*/*.txt")});
    const std::string warned = ::testing::internal::GetCapturedStderr();
    const absl::Status none = ExpandFilePatterns({Path("corpus/lost+found/*.txt")}).status();
    const std::string skipped = Path("corpus/lost+found") + ": Permission denied";
    const bool ok = some.ok() && *some == std::vector<std::string>{Path("corpus/a/x.txt")} &&
                    HasText(warned, "skips the folders it cannot read: " + skipped) &&
                    absl::IsNotFound(none) && HasText(none.message(), skipped);
    if (!ok) std::cerr << some.status() << " / " << warned << " / " << none << "\n";
    return ok;
  };
  if (geteuid() != 0) {
    EXPECT_TRUE(check());
    return;
  }
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const bool dropped = setgid(65534) == 0 && setuid(65534) == 0;
    _exit(dropped && check() ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

// A device or FIFO is no folder of files: its bytes may never end.
TEST_F(TokenFileTest, ADeviceIsNoDataFile) {
  const absl::Status status = LoadTokenFiles({"/dev/null"}, TokenFormat::kText, 256).status();
  EXPECT_TRUE(HasText(status.message(), "data file /dev/null is not a regular file (a device"));
  EXPECT_FALSE(HasText(status.message(), "/dev/null/*"));
}

// A FIFO is refused at once: opening it waited for a writer, without end.
TEST_F(TokenFileTest, AFifoIsNoDataFileAndIsNotWaitedOn) {
  const std::string fifo = Path("data.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << strerror(errno);
  const absl::Status status = LoadTokenFiles({fifo}, TokenFormat::kText, 256).status();
  EXPECT_TRUE(HasText(status.message(), "data file " + fifo + " is not a regular file"));
}

TEST_F(TokenFileTest, TextBytesAreTokensInFileOrder) {
  const std::string a = WriteText("a.txt", "hi");
  const std::string b = WriteText("b.txt", std::string("\xff\n", 2));
  absl::StatusOr<std::vector<int32_t>> tokens = LoadTokenFiles({a, b}, TokenFormat::kText, 256);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(*tokens, (std::vector<int32_t>{'h', 'i', 255, '\n'}));
}

TEST_F(TokenFileTest, ReadsLlmcShards) {
  const std::string a = WriteLlmc("a.bin", {50256, 1, 2});
  const std::string b = WriteLlmc("b.bin", {});
  const std::string c = WriteLlmc("c.bin", {7});
  absl::StatusOr<std::vector<int32_t>> tokens =
      LoadTokenFiles({a, b, c}, TokenFormat::kLlmc, 50257);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(*tokens, (std::vector<int32_t>{50256, 1, 2, 7}));
}

TEST_F(TokenFileTest, LlmcBadMagicIsAnError) {
  const std::string path = WriteLlmc("m.bin", {1, 2}, /*magic=*/1234);
  const absl::Status status = LoadTokenFiles({path}, TokenFormat::kLlmc, 256).status();
  EXPECT_TRUE(HasText(status.message(), path));
  EXPECT_TRUE(HasText(status.message(), "header[0] = 1234, not the llm.c magic 20240520"));
  EXPECT_EQ(ExitCodeOf(status), kExitUsage);
  EXPECT_TRUE(HasText(status.message(), "data.format: text"));
}

TEST_F(TokenFileTest, LlmcBadVersionIsAnError) {
  const std::string path = WriteLlmc("v.bin", {1, 2}, 20240520, /*version=*/2);
  const absl::Status status = LoadTokenFiles({path}, TokenFormat::kLlmc, 256).status();
  EXPECT_TRUE(HasText(status.message(), path));
  EXPECT_TRUE(HasText(status.message(), "llm.c shard version 2, expected 1"));
}

TEST_F(TokenFileTest, TruncatedLlmcShardIsAnError) {
  const std::string path = WriteLlmc("t.bin", {1, 2, 3}, 20240520, 1, /*declared=*/5);
  const absl::Status status = LoadTokenFiles({path}, TokenFormat::kLlmc, 256).status();
  EXPECT_TRUE(HasText(status.message(), path));
  EXPECT_TRUE(HasText(status.message(), "header says 5 tokens (10 bytes) but 6 bytes follow"));
  EXPECT_TRUE(HasText(status.message(), "truncated"));
}

TEST_F(TokenFileTest, FileShorterThanLlmcHeaderIsAnError) {
  const std::string path = WriteText("tiny.bin", "abc");
  const absl::Status status = LoadTokenFiles({path}, TokenFormat::kLlmc, 256).status();
  EXPECT_TRUE(HasText(status.message(), "3 bytes is shorter than the 1024-byte llm.c header"));
}

TEST_F(TokenFileTest, TokenOutsideVocabularyIsAnError) {
  const std::string shard = WriteLlmc("big.bin", {5, 300, 6});
  absl::Status status = LoadTokenFiles({shard}, TokenFormat::kLlmc, 256).status();
  EXPECT_TRUE(HasText(status.message(), shard));
  EXPECT_TRUE(HasText(status.message(), "token 300 at position 1 is outside model.vocab_size 256"));
  EXPECT_EQ(ExitCodeOf(status), kExitUsage);  // a restart reads the same: not restarted

  const std::string text = WriteText("t.txt", "a\xc8");
  status = LoadTokenFiles({text}, TokenFormat::kText, 128).status();
  EXPECT_TRUE(HasText(status.message(), "token 200 at position 1"));
}

TEST_F(TokenFileTest, MissingFileIsAnError) {
  const absl::Status status =
      LoadTokenFiles({Path("absent.txt")}, TokenFormat::kText, 256).status();
  EXPECT_TRUE(HasText(status.message(), Path("absent.txt")));
}

// A directory opens like a file; its size must not come from seeking to its end (2^63 - 1 on
// ext4, which used to end in bad_alloc).
TEST_F(TokenFileTest, DirectoryIsAnErrorNamingIt) {
  std::filesystem::create_directory(Path("shards"));
  for (const TokenFormat format : {TokenFormat::kText, TokenFormat::kLlmc}) {
    const absl::Status status = LoadTokenFiles({Path("shards")}, format, 256).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(HasText(status.message(), "data file " + Path("shards") + " is a directory"));
    EXPECT_TRUE(HasText(status.message(), Path("shards") + "/*"));
  }
}

TEST_F(TokenFileTest, ParsesFormats) {
  EXPECT_EQ(*ParseTokenFormat("text"), TokenFormat::kText);
  EXPECT_EQ(*ParseTokenFormat("llmc"), TokenFormat::kLlmc);
  EXPECT_TRUE(HasText(ParseTokenFormat("npy").status().message(), "data.format 'npy'"));
}

}  // namespace
}  // namespace dtrain
