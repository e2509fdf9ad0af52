// `dtrain data pack --tokenizer`, `data inspect --tokenizer`, `data encode|decode`, and the
// trainer's check of the tokenizer the shards record.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/util/subprocess.h"
#include "nlohmann/json.hpp"
#include "tests/core/data/tar_test_util.h"
#include "tests/core/data/tokenizers/tokenizer_json.h"
#include "tests/testing/run_dtrain.h"

namespace dtrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::Outcome;
using testing::RunDtrain;

// A tokenizer.json folder whose vocabulary (259) is just above the byte-level one.
std::string TokenizerDir(const std::string& name) {
  const std::string dir = testing::FreshTempDir(name);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/tokenizer.json")
      << testing::TokenizerJson({{"t", "h"}, {"th", "e"}}, {"<|endoftext|>"}).dump();
  return dir;
}

// Packs `text` and a JSON-lines file with the tokenizer; returns the shard pattern.
std::string Pack(const std::string& tokenizer, const std::string& name) {
  const std::string text = testing::WriteTempFile(name + ".txt", "the theme<|endoftext|>\n");
  const std::string lines =
      testing::WriteTempFile(name + ".jsonl", "{\"text\": \"caf\\u00e9 then\"}\n");
  const std::string out = testing::FreshTempDir(name + "_shards");
  const Outcome pack = RunDtrain(absl::StrCat("data pack ", text, " ", lines, " --out ", out,
                                              " --tokenizer ", tokenizer, " --threads 2"));
  EXPECT_EQ(pack.exit_code, 0) << pack.stderr_text;
  EXPECT_THAT(pack.stdout_text, HasSubstr("2 documents, 15 tokens in 1 shards"));
  return out + "/shard-000000.tar";
}

// The pack names its shards as data.shards reads them (one slash, whatever --out ends in), says
// how to train on them, and notes documents larger than a shard.
TEST(DataCommandTest, PackNamesItsShardsForTheRecipe) {
  const std::string text = testing::WriteTempFile("pack_big.txt", std::string(6000, 'x'));
  const std::string out = testing::FreshTempDir("pack_big_shards");
  const Outcome pack =
      RunDtrain(absl::StrCat("data pack ", text, " --out ", out, "/ --shard-size 4KiB"));
  ASSERT_EQ(pack.exit_code, 0) << pack.stderr_text;
  const std::string pattern = out + "/shard-{000000..000000}.tar";
  EXPECT_THAT(pack.stdout_text, HasSubstr("1 documents, 6000 tokens in 1 shards: " + pattern));
  EXPECT_THAT(pack.stdout_text,
              HasSubstr("note: documents larger than --shard-size 4KiB: 1, each in a shard of its "
                        "own (a sample never spans two shards)"));
  EXPECT_THAT(pack.stdout_text,
              HasSubstr("train on them: data.format: webdataset, data.shards: '" + pattern + "'"));
}

TEST(DataCommandTest, PackRecordsTheTokenizerAndInspectDecodesItsIds) {
  const std::string tokenizer = TokenizerDir("data_tok");
  const std::string shard = Pack(tokenizer, "data_pack");
  const Outcome inspect =
      RunDtrain(absl::StrCat("data inspect ", shard, " --tokenizer ", tokenizer));
  ASSERT_EQ(inspect.exit_code, 0) << inspect.stderr_text;
  // "the", " ", "the", "m", "e", <|endoftext|>, "\n": 7 ids, and "c", "a", "f", two bytes of
  // "é", " ", "the", "n": 8. The first sample of the shard holds the record.
  EXPECT_THAT(inspect.stdout_text, HasSubstr("000000000: .tokens(14 B) .tokenizer.json("));
  EXPECT_THAT(inspect.stdout_text, HasSubstr("000000001: .tokens(16 B)  8 tokens"));
  EXPECT_THAT(inspect.stdout_text, HasSubstr("text: \"the theme<|endoftext|>\\n\""));
  EXPECT_THAT(inspect.stdout_text, HasSubstr("text: \"café then\""));
  EXPECT_THAT(inspect.stdout_text, ::testing::Not(HasSubstr("note:")));
  // A long sample shows its first --text-tokens as text.
  const Outcome head = RunDtrain(
      absl::StrCat("data inspect ", shard, " --tokenizer ", tokenizer, " --text-tokens 2"));
  EXPECT_THAT(head.stdout_text, HasSubstr("text: \"the \" ... (5 more tokens)"));
  // Decoding with another tokenizer than the one the shard records says so; the same one's
  // files in another folder (the same hash) are the same tokenizer.
  const std::string other_dir = testing::FreshTempDir("data_tok_other");
  std::filesystem::create_directories(other_dir);
  std::ofstream(other_dir + "/tokenizer.json")
      << testing::TokenizerJson({{"t", "h"}, {"e", "m"}}, {"<|endoftext|>"}).dump();
  const Outcome other = RunDtrain(absl::StrCat("data inspect ", shard, " --tokenizer ", other_dir));
  EXPECT_THAT(other.stdout_text, HasSubstr("note: the shard records tokenizer hf-bpe:"));
  const Outcome copy = RunDtrain(
      absl::StrCat("data inspect ", shard, " --tokenizer ", TokenizerDir("data_tok_copy")));
  EXPECT_THAT(copy.stdout_text, ::testing::Not(HasSubstr("note:")));
  // Without a tokenizer the record is one more field of the sample.
  const Outcome plain = RunDtrain("data inspect " + shard);
  EXPECT_EQ(plain.exit_code, 0) << plain.stderr_text;
  EXPECT_THAT(plain.stdout_text, HasSubstr("2 samples, 15 tokens"));
}

