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
  std::string device = "cpu";             // cpu | cuda
  int threads = 0;                        // worker threads for CPU kernels; 0 = all cores
  std::string matmul_precision = "auto";  // auto | highest | high | medium (matmul_precision.h)
  std::string precision = "auto";  // auto | fp32 | bf16: the parameters the model computes with
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
  // text (bytes, vocab 256) | llmc (llm.c token shards) | webdataset | sft (data pack --sft shards)
  std::string format = "text";
  // The data's tokenizer file or folder, which sampled text decodes through; empty = bytes.
  std::string tokenizer;
  std::vector<std::string> train;  // files; glob patterns allowed
  std::vector<std::string> val;    // empty = the last val_fraction of the train tokens
  double val_fraction = 0.05;
  // webdataset: tar shards streamed from files, http(s) or pipes.
  std::string shards;      // URL pattern: brace ranges, "::" lists
  std::string val_shards;  // empty = no validation data
  int streams = 64;        // logical shard streams; fixes the order; a multiple of the dp size
  bool shard_shuffle = true;
  int shuffle_buffer = 4096;      // samples shuffled together, across all streams
  int shuffle_buffer_mb = 1024;   // ... and at most about this many MiB of their tokens
  int eos_id = -1;                // appended after every document; -1 = none
  int epochs = 0;                 // passes over the shards; 0 = endless
  std::string on_error = "fail";  // fail | skip_shard
  double http_timeout_s = 30;
  int http_retries = 3;
  double pipe_timeout_s = 120;
  int read_ahead_mb = 64;
  // sft: samples packed whole into sequences with document-aware attention, or one per sequence.
  bool packing = true;
  std::string on_long_sample = "truncate";  // truncate | skip
};

struct TrainSection {
  int steps = 200;
  int batch_size = 16;   // sequences per optimizer step, across all ranks
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
  double grad_clip = 1.0;                                    // global L2 norm; 0 disables clipping
  std::vector<std::string> no_decay = {"*.bias", "*norm*"};  // glob on tensor names
  int eval_every = 50;                                       // 0 disables evaluation
  int eval_batches = 8;   // batches of batch_size sequences per evaluation
  std::string init_from;  // safetensors file or Hugging Face model folder; empty = random init
  // Relative to the run folder: *.safetensors = one file, else a Hugging Face model folder.
  std::string export_to = "model.safetensors";
};

struct ParallelSection {
  std::string strategy = "ddp";  // ddp | zero1 | zero2 | zero3 | fsdp | auto (the planner picks)
  int tp = 1;
  int pp = 1;
  std::string pp_schedule = "1f1b";  // 1f1b | interleaved | gpipe (parallel/pipeline/schedule.h)
  int pp_virtual_stages = 1;         // model chunks per pipeline stage (interleaved)

  std::string recompute = "none";     // none | selective | full (core/model/recompute.h)
  bool sequence_parallel = false;     // Megatron sequence parallelism in the tp group (tp > 1)
  double bucket_mb = 25;              // gradient all-reduce / reduce-scatter bucket (ddp, zero1/2)
  double prefetch_bucket_mb = 50;     // parameter all-gather unit of zero3
  std::string reduce_dtype = "auto";  // auto | fp32 | bf16: the gradients' data-parallel reductions
  double timeout_s = 300;             // a collective or rendezvous wait longer than this fails
  bool check_replicas = false;        // compare replicated parameters across ranks every step
};

// Sharded, resumable checkpoints (core/checkpoint/): <dir>/step-<N>/ holds one file per rank and
// a manifest written last; <dir>/latest names the newest complete one.
struct CheckpointSection {
  std::string dir;    // empty = <run dir>/checkpoints; relative paths are from the run dir
  int interval = 0;   // steps between saves; 0 = only at the end and on SIGTERM / SIGUSR1
  int keep_last = 3;  // complete checkpoints kept; older ones go once a newer is complete
  bool async = true;  // periodic saves: copy to host staging memory, write on a background thread
  bool save_at_end = true;      // false: the last step writes none (SIGTERM and SIGUSR1 still save)
  std::string resume = "auto";  // auto (newest complete in dir, if any) | never | PATH
};

