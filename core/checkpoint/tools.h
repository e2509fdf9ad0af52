// What `dtrain ckpt` does with a checkpoint on its own, outside a training run: inspect (summary
// and full checksum validation), export (consolidated weights, streamed one tensor at a time)
// and a save/load throughput measurement for scripts/bench/ckpt_throughput.sh.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace dtrain {

// Whether `path` is a regular file that starts as llm.c's GPT-2 model file (which `ckpt export
// --format llmc` writes) does.
bool IsLlmcModelFile(const std::string& path);

// `path` is a step-<N> folder, or a checkpoint folder: then its newest complete checkpoint, with
// a warning naming each newer one skipped and why.
absl::StatusOr<std::string> ResolveCheckpoint(const std::string& path);

// Gives `use` the newest checkpoint of `path` (ResolveCheckpoint), and where `use` failed because
// that step-<N> folder was removed meanwhile (a run still training pruned it), the newest again,
// up to 3 times; a step-<N> folder given as `path` is not taken again. The folder used.
absl::StatusOr<std::string> WithNewestCheckpoint(
    const std::string& path, const std::function<absl::Status(const std::string& dir)>& use);

struct InspectReport {
  std::string text;  // the summary, then one line per problem
  bool valid = false;
  bool found = true;  // false: `path` does not exist or holds no checkpoint (a wrong path)
};
// Inspects `path`: a step-<N> folder, or every step-<N> folder of a checkpoint folder (newest
// first, with what `latest` names). Invalid when any inspected one is incomplete or corrupt.
InspectReport InspectCheckpoints(const std::string& path);

// Writes the model's parameters of the checkpoint at `path` (ResolveCheckpoint) to `out`:
// format "safetensors" (Hugging Face names and layouts), "hf" (the folder `out` that
// transformers' from_pretrained loads, with the tokenizer at `tokenizer_path` ("bytes": one token
// per byte), or when that is empty the run's (DataTokenizer: data.tokenizer, left out with a
// warning where it is not at its path, or bytes), none for "none", and with a tokenizer, for an SFT
// run, the chat template its shards record; core/model/hf_folder.h) or "llmc" (llm.c's GPT-2 model
// file, version 3: float32, vocabulary padded to a multiple of 128; GPT-2 with d_ff = 4 d_model
// only). Host memory stays near one tensor. Every chunk read is checksum-verified. A checkpoint
// pruned while it is read is exported again from the newest (WithNewestCheckpoint). The step-<N>
// folder exported.
absl::StatusOr<std::string> ExportCheckpoint(const std::string& path, const std::string& out,
                                             const std::string& format,
                                             const std::string& tokenizer_path = "");

// Saves `numel` floats of parameters plus AdamW's two moments (one rank) synchronously and
// asynchronously into a new scratch folder in `parent` (created if missing; nothing else in it is
// touched), loads them back and removes the scratch folder; returns one line of key=value figures
// (bytes, save_s, load_s, async_blocked_s, ...).
absl::StatusOr<std::string> BenchCheckpointIo(const std::string& parent, int64_t numel);

}  // namespace dtrain