// Inspect refuses what training refuses, listing each such sample with why and failing after the
// totals: a cut id, and with --tokenizer an id past its vocabulary (259); before, they passed as
// "no tokens" or as ids. A shard command that fails is named by its exit status, not by the
// archive it cut short, and the shards after it are still read (it stopped at the first).
TEST(DataCommandTest, InspectFailsOnSamplesTrainingRefuses) {
  const std::string dir = testing::FreshTempDir("inspect_refused");
  std::filesystem::create_directories(dir);
  const auto ids = [](std::vector<uint16_t> words) {
    return std::string(reinterpret_cast<const char*>(words.data()), 2 * words.size());
  };
  testing::WriteFile(dir + "/mixed.tar", testing::TarArchive({{"a.tokens", ids({104, 101})},
                                                              {"b.tokens", "xyz"},
                                                              {"c.tokens", ids({104, 300})}}));
  const Outcome plain = RunDtrain("data inspect " + dir + "/mixed.tar");
  EXPECT_EQ(plain.exit_code, 1);
  EXPECT_THAT(plain.stdout_text, HasSubstr("a: .tokens(4 B)  2 tokens"));
  EXPECT_THAT(plain.stdout_text, HasSubstr("b: .tokens(3 B)  refused: shard "));
  EXPECT_THAT(plain.stdout_text, HasSubstr("c: .tokens(4 B)  2 tokens"));
  EXPECT_THAT(plain.stdout_text, HasSubstr("1 shards, 3 samples, 4 tokens"));
  EXPECT_THAT(plain.stderr_text,
              HasSubstr("1 of 3 samples hold no tokens training accepts, which fails the run"));

  const Outcome tokenized = RunDtrain(absl::StrCat("data inspect ", dir, "/mixed.tar --tokenizer ",
                                                   TokenizerDir("inspect_refused_tok")));
  EXPECT_EQ(tokenized.exit_code, 1);
  EXPECT_THAT(tokenized.stdout_text, HasSubstr("c: .tokens(4 B)  refused: shard "));
  EXPECT_THAT(tokenized.stdout_text, HasSubstr("300"));
  EXPECT_THAT(tokenized.stderr_text, HasSubstr("2 of 3 samples hold no tokens training accepts"));

  // A shard that does not read is listed, and the shards after it are still read and counted.
  const Outcome piped = RunDtrain(absl::StrCat("data inspect 'pipe:head -c 700 ", dir,
                                               "/mixed.tar; exit 7::", dir, "/mixed.tar'"));
  EXPECT_EQ(piped.exit_code, 1);
  EXPECT_THAT(piped.stdout_text, HasSubstr("exit 7  does not read: shard command "));
  EXPECT_THAT(piped.stdout_text, HasSubstr("2 shards, 3 samples"));
  EXPECT_THAT(piped.stderr_text, HasSubstr("1 of 2 shards do not read to their end"));
  EXPECT_THAT(piped.stderr_text, HasSubstr("; and 1 samples hold no tokens training accepts"));
  EXPECT_THAT(piped.stderr_text,
              HasSubstr("ended with exit code 7; run it in a shell to see why (reading its "
                        "archive: "));
}

// Whether a process whose command line holds `word` as an argument runs.
bool ProcessWithArgumentRuns(const std::string& word) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    std::ifstream in(entry.path() / "cmdline");
    std::string argument;
    while (std::getline(in, argument, '\0')) {
      if (argument == word) return true;
    }
  }
  return false;
}

