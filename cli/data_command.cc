// `dtrain data pack INPUT... --out DIR --shard-size SIZE` and `dtrain data inspect PATTERN`.
#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "cli/commands.h"
#include "core/data/data_inspect.h"
#include "core/data/data_pack.h"

namespace dtrain::cli {

void AddDataCommand(CLI::App& app) {
  CLI::App* data = app.add_subcommand("data", "Write and inspect WebDataset token shards");
  data->require_subcommand(1);

  struct PackArgs {
    std::vector<std::string> inputs;
    std::string out_dir;
    std::string shard_size = "256MB";
    bool sft = false;
    std::string chat_template = "llama3";
  };
  auto pack_args = std::make_shared<PackArgs>();
  CLI::App* pack = data->add_subcommand(
      "pack",
      "Write token shards (byte-level tokens) from text files (one document each) and "
      "JSON-lines files (one document per line, its \"text\")");
  pack->add_option("inputs", pack_args->inputs, "Input .txt / .jsonl files")->required();
  pack->add_option("--out", pack_args->out_dir, "Folder for shard-000000.tar, ...")->required();
  pack->add_option("--shard-size", pack_args->shard_size, "Largest shard, e.g. 64MB or 1GiB")
      ->capture_default_str();
  pack->add_flag("--sft", pack_args->sft,
                 "SFT samples: each .jsonl line a {\"prompt\", \"completion\"} or "
                 "{\"messages\": [...]} object; writes a loss mask (.mask) beside the tokens, "
                 "for data.format sft");
  pack->add_option("--chat-template", pack_args->chat_template,
                   "With --sft: llama3, chatml, none (the texts as they are) or a template "
                   "file (README.md, SFT data)")
      ->capture_default_str();
  pack->callback([pack_args] {
    absl::StatusOr<int64_t> shard_bytes = ParseByteSize(pack_args->shard_size);
    if (!shard_bytes.ok()) Fail(shard_bytes.status(), kExitUsage);
    absl::StatusOr<PackResult> result;
    if (pack_args->sft) {
      absl::StatusOr<ChatTemplate> chat_template = LoadChatTemplate(pack_args->chat_template);
      if (!chat_template.ok()) Fail(chat_template.status(), kExitUsage);
      result = PackSftShards(pack_args->inputs, pack_args->out_dir, *shard_bytes, ByteTokenizer(),
                             *chat_template);
    } else {
      result = PackShards(pack_args->inputs, pack_args->out_dir, *shard_bytes, ByteTokenizer());
    }
    if (!result.ok()) Fail(result.status(), kExitFailure);
    if (pack_args->sft) {
      std::cout << absl::StrFormat("%d of the tokens are trained (assistant/completion)\n",
                                   result->trained_tokens);
    }
    std::cout << absl::StrFormat(
        "%d documents, %d tokens in %d shards: %s/shard-{000000..%06d}"
        ".tar\n",
        result->documents, result->tokens, result->shards.size(), pack_args->out_dir,
        result->shards.empty() ? 0 : result->shards.size() - 1);
  });

  struct InspectArgs {
    std::string pattern;
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
  inspect->callback([inspect_args] {
    const absl::Status status =
        InspectShards(inspect_args->pattern, inspect_args->options, std::cout);
    if (!status.ok()) Fail(status, kExitFailure);
  });
}

}  // namespace dtrain::cli
