// The recipe: everything a run needs, read from one YAML file with documented defaults.
//
// Parsing is strict: an unknown key, a wrong type, an out-of-range value or an inconsistent
// combination is an error naming the key path, the line:column in the file and the fix. Values
// given with `--set a.b=c` override the file. Every key, its type, default and meaning lives in
// one table (recipe.cc), which also prints the resolved recipe and the README's reference.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dtrain {

struct RunSection {
  std::string name = "dtrain";  // names the run's output folder <out_dir>/<name>
  std::string out_dir = "runs";
  uint64_t seed = 1337;
  std::string device = "cpu";  // cpu | cuda
  int threads = 0;             // worker threads for CPU kernels; 0 = all cores
};

struct ModelSection {
  std::string family = "gpt2";  // gpt2 | llama
  int n_layer = 4;
  int n_head = 4;
  int n_kv_head = 0;  // llama grouped-query attention; 0 = n_head
  int d_model = 128;
  int d_ff = 0;  // 0 = 4*d_model (gpt2) or the Llama rule 256*ceil(8*d_model/3/256) (llama)
  int vocab_size = 256;
  int max_seq_len = 256;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  double init_std = 0.02;
};

struct DataSection {
  std::string format = "text";      // text (bytes, vocab 256) | llmc (llm.c token shards)
  std::vector<std::string> train;    // files; glob patterns allowed
  std::vector<std::string> val;      // empty = the last val_fraction of the train tokens
  double val_fraction = 0.05;
};

struct TrainSection {
  int steps = 200;
  int batch_size = 16;  // sequences per optimizer step, across all ranks
  int micro_batch = 16;  // sequences per forward/backward on one rank
  int seq_len = 128;
  double lr = 1e-3;
  double min_lr = 1e-4;
  int warmup_steps = 20;
  std::string schedule = "cosine";  // cosine | linear | constant
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  // global L2 norm; 0 disables clipping
  std::vector<std::string> no_decay = {"*.bias", "*norm*"};  // glob on tensor names
  int eval_every = 50;   // 0 disables evaluation
  int eval_batches = 8;  // micro-batches per evaluation
  std::string init_from;  // safetensors file with Hugging Face names; empty = random init
  std::string export_to = "model.safetensors";  // relative to the run folder; empty = none
};

struct ParallelSection {
  std::string strategy = "ddp";  // ddp | zero1 | zero2 | zero3 | fsdp
  int tp = 1;
  int pp = 1;
  bool activation_checkpointing = false;  // recompute each block's forward in backward
};

struct LoggingSection {
  int every = 1;  // steps between step-log lines
  std::string metrics_file = "metrics.jsonl";  // relative to the run folder
  int sample_tokens = 64;  // generated at each evaluation; 0 disables
  double sample_temperature = 0.8;
  int sample_top_k = 40;
  std::string sample_prompt = "\n";
};

struct Recipe {
  RunSection run;
  ModelSection model;
  DataSection data;
  TrainSection train;
  ParallelSection parallel;
  LoggingSection logging;

  std::string source_path;  // the file it came from, for messages

  // Values derived from the keys above.
  int n_kv_head() const { return model.n_kv_head > 0 ? model.n_kv_head : model.n_head; }
  int d_ff() const;
  std::string run_dir() const;  // <run.out_dir>/<run.name>
};

// Reads, overrides (each "a.b=value"), validates. Errors are InvalidArgument with a message
// that names the key, its line:column and the fix.
absl::StatusOr<Recipe> LoadRecipe(const std::string& path,
                                  const std::vector<std::string>& overrides = {});
absl::StatusOr<Recipe> ParseRecipe(const std::string& yaml_text, const std::string& source_name,
                                   const std::vector<std::string>& overrides = {});

// The fully resolved recipe as YAML, every key present, one comment per key.
std::string ResolvedRecipeYaml(const Recipe& recipe);

// The reference table of every key (path, type, default, meaning) in Markdown, for the README.
std::string RecipeReferenceMarkdown();

}  // namespace dtrain