// A trainer killed by SIGKILL (the agent's end for a rank that does not stop) takes its shard
// commands along: their shell, leading a process group of its own, gets SIGTERM as the trainer
// dies and ends the group. Before, the command (a `sleep` here, behind the shell) ran on.
TEST(DataCommandTest, ATrainerKilledBySigkillLeavesNoShardCommand) {
  const std::string marker = absl::StrCat("600.", getpid());
  const std::string recipe = testing::WriteTempFile(
      "sigkill_pipe.yaml",
      absl::StrCat("data: {format: webdataset, shards: 'pipe:sleep ", marker,
                   "; true'}\nmodel: {n_layer: 1, n_head: 1, d_model: 16, vocab_size: 256, "
                   "max_seq_len: 8}\ntrain: {steps: 1, warmup_steps: 1, batch_size: 1, "
                   "micro_batch: 1, seq_len: 8, eval_every: 0}\n"));
  SubprocessOptions options;
  options.stdout_stream = options.stderr_stream = SubprocessOptions::Stream::kNull;
  absl::StatusOr<std::unique_ptr<Subprocess>> trainer =
      Subprocess::Spawn({DTRAIN_BINARY, "train", recipe}, options);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const auto within = [](absl::Duration limit, const std::function<bool()>& done) {
    for (const absl::Time end = absl::Now() + limit; absl::Now() < end;) {
      if (done()) return true;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return done();
  };
  ASSERT_TRUE(within(absl::Seconds(30), [&] { return ProcessWithArgumentRuns(marker); }))
      << "the shard command never started";
  (*trainer)->Signal(SIGKILL);
  EXPECT_EQ((*trainer)->Wait().ToString(), "signal 9 (SIGKILL)");
  EXPECT_TRUE(within(absl::Seconds(30), [&] { return !ProcessWithArgumentRuns(marker); }))
      << "sleep " << marker << " outlived the trainer";
}

// A first shard that does not read fails the run at start, where the trainer reads it for the
// tokenizer it records: a command that writes nothing runs once (it ran again in training, which
// cost data.pipe_timeout_s twice). With data.on_error: skip_shard the run goes on to training.
TEST(DataCommandTest, AFirstShardThatDoesNotReadFailsAtStart) {
  const std::string runs = testing::FreshTempDir("silent_first_runs");
  std::filesystem::create_directories(runs);
  const auto recipe = [&](const std::string& name, const std::string& on_error) {
    return testing::WriteTempFile(
        name + ".yaml",
        absl::StrCat("run: {out_dir: ", runs,
                     "}\ndata: {format: webdataset, shards: 'pipe:echo >> ", runs, "/", name,
                     ".count; exec sleep 60', pipe_timeout_s: 1, on_error: ", on_error,
                     "}\nmodel: {n_layer: 1, n_head: 1, d_model: 16, vocab_size: 256, "
                     "max_seq_len: 8}\ntrain: {steps: 1, warmup_steps: 1, batch_size: 1, "
                     "micro_batch: 1, seq_len: 8, eval_every: 0}\n"));
  };
  const auto runs_of = [&](const std::string& name) {
    std::ifstream in(runs + "/" + name + ".count");
    return std::count(std::istreambuf_iterator<char>(in), {}, '\n');
  };
  const Outcome failed = RunDtrain("train " + recipe("fail", "fail"));
  EXPECT_EQ(failed.exit_code, 1);
  EXPECT_THAT(failed.stderr_text, HasSubstr("wrote nothing for 1 s (data.pipe_timeout_s)"));
  EXPECT_THAT(failed.stderr_text, HasSubstr("(data.on_error: skip_shard would skip this shard)"));
  EXPECT_EQ(runs_of("fail"), 1);

  const Outcome skipped = RunDtrain("train " + recipe("skip", "skip_shard"));
  EXPECT_EQ(skipped.exit_code, 1);
  EXPECT_THAT(skipped.stderr_text,
              HasSubstr("samples print as token ids: the first shard, which records the data's "
                        "tokenizer, did not read"));
  EXPECT_THAT(skipped.stderr_text,
              HasSubstr("every shard it reads (1) failed before its first token"));
  EXPECT_EQ(runs_of("skip"), 2);
}

// Documents without text are left out and counted; inputs with none at all are an error, not
// an empty set of shards.
TEST(DataCommandTest, PackLeavesOutEmptyDocumentsAndRefusesNoText) {
  const std::string empty_text = testing::WriteTempFile("pack_empty.txt", "");
  const std::string lines = testing::WriteTempFile(
      "pack_some.jsonl", "{\"text\": \"\"}\n{\"text\": \"abc\"}\n{\"text\": \"\"}\n");
  const std::string out = testing::FreshTempDir("pack_empty_shards");
  const Outcome some =
      RunDtrain(absl::StrCat("data pack ", empty_text, " ", lines, " --out ", out));
  EXPECT_EQ(some.exit_code, 0) << some.stderr_text;
  EXPECT_THAT(some.stdout_text, HasSubstr("1 documents (3 empty ones left out), 3 tokens"));
  const std::string none_out = testing::FreshTempDir("pack_none_shards");
  const Outcome none =
      RunDtrain(absl::StrCat("data pack ", empty_text, " --out ", none_out, "/a/b/"));
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_THAT(none.stderr_text, HasSubstr("the inputs hold no text to pack (1 empty documents)"));
  // The folders it made for the shards go with them (they were left empty).
  EXPECT_FALSE(std::filesystem::exists(none_out));
}

// An --out that names a file is a usage error (exit 2, as other paths that can never be written).
TEST(DataCommandTest, PackToAFileIsAUsageError) {
  const std::string file = testing::WriteTempFile("pack_out_file", "x");
  const Outcome pack = RunDtrain(absl::StrCat(
      "data pack ", testing::WriteTempFile("pack_to_file.txt", "abc"), " --out ", file));
  EXPECT_EQ(pack.exit_code, 2) << pack.stderr_text;
  EXPECT_THAT(pack.stderr_text, HasSubstr(absl::StrCat("create the folder ", file,
                                                       ": Not a directory; point --out at")));
}

// --text-key with no .jsonl input names a key nothing reads (it was ignored): a usage error.
TEST(DataCommandTest, PackRefusesATextKeyWithoutJsonLines) {
  const Outcome pack = RunDtrain(
      absl::StrCat("data pack ", testing::WriteTempFile("pack_key_only.txt", "abc"),
                   " --text-key content --out ", testing::FreshTempDir("pack_key_only_shards")));
  EXPECT_EQ(pack.exit_code, 2) << pack.stderr_text;
  EXPECT_THAT(pack.stderr_text, HasSubstr("--text-key content names the document's key in .jsonl "
                                          "lines, and no input is a .jsonl file"));
}

// Inputs whose bytes nobody means to train on as text are refused, naming the fix: a gzip archive
// (its compressed bytes became tokens), JSON lines in a .json file (one document, braces and keys
// included), a line of a .jsonl file that is not JSON. JSON lines in .JSONL are JSON lines.
TEST(DataCommandTest, PackRefusesArchivesAndMisnamedJsonLines) {
  const auto pack = [](const std::string& name, const std::string& bytes) {
    return RunDtrain(absl::StrCat("data pack ", testing::WriteTempFile(name, bytes), " --out ",
                                  testing::FreshTempDir("pack_refused_shards")));
  };
  const Outcome gzip = pack("pack_corpus.txt.gz", std::string("\x1f\x8b\x08\x00\x00", 5));
  EXPECT_EQ(gzip.exit_code, 2);
  // A shard packed again: its tar headers would become text.
  const std::string shards = testing::FreshTempDir("pack_tar_shards");
  ASSERT_EQ(RunDtrain(absl::StrCat("data pack ", testing::WriteTempFile("pack_tar.txt", "abc"),
                                   " --out ", shards))
                .exit_code,
            0);
  const Outcome tar = RunDtrain(absl::StrCat("data pack ", shards, "/shard-000000.tar --out ",
                                             testing::FreshTempDir("pack_tar_again")));
  EXPECT_EQ(tar.exit_code, 2);
  EXPECT_THAT(tar.stderr_text, HasSubstr("shard-000000.tar is a tar archive, whose headers would "
                                         "be packed as text: unpack it"));
  EXPECT_THAT(gzip.stderr_text, HasSubstr("pack_corpus.txt.gz is a gzip archive, whose bytes would "
                                          "be packed as text: unpack it first"));
  const std::string lines = "{\"text\": \"one\"}\n{\"text\": \"two\"}\n";
  const Outcome json = pack("pack_lines.json", lines);
  EXPECT_EQ(json.exit_code, 2);
  EXPECT_THAT(json.stderr_text, HasSubstr("pack_lines.json holds JSON lines (an object a line), "
                                          "but a .json file is packed as one plain-text document, "
                                          "braces and keys included: name it .jsonl to pack each "
                                          "line's \"text\"\n"));
  // Lines of another key are JSON lines too (they were packed whole; a blank line between them
  // changes nothing), and so is a first line
  // with the key --text-key names (beside a .jsonl input, without which --text-key is refused).
  const Outcome other_key =
      pack("pack_content.json", "{\"content\": \"one\", \"id\": 1}\n\n{\"content\": \"two\"}\n");
  EXPECT_EQ(other_key.exit_code, 2);
  EXPECT_THAT(other_key.stderr_text,
              HasSubstr("pack_content.json holds JSON lines (an object a line), but a .json file "
                        "is packed as one plain-text document, braces and keys included: name it "
                        ".jsonl to pack each line's \"text\" (its string keys: content; name the "
                        "document's with --text-key KEY)"));
  const Outcome named_key = RunDtrain(absl::StrCat(
      "data pack ", testing::WriteTempFile("pack_one_content.jsonl", "{\"content\": \"a\"}"), " ",
      testing::WriteTempFile("pack_one_content.json", "{\"content\": \"b\"}"),
      " --text-key content --out ", testing::FreshTempDir("pack_refused_shards")));
  EXPECT_EQ(named_key.exit_code, 2);
  EXPECT_THAT(named_key.stderr_text, HasSubstr("name it .jsonl to pack each line's \"content\"\n"));
  // One object that is not a line of documents is text like any other.
  const Outcome object = pack("pack_object.json", "{\"name\": \"dtrain\"}\n");
  EXPECT_EQ(object.exit_code, 0) << object.stderr_text;
  EXPECT_THAT(object.stdout_text, HasSubstr("1 documents, 19 tokens"));
  const Outcome upper = pack("pack_lines.JSONL", lines);
  EXPECT_EQ(upper.exit_code, 0) << upper.stderr_text;
  EXPECT_THAT(upper.stdout_text, HasSubstr("2 documents, 6 tokens"));
  const Outcome broken = pack("pack_broken.jsonl", "{\"text\": \"one\"}\n{\"text\": \n");
  EXPECT_EQ(broken.exit_code, 2);
  EXPECT_THAT(broken.stderr_text,
              HasSubstr("pack_broken.jsonl:2: not valid JSON (a syntax error, or text that is not "
                        "UTF-8)"));
  // Another key holds the documents: the error names the line's string keys, and --text-key
  // takes one.
  const std::string content = testing::WriteTempFile(
      "pack_content.jsonl", "{\"id\": 1, \"content\": \"one\", \"url\": \"u\"}\n");
  const Outcome keyless =
      RunDtrain(absl::StrCat("data pack ", content, " --out ", testing::FreshTempDir("pack_key")));
  EXPECT_EQ(keyless.exit_code, 2);
  EXPECT_THAT(keyless.stderr_text,
              HasSubstr("pack_content.jsonl:1: expected a JSON object with a \"text\" string (its "
                        "string keys: content, url; name the document's with --text-key KEY)"));
  const Outcome keyed = RunDtrain(absl::StrCat("data pack ", content, " --text-key content --out ",
                                               testing::FreshTempDir("pack_key")));
  EXPECT_EQ(keyed.exit_code, 0) << keyed.stderr_text;
  EXPECT_THAT(keyed.stdout_text, HasSubstr("1 documents, 3 tokens"));
}

// A folder holding shards of an earlier pack is refused, where a smaller pack left the earlier
// pack's last shards beside its own, read as one dataset.
TEST(DataCommandTest, PackRefusesAFolderHoldingShards) {
  const std::string text = testing::WriteTempFile("pack_again.txt", "Some text to pack twice.");
  const std::string out = testing::FreshTempDir("pack_again_shards");
  const Outcome first = RunDtrain(absl::StrCat("data pack ", text, " --out ", out));
  ASSERT_EQ(first.exit_code, 0) << first.stderr_text;
  const Outcome second = RunDtrain(absl::StrCat("data pack ", text, " --out ", out));
  EXPECT_EQ(second.exit_code, 2);
  EXPECT_THAT(second.stderr_text,
              HasSubstr(absl::StrCat("--out ", out, " holds 1 shard(s) of an earlier pack")));
}

// A folder the printed data.shards pattern (or SFT's glob) could not name is refused before
// anything is written: the pattern printed for `a::b` read shards of "a" and "b".
TEST(DataCommandTest, PackRefusesAFolderItsPatternCouldNotName) {
  const std::string text = testing::WriteTempFile("pack_named.txt", "Some text to pack.");
  const std::string base = testing::FreshTempDir("pack_named");
  for (const std::string& out : {base + "/a::b", base + "/x{1..2}", base + "/x{1}"}) {
    const Outcome run = RunDtrain(absl::StrCat("data pack ", text, " --out '", out, "'"));
    EXPECT_EQ(run.exit_code, 2) << out;
    EXPECT_THAT(run.stderr_text, HasSubstr("--out " + out + ": data.shards could not name"));
    EXPECT_FALSE(std::filesystem::exists(out)) << out;
  }
  const Outcome sft = RunDtrain(absl::StrCat("data pack --sft ", text, " --out '", base, "/s[1]'"));
  EXPECT_EQ(sft.exit_code, 2);
  EXPECT_THAT(sft.stderr_text, HasSubstr("would read '*', '?' or '[' in the folder's name"));
  const Outcome plain = RunDtrain(absl::StrCat("data pack ", text, " --out '", base, "/a:b c'"));
  EXPECT_EQ(plain.exit_code, 0) << plain.stderr_text;
}

// A folder given as an input is a usage error naming it, for every command that reads inputs,
// where reading it ended the process (std::ios_failure, exit 134).
TEST(DataCommandTest, AFolderAsAnInputIsRefusedNamingIt) {
  const std::string folder = testing::FreshTempDir("data_input_folder");
  std::filesystem::create_directories(folder);
  for (const std::string& command :
       {absl::StrCat("data pack ", folder, " --out ", folder, "/shards"),
        absl::StrCat("data pack --sft ", folder, " --out ", folder, "/shards"),
        absl::StrCat("data encode --tokenizer ", TokenizerDir("data_tok_folder"), " ", folder),
        absl::StrCat("data decode --tokenizer ", TokenizerDir("data_tok_folder"), " ", folder)}) {
    const Outcome run = RunDtrain(command);
    EXPECT_EQ(run.exit_code, 2) << command << "\n" << run.stderr_text;
    EXPECT_THAT(run.stderr_text, HasSubstr("File is actually a directory: " + folder)) << command;
  }
}

// --chat-template shapes SFT samples only: without --sft it is refused, not ignored.
TEST(DataCommandTest, AChatTemplateWithoutSftIsRefused) {
  const std::string text = testing::WriteTempFile("pack_template.txt", "Some text.");
  const Outcome run = RunDtrain(absl::StrCat("data pack --chat-template chatml ", text, " --out ",
                                             testing::FreshTempDir("pack_template_shards")));
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.stderr_text, HasSubstr("--chat-template requires --sft"));
}

