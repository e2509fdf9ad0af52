// `dtrain ckpt inspect DIR`, `dtrain ckpt export DIR --out PATH [--format safetensors|hf|llmc]
// [--tokenizer PATH]` and
// `dtrain ckpt bench DIR` (the measurement behind scripts/bench/ckpt_throughput.sh).
#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "core/checkpoint/tools.h"

namespace dtrain::cli {

void AddCkptCommand(CLI::App& app) {
  CLI::App* ckpt = app.add_subcommand("ckpt", "Inspect, validate and export checkpoints");
  ckpt->require_subcommand(1);

  auto inspect_path = std::make_shared<std::string>();
  CLI::App* inspect = ckpt->add_subcommand(
      "inspect",
      "Summarise a checkpoint (step, tensors, world layout, sizes) and verify every chunk's "
      "checksum; exits 1 naming the bad file or chunk when invalid");
  inspect->add_option("dir", *inspect_path, "A step-<N> folder, or a checkpoint folder (all)")
      ->required();
  inspect->callback([inspect_path] {
    const InspectReport report = InspectCheckpoints(*inspect_path);
    std::cout << report.text;
    if (!report.found) {
      Fail(absl::NotFoundError(absl::StrCat(*inspect_path,
                                            " is no checkpoint: give a step-<N> folder or the "
                                            "folder that holds them")),
           kExitUsage);
    }
    if (!report.valid) {
      Fail(absl::DataLossError(
               absl::StrCat(*inspect_path, " is not a valid checkpoint (see above)")),
           kExitFailure);
    }
  });

  struct ExportArgs {
    std::string dir, out, format = "safetensors", tokenizer;
  };
  auto export_args = std::make_shared<ExportArgs>();
  CLI::App* export_command = ckpt->add_subcommand(
      "export",
      "Write the consolidated model weights of a checkpoint, from any number of ranks, one "
      "tensor in memory at a time");
  export_command
      ->add_option("dir", export_args->dir,
                   "A step-<N> folder, or a checkpoint folder (its newest complete checkpoint)")
      ->required();
  export_command
      ->add_option("--out", export_args->out, "The file to write (the folder, for --format hf)")
      ->required();
  export_command
      ->add_option("--format", export_args->format,
                   "safetensors (Hugging Face names), hf (a folder transformers' from_pretrained "
                   "loads: config.json, model.safetensors, tokenizer) or llmc (llm.c's GPT-2 "
                   "model file)")
      ->capture_default_str();
  export_command->add_option(
      "--tokenizer", export_args->tokenizer,
      "With --format hf: the tokenizer to include (tokenizer.json, tokenizer.model, GPT-2's "
      "encoder.json / vocab.bpe, or a folder holding one; bytes: one token per byte, "
      "data.format text's; default: the run's data.tokenizer where it is at its path, or bytes "
      "for a run on bytes; none: no tokenizer)");
  export_command->callback([export_args] {
    const absl::StatusOr<std::string> exported = ExportCheckpoint(
        export_args->dir, export_args->out, export_args->format, export_args->tokenizer);
    if (!exported.ok()) {
      // A wrong path or option fails the same way again, as does a file error that asks for its
      // own exit code (a full disk: 3); a damaged checkpoint is the data's.
      const absl::Status& status = exported.status();
      Fail(status,
           absl::IsInvalidArgument(status) || absl::IsNotFound(status) ? kExitUsage : kExitFailure);
    }
    std::cout << "wrote " << export_args->out << " (" << export_args->format << ") from "
              << *exported << "\n";
  });

  struct BenchArgs {
    std::string dir;
    int64_t values = int64_t{124} << 20;
  };
  auto bench_args = std::make_shared<BenchArgs>();
  CLI::App* bench = ckpt->add_subcommand(
      "bench", "Time saving and loading parameters + AdamW moments (sync and async), one rank");
  bench
      ->add_option("dir", bench_args->dir,
                   "Folder for a scratch folder of the bench's own (removed after)")
      ->required();
  bench->add_option("--values", bench_args->values, "Parameter count; the state is 3x it")
      ->capture_default_str()
      ->check(Positive());
  bench->callback([bench_args] {
    absl::StatusOr<std::string> line = BenchCheckpointIo(bench_args->dir, bench_args->values);
    if (!line.ok()) Fail(line.status(), kExitFailure);
    std::cout << *line << "\n";
  });
}

}  // namespace dtrain::cli