// The machines a run is planned for (`dtrain plan`, parallel.strategy: auto). Names refer to the
// planner's catalog (parallel/planner/catalog.h); a 0 figure takes the catalog's value.
struct ClusterSection {
  int nodes = 1;
  int gpus_per_node = 8;
  std::string gpu = "h100-sxm";
  double gpu_memory_gib = 0;    // usable memory per GPU
  double peak_tflops = 0;       // dense bf16 per GPU
  double memory_gbps = 0;       // device memory bandwidth per GPU
  double intra_gbps = 0;        // all-reduce bus bandwidth inside a node
  double intra_latency_us = 0;  // per hop inside a node
  std::string network = "ib-ndr";
  double inter_gbps = 0;        // all-reduce bus bandwidth of one NIC between nodes
  double inter_latency_us = 0;  // per hop between nodes
  int nics_per_node = 0;        // 0 = one per GPU
};

struct LoggingSection {
  int every = 1;                               // steps between step-log lines
  std::string metrics_file = "metrics.jsonl";  // relative to the run folder
  int sample_tokens = 64;                      // generated at each evaluation; 0 disables
  double sample_temperature = 0.8;
  int sample_top_k = 40;
  std::string sample_prompt = "\n";
  int flight_recorder_entries = 256;        // per rank, every group; 0 = off
  double straggler_pct = 10;                // lag above the median that names a straggler; 0 = off
  int metrics_port = 0;                     // Prometheus /metrics at this + local rank; 0 = off
  std::string metrics_address = "0.0.0.0";  // where /metrics listens: every interface
};

struct Recipe {
  RunSection run;
  ModelSection model;
  DataSection data;
  TrainSection train;
  ParallelSection parallel;
  CheckpointSection checkpoint;
  ClusterSection cluster;
  LoggingSection logging;

  std::string source_path;  // the file it came from, for messages

  // Values derived from the keys above.
  int n_kv_head() const { return model.n_kv_head > 0 ? model.n_kv_head : model.n_head; }
  int d_ff() const;
  bool cuda() const { return run.device == "cuda"; }  // the run's kernels run on GPUs
  // run.precision resolved: bf16 parameters (over float32 masters) for compute, the default on
  // cuda, or float32 throughout.
  bool bf16_params() const;
  // run.matmul_precision resolved: auto is medium (the bf16 tensor cores, as under PyTorch's
  // bf16 autocast) on cuda with bf16 parameters, highest otherwise.
  std::string matmul_precision() const;
  std::string run_dir() const;  // <run.out_dir>/<run.name>
  // checkpoint.dir resolved: <run dir>/checkpoints when empty, relative to the run dir.
  std::string checkpoint_dir() const;
};

// Reads, overrides (each "a.b=value"), validates. Errors are InvalidArgument with a message
// that names the key, its line:column and the fix.
absl::StatusOr<Recipe> LoadRecipe(const std::string& path,
                                  const std::vector<std::string>& overrides = {});
absl::StatusOr<Recipe> ParseRecipe(const std::string& yaml_text, const std::string& source_name,
                                   const std::vector<std::string>& overrides = {});

// A path key (run.out_dir, data.train, checkpoint.dir, ...) that starts with '~' is
// InvalidArgument naming it: only a shell expands '~', and neither a recipe nor a --set value
// (past a word's start) goes through one, so a run took it as a folder named '~'. Checked where a
// recipe is loaded to run, not where a run's stored recipe is read back (ckpt export, report).
absl::Status CheckNoTildePaths(const Recipe& recipe);

// logging.metrics_address, where logging.metrics_port is on, is an IP address or localhost:
// InvalidArgument naming the key otherwise (a run warned at its start, guessing at a busy port).
// Checked where a recipe is loaded to run, as CheckNoTildePaths.
absl::Status CheckMetricsAddress(const Recipe& recipe);

// The fully resolved recipe as YAML, every key present, one comment per key.
std::string ResolvedRecipeYaml(const Recipe& recipe);

// Every key's resolved value, one "section.key: value" line each, in the reference's order.
std::string RecipeSettings(const Recipe& recipe);

// The reference table of every key (path, type, default, meaning) in Markdown, for the README.
std::string RecipeReferenceMarkdown();

}  // namespace dtrain