// A vocabulary past 65536 (Llama 3's 128256) needs 4-byte ids: .tokens32.
TEST(DataCommandTest, PackWritesWideIdsForALargeVocabulary) {
  const std::string dir = testing::FreshTempDir("data_tok_wide");
  std::filesystem::create_directories(dir);
  nlohmann::json tokenizer = testing::TokenizerJson({{"t", "h"}}, {"<|eot_id|>"});
  tokenizer["added_tokens"][0]["id"] = 128255;
  std::ofstream(dir + "/tokenizer.json") << tokenizer.dump();
  const std::string text = testing::WriteTempFile("data_wide.txt", "th<|eot_id|>");
  const std::string out = testing::FreshTempDir("data_wide_shards");
  const Outcome pack =
      RunDtrain(absl::StrCat("data pack ", text, " --out ", out, " --tokenizer ", dir));
  ASSERT_EQ(pack.exit_code, 0) << pack.stderr_text;
  const Outcome inspect = RunDtrain(absl::StrCat(
      "data inspect ", out, "/shard-000000.tar --tokenizer ", dir + "/tokenizer.json"));
  EXPECT_THAT(inspect.stdout_text, HasSubstr("000000000: .tokens32(8 B)"));
  EXPECT_THAT(inspect.stdout_text, HasSubstr("text: \"th<|eot_id|>\""));
}

