// `dtrain data pack INPUT... --out DIR --shard-size SIZE`, `dtrain data inspect PATTERN` and
// `dtrain data encode|decode --tokenizer PATH FILE`.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/commands.h"
#include "core/data/data_inspect.h"
#include "core/data/data_pack.h"
#include "core/data/tokenizers/load_tokenizer.h"
#include "core/util/byte_size.h"
#include "core/util/files.h"
#include "core/util/thread_pool.h"

namespace dtrain::cli {
namespace {

std::unique_ptr<Tokenizer> LoadTokenizerOrFail(const std::string& path, int threads) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(path, threads);
  if (!tokenizer.ok()) Fail(tokenizer.status(), kExitUsage);
  return std::move(tokenizer).value();
}

std::string ReadInputOrFail(const std::string& path) {
  absl::StatusOr<std::string> text = ReadWholeFile(path);
  if (!text.ok()) Fail(text.status(), kExitUsage);
  return *std::move(text);
}

void AddEncodeCommands(CLI::App* data) {
  struct CodecArgs {
    std::string tokenizer;
    std::string input;
    int threads = 1;
    bool summary = false;
  };
  auto encode_args = std::make_shared<CodecArgs>();
  CLI::App* encode = data->add_subcommand(
      "encode",
      "Encode a file's bytes (one text) with a model's tokenizer; print the ids as a JSON list");
  encode->add_option("--tokenizer", encode_args->tokenizer, "tokenizer file or folder, or bytes")
      ->required();
  encode->add_option("input", encode_args->input, "Text file")
      ->required()
      ->check(CLI::ExistingFile);
  encode->add_option("--threads", encode_args->threads, "Encoding threads")
      ->capture_default_str()
      ->check(CLI::Range(1, kMaxThreads));
  encode->add_flag("--summary", encode_args->summary,
                   "Print the token count and the encoding rate instead of the ids");
  encode->callback([encode_args] {
    const auto tokenizer = LoadTokenizerOrFail(encode_args->tokenizer, encode_args->threads);
    const std::string text = ReadInputOrFail(encode_args->input);
    std::vector<int32_t> ids;
    const auto start = std::chrono::steady_clock::now();
    if (const absl::Status status = tokenizer->Encode(text, &ids); !status.ok()) {
      Fail(absl::Status(status.code(), encode_args->input + ": " + std::string(status.message())),
           kExitFailure);
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (encode_args->summary) {
      std::cout << absl::StrFormat("%d bytes, %d tokens in %.3f s: %.2f MB/s (%s, %d threads)\n",
                                   text.size(), ids.size(), seconds,
                                   static_cast<double>(text.size()) / 1e6 / std::max(seconds, 1e-9),
                                   tokenizer->name(), encode_args->threads);
    } else {
      std::cout << nlohmann::json(ids).dump() << "\n";
    }
  });

  auto decode_args = std::make_shared<CodecArgs>();
  CLI::App* decode = data->add_subcommand(
      "decode",
      "Decode a JSON list of token ids (a file) with a model's tokenizer; write the text");
  decode->add_option("--tokenizer", decode_args->tokenizer, "tokenizer file or folder, or bytes")
      ->required();
  decode->add_option("input", decode_args->input, "File holding a JSON list of ids")
      ->required()
      ->check(CLI::ExistingFile);
  decode->callback([decode_args] {
    const auto tokenizer = LoadTokenizerOrFail(decode_args->tokenizer, 1);
    const nlohmann::json ids =
        nlohmann::json::parse(ReadInputOrFail(decode_args->input), nullptr, false);
    std::vector<int32_t> values;
    for (const nlohmann::json& id : ids.is_array() ? ids : nlohmann::json::array()) {
      if (!id.is_number_integer()) break;
      // Read wide: get<int32_t> would wrap 2^32 + 1 to 1.
      const bool fits = id.is_number_unsigned()
                            ? id.get<uint64_t>() <= INT32_MAX
                            : id.get<int64_t>() >= INT32_MIN && id.get<int64_t>() <= INT32_MAX;
      if (!fits) {
        Fail(absl::InvalidArgumentError(absl::StrCat(decode_args->input, ": id ", id.dump(),
                                                     " is not a token id of ", tokenizer->name(),
                                                     " (0 to ", tokenizer->vocab_size() - 1, ")")),
             kExitUsage);
      }
      values.push_back(id.get<int32_t>());
    }
    if (!ids.is_array() || values.size() != ids.size()) {
      Fail(absl::InvalidArgumentError(decode_args->input +
                                      " is not a JSON list of token ids like [15496, 995]"),
           kExitUsage);
    }
    // Decoding fails only on ids outside the vocabulary: the input's.
    absl::StatusOr<std::string> text = tokenizer->Decode(values);
    if (!text.ok()) Fail(text.status(), kExitUsage);
    std::cout << *text;
  });
}

}  // namespace

void AddDataCommand(CLI::App& app) {
  CLI::App* data = app.add_subcommand("data", "Write and inspect WebDataset token shards");
  data->require_subcommand(1);

  struct PackArgs {
    std::vector<std::string> inputs;
    std::string out_dir;
    std::string shard_size = "256MB";
    std::string tokenizer;
    int threads = 0;
    bool sft = false;
    std::string chat_template = "llama3";
    std::string text_key = "text";
  };
  auto pack_args = std::make_shared<PackArgs>();
  CLI::App* pack = data->add_subcommand(
      "pack",
      "Write token shards from text files (one document each) and JSON-lines files (one "
      "document per line, its \"text\"), with a model's tokenizer or byte-level tokens");
  pack->add_option("inputs", pack_args->inputs, "Input .txt / .jsonl files")
      ->required()
      ->check(CLI::ExistingFile);
  pack->add_option("--out", pack_args->out_dir, "Folder for shard-000000.tar, ...")->required();
  pack->add_option("--shard-size", pack_args->shard_size, "Largest shard, e.g. 64MB or 1GiB")
      ->capture_default_str();
  pack->add_option("--tokenizer", pack_args->tokenizer,
                   "tokenizer.json, tokenizer.model, GPT-2's encoder.json/vocab.bpe, or their "
                   "folder; empty or bytes = byte-level tokens");
  pack->add_option("--threads", pack_args->threads, "Encoding threads; 0 = one per core")
      ->check(CLI::Range(0, kMaxThreads));
  CLI::Option* text_key =
      pack->add_option("--text-key", pack_args->text_key,
                       "The key of each .jsonl line's document (\"content\" in many datasets)")
          ->capture_default_str();
  CLI::Option* sft =
      pack->add_flag("--sft", pack_args->sft,
                     "SFT samples: each .jsonl line a {\"prompt\", \"completion\"} or "
                     "{\"messages\": [...]} object; writes a loss mask (.mask) beside the tokens, "
                     "for data.format sft")
          ->excludes(text_key);
  pack->add_option("--chat-template", pack_args->chat_template,
                   "With --sft: llama3, chatml, none (the texts as they are) or a template "
                   "file (README.md, SFT data)")
      ->capture_default_str()
      ->needs(sft);
  pack->callback([pack_args, text_key] {
    // A tar shard's headers alone take a few KiB.
    absl::StatusOr<int64_t> shard_bytes =
        ParseByteSize("--shard-size", pack_args->shard_size, /*minimum=*/4096);
    if (!shard_bytes.ok()) Fail(shard_bytes.status(), kExitUsage);
    if (text_key->count() > 0 && absl::c_none_of(pack_args->inputs, IsJsonLines)) {
      Fail(absl::InvalidArgumentError(absl::StrCat(
               "--text-key ", pack_args->text_key,
               " names the document's key in .jsonl lines, and no input is a .jsonl file (each "
               "other file is packed whole as one document): name JSON lines .jsonl, or drop "
               "--text-key")),
           kExitUsage);
    }
    if (absl::Status named = CheckShardsCanBeNamed(pack_args->out_dir, pack_args->sft);
        !named.ok()) {
      Fail(named, kExitUsage);
    }
    const int threads = pack_args->threads > 0 ? pack_args->threads : UsableCpus();
    const auto tokenizer = LoadTokenizerOrFail(pack_args->tokenizer, threads);
    // The folders that the pack makes for its shards: a failed one removes them with its
    // shards (where empty).
    const std::vector<std::filesystem::path> made = MissingFolders(pack_args->out_dir);
    absl::StatusOr<PackResult> result;
    if (pack_args->sft) {
      absl::StatusOr<ChatTemplate> chat_template = LoadChatTemplate(pack_args->chat_template);
      if (!chat_template.ok()) Fail(chat_template.status(), kExitUsage);
      for (const std::string& marker : TemplateMarkers(*chat_template)) {
        if (tokenizer->SpecialToken(marker).ok()) continue;
        std::cerr << absl::StrFormat(
            "warning: tokenizer %s has no special token %s, which the %s template writes: it is "
            "packed as ordinary text (several tokens); use the model's own tokenizer, or a "
            "template of its markers\n",
            tokenizer->name(), marker, chat_template->name);
      }
      result = PackSftShards(pack_args->inputs, pack_args->out_dir, *shard_bytes, *tokenizer,
                             *chat_template, threads);
    } else {
      result = PackShards(pack_args->inputs, pack_args->out_dir, *shard_bytes, *tokenizer, threads,
                          pack_args->text_key);
    }
    if (!result.ok()) {
      RemoveEmptyFolders(made);
      // An input that is not there or of no form it packs, an --out of an earlier pack, fail
      // the same way again.
      const absl::Status& status = result.status();
      Fail(status, absl::IsInvalidArgument(status) || absl::IsNotFound(status) ||
                           absl::IsAlreadyExists(status)
                       ? kExitUsage
                       : kExitFailure);
    }
    if (pack_args->sft) {
      std::cout << absl::StrFormat("%d of the tokens are trained (assistant/completion)\n",
                                   result->trained_tokens);
    }
    const std::string pattern =
        ShardPattern(pack_args->out_dir, static_cast<int>(result->shards.size()));
    std::cout << absl::StrFormat(
        "%d documents%s, %d tokens in %d shards: %s\n", result->documents,
        result->empty_documents == 0
            ? ""
            : absl::StrFormat(" (%d empty ones left out)", result->empty_documents),
        result->tokens, result->shards.size(), pattern);
    if (result->oversized_documents > 0) {
      std::cout << absl::StrFormat(
          "note: documents larger than --shard-size %s: %d, each in a shard of its own "
          "(a sample never spans two shards)\n",
          pack_args->shard_size, result->oversized_documents);
    }
    // SFT samples are read whole at start (files, globs allowed); others stream (one pattern).
    std::cout << (pack_args->sft
                      ? absl::StrFormat("train on them: data.format: sft, data.train: ['%s']\n",
                                        ShardGlob(pack_args->out_dir))
                      : absl::StrFormat(
                            "train on them: data.format: webdataset, data.shards: '%s'\n",
                            pattern));
  });

  struct InspectArgs {
    std::string pattern;
    std::string tokenizer;
    InspectOptions options;
  };
  auto inspect_args = std::make_shared<InspectArgs>();
  CLI::App* inspect = data->add_subcommand(
      "inspect", "List the samples, keys, extensions and token counts of shards");
  inspect
      ->add_option("pattern", inspect_args->pattern,
                   "Shard URL pattern, as data.shards: paths, http(s)://, pipe:CMD, "
                   "{000..009} ranges, '::' lists")
      ->required();
  inspect->add_flag("--summary", inspect_args->options.summary_only,
                    "Print only the totals and the read rate");
  inspect->add_option("--max-samples", inspect_args->options.max_samples,
                      "List at most this many samples (the totals still count all)");
  inspect->add_option("--tokenizer", inspect_args->tokenizer,
                      "Decode each listed sample's tokens to text with this tokenizer");
  inspect->add_option("--text-tokens", inspect_args->options.text_tokens,
                      "With --tokenizer: the tokens of a sample shown as text (default 200; -1 = "
                      "all)");
  inspect->callback([inspect_args] {
    std::unique_ptr<Tokenizer> tokenizer;
    if (!inspect_args->tokenizer.empty()) {
      tokenizer = LoadTokenizerOrFail(inspect_args->tokenizer, 1);
      inspect_args->options.tokenizer = tokenizer.get();
    }
    const absl::Status status =
        InspectShards(inspect_args->pattern, inspect_args->options, std::cout);
    if (!status.ok()) Fail(status, kExitFailure);
  });

  AddEncodeCommands(data);
}

}  // namespace dtrain::cli
