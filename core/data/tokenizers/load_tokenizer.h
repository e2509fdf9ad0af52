// A model's tokenizer from the files its users already have:
//   - a Hugging Face tokenizer.json with a BPE model: byte-level (GPT-2, Llama 3, ...) or
//     SentencePiece-style (Llama 2, Mistral, TinyLlama, SentencePieceBPETokenizer; bpe.h);
//   - GPT-2's encoder.json + vocab.bpe (or Hugging Face's names for them, vocab.json +
//     merges.txt): either file's path, or their folder;
//   - a SentencePiece model (tokenizer.model, Llama 2), a file ending in .model;
//   - a folder: its tokenizer.json, else tokenizer.model, else the GPT-2 pair. A tokenizer.json
//     whose model or stages dtrain does not read (a Unigram model) gives way to a
//     tokenizer.model beside it.
// An empty path, or "bytes" (the byte-level tokenizer's name(), as shards record it; a file of
// that name is ./bytes), is the byte-level tokenizer. name() is "<kind>:<folder>/<file>#<hash>",
// the hash (FNV-1a of the files' bytes, 12 hex digits) telling tokenizers with the same file name
// apart. Errors name the file and what is wrong with it.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/data/tokenizer.h"

namespace dtrain {

// threads > 1: large texts encode in parallel where the tokenizer allows (bpe.h).
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path, int threads = 1);

}  // namespace dtrain