// Shards of two tokenizers in one run are refused when the stream reaches the one that differs
// from the first shard's record: their ids would train as one vocabulary.
TEST(DataCommandTest, TrainRefusesShardsOfAnotherTokenizerThanTheFirsts) {
  const std::string first = Pack(TokenizerDir("data_tok_mix_a"), "data_pack_mix_a");
  const std::string other_dir = testing::FreshTempDir("data_tok_mix_b");
  std::filesystem::create_directories(other_dir);
  std::ofstream(other_dir + "/tokenizer.json")
      << testing::TokenizerJson({{"t", "h"}, {"e", "m"}}, {"<|endoftext|>"}).dump();
  const std::string text = testing::WriteTempFile("data_pack_mix_b.txt", "the theme\n");
  const std::string out = testing::FreshTempDir("data_pack_mix_b_shards");
  ASSERT_EQ(RunDtrain(absl::StrCat("data pack ", text, " --out ", out, " --tokenizer ", other_dir))
                .exit_code,
            0);
  const std::string second = out + "/shard-000000.tar";
  const Outcome train = RunDtrain(absl::StrCat(
      "train --set data.format=webdataset --set data.shards=", first, "::", second,
      " --set data.streams=1 --set data.train=[] --set model.vocab_size=300 --set "
      "train.eval_every=0 --set train.warmup_steps=0 --set train.steps=8 --set train.seq_len=4 "
      "--set train.batch_size=1 --set train.micro_batch=1 --set logging.sample_tokens=0 --set "
      "run.out_dir=",
      testing::FreshTempDir("data_mix_run")));
  // A usage error, which dtrain launch does not restart (exit 1 was restarted in vain).
  EXPECT_EQ(train.exit_code, 2) << train.stderr_text;
  EXPECT_THAT(train.stderr_text, AllOf(HasSubstr("shard " + second + " records tokenizer hf-bpe:"),
                                       HasSubstr("but the data's first shard records hf-bpe:"),
                                       HasSubstr("pack every shard with one tokenizer")));
}

TEST(DataCommandTest, TrainRefusesShardsOfALargerVocabulary) {
  const std::string tokenizer = TokenizerDir("data_tok_train");
  const std::string shard = Pack(tokenizer, "data_pack_train");
  const std::string out = testing::FreshTempDir("data_train_run");
  const Outcome train = RunDtrain(
      absl::StrCat("train --set data.format=webdataset --set data.shards=", shard,
                   " --set data.train=[] --set model.vocab_size=256 --set train.eval_every=0 --set "
                   "train.warmup_steps=0 --set train.steps=1 --set run.out_dir=",
                   out));
  EXPECT_EQ(train.exit_code, 2) << train.stderr_text;
  // Streamed: the set-up names the shards, not "0 tokens for training".
  EXPECT_THAT(train.stderr_text, HasSubstr("data: streaming 1 training shard(s) in "));
  EXPECT_THAT(train.stderr_text, ::testing::Not(HasSubstr("tokens for training")));
  EXPECT_THAT(train.stderr_text, HasSubstr("shard " + shard + " holds ids of tokenizer hf-bpe:"));
  EXPECT_THAT(train.stderr_text,
              HasSubstr("(vocabulary 259), which do not fit model.vocab_size 256; set "
                        "model.vocab_size to at least 259"));
}

// Local shards that do not exist are a usage error at start, naming the key: validation shards
// failed at the first evaluation, after the steps before it (none saved), and training shards
// when the stream reached them. Under data.on_error: skip_shard missing training shards are
// skipped as they are reached.
TEST(DataCommandTest, MissingLocalShardsAreRefusedAtStart) {
  const std::string shard = Pack(TokenizerDir("data_tok_missing"), "data_pack_missing");
  const std::string out = testing::FreshTempDir("data_missing_run");
  const std::string base = absl::StrCat(
      "train --set data.format=webdataset --set data.train=[] --set model.vocab_size=300 "
      "--set train.warmup_steps=0 --set train.steps=4 --set train.seq_len=4 --set "
      "train.batch_size=1 --set train.micro_batch=1 --set logging.sample_tokens=0 --set "
      "data.streams=1 --set run.out_dir=",
      out);
  const Outcome val =
      RunDtrain(absl::StrCat(base, " --set data.shards=", shard, " --set data.val_shards=", out,
                             "/val-missing.tar --set train.eval_every=2"));
  EXPECT_EQ(val.exit_code, 2) << val.stderr_text;
  EXPECT_THAT(val.stderr_text, HasSubstr("data.val_shards: shard " + out +
                                         "/val-missing.tar does not exist; fix data.val_shards"));
  EXPECT_THAT(val.stderr_text, ::testing::Not(HasSubstr("step 1/4")));
  const Outcome train =
      RunDtrain(absl::StrCat(base, " --set train.eval_every=0 --set data.shards=", shard, "::", out,
                             "/train-missing.tar"));
  EXPECT_EQ(train.exit_code, 2) << train.stderr_text;
  EXPECT_THAT(train.stderr_text,
              HasSubstr("data.shards: shard " + out + "/train-missing.tar does not exist"));
}

// data.on_error: skip_shard skips training shards only: a validation shard that does not read
// fails the evaluation, since each rank reads the whole validation set and a shard skipped on
// one rank only would give the ranks different sets (and different evaluation lengths: a hang).
TEST(DataCommandTest, AValidationShardIsNeverSkipped) {
  const std::string shard = Pack(TokenizerDir("data_tok_val_skip"), "data_pack_val_skip");
  const std::string out = testing::FreshTempDir("data_val_skip_run");
  const std::string bad = testing::WriteTempFile("data_val_skip_bad.tar", std::string(2048, 'x'));
  const Outcome run = RunDtrain(absl::StrCat(
      "train --set data.format=webdataset --set data.train=[] --set model.vocab_size=300 "
      "--set train.warmup_steps=0 --set train.steps=4 --set train.seq_len=4 --set "
      "train.batch_size=1 --set train.micro_batch=1 --set logging.sample_tokens=0 --set "
      "data.streams=1 --set data.on_error=skip_shard --set train.eval_every=2 --set run.out_dir=",
      out, " --set data.shards=", shard, " --set data.val_shards=", shard, "::", bad));
  EXPECT_NE(run.exit_code, 0) << run.stderr_text;
  EXPECT_THAT(run.stderr_text, HasSubstr("shard " + bad)) << run.stderr_text;
  EXPECT_THAT(run.stderr_text, ::testing::Not(HasSubstr("step 3/4")));
}

// A checkpoint's data order that the recipe cannot continue (other data.streams) is a usage
// error, which dtrain launch does not restart in vain.
TEST(DataCommandTest, ResumingAnotherDataOrderIsAUsageError) {
  const std::string shard = Pack(TokenizerDir("data_tok_order"), "data_pack_order");
  const std::string out = testing::FreshTempDir("data_order_run");
  const std::string base = absl::StrCat(
      "train --set data.format=webdataset --set data.train=[] --set model.vocab_size=300 "
      "--set train.warmup_steps=0 --set train.seq_len=4 --set train.batch_size=1 --set "
      "train.micro_batch=1 --set logging.sample_tokens=0 --set train.eval_every=0 --set "
      "data.shards=",
      shard, " --set run.out_dir=", out);
  const Outcome first = RunDtrain(base + " --set train.steps=2 --set data.streams=1");
  ASSERT_EQ(first.exit_code, 0) << first.stderr_text;
  const Outcome resumed = RunDtrain(base + " --set train.steps=4 --set data.streams=2");
  EXPECT_EQ(resumed.exit_code, 2) << resumed.stderr_text;
  EXPECT_THAT(resumed.stderr_text,
              HasSubstr("the checkpoint's data order has data.streams = 1, this run 2"));
}

// A one-step recipe of a 1-layer model (`model_extra` appended to its keys) on `data` (the data
// section's keys), which evaluates once and samples `sample_tokens` after the prompt "the".
std::string SampleRecipe(const std::string& name, const std::string& model_extra,
                         const std::string& data, int sample_tokens) {
  return testing::WriteTempFile(
      name + ".yaml",
      absl::StrCat("model: {n_layer: 1, n_head: 2, d_model: 32, max_seq_len: 32", model_extra,
                   "}\ndata: {", data,
                   "}\ntrain: {steps: 1, warmup_steps: 0, batch_size: 2, micro_batch: 2, "
                   "seq_len: 16, eval_every: 1, eval_batches: 1}\n"
                   "logging: {sample_tokens: ",
                   sample_tokens, ", sample_prompt: the}\n"));
}

// A tokenizer folder (TokenizerDir), 200 lines of "the theme of them" packed with it into one
// shard, and a SampleRecipe on that shard with data.tokenizer set; names from `name`.
struct PackedText {
  std::string tokenizer, text_file, shard, recipe;
};
PackedText PackTextWithTokenizer(const std::string& name, int sample_tokens) {
  PackedText packed;
  packed.tokenizer = TokenizerDir("data_tok_" + name);
  std::string text;
  for (int i = 0; i < 200; ++i) text += "the theme of them\n";
  packed.text_file = testing::WriteTempFile("data_" + name + ".txt", text);
  const std::string shards = testing::FreshTempDir("data_" + name + "_shards");
  EXPECT_EQ(RunDtrain(absl::StrCat("data pack ", packed.text_file, " --out ", shards,
                                   " --tokenizer ", packed.tokenizer))
                .exit_code,
            0);
  packed.shard = shards + "/shard-000000.tar";
  packed.recipe = SampleRecipe(
      "data_" + name, ", vocab_size: 300",
      absl::StrCat("format: webdataset, streams: 1, shards: '", packed.shard, "', val_shards: '",
                   packed.shard, "', tokenizer: ", packed.tokenizer),
      sample_tokens);
  return packed;
}

// Shards packed with data.tokenizer sample as its text; a tokenizer the data was not packed
// with is refused at start (exit 2), as is one beside data.format text, whose ids are bytes: the
// samples would decode, and train.export_to ship, a tokenizer the ids do not belong to. The
// same tokenizer's files elsewhere (another folder, the hash the same) are the same tokenizer.
TEST(DataCommandTest, SampledTextDecodesThroughDataTokenizer) {
  const auto [tokenizer, text_file, shard, recipe] = PackTextWithTokenizer("sample", 24);
  const std::string out = testing::FreshTempDir("data_sample_run");
  const Outcome train = RunDtrain(absl::StrCat("train ", recipe, " --set run.out_dir=", out));
  ASSERT_EQ(train.exit_code, 0) << train.stderr_text;
  // The prompt is the one id of "the"; the untrained model samples ids past the tokenizer's
  // 259 too, which show as <id N> (as bytes they would be \xNNN).
  EXPECT_THAT(train.stderr_text, HasSubstr("sample at step 1:\nthe"));
  EXPECT_THAT(train.stderr_text, HasSubstr("<id 2"));
  EXPECT_THAT(train.stderr_text, ::testing::Not(HasSubstr("\\x1")));
  // The tokenizer has an end of text, which data.eos_id -1 leaves out between documents.
  const std::string joined = "data.tokenizer has <|endoftext|>: set data.eos_id: 258";
  EXPECT_THAT(train.stderr_text, HasSubstr(joined));
  const Outcome separated = RunDtrain(
      absl::StrCat("train ", recipe, " --set data.eos_id=258 --set run.out_dir=", out, "_eos"));
  ASSERT_EQ(separated.exit_code, 0) << separated.stderr_text;
  EXPECT_THAT(separated.stderr_text, ::testing::Not(HasSubstr(joined)));

  const std::string copy = testing::FreshTempDir("data_tok_sample_copy");
  std::filesystem::create_directories(copy);
  std::filesystem::copy_file(tokenizer + "/tokenizer.json", copy + "/tokenizer.json");
  const Outcome copied = RunDtrain(
      absl::StrCat("train ", recipe, " --set data.tokenizer=", copy, " --set run.out_dir=", out));
  EXPECT_EQ(copied.exit_code, 0) << copied.stderr_text;

  const std::string other = testing::FreshTempDir("data_tok_sample_other");
  std::filesystem::create_directories(other);
  std::ofstream(other + "/tokenizer.json")
      << testing::TokenizerJson({{"t", "h"}, {"e", "m"}}, {"<|endoftext|>"}).dump();
  const Outcome mismatched = RunDtrain(
      absl::StrCat("train ", recipe, " --set data.tokenizer=", other, " --set run.out_dir=", out));
  EXPECT_EQ(mismatched.exit_code, 2) << mismatched.stderr_text;
  EXPECT_THAT(mismatched.stderr_text, HasSubstr("but the first shard records hf-bpe:"));
  EXPECT_THAT(mismatched.stderr_text, HasSubstr("data_tok_sample/tokenizer.json#"));
  const Outcome bytes =
      RunDtrain(absl::StrCat("train ", recipe, " --set data.format=text --set data.train=[",
                             text_file, "] --set run.out_dir=", out));
  EXPECT_EQ(bytes.exit_code, 2) << bytes.stderr_text;
  EXPECT_THAT(bytes.stderr_text, HasSubstr("data.format text trains on the files' bytes"));

  const Outcome small = RunDtrain(
      absl::StrCat("train ", recipe, " --set model.vocab_size=256 --set run.out_dir=", out));
  EXPECT_EQ(small.exit_code, 2) << small.stderr_text;  // a restart would fail alike
  EXPECT_THAT(small.stderr_text,
              HasSubstr("has a vocabulary of 259, more than model.vocab_size 256"));
  const Outcome missing = RunDtrain(
      absl::StrCat("train ", recipe, " --set data.tokenizer=/nonexistent --set run.out_dir=", out));
  EXPECT_EQ(missing.exit_code, 2) << missing.stderr_text;
  EXPECT_THAT(missing.stderr_text, HasSubstr("data.tokenizer: tokenizer file /nonexistent"));
}

// WebDataset's text shards (a .txt and a .json of metadata per sample) train through
// data.tokenizer, window for window as the same documents packed with it: their bytes were taken
// as ids, silently. `data inspect --tokenizer` counts and shows them as training reads them.
TEST(DataCommandTest, TextShardsEncodeThroughDataTokenizer) {
  const std::string tokenizer = TokenizerDir("data_tok_text_shards");
  std::string lines;
  std::vector<std::pair<std::string, std::string>> members;
  for (int i = 0; i < 40; ++i) {
    const std::string text = absl::StrCat("the theme of them ", i, "\n");
    absl::StrAppend(&lines, "{\"text\": \"the theme of them ", i, "\\n\"}\n");
    const std::string key = absl::StrCat("doc", 1000 + i);
    members.push_back({key + ".txt", text});
    members.push_back({key + ".json", absl::StrCat("{\"i\": ", i, "}")});
  }
  const std::string packed_dir = testing::FreshTempDir("data_text_shards_packed");
  ASSERT_EQ(
      RunDtrain(absl::StrCat("data pack ", testing::WriteTempFile("data_text_shards.jsonl", lines),
                             " --out ", packed_dir, " --tokenizer ", tokenizer))
          .exit_code,
      0);
  const std::string packed = packed_dir + "/shard-000000.tar";
  const std::string text_shard = testing::FreshTempDir("data_text_shards") + ".tar";
  testing::WriteFile(text_shard, testing::TarArchive(members));
  const std::string recipe =
      SampleRecipe("data_text_shards", ", vocab_size: 300",
                   absl::StrCat("format: webdataset, streams: 1, shards: '", packed,
                                "', val_shards: '", packed, "', tokenizer: ", tokenizer),
                   8);
  const auto metrics = [&](const std::string& shard, const std::string& tokenizer_path) {
    const std::string out = testing::FreshTempDir("data_text_shards_run");
    const Outcome run = RunDtrain(
        absl::StrCat("train ", recipe, " --set train.steps=3 --set data.shards=", shard,
                     " --set data.val_shards=", shard, " --set data.tokenizer=", tokenizer_path,
                     " --set run.out_dir=", out));
    EXPECT_EQ(run.exit_code, 0) << run.stderr_text;
    return testing::ReadFile(out + "/dtrain/metrics.jsonl");
  };
  const std::string from_packed = metrics(packed, tokenizer);
  const auto losses = [](const std::string& jsonl) {
    std::vector<std::string> out;
    std::istringstream in(jsonl);
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json step = nlohmann::json::parse(line, nullptr, false);
      if (step.contains("loss")) out.push_back(step["loss"].dump());
    }
    return out;
  };
  ASSERT_EQ(losses(from_packed).size(), 3u) << from_packed;
  EXPECT_EQ(losses(metrics(text_shard, tokenizer)), losses(from_packed));
  EXPECT_NE(losses(metrics(text_shard, "")), losses(from_packed));  // bytes, without it

  const Outcome inspect = RunDtrain(
      absl::StrCat("data inspect ", text_shard, " --max-samples 1 --tokenizer ", tokenizer));
  ASSERT_EQ(inspect.exit_code, 0) << inspect.stderr_text;
  // "the theme of them 0\n": the, " ", the, m, e, " ", o, f, " ", the, m, " ", 0, "\n".
  EXPECT_THAT(inspect.stdout_text, HasSubstr("14 tokens"));
  EXPECT_THAT(inspect.stdout_text, HasSubstr("\"the theme of them 0\\n\""));
}

// train.init_from's folder carries its model's tokenizer: data of another tokenizer's ids (here
// bytes) is warned of; data of the folder's tokenizer is not.
TEST(DataCommandTest, InitFromAFolderOfAnotherTokenizerWarns) {
  const auto [tokenizer, text_file, shard, recipe] = PackTextWithTokenizer("init", 0);
  const std::string out = testing::FreshTempDir("data_init_run");
  const Outcome exported = RunDtrain(
      absl::StrCat("train ", recipe, " --set train.export_to=hf --set run.out_dir=", out));
  ASSERT_EQ(exported.exit_code, 0) << exported.stderr_text;
  const std::string folder = out + "/dtrain/hf";
  const std::string warning = "train.init_from " + folder + " carries tokenizer hf-bpe:";

  const Outcome same = RunDtrain(absl::StrCat("train ", recipe, " --set train.init_from=", folder,
                                              " --set run.out_dir=", out, "_same"));
  ASSERT_EQ(same.exit_code, 0) << same.stderr_text;
  EXPECT_THAT(same.stderr_text, ::testing::Not(HasSubstr(warning)));
  const Outcome bytes = RunDtrain(
      absl::StrCat("train ", recipe, " --set train.init_from=", folder, " --set run.out_dir=", out,
                   "_bytes --set data.format=text --set data.train=[", text_file,
                   "] --set data.tokenizer= --set data.shards= --set data.val_shards="));
  ASSERT_EQ(bytes.exit_code, 0) << bytes.stderr_text;
  EXPECT_THAT(bytes.stderr_text,
              AllOf(HasSubstr(warning), HasSubstr("but the data's ids are of bytes")));
}

// Shards packed without --tokenizer record bytes: their samples print as text, as data.format
// text's do (they printed as ids); shards of another tokenizer print ids and say how to see text.
TEST(DataCommandTest, SampledTextOfShardsDecodesThroughTheirRecordedTokenizer) {
  std::string text;
  for (int i = 0; i < 100; ++i) text += "the theme of them\n";
  const std::string shards = testing::FreshTempDir("data_sample_bytes_shards");
  ASSERT_EQ(
      RunDtrain(absl::StrCat("data pack ", testing::WriteTempFile("data_sample_bytes.txt", text),
                             " --out ", shards))
          .exit_code,
      0);
  const std::string recipe =
      SampleRecipe("data_sample_bytes", "",
                   absl::StrCat("format: webdataset, streams: 1, shards: '", shards,
                                "/shard-000000.tar', val_shards: '", shards, "/shard-000000.tar'"),
                   8);
  const std::string out = testing::FreshTempDir("data_sample_bytes_run");
  const Outcome train = RunDtrain(absl::StrCat("train ", recipe, " --set run.out_dir=", out));
  ASSERT_EQ(train.exit_code, 0) << train.stderr_text;
  EXPECT_THAT(train.stderr_text, HasSubstr("sample at step 1:\nthe"));
  EXPECT_THAT(train.stderr_text, ::testing::Not(HasSubstr("samples print as token ids")));

  const std::string tokenizer = TokenizerDir("data_tok_sample_ids");
  const std::string other = testing::FreshTempDir("data_sample_ids_shards");
  ASSERT_EQ(
      RunDtrain(absl::StrCat("data pack ", testing::WriteTempFile("data_sample_ids.txt", text),
                             " --out ", other, " --tokenizer ", tokenizer))
          .exit_code,
      0);
  const Outcome ids = RunDtrain(absl::StrCat(
      "train ", recipe, " --set run.out_dir=", testing::FreshTempDir("data_sample_ids_run"),
      " --set model.vocab_size=300", " --set data.shards=", other,
      "/shard-000000.tar --set data.val_shards=", other, "/shard-000000.tar"));
  ASSERT_EQ(ids.exit_code, 0) << ids.stderr_text;
  EXPECT_THAT(ids.stderr_text, HasSubstr("samples print as token ids: set data.tokenizer to the "
                                         "data's tokenizer"));
  EXPECT_THAT(ids.stderr_text, HasSubstr("(the shards record hf-bpe:"));
}

TEST(DataCommandTest, EncodeAndDecodeRoundTrip) {
  const std::string tokenizer = TokenizerDir("data_tok_codec");
  const std::string text = testing::WriteTempFile("data_codec.txt", "the\xff theme");
  const Outcome encode = RunDtrain(absl::StrCat("data encode --tokenizer ", tokenizer, " ", text));
  ASSERT_EQ(encode.exit_code, 0) << encode.stderr_text;
  EXPECT_EQ(encode.stdout_text, "[257,255,32,257,109,101]\n");
  const std::string ids = testing::WriteTempFile("data_codec.json", encode.stdout_text);
  const Outcome decode = RunDtrain(absl::StrCat("data decode --tokenizer ", tokenizer, " ", ids));
  EXPECT_EQ(decode.stdout_text, "the\xff theme");
  // An id past 32 bits is refused, not wrapped (2^32 + 32 decoded as a space).
  const Outcome wide =
      RunDtrain(absl::StrCat("data decode --tokenizer ", tokenizer, " ",
                             testing::WriteTempFile("data_wide.json", "[4294967328]")));
  EXPECT_EQ(wide.exit_code, 2);
  EXPECT_THAT(wide.stderr_text, HasSubstr("id 4294967328 is not a token id of "));
  // An id outside the vocabulary is the input's fault too: exit 2, as for the wide id.
  const Outcome negative =
      RunDtrain(absl::StrCat("data decode --tokenizer ", tokenizer, " ",
                             testing::WriteTempFile("data_negative.json", "[-1]")));
  EXPECT_EQ(negative.exit_code, 2) << negative.stderr_text;
  const Outcome missing = RunDtrain(absl::StrCat("data encode --tokenizer /nonexistent ", text));
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.stderr_text, HasSubstr("tokenizer file /nonexistent does not exist"));
}

}  // namespace
}  // namespace dtrain
