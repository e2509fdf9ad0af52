// The recipe's key table and the strict parser, printer and reference built on it.
//
// Every key is one row of Keys(): its path, the struct member it binds, its doc and its allowed
// values or range. Its type comes from the member and its default from a default-constructed
// Recipe, so adding a key to recipe.h and one row here is all a new key needs.
#include "core/recipe/recipe.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/model/hf_folder.h"
#include "core/model/model_config.h"
#include "core/util/decimal.h"
#include "core/util/files.h"
#include "core/util/log.h"
#include "core/util/names.h"
#include "core/util/status.h"
#include "core/util/thread_pool.h"
#include "core/util/utf8.h"

namespace dtrain {
namespace {

// ---------------------------------------------------------------------------------------------
// The key table.

// A pointer to the member a key binds; the alternative is the key's type.
using FieldPtr =
    std::variant<int*, uint64_t*, double*, bool*, std::string*, std::vector<std::string>*>;
using FieldFn = FieldPtr (*)(Recipe&);

template <auto kSection, auto kMember>
FieldPtr Bind(Recipe& recipe) {
  return &((recipe.*kSection).*kMember);
}

// Spells the path and the member once, so the two cannot drift apart.
#define DTRAIN_RECIPE_KEY(section, key) \
#section "." #key, &Bind < &Recipe::section, &decltype(Recipe::section)::key>

// Allowed values of a numeric key; an open end excludes the bound itself. A bound that is not
// the key's meaning says why (`reason`), after the value it refused.
struct Range {
  double min = -std::numeric_limits<double>::infinity();
  bool min_open = false;
  double max = std::numeric_limits<double>::infinity();
  bool max_open = false;
  absl::string_view reason = "";
};

constexpr Range AtLeast(double min) { return Range{.min = min}; }
constexpr Range Between(double min, double max) { return Range{.min = min, .max = max}; }

// Upper bounds of the model's sizes, far above any real model (hundreds of layers, widths in the
// tens of thousands), so that the 64-bit parameter count and buffer sizes derived from them cannot
// overflow. Whether the model fits a machine is checked later (core/model/model_size.h).
constexpr double kMaxLayers = 65536;
constexpr double kMaxWidth = 1 << 20;
constexpr double kMaxTokens = 1 << 30;  // vocabulary and sequence length
// Bounds of the run's other counts, far above any real run, below what would exhaust the
// machine's threads, memory or a 32-bit product before the run could say so.
constexpr double kMaxStreams = 1 << 20;
constexpr double kMaxTimeout_s = 7 * 24 * 3600;  // NCCL's default is 10 minutes, PyTorch's 30
constexpr double kMaxNodes = 1 << 20;
constexpr double kMaxGpusPerNode = 1024;  // kMaxNodes x this fits an int
constexpr double kMaxSampleTokens = 1 << 20;
constexpr Range Positive() { return Range{.min = 0, .min_open = true}; }
constexpr Range UnitInterval() { return Range{.min = 0, .max = 1, .max_open = true}; }  // [0, 1)
// (0, 1): a rate or epsilon of 1 or more is a typo (3e4 for 3e-4), whose run would train on
// without a word until its loss overflowed.
constexpr Range BelowOne(absl::string_view reason) {
  return Range{.min = 0, .min_open = true, .max = 1, .max_open = true, .reason = reason};
}

struct KeySpec {
  absl::string_view path;  // "section.key"
  FieldFn field;
  absl::string_view doc;                        // one line: what the key means, with units
  std::vector<absl::string_view> allowed = {};  // non-empty: a string key with a closed set
  std::optional<Range> range = std::nullopt;
};

const std::vector<KeySpec>& Keys() {
  static const auto* const keys = new std::vector<KeySpec>{
      // run
      {DTRAIN_RECIPE_KEY(run, name), "name of the run; its outputs go to <out_dir>/<name>"},
      {DTRAIN_RECIPE_KEY(run, out_dir), "folder holding one subfolder per run"},
      {DTRAIN_RECIPE_KEY(run, seed),
       "seeds initialization, data order and sampling; on CPU the same seed and layout give a "
       "bit-identical run"},
      {DTRAIN_RECIPE_KEY(run, device),
       "where the kernels run; cuda: the local rank's GPU, through libdtrain_cuda.so beside "
       "the binary (no GPU there is an error at start)",
       {"cpu", "cuda"}},
      {DTRAIN_RECIPE_KEY(run, threads),
       "worker threads for CPU kernels, OpenBLAS's GEMMs included; 0 = every CPU this process "
       "may run on (its affinity: taskset, a Slurm task's cores; GEMMs: OpenBLAS's own count)",
       {},
       Between(0, kMaxThreads)},
      {DTRAIN_RECIPE_KEY(run, matmul_precision),
       "inputs of the float32 GEMMs (run.precision fp32's linear layers and head, and there the "
       "start-up GEMM peak that MFU is against), named as PyTorch's "
       "set_float32_matmul_precision levels: highest float32, high TF32, medium bfloat16 (tensor "
       "cores on the GPU, where PyTorch runs medium as TF32; the CPU rounds the inputs alike); "
       "float32 sums and values at every level; auto = medium on cuda at "
       "run.precision bf16 (whose GEMMs, and the peak, multiply bf16 values already), highest "
       "otherwise",
       {"auto", "highest", "high", "medium"}},
      {DTRAIN_RECIPE_KEY(run, precision),
       "what the model stores (PyTorch FSDP's param_dtype, Megatron-LM's bf16): bf16 = bfloat16 "
       "copies of the float32 master weights (rounded to nearest even after each update; the "
       "ZeRO-1/2/3 and FSDP all-gathers move them at half the bytes) and bfloat16 activations and "
       "activation gradients, the arithmetic, parameter gradients and saved statistics float32, "
       "while AdamW updates the masters and checkpoints keep them; fp32 = float32 throughout; "
       "auto = bf16 on cuda, fp32 on cpu (where bf16 is the GPU's reference: each kernel widens "
       "its bf16 inputs, computes and rounds its outputs)",
       {"auto", "fp32", "bf16"}},
      // model
      {DTRAIN_RECIPE_KEY(model, family),
       "gpt2: LayerNorm, learned positions, GELU, tied head; llama: RMSNorm, RoPE, SwiGLU, "
       "grouped-query attention",
       {"gpt2", "llama"}},
      {DTRAIN_RECIPE_KEY(model, n_layer), "transformer blocks", {}, Between(1, kMaxLayers)},
      {DTRAIN_RECIPE_KEY(model, n_head),
       "attention heads; head size is d_model / n_head",
       {},
       AtLeast(1)},
      {DTRAIN_RECIPE_KEY(model, n_kv_head),
       "key/value heads for grouped-query attention (llama only); 0 = n_head",
       {},
       AtLeast(0)},
      {DTRAIN_RECIPE_KEY(model, d_model),
       "width of the residual stream",
       {},
       Between(1, kMaxWidth)},
      {DTRAIN_RECIPE_KEY(model, d_ff),
       "MLP hidden width; 0 = 4*d_model (gpt2) or 256*ceil((8*d_model/3)/256) (llama)",
       {},
       Between(0, 4 * kMaxWidth)},
      {DTRAIN_RECIPE_KEY(model, vocab_size),
       "token ids are below this; text data needs >= 256 (one token per byte)",
       {},
       Between(1, kMaxTokens)},
      {DTRAIN_RECIPE_KEY(model, max_seq_len),
       "longest sequence the model accepts, in tokens (gpt2: rows of the position table)",
       {},
       Between(1, kMaxTokens)},
      {DTRAIN_RECIPE_KEY(model, norm_eps),
       "epsilon added to the variance in LayerNorm/RMSNorm",
       {},
       BelowOne("it is added to a variance of about 1; 1e-5 is usual")},
      {DTRAIN_RECIPE_KEY(model, rope_theta), "RoPE base frequency (llama)", {}, Positive()},
      {DTRAIN_RECIPE_KEY(model, init_std),
       "standard deviation of the random weight init",
       {},
       Positive()},
      // data
      {DTRAIN_RECIPE_KEY(data, format),
       "text: files read as bytes (vocab 256; a tar or compressed file is refused); llmc: llm.c "
       ".bin token shards; webdataset: tar "
       "shards streamed from data.shards; sft: shards of `dtrain data pack --sft` (data.train), "
       "loss on completion tokens only",
       {"text", "llmc", "webdataset", "sft"}},
      {DTRAIN_RECIPE_KEY(data, tokenizer),
       "the data's tokenizer (tokenizer.json, tokenizer.model, GPT-2's encoder.json/vocab.bpe, "
       "or their folder): sampled text is decoded through it, webdataset's .txt samples are "
       "encoded through it as they stream, and train.export_to's folder ships it; shards must "
       "record it (the one `data pack` used), and data.format text, whose ids are bytes, takes "
       "none; empty = bytes"},
      {DTRAIN_RECIPE_KEY(data, train), "training files; glob patterns allowed"},
      {DTRAIN_RECIPE_KEY(data, val),
       "validation files; empty = hold out the last val_fraction of the training tokens"},
      {DTRAIN_RECIPE_KEY(data, val_fraction),
       "share of the training tokens held out for validation when data.val is empty",
       {},
       UnitInterval()},
      {DTRAIN_RECIPE_KEY(data, shards),
       "webdataset training shards: paths, file:, http(s)://, pipe:CMD; brace ranges "
       "{000..099} and '::' lists"},
      {DTRAIN_RECIPE_KEY(data, val_shards),
       "webdataset validation shards, read in order; empty = no validation data"},
      {DTRAIN_RECIPE_KEY(data, streams),
       "webdataset logical streams; they fix the data order, so keep the value when the world "
       "size changes; must be a multiple of the data-parallel size; give it at least as many "
       "shards (fewer is a warning: streams would read the same shards side by side)",
       {},
       Between(1, kMaxStreams)},
      {DTRAIN_RECIPE_KEY(data, shard_shuffle), "webdataset: shuffle the shards at every pass"},
      {DTRAIN_RECIPE_KEY(data, shuffle_buffer),
       "webdataset samples shuffled together, over all streams (memory: this many samples, "
       "within data.shuffle_buffer_mb); 1 = no sample shuffle",
       {},
       AtLeast(1)},
      {DTRAIN_RECIPE_KEY(data, shuffle_buffer_mb),
       "webdataset: at most about this many MiB of tokens in the shuffle buffer, over all "
       "streams (each stream's share ends a block early, with the sample that reaches it): "
       "large samples (whole files, books) shuffle in fewer at a time instead of filling memory",
       {},
       AtLeast(1)},
      {DTRAIN_RECIPE_KEY(data, eos_id),
       "webdataset token appended after every document; -1 = none (a warning where "
       "data.tokenizer has an end-of-text token: <|endoftext|>, <|end_of_text|> or </s>)",
       {},
       AtLeast(-1)},
      {DTRAIN_RECIPE_KEY(data, epochs),
       "webdataset: passes over the shards, each in its own shuffled order; training does not "
       "end with them (train.steps decides): past the last, the same passes repeat in the same "
       "orders, which the log says; 0 = every pass shuffled anew",
       {},
       AtLeast(0)},
      {DTRAIN_RECIPE_KEY(data, on_error),
       "webdataset training shard that fails to read: fail the run, or skip it (logged and "
       "counted); a validation shard that fails always fails the run (every rank must evaluate "
       "the same set)",
       {"fail", "skip_shard"}},
      {DTRAIN_RECIPE_KEY(data, http_timeout_s),
       "http(s) shards: connect timeout and longest wait for data, in seconds",
       {},
       Positive()},
      {DTRAIN_RECIPE_KEY(data, http_retries),
       "http(s) shards: retries after a failure, each resuming where the last stopped; "
       "an attempt that received data starts the count again",
       {},
       AtLeast(0)},
      {DTRAIN_RECIPE_KEY(data, pipe_timeout_s),
       "pipe: shards: longest wait for the command's next byte, in seconds; a command that "
       "writes nothing for this long fails its shard (data.on_error decides what follows)",
       {},
       Positive()},
      {DTRAIN_RECIPE_KEY(data, read_ahead_mb),
       "webdataset: packed sequences read ahead of the step, in MiB per rank",
       {},
       AtLeast(1)},
      {DTRAIN_RECIPE_KEY(data, packing),
       "sft: pack samples whole into each sequence, attention and positions per sample; false = "
       "one sample per sequence, padded"},
      {DTRAIN_RECIPE_KEY(data, on_long_sample),
       "sft: a sample longer than train.seq_len + 1 tokens is cut to it or left out (counted)",
       {"truncate", "skip"}},
      // train
      {DTRAIN_RECIPE_KEY(train, steps), "optimizer steps", {}, AtLeast(1)},
      {DTRAIN_RECIPE_KEY(train, batch_size),
       "sequences per optimizer step, across all ranks",
       {},
       AtLeast(1)},
      {DTRAIN_RECIPE_KEY(train, micro_batch),
       "sequences per forward/backward on one rank; gradients accumulate up to batch_size",
       {},
       AtLeast(1)},
      {DTRAIN_RECIPE_KEY(train, seq_len), "tokens per training sequence", {}, AtLeast(1)},
      {DTRAIN_RECIPE_KEY(train, lr),
       "peak learning rate, reached at the end of warmup",
       {},
       BelowOne("AdamW moves each weight by up to about lr a step; 1e-4 to 1e-3 is usual")},
      {DTRAIN_RECIPE_KEY(train, min_lr),
       "learning rate the schedule decays to, reached after the last step (the last step trains "
       "one step of the decay above it, as in Hugging Face's schedules)",
       {},
       AtLeast(0)},
      {DTRAIN_RECIPE_KEY(train, warmup_steps), "steps of linear warmup up to lr", {}, AtLeast(0)},
      {DTRAIN_RECIPE_KEY(train, schedule),
       "decay from lr to min_lr after warmup",
       {"cosine", "linear", "constant"}},
      {DTRAIN_RECIPE_KEY(train, weight_decay),
       "AdamW decoupled weight decay, skipped for no_decay tensors",
       {},
       AtLeast(0)},
      {DTRAIN_RECIPE_KEY(train, beta1), "AdamW decay of the first moment", {}, UnitInterval()},
      {DTRAIN_RECIPE_KEY(train, beta2), "AdamW decay of the second moment", {}, UnitInterval()},
      {DTRAIN_RECIPE_KEY(train, eps),
       "AdamW epsilon in the update's denominator",
       {},
       BelowOne("it keeps the denominator off 0; 1e-8 is usual")},
      {DTRAIN_RECIPE_KEY(train, grad_clip),
       "clip the global gradient L2 norm to this; 0 = off",
       {},
       AtLeast(0)},
      {DTRAIN_RECIPE_KEY(train, no_decay),
       "globs naming tensors exempt from weight decay; a glob matches a tensor's dtrain name "
       "(blocks.N.norm1.weight) or its Hugging Face name for model.family (gpt2: "
       "h.N.ln_1.weight or transformer.h.N.ln_1.weight; llama: "
       "model.layers.N.input_layernorm.weight); one that matches no tensor is an error, but "
       "for the defaults"},
      {DTRAIN_RECIPE_KEY(train, eval_every),
       "steps between validation-loss evaluations; 0 = off",
       {},
       AtLeast(0)},
      {DTRAIN_RECIPE_KEY(train, eval_batches),
       "batches of train.batch_size sequences per evaluation (the same sequences at every layout)",
       {},
       AtLeast(1)},
      {DTRAIN_RECIPE_KEY(train, init_from),
       "weights to start from: a safetensors file (Hugging Face tensor names) or a Hugging Face "
       "model folder (config.json, which sets the model.* keys the recipe leaves unset and must "
       "match the others, and model.safetensors or its shards); empty = random init"},
      {DTRAIN_RECIPE_KEY(train, export_to),
       "weights written at the end, relative to the run folder: a path ending in .safetensors "
       "is one file; any other is a Hugging Face model folder (config.json, model.safetensors) "
       "that transformers loads; empty = none"},
      // parallel
      {DTRAIN_RECIPE_KEY(parallel, strategy),
       "data-parallel engine: ddp replicates; zero1/zero2/zero3 shard optimizer state, "
       "+gradients, +parameters; fsdp shards per block; auto: the layout `dtrain plan` "
       "recommends for the actual world, among those the trainer runs (on cpu, in the "
       "machine's memory rather than cluster.gpu's): the engine, tp and pp (the recipe leaves "
       "both at 1), micro_batch and recompute, the log naming the recipe's values it replaced",
       {"ddp", "zero1", "zero2", "zero3", "fsdp", "auto"}},
      {DTRAIN_RECIPE_KEY(parallel, tp),
       "tensor-parallel degree: ranks sharing each block's heads and MLP width (Megatron-style; "
       "divides the world size)",
       {},
       AtLeast(1)},
      {DTRAIN_RECIPE_KEY(parallel, pp),
       "pipeline-parallel stages, at most model.n_layer; each data-parallel replica is pp x tp "
       "ranks (tp innermost)",
       {},
       AtLeast(1)},
      {DTRAIN_RECIPE_KEY(parallel, pp_schedule),
       "pipeline schedule: 1f1b (Megatron's one forward one backward: a stage holds at most pp "
       "micro-batches' activations); interleaved (Megatron's interleaved 1F1B over "
       "pp_virtual_stages chunks per stage: a bubble pp_virtual_stages times smaller, as many "
       "times the point-to-point traffic); gpipe (all forwards, then all backwards: every "
       "micro-batch's activations held)",
       {"1f1b", "interleaved", "gpipe"}},
      {DTRAIN_RECIPE_KEY(parallel, pp_virtual_stages),
       "model chunks per pipeline stage, for pp_schedule: interleaved; must divide the "
       "model.n_layer / pp blocks of a stage",
       {},
       AtLeast(1)},
      {DTRAIN_RECIPE_KEY(parallel, recompute),
       "what backward recomputes instead of keeping: none; selective: each block's attention "
       "core (scores, softmax, times V) from its saved q, k, v; full: each block's forward, "
       "keeping only block inputs (~1/3 more compute). Replaces activation_checkpointing "
       "(true = full), still read with a warning",
       {"none", "selective", "full"}},
      {DTRAIN_RECIPE_KEY(parallel, sequence_parallel),
       "with parallel.tp > 1: norms and residual adds run on train.seq_len / tp of the tokens "
       "on each rank (Megatron's sequence parallelism; the tp all-reduces become reduce-scatters "
       "and all-gathers of the same bytes), so those activations take 1/tp of the memory; "
       "needs seq_len divisible by tp; no effect (with a warning) at tp 1"},
      {DTRAIN_RECIPE_KEY(parallel, bucket_mb),
       "MiB of gradients reduced together as backward produces them (ddp, zero1, zero2)",
       {},
       Positive()},
      {DTRAIN_RECIPE_KEY(parallel, prefetch_bucket_mb),
       "MiB of parameters zero3 gathers (and prefetches) together; fsdp gathers one block",
       {},
       Positive()},
      {DTRAIN_RECIPE_KEY(parallel, reduce_dtype),
       "the type gradients travel in when the data-parallel ranks reduce them (PyTorch FSDP's "
       "reduce_dtype): fp32, or bf16 for half the bytes (rounded before, summed in float32 and "
       "rounded per step of the reduction, widened after; PyTorch DDP's bf16 compression hook); "
       "auto = the parameters' type (run.precision: bf16 on cuda, and in `dtrain plan`, which "
       "plans for GPUs)",
       {"auto", "fp32", "bf16"}},
      {DTRAIN_RECIPE_KEY(parallel, timeout_s),
       "seconds a collective or rendezvous may wait for the other ranks before failing with "
       "their names (at most a week)",
       {},
       Range{.min = 0, .min_open = true, .max = kMaxTimeout_s}},
      {DTRAIN_RECIPE_KEY(parallel, check_replicas),
       "after every step, check that ranks holding replicated parameters hold the same bits, "
       "and under pp > 1 that GPT-2's tied embedding copies on the first and the last stage do "
       "(costs one pass over the parameters)"},
      // checkpoint
      {DTRAIN_RECIPE_KEY(checkpoint, dir),
       "folder of the checkpoints (step-<N>/ each, and `latest`); empty = <run folder>/"
       "checkpoints; a relative path is relative to the run folder"},
      {DTRAIN_RECIPE_KEY(checkpoint, interval),
       "steps between checkpoints; 0 = none on the way (one is still written at the end and on "
       "SIGTERM or SIGUSR1)",
       {},
       AtLeast(0)},
      {DTRAIN_RECIPE_KEY(checkpoint, keep_last),
       "complete checkpoints kept; an older one is removed only once a newer one is complete",
       {},
       AtLeast(1)},
      {DTRAIN_RECIPE_KEY(checkpoint, async),
       "periodic saves (checkpoint.interval > 0) copy the state to host memory at the step and "
       "write it on a background thread (one save in flight); false = training waits for the "
       "write. The saves that end a run are written directly"},
      {DTRAIN_RECIPE_KEY(checkpoint, save_at_end),
       "false: the run's last step writes no checkpoint (benchmarks, smoke tests: a large model's "
       "state takes seconds to write); SIGTERM and SIGUSR1 still save"},
      {DTRAIN_RECIPE_KEY(checkpoint, resume),
       "auto: continue from the newest complete checkpoint in checkpoint.dir, if any; never: "
       "start fresh; or the path of a step-<N> folder (or of a checkpoint folder) to load, into "
       "any world size or strategy. A restart (dtrain launch's, a requeued Slurm job's) resumes "
       "as auto once checkpoint.dir holds checkpoints"},
      // cluster
      {DTRAIN_RECIPE_KEY(cluster, nodes),
       "machines the run is planned for",
       {},
       Between(1, kMaxNodes)},
      {DTRAIN_RECIPE_KEY(cluster, gpus_per_node),
       "GPUs in each machine",
       {},
       Between(1, kMaxGpusPerNode)},
      {DTRAIN_RECIPE_KEY(cluster, gpu),
       "GPU model, a name from the planner's catalog (`dtrain plan --catalog` lists them)"},
      {DTRAIN_RECIPE_KEY(cluster, gpu_memory_gib),
       "usable memory per GPU in GiB; 0 = the catalog's figure for cluster.gpu",
       {},
       AtLeast(0)},
      {DTRAIN_RECIPE_KEY(cluster, peak_tflops),
       "dense bf16 peak per GPU in TFLOP/s (TF32 and float32 GEMMs plan at the catalog's "
       "proportion to it); 0 = the catalog's figure for cluster.gpu",
       {},
       AtLeast(0)},
      {DTRAIN_RECIPE_KEY(cluster, memory_gbps),
       "device memory bandwidth per GPU in GB/s (the optimizer step's pace); 0 = the catalog's "
       "figure for cluster.gpu",
       {},
       AtLeast(0)},
      {DTRAIN_RECIPE_KEY(cluster, intra_gbps),
       "all-reduce bus bandwidth inside a node in GB/s (nccl-tests busbw); 0 = the catalog's "
       "figure for cluster.gpu's link",
       {},
       AtLeast(0)},
      {DTRAIN_RECIPE_KEY(cluster, intra_latency_us),
       "latency of one hop inside a node in microseconds; 0 = the catalog's figure",
       {},
       AtLeast(0)},
      {DTRAIN_RECIPE_KEY(cluster, network),
       "network between nodes, a name from the planner's catalog (`dtrain plan --catalog` lists "
       "them)"},
      {DTRAIN_RECIPE_KEY(cluster, inter_gbps),
       "all-reduce bus bandwidth of one NIC between nodes in GB/s (nccl-tests busbw); 0 = the "
       "catalog's figure for cluster.network",
       {},
       AtLeast(0)},
      {DTRAIN_RECIPE_KEY(cluster, inter_latency_us),
       "latency of one hop between nodes in microseconds; 0 = the catalog's figure",
       {},
       AtLeast(0)},
      {DTRAIN_RECIPE_KEY(cluster, nics_per_node),
       "network adapters per node for the training traffic; 0 = one per GPU on InfiniBand and "
       "RoCE, one on TCP Ethernet (eth-*)",
       {},
       AtLeast(0)},
      // logging
      {DTRAIN_RECIPE_KEY(logging, every),
       "steps between step-log lines; a step that evaluates, saves on SIGUSR1 or stops is logged "
       "too (metrics.jsonl has every step)",
       {},
       AtLeast(1)},
      {DTRAIN_RECIPE_KEY(logging, metrics_file),
       "JSON-lines metrics file, relative to the run folder"},
      {DTRAIN_RECIPE_KEY(logging, sample_tokens),
       "tokens generated at each evaluation, each from at most the last train.seq_len tokens (the "
       "model's activations are sized for a training sequence); 0 = no samples",
       {},
       Between(0, kMaxSampleTokens)},
      {DTRAIN_RECIPE_KEY(logging, sample_temperature),
       "softmax temperature for samples",
       {},
       Positive()},
      {DTRAIN_RECIPE_KEY(logging, sample_top_k),
       "sample among the k most likely tokens; 0 = all tokens",
       {},
       AtLeast(0)},
      {DTRAIN_RECIPE_KEY(logging, sample_prompt), "text the samples continue"},
      {DTRAIN_RECIPE_KEY(logging, flight_recorder_entries),
       "collectives and point-to-point operations each rank keeps for the flight recorder, "
       "dumped to <run folder>/flight_recorder/ on a failure or SIGUSR2 and compared across "
       "ranks; 0 = off",
       {},
       AtLeast(0)},
      {DTRAIN_RECIPE_KEY(logging, straggler_pct),
       "a rank whose compute time in a step lies this many percent above the ranks' median is "
       "named in the step log and metrics (straggler_rank), and at the end of the run a rank "
       "that was so in more than half of the steps (5 at least); 0 = off (no per-step exchange "
       "of the times)",
       {},
       AtLeast(0)},
      {DTRAIN_RECIPE_KEY(logging, metrics_port),
       "Prometheus /metrics (text format 0.0.4): each worker serves on this port + its local "
       "rank, at logging.metrics_address; a busy port warns and training goes on; 0 = off",
       {},
       Between(0, 65535)},
      {DTRAIN_RECIPE_KEY(logging, metrics_address),
       "the IP address /metrics listens on (or localhost; a host name would be one node's): "
       "0.0.0.0 = every interface (a Prometheus on another host), 127.0.0.1 = this host only, "
       "or one interface's address"},
  };
  return *keys;
}

#undef DTRAIN_RECIPE_KEY

// The bool that parallel.recompute replaced; still read (see Parser::ReadRenamedKey).
constexpr absl::string_view kRenamedCheckpointingKey = "parallel.activation_checkpointing";

absl::string_view SectionOf(absl::string_view path) { return path.substr(0, path.find('.')); }
absl::string_view NameOf(absl::string_view path) { return path.substr(path.find('.') + 1); }

const KeySpec* FindKey(absl::string_view path) {
  for (const KeySpec& key : Keys()) {
    if (key.path == path) return &key;
  }
  return nullptr;
}

std::vector<absl::string_view> Sections() {
  std::vector<absl::string_view> sections;
  for (const KeySpec& key : Keys()) {
    if (std::find(sections.begin(), sections.end(), SectionOf(key.path)) == sections.end()) {
      sections.push_back(SectionOf(key.path));
    }
  }
  return sections;
}

// ---------------------------------------------------------------------------------------------
// Suggestions for misspelled names.

// What to say of an unknown key `section.name`: the key other trainers' name for it means (Hugging
// Face's TrainingArguments, Megatron-LM's flags, llm.c's and nanoGPT's), else the valid key closest
// to it when it is close (a key in another section costs one edit more, so a typo stays in its
// section but a key filed under the wrong section is still found), else where the keys are listed.
std::string KeyHint(absl::string_view section, absl::string_view name) {
  static const auto* const kAliases =
      new std::vector<std::pair<absl::string_view, absl::string_view>>{
          {"learning_rate", "train.lr"},
          {"max_steps", "train.steps"},
          {"train_iters", "train.steps"},
          {"warmup", "train.warmup_steps"},
          {"num_warmup_steps", "train.warmup_steps"},
          {"lr_warmup_iters", "train.warmup_steps"},
          {"global_batch_size", "train.batch_size"},
          {"train_batch_size", "train.batch_size"},
          {"micro_batch_size", "train.micro_batch"},
          {"per_device_train_batch_size", "train.micro_batch"},
          {"seq_length", "train.seq_len"},
          {"max_seq_length", "train.seq_len"},
          {"max_grad_norm", "train.grad_clip"},
          {"clip_grad", "train.grad_clip"},
          {"tensor_model_parallel_size", "parallel.tp"},
          {"tensor_parallel_size", "parallel.tp"},
          {"pipeline_model_parallel_size", "parallel.pp"},
          {"pipeline_parallel_size", "parallel.pp"},
          {"num_layers_per_virtual_pipeline_stage", "parallel.pp_virtual_stages"},
          {"sequence_parallel", "parallel.sequence_parallel"},
          {"recompute_granularity", "parallel.recompute"},
          {"activation_checkpointing", "parallel.recompute"},
          {"gradient_checkpointing", "parallel.recompute"},
          {"grad_reduce_in_bf16", "parallel.reduce_dtype"},
          {"distributed_timeout_minutes", "parallel.timeout_s"},
          {"save_interval", "checkpoint.interval"},
          {"save_steps", "checkpoint.interval"},
          {"checkpoint_every", "checkpoint.interval"},  // llm.c
          {"ckpt_every", "checkpoint.interval"},
          {"save_every", "checkpoint.interval"},
          {"eval_interval", "train.eval_every"},   // nanoGPT, Megatron-LM
          {"eval_steps", "train.eval_every"},      // Hugging Face
          {"val_loss_every", "train.eval_every"},  // llm.c
          {"load", "checkpoint.resume"},
          {"resume_from_checkpoint", "checkpoint.resume"},
      };
  // DeepSpeed's ZeRO stages and FSDP's sharding strategies are parallel.strategy's engines.
  if (name == "zero_stage" || name == "stage" || name == "sharding_strategy") {
    return "did you mean parallel.strategy? (zero1, zero2, zero3 or fsdp; DeepSpeed's ZeRO stage "
           "N is zeroN)";
  }
  for (const auto& [alias, key] : *kAliases) {
    if (name == alias) return absl::StrCat("did you mean ", key, "?");
  }
  if (name == "gradient_accumulation_steps" || name == "grad_accum") {
    return "dtrain accumulates train.batch_size / (data-parallel ranks x train.micro_batch) "
           "micro-batches a step: set those two";
  }
  const auto cost_of = [&](absl::string_view candidate, absl::string_view key) {
    return EditDistance(name, candidate) + (SectionOf(key) == section ? 0 : 1);
  };
  absl::string_view best;
  int best_cost = std::numeric_limits<int>::max();
  for (const KeySpec& key : Keys()) {
    if (const int cost = cost_of(NameOf(key.path), key.path); cost < best_cost) {
      best = key.path;
      best_cost = cost;
    }
  }
  // Long aliases misspelled ("lerning_rate"), where no key is as close.
  for (const auto& [alias, key] : *kAliases) {
    if (const int cost = cost_of(alias, key);
        alias.size() >= 8 && EditDistance(name, alias) <= 2 && cost < best_cost) {
      best = key;
      best_cost = cost;
    }
  }
  // More edits than a third of the name is another word, not a typo of it.
  if (best_cost <= std::max<int>(2, static_cast<int>(name.size()) / 3)) {
    return absl::StrCat("did you mean ", best, "?");
  }
  return "`dtrain recipe reference` lists every key";
}

// The likely fix of a recipe yaml-cpp cannot parse: a tab in an indentation (YAML indents with
// spaces only, and yaml-cpp's message does not say so), else the usual slips.
std::string YamlErrorHint(absl::string_view text) {
  int line = 1;
  for (absl::string_view row : absl::StrSplit(text, '\n')) {
    const size_t indent = row.find_first_not_of(" \t");
    if (row.substr(0, indent).find('\t') != absl::string_view::npos) {
      return absl::StrCat("line ", line, " is indented with a tab: YAML indents with spaces only");
    }
    ++line;
  }
  return "check the indentation (each key of a section two spaces in), the ': ' after each key, "
         "and quotes around a value holding ': ' or ' #'";
}

// For an unknown top-level name: the closest section, or a key when a key was put at the top;
// empty when none is close enough to be a typo of it.
absl::string_view NearestSectionOrKey(absl::string_view name) {
  absl::string_view best;
  int best_cost = std::numeric_limits<int>::max();
  for (absl::string_view section : Sections()) {
    const int cost = EditDistance(name, section);
    if (cost < best_cost) best = section, best_cost = cost;
  }
  for (const KeySpec& key : Keys()) {
    const int cost = EditDistance(name, NameOf(key.path));
    if (cost < best_cost) best = key.path, best_cost = cost;
  }
  return best_cost <= TypoEdits(name) ? best : absl::string_view();
}

// ---------------------------------------------------------------------------------------------
// Printing values: one spelling for the resolved YAML, the reference and the messages.

// The shortest text that reads back as exactly `value`.
std::string ShortestDouble(double value) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

std::string FormatDouble(double value) {
  std::string text = ShortestDouble(value);
  // A visible decimal point says "this key is a float" to a reader of the resolved recipe.
  if (text.find_first_of(".e") == std::string::npos) text += ".0";
  return text;
}

bool IsPlainSafe(const std::string& text) {
  if (text.empty()) return false;
  const char first = text[0];
  if (!absl::ascii_isalpha(first) && first != '_' && first != '/') return false;
  for (const char c : text) {
    if (!absl::ascii_isalnum(c) && c != '_' && c != '.' && c != '/' && c != '-') return false;
  }
  // Words YAML (1.1 or 1.2) would read as something other than a string.
  static constexpr absl::string_view kSpecial[] = {"true", "false", "yes", "no",  "on", "off",
                                                   "null", "y",     "n",   "nan", "inf"};
  const std::string lower = absl::AsciiStrToLower(text);
  return std::find(std::begin(kSpecial), std::end(kSpecial), lower) == std::end(kSpecial);
}

std::string QuoteString(const std::string& text) {
  if (IsPlainSafe(text)) return text;
  std::string quoted = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        quoted += "\\\"";
        break;
      case '\\':
        quoted += "\\\\";
        break;
      case '\n':
        quoted += "\\n";
        break;
      case '\t':
        quoted += "\\t";
        break;
      case '\r':
        quoted += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          absl::StrAppend(&quoted, "\\x",
                          absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
        } else {
          quoted += c;
        }
    }
  }
  return quoted + "\"";
}

std::string FormatValue(const FieldPtr& field) {
  struct Visitor {
    std::string operator()(int* v) const { return absl::StrCat(*v); }
    std::string operator()(uint64_t* v) const { return absl::StrCat(*v); }
    std::string operator()(double* v) const { return FormatDouble(*v); }
    std::string operator()(bool* v) const { return *v ? "true" : "false"; }
    std::string operator()(std::string* v) const { return QuoteString(*v); }
    std::string operator()(std::vector<std::string>* v) const {
      std::vector<std::string> items;
      for (const std::string& item : *v) items.push_back(QuoteString(item));
      return absl::StrCat("[", absl::StrJoin(items, ", "), "]");
    }
  };
  return std::visit(Visitor{}, field);
}

std::string FormatBound(double value, bool is_integer) {
  return is_integer ? absl::StrCat(static_cast<int64_t>(value)) : ShortestDouble(value);
}

// "> 0", ">= 1", "in [0, 1)".
std::string DescribeRange(const Range& range, bool is_integer) {
  const bool has_min = std::isfinite(range.min);
  const bool has_max = std::isfinite(range.max);
  if (has_min && has_max) {
    return absl::StrCat("in ", range.min_open ? "(" : "[", FormatBound(range.min, is_integer), ", ",
                        FormatBound(range.max, is_integer), range.max_open ? ")" : "]");
  }
  if (has_min)
    return absl::StrCat(range.min_open ? "> " : ">= ", FormatBound(range.min, is_integer));
  if (has_max)
    return absl::StrCat(range.max_open ? "< " : "<= ", FormatBound(range.max, is_integer));
  return "any";
}

bool InRange(const Range& range, double value) {
  if (range.min_open ? !(value > range.min) : !(value >= range.min)) return false;
  if (range.max_open ? !(value < range.max) : !(value <= range.max)) return false;
  return true;
}

bool IsListKey(const KeySpec& key) {
  Recipe recipe;
  return std::holds_alternative<std::vector<std::string>*>(key.field(recipe));
}

// A key whose value is text: a string or a list of strings.
bool IsTextKey(const KeySpec& key) {
  Recipe recipe;
  const FieldPtr field = key.field(recipe);
  return std::holds_alternative<std::string*>(field) ||
         std::holds_alternative<std::vector<std::string>*>(field);
}

// `value` written as the one item of a list key: ["*.bias"], quoted as YAML needs it.
std::string AsOneItemList(absl::string_view value) {
  return absl::StrCat("[\"", absl::CHexEscape(value), "\"]");
}

// A --set value quoted for YAML, as a one-item list for a list key (`spec` null: unknown).
std::string QuotedOverride(const KeySpec* spec, absl::string_view value) {
  return spec != nullptr && IsListKey(*spec) ? AsOneItemList(value)
                                             : absl::StrCat("\"", value, "\"");
}

std::string TypeName(const KeySpec& key) {
  if (!key.allowed.empty()) return absl::StrCat("one of ", absl::StrJoin(key.allowed, ", "));
  Recipe recipe;
  struct Visitor {
    const char* operator()(int*) const { return "int"; }
    const char* operator()(uint64_t*) const { return "uint64"; }
    const char* operator()(double*) const { return "float"; }
    const char* operator()(bool*) const { return "bool"; }
    const char* operator()(std::string*) const { return "string"; }
    const char* operator()(std::vector<std::string>*) const { return "list of strings"; }
  };
  const FieldPtr field = key.field(recipe);
  std::string name = std::visit(Visitor{}, field);
  if (key.range) {
    const bool is_integer = !std::holds_alternative<double*>(field);
    absl::StrAppend(&name, " ", DescribeRange(*key.range, is_integer));
  }
  return name;
}

// ---------------------------------------------------------------------------------------------
// The strict parser.

std::string DescribeNode(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar:
      return absl::StrCat("'", node.Scalar(), "'");
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a map";
    default:
      return "nothing";
  }
}

// yaml-cpp tags a quoted scalar "!" and a plain one "?": "5" in quotes is a string, not a number.
bool IsQuoted(const YAML::Node& node) { return node.Tag() == "!"; }

// A key's value and where it came from.
struct Entry {
  YAML::Node value;
  YAML::Mark mark;  // of the value where it has one, else of the key; file only
  // How a message names a key not set in the file: "--set a.b=c" from the command line, or the
  // config.json field of train.init_from's folder that gave it.
  std::string from_override;
};

class Parser {
 public:
  explicit Parser(std::string source_name) : source_name_(std::move(source_name)) {}

  absl::StatusOr<Recipe> Parse(const std::string& yaml_text,
                               const std::vector<std::string>& overrides) {
    RETURN_IF_ERROR(ReadTree(yaml_text));
    for (const std::string& text : overrides) RETURN_IF_ERROR(ApplyOverride(text));
    RETURN_IF_ERROR(FillModelFromInitFolder());
    Recipe recipe;
    recipe.source_path = source_name_;
    for (const KeySpec& key : Keys()) {
      const auto it = entries_.find(key.path);
      if (it != entries_.end()) RETURN_IF_ERROR(ReadValue(key, it->second, recipe));
    }
    RETURN_IF_ERROR(CheckConsistency(recipe));
    return recipe;
  }

 private:
  std::string At(const YAML::Mark& mark) const {
    // yaml-cpp counts from 0; editors count from 1.
    if (mark.is_null()) return source_name_;
    return absl::StrCat(source_name_, ":", mark.line + 1, ":", mark.column + 1);
  }

  // How a message names a key: "train.lr at f.yaml:3:7", "--set train.lr=x" or, for a default,
  // "train.lr (default, not set in f.yaml)".
  std::string Subject(absl::string_view path) const {
    const auto it = entries_.find(path);
    if (it == entries_.end()) {
      return absl::StrCat(path, " (default, not set in ", source_name_, ")");
    }
    if (!it->second.from_override.empty()) return it->second.from_override;
    return absl::StrCat(path, " at ", At(it->second.mark));
  }

  absl::Status Error(absl::string_view path, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(Subject(path), ": ", what));
  }

  absl::Status ReadTree(const std::string& yaml_text) {
    source_text_ = yaml_text;
    std::vector<YAML::Node> documents;
    try {
      documents = YAML::LoadAll(yaml_text);
    } catch (const YAML::Exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat(At(e.mark), ": not valid YAML: ", e.msg, "; ", YamlErrorHint(yaml_text)));
    }
    if (documents.size() > 1) {
      return absl::InvalidArgumentError(absl::StrCat(source_name_, ": holds ", documents.size(),
                                                     " YAML documents; a recipe is one"));
    }
    if (documents.empty() || documents[0].IsNull()) return absl::OkStatus();
    const YAML::Node& root = documents[0];
    if (!root.IsMap()) {
      return absl::InvalidArgumentError(
          absl::StrCat(At(root.Mark()), ": a recipe is a map of sections (",
                       absl::StrJoin(Sections(), ", "), "), got ", DescribeNode(root)));
    }
    for (auto section_it = root.begin(); section_it != root.end(); ++section_it) {
      RETURN_IF_ERROR(ReadSection(section_it->first, section_it->second));
    }
    return absl::OkStatus();
  }

  absl::Status ReadSection(const YAML::Node& name_node, const YAML::Node& body) {
    if (!name_node.IsScalar()) {
      return absl::InvalidArgumentError(
          absl::StrCat(At(name_node.Mark()), ": a section name must be a plain word"));
    }
    const std::string section = name_node.Scalar();
    const std::vector<absl::string_view> sections = Sections();
    if (std::find(sections.begin(), sections.end(), section) == sections.end()) {
      const absl::string_view nearest = NearestSectionOrKey(section);
      return absl::InvalidArgumentError(
          absl::StrCat("unknown section '", section, "' at ", At(name_node.Mark()),
                       nearest.empty() ? "" : absl::StrCat(" (did you mean ", nearest, "?)"),
                       "; sections are ", absl::StrJoin(sections, ", ")));
    }
    if (!seen_sections_.insert({section, name_node.Mark()}).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("section '", section, "' at ", At(name_node.Mark()),
                       " appears twice (first at ", At(seen_sections_[section]), ")"));
    }
    if (body.IsNull()) return absl::OkStatus();  // "logging:" alone: every key at its default
    if (!body.IsMap()) {
      return absl::InvalidArgumentError(
          absl::StrCat("section '", section, "' at ", At(body.Mark()),
                       ": expected a map of keys, each on its own line below it, indented ('",
                       section, ": {key: value}' on one line), got ", DescribeNode(body)));
    }
    for (auto it = body.begin(); it != body.end(); ++it) {
      const YAML::Node& key_node = it->first;
      if (!key_node.IsScalar()) {
        return absl::InvalidArgumentError(absl::StrCat(At(key_node.Mark()), ": a key in section '",
                                                       section, "' must be a plain word"));
      }
      const std::string path = absl::StrCat(section, ".", key_node.Scalar());
      const YAML::Mark value_mark = it->second.Mark();
      const Entry entry{.value = it->second,
                        .mark = value_mark.is_null() ? key_node.Mark() : value_mark};
      ASSIGN_OR_RETURN(const bool renamed, ReadRenamedKey(path, entry));
      if (renamed) continue;
      if (FindKey(path) == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("unknown key ", path, " at ",
                                                       At(key_node.Mark()), " (",
                                                       KeyHint(section, key_node.Scalar()), ")"));
      }
      if (const auto seen = entries_.find(path); seen != entries_.end()) {
        return absl::InvalidArgumentError(absl::StrCat(path, " at ", At(key_node.Mark()),
                                                       ": set twice (first at ",
                                                       At(seen->second.mark), ")"));
      }
      entries_[path] = entry;
    }
    return absl::OkStatus();
  }

  // parallel.activation_checkpointing, the bool that parallel.recompute replaced, still reads:
  // true as full, false as none, with a warning. False for every other key.
  absl::StatusOr<bool> ReadRenamedKey(const std::string& path, const Entry& entry) {
    constexpr absl::string_view kNew = "parallel.recompute";
    if (path != kRenamedCheckpointingKey) return false;
    const std::string subject = entry.from_override.empty()
                                    ? absl::StrCat(path, " at ", At(entry.mark))
                                    : entry.from_override;
    const YAML::Node& node = entry.value;
    if (!node.IsScalar() || IsQuoted(node) ||
        (node.Scalar() != "true" && node.Scalar() != "false")) {
      return absl::InvalidArgumentError(
          absl::StrCat(subject, ": expected true or false, got ", DescribeNode(node),
                       "; better, replace it with parallel.recompute: none | selective | full"));
    }
    const auto seen = entries_.find(kNew);
    if (entry.from_override.empty() && seen != entries_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(subject, ": sets ", kNew, ", set at ",
                                                     At(seen->second.mark),
                                                     "; keep only parallel.recompute"));
    }
    const std::string value = node.Scalar() == "true" ? "full" : "none";
    LogWarn("%s: parallel.activation_checkpointing is deprecated; read as parallel.recompute: %s",
            subject, value);
    entries_[std::string(kNew)] =
        Entry{.value = YAML::Node(value), .mark = entry.mark, .from_override = entry.from_override};
    return true;
  }

  // train.init_from's Hugging Face folder sets the model keys the recipe leaves unset, as
  // from_pretrained takes the shape from config.json; a key the recipe sets is checked against it
  // at start. A recipe of another model.family takes none (the start names the family).
  absl::Status FillModelFromInitFolder() {
    const auto init_from = entries_.find("train.init_from");
    if (init_from == entries_.end() || !init_from->second.value.IsScalar() ||
        init_from->second.value.Scalar().empty()) {
      return absl::OkStatus();
    }
    const std::string config =
        (std::filesystem::path(init_from->second.value.Scalar()) / "config.json").string();
    std::error_code error;
    if (!std::filesystem::is_regular_file(config, error)) return absl::OkStatus();
    absl::StatusOr<std::vector<HfModelKey>> keys = HfModelKeys(config);
    if (!keys.ok()) return Error("train.init_from", keys.status().message());
    const auto family = entries_.find("model.family");
    if (family != entries_.end() && family->second.value.IsScalar() &&
        family->second.value.Scalar() != keys->front().value) {
      return absl::OkStatus();
    }
    for (const HfModelKey& key : *keys) {
      if (entries_.contains(key.recipe_key)) continue;
      entries_[key.recipe_key] =
          Entry{.value = YAML::Node(key.value),
                .from_override = absl::StrCat(key.recipe_key, " from ", config, "'s ", key.hf_key,
                                              " (train.init_from)")};
    }
    return absl::OkStatus();
  }

  absl::Status ApplyOverride(const std::string& text) {
    if (const std::string bad = DescribeInvalidUtf8(text); !bad.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--set ", EscapeInvalidUtf8(text), ": ", bad,
                       "; recipe text must be UTF-8, so pass the value in a UTF-8 locale"));
    }
    const std::string subject = absl::StrCat("--set ", text);
    const size_t equals = text.find('=');
    if (equals == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(subject, ": expected key=value, e.g. --set train.lr=3e-4"));
    }
    const std::string path(absl::StripAsciiWhitespace(text.substr(0, equals)));
    const std::string value_text = text.substr(equals + 1);
    const KeySpec* spec = FindKey(path);
    if (path != kRenamedCheckpointingKey && spec == nullptr) {
      const size_t dot = path.find('.');
      const absl::string_view section = dot == std::string::npos ? "" : SectionOf(path);
      const absl::string_view name = dot == std::string::npos ? path : NameOf(path);
      return absl::InvalidArgumentError(
          absl::StrCat(subject, ": unknown key ", path, " (", KeyHint(section, name), ")"));
    }
    YAML::Node value;
    try {
      value = YAML::Load(value_text);
    } catch (const YAML::Exception& e) {
      // A list key's value is a list, so the quoted value goes inside one.
      return absl::InvalidArgumentError(absl::StrCat(subject, ": the value is not valid YAML (",
                                                     e.msg, "); quote it, e.g. '",
                                                     QuotedOverride(spec, value_text), "'"));
    }
    RETURN_IF_ERROR(CheckOverrideReadsAsWritten(subject, spec, value_text, value));
    const Entry entry{.value = value, .from_override = subject};
    ASSIGN_OR_RETURN(const bool renamed, ReadRenamedKey(path, entry));
    if (!renamed) entries_[path] = entry;
    return absl::OkStatus();
  }

  // A --set value that YAML reads as other than its text, unquoted: '#' starts a comment, and
  // '&', '!', '|' and '>' mean an anchor, a tag and block text, so `run.out_dir=#scratch` was an
  // empty folder (the file system's root) and `run.name=lr 3e-4 #2` was "lr 3e-4", silently;
  // '%' starts a directive.
  static absl::Status CheckOverrideReadsAsWritten(const std::string& subject, const KeySpec* spec,
                                                  const std::string& value_text,
                                                  const YAML::Node& value) {
    const std::string text(absl::StripAsciiWhitespace(value_text));
    if (text.empty() || text[0] == '"' || text[0] == '\'') return absl::OkStatus();
    // A text key's value with ": " in it, or in brackets, is a map or a list to YAML, which the
    // key's own check would call only "expected a string, got a map".
    if (spec != nullptr && IsTextKey(*spec) &&
        (value.IsMap() || (value.IsSequence() && !IsListKey(*spec)))) {
      return absl::InvalidArgumentError(absl::StrCat(
          subject, ": YAML reads the value as ",
          value.IsMap() ? "a map (': ' separates a key from its value)" : "a list ('[' opens one)",
          "; quote it, e.g. '", QuotedOverride(spec, value_text), "'"));
    }
    const bool as_written =
        value.IsScalar() ? value.Scalar() == text
                         : !value.IsNull() || text == "~" || absl::AsciiStrToLower(text) == "null";
    if (as_written) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        subject, ": YAML reads the value as ",
        value.IsScalar() ? absl::StrCat("'", value.Scalar(), "'") : std::string("empty"),
        " ('#' starts a comment; '&', '!', '|', '>' and '%' have meanings of their own); "
        "quote it, e.g. '",
        QuotedOverride(spec, value_text), "'"));
  }

  // yaml-cpp reads a quoted scalar up to its closing quote, across lines: a quote left open
  // swallows the keys below it into the value, so the run would differ from what the file shows.
  // A recipe's quoted value closes on the line it opens. `item` is 1-based in a list, else 0.
  absl::Status CheckQuoteClosesOnItsLine(const KeySpec& key, const Entry& entry,
                                         const YAML::Node& node, size_t item) const {
    if (!entry.from_override.empty() || !node.IsScalar() || !IsQuoted(node)) {
      return absl::OkStatus();
    }
    const YAML::Mark mark = node.Mark();
    if (mark.is_null() || static_cast<size_t>(mark.pos) >= source_text_.size()) {
      return absl::OkStatus();
    }
    const absl::string_view text = source_text_;
    const char quote = text[mark.pos];
    if (quote != '"' && quote != '\'') return absl::OkStatus();  // a block scalar, | or >
    size_t close = mark.pos + 1;
    for (; close < text.size(); ++close) {
      const bool doubled = quote == '\'' && text[close] == quote && close + 1 < text.size() &&
                           text[close + 1] == quote;
      if (text[close] == quote && !doubled) break;
      // An escape (or a doubled single quote) is two characters, neither of them the close.
      if ((quote == '"' && text[close] == '\\' && close + 1 < text.size() &&
           text[close + 1] != '\n') ||
          doubled) {
        ++close;
      }
    }
    const auto lines = std::count(text.begin() + mark.pos, text.begin() + close, '\n');
    if (lines == 0) return absl::OkStatus();
    const std::string closes = close == text.size()
                                   ? "is never closed, so every line after it is read as part of it"
                                   : absl::StrCat("closes on line ", mark.line + 1 + lines,
                                                  ", so the lines between are read as part of it");
    return Error(key.path, absl::StrCat(item > 0 ? absl::StrCat("item ", item, ": ") : "",
                                        "the quoted value opened on line ", mark.line + 1, " ",
                                        closes, "; close the quote on line ", mark.line + 1));
  }

  // Text leaves the process as JSON (checkpoint manifests, metrics), which cannot carry a byte
  // that is not UTF-8; such a byte is refused here rather than at the first checkpoint. So is a
  // NUL (YAML's "\0"), at which a path or name would silently end.
  absl::Status CheckText(const KeySpec& key, const std::string& text, size_t item) const {
    const std::string where = item > 0 ? absl::StrCat("item ", item, ": ") : "";
    if (const size_t nul = text.find('\0'); nul != std::string::npos) {
      return Error(key.path, absl::StrCat(where, "a NUL character at byte ", nul + 1,
                                          ", where a path or name would end; remove it"));
    }
    const std::string bad = DescribeInvalidUtf8(text);
    if (bad.empty()) return absl::OkStatus();
    return Error(key.path,
                 absl::StrCat(where, bad, " ('", EscapeInvalidUtf8(text),
                              "'); recipe text must be UTF-8, so save the file as UTF-8"));
  }

  absl::Status ReadValue(const KeySpec& key, const Entry& entry, Recipe& recipe) const {
    const YAML::Node& node = entry.value;
    const FieldPtr field = key.field(recipe);
    const std::string got = DescribeNode(node);
    RETURN_IF_ERROR(CheckQuoteClosesOnItsLine(key, entry, node, 0));

    if (auto* out = std::get_if<bool*>(&field)) {
      if (node.IsScalar() && !IsQuoted(node) &&
          (node.Scalar() == "true" || node.Scalar() == "false")) {
        **out = node.Scalar() == "true";
        return absl::OkStatus();
      }
      return Error(key.path, absl::StrCat("expected true or false, got ", got));
    }

    if (auto* out = std::get_if<std::string*>(&field)) {
      if (node.IsNull()) {
        **out = "";
      } else if (node.IsScalar()) {
        RETURN_IF_ERROR(CheckText(key, node.Scalar(), 0));
        **out = node.Scalar();
      } else {
        return Error(key.path, absl::StrCat("expected a string, got ", got));
      }
      if (!key.allowed.empty() &&
          std::find(key.allowed.begin(), key.allowed.end(), **out) == key.allowed.end()) {
        return Error(key.path, absl::StrCat("'", **out, "' is not allowed; use one of ",
                                            absl::StrJoin(key.allowed, ", ")));
      }
      return absl::OkStatus();
    }

    if (auto* out = std::get_if<std::vector<std::string>*>(&field)) {
      if (node.IsNull()) {
        (*out)->clear();
        return absl::OkStatus();
      }
      if (!node.IsSequence()) {
        return Error(
            key.path,
            absl::StrCat(
                "expected a list of strings like [a.txt, b.txt], got ", got,
                node.IsScalar() ? absl::StrCat("; write ", AsOneItemList(node.Scalar())) : ""));
      }
      std::vector<std::string> items;
      for (size_t i = 0; i < node.size(); ++i) {
        if (!node[i].IsScalar()) {
          return Error(key.path, absl::StrCat("expected a list of strings, item ", i + 1, " is ",
                                              DescribeNode(node[i])));
        }
        RETURN_IF_ERROR(CheckQuoteClosesOnItsLine(key, entry, node[i], i + 1));
        RETURN_IF_ERROR(CheckText(key, node[i].Scalar(), i + 1));
        items.push_back(node[i].Scalar());
      }
      **out = std::move(items);
      return absl::OkStatus();
    }

    // Numbers: plain scalars only, so a quoted "5" is a mistake rather than a number.
    const std::string quoted_hint = node.IsScalar() && IsQuoted(node) ? " (remove the quotes)" : "";
    const std::string scalar = node.IsScalar() && !IsQuoted(node) ? node.Scalar() : "";
    double value = 0;
    if (auto* out = std::get_if<double*>(&field)) {
      if (scalar.empty() || !ParseDecimal(scalar, &value)) {
        return Error(key.path, absl::StrCat("expected a number, got ", got, quoted_hint));
      }
      **out = value;
    } else if (auto* out = std::get_if<uint64_t*>(&field)) {
      uint64_t parsed = 0;
      if (scalar.empty() || !absl::SimpleAtoi(scalar, &parsed) || scalar[0] == '-') {
        return Error(key.path,
                     absl::StrCat("expected a non-negative integer, got ", got, quoted_hint));
      }
      **out = parsed;
      value = static_cast<double>(parsed);
    } else if (auto* out = std::get_if<int*>(&field)) {
      int64_t parsed = 0;
      if (scalar.empty() || !absl::SimpleAtoi(scalar, &parsed)) {
        return Error(key.path, absl::StrCat("expected an integer, got ", got, quoted_hint));
      }
      if (parsed < std::numeric_limits<int>::min() || parsed > std::numeric_limits<int>::max()) {
        return Error(key.path, absl::StrCat("must fit in 32 bits, got ", parsed));
      }
      **out = static_cast<int>(parsed);
      value = static_cast<double>(parsed);
    }
    if (key.range && !InRange(*key.range, value)) {
      const bool is_integer = !std::holds_alternative<double*>(field);
      return Error(key.path,
                   absl::StrCat("must be ", DescribeRange(*key.range, is_integer), ", got ", scalar,
                                key.range->reason.empty() ? "" : ": ", key.range->reason));
    }
    return absl::OkStatus();
  }

  // parallel.tp against the model's shape (CheckTensorParallel's rules), with the nearest sizes
  // that fit; whether it divides the world is checked where the world is known.
  absl::Status CheckTensorParallelSize(const Recipe& r) const {
    const ModelConfig config = ModelConfigFromRecipe(r.model, r.d_ff());
    const absl::Status status = CheckTensorParallel(config, r.parallel.tp);
    if (status.ok()) return status;
    int below = 1, above = 0;
    for (int tp = 1; tp <= config.n_head; ++tp) {
      if (!CheckTensorParallel(config, tp).ok()) continue;
      if (tp < r.parallel.tp) below = tp;
      if (tp > r.parallel.tp && above == 0) above = tp;
    }
    const std::string nearest = above == 0 ? absl::StrCat("parallel.tp: ", below)
                                           : absl::StrCat("parallel.tp: ", below, " or ", above);
    return Error("parallel.tp", absl::StrCat(status.message(), "; or, for this model, set ",
                                             nearest, " (the nearest sizes that fit)"));
  }

  // Keys the recipe sets to other than their defaults that another key makes moot (a webdataset
  // key with data.format text): a warning each, naming what makes it so, since the run goes on
  // without them.
  void WarnOfKeysWithoutEffect(const Recipe& r) const {
    const auto warn = [&](absl::string_view path, bool moot, absl::string_view because) {
      if (!moot || !entries_.contains(path)) return;
      Recipe set = r, defaults;
      const KeySpec* key = FindKey(path);
      const bool is_default = std::visit(
          [&](auto* value) { return *value == *std::get<decltype(value)>(key->field(defaults)); },
          key->field(set));
      if (!is_default) LogWarn("%s: has no effect %s; remove it", Subject(path), because);
    };
    const bool streamed = r.data.format == "webdataset";
    const std::string format = absl::StrCat("with data.format ", r.data.format);
    for (absl::string_view path :
         {"data.shards", "data.val_shards", "data.streams", "data.shard_shuffle",
          "data.shuffle_buffer", "data.shuffle_buffer_mb", "data.eos_id", "data.epochs",
          "data.on_error", "data.http_timeout_s", "data.http_retries", "data.pipe_timeout_s",
          "data.read_ahead_mb"}) {
      warn(path, r.data.format == "text" || r.data.format == "llmc", format);
    }
    for (absl::string_view path : {"data.train", "data.val", "data.val_fraction"}) {
      warn(path, streamed,
           "with data.format webdataset, which reads data.shards and "
           "data.val_shards");
    }
    warn("data.val_fraction", !streamed && !r.data.val.empty(), "when data.val is set");
    for (absl::string_view path : {"data.packing", "data.on_long_sample"}) {
      warn(path, r.data.format != "sft", format);
    }
    warn("model.rope_theta", r.model.family == "gpt2",
         "with model.family gpt2, whose positions are learned");
    warn("train.min_lr", r.train.schedule == "constant", "with train.schedule constant");
  }

  // The pipeline keys against the model and the batch (parallel/pipeline/schedule.h builds the
  // schedules; the names are the key table's).
  absl::Status CheckPipeline(const Recipe& r) const {
    const ParallelSection& p = r.parallel;
    const int n_layer = r.model.n_layer;
    if (p.pp > n_layer) {
      return Error("parallel.pp",
                   absl::StrCat(p.pp, " stages exceed the model.n_layer = ", n_layer,
                                " blocks; every stage runs at least one, so set parallel.pp to "
                                "at most ",
                                n_layer));
    }
    const int v = p.pp_virtual_stages;
    if (v > 1) {
      if (p.pp_schedule != "interleaved") {
        return Error(
            "parallel.pp_virtual_stages",
            absl::StrCat(v, " needs parallel.pp_schedule: interleaved (it is ", p.pp_schedule,
                         "); set pp_schedule: interleaved, or pp_virtual_stages: 1"));
      }
      // Under auto, parallel.pp stays 1 and the search takes the chunks for its pipelines.
      if (p.pp == 1 && p.strategy != "auto") {
        return Error("parallel.pp_virtual_stages",
                     absl::StrCat(v,
                                  " chunks interleave over pipeline stages, and parallel.pp is "
                                  "1; set pp_virtual_stages: 1, or parallel.pp above 1"));
      }
      if (n_layer % (p.pp * v) != 0) {
        // 1 always fits (no interleaving); above it, v with pp x v dividing n_layer.
        int below = 1, above = 0;
        for (int candidate = 2; candidate <= n_layer / p.pp; ++candidate) {
          if (n_layer % (p.pp * candidate) != 0) continue;
          if (candidate < v) below = candidate;
          if (candidate > v && above == 0) above = candidate;
        }
        const std::string blocks =
            n_layer % p.pp == 0 ? absl::StrCat("the ", n_layer / p.pp, " blocks per stage")
                                : absl::StrCat("blocks per stage (model.n_layer = ", n_layer,
                                               " is not a multiple of parallel.pp = ", p.pp, ")");
        return Error(
            "parallel.pp_virtual_stages",
            absl::StrCat(v, " does not divide ", blocks,
                         "; each stage's blocks split into equal chunks (the nearest "
                         "values that fit: parallel.pp_virtual_stages: ",
                         above == 0 ? absl::StrCat(below) : absl::StrCat(below, " or ", above),
                         ")"));
      }
    }
    // The batch split is checked before; with data parallelism each pipeline gets fewer.
    const int micro_batches = r.train.batch_size / r.train.micro_batch;
    if (p.pp > 1 && micro_batches < p.pp) {
      LogWarn(
          "%s: train.batch_size / train.micro_batch = %d micro-batches per step, fewer than "
          "parallel.pp = %d stages: the pipeline idles at least %d of every %d micro-batch slots "
          "(the bubble); raise train.batch_size%s to %d or more micro-batches",
          source_name_, micro_batches, p.pp, p.pp - 1, micro_batches + p.pp - 1,
          r.train.micro_batch > 1 ? " or lower train.micro_batch" : "", p.pp);
    }
    return absl::OkStatus();
  }

  // parallel.sequence_parallel splits every micro-batch's tokens evenly over the tp ranks, which
  // the model does by whole positions only when tp divides train.seq_len (as Megatron requires);
  // the fixes offered are the nearest seq_len multiples of tp and the nearest tp sizes that both
  // divide seq_len and fit the model. At tp 1 there is nothing to split: like Megatron, it warns
  // and runs without it.
  absl::Status CheckSequenceParallel(const Recipe& r) const {
    const int tp = r.parallel.tp, seq_len = r.train.seq_len;
    if (!r.parallel.sequence_parallel) return absl::OkStatus();
    if (tp == 1) {
      LogWarn(
          "%s: true has no effect with parallel.tp: 1 (one rank holds every token); set "
          "parallel.tp > 1 to split the norms' tokens over ranks, or remove the key",
          Subject("parallel.sequence_parallel"));
      return absl::OkStatus();
    }
    if (seq_len % tp == 0) return absl::OkStatus();
    std::vector<std::string> lengths;
    if (seq_len > tp) lengths.push_back(absl::StrCat(seq_len / tp * tp));
    if (seq_len / tp * tp + tp <= r.model.max_seq_len) {
      lengths.push_back(absl::StrCat(seq_len / tp * tp + tp));
    }
    const ModelConfig config = ModelConfigFromRecipe(r.model, r.d_ff());
    int tp_below = 0, tp_above = 0;
    for (int size = 2; size <= config.n_head; ++size) {
      if (seq_len % size != 0 || !CheckTensorParallel(config, size).ok()) continue;
      if (size < tp) tp_below = size;
      if (size > tp && tp_above == 0) tp_above = size;
    }
    std::vector<std::string> sizes;
    for (const int size : {tp_below, tp_above}) {
      if (size > 0) sizes.push_back(absl::StrCat(size));
    }
    std::string fixes;
    if (!lengths.empty())
      absl::StrAppend(&fixes, "train.seq_len: ", absl::StrJoin(lengths, " or "));
    if (!sizes.empty()) {
      absl::StrAppend(&fixes, fixes.empty() ? "" : ", ",
                      "parallel.tp: ", absl::StrJoin(sizes, " or "));
    }
    absl::StrAppend(&fixes, fixes.empty() ? "" : ", or ", "parallel.sequence_parallel: false");
    return Error("parallel.sequence_parallel",
                 absl::StrCat("splits each sequence's train.seq_len = ", seq_len,
                              " tokens over parallel.tp = ", tp,
                              " ranks, which needs seq_len divisible by tp; set ", fixes));
  }

  // Rules that tie keys together. Each names the keys, their values and the fix.
  absl::Status CheckConsistency(const Recipe& r) const {
    const ModelSection& m = r.model;
    if (m.d_model % m.n_head != 0) {
      return Error("model.d_model",
                   absl::StrCat(m.d_model, " is not divisible by model.n_head (", m.n_head,
                                "); every head gets d_model / n_head dimensions, so make d_model "
                                "a multiple of n_head"));
    }
    if (m.family == "gpt2" && m.n_kv_head != 0 && m.n_kv_head != m.n_head) {
      return Error("model.n_kv_head",
                   absl::StrCat(m.n_kv_head,
                                " key/value heads need grouped-query attention, "
                                "which only the llama family has; set model.family: llama, or "
                                "remove model.n_kv_head"));
    }
    if (m.n_head % r.n_kv_head() != 0) {
      return Error(
          "model.n_kv_head",
          absl::StrCat("model.n_head (", m.n_head, ") is not divisible by n_kv_head (", m.n_kv_head,
                       "); each key/value head serves a whole group of query heads, so "
                       "pick a divisor of n_head"));
    }
    if (m.family == "llama" && (m.d_model / m.n_head) % 2 != 0) {
      return Error("model.n_head",
                   absl::StrCat("the head size d_model / n_head = ", m.d_model, " / ", m.n_head,
                                " = ", m.d_model / m.n_head,
                                " is odd; RoPE rotates pairs of dimensions, so choose d_model "
                                "and n_head with an even head size"));
    }
    RETURN_IF_ERROR(CheckTensorParallelSize(r));
    RETURN_IF_ERROR(CheckSequenceParallel(r));
    if (r.parallel.tp > 1 && r.parallel.strategy == "auto") {
      return Error(
          "parallel.strategy",
          absl::StrCat(
              "auto picks the tensor-parallel degree itself, so parallel.tp = ", r.parallel.tp,
              " contradicts it; set parallel.tp: 1 to let auto choose, or name the "
              "data-parallel strategy (e.g. ddp or zero1) to keep this tp"));
    }
    if (r.parallel.pp > 1 && r.parallel.strategy == "auto") {
      return Error(
          "parallel.strategy",
          absl::StrCat("auto picks the pipeline degree itself, so parallel.pp = ", r.parallel.pp,
                       " contradicts it; set parallel.pp: 1 to let auto choose, or name "
                       "the data-parallel strategy (e.g. ddp or zero1) to keep this pp"));
    }
    if (const int batch = r.train.batch_size, micro = r.train.micro_batch; batch % micro != 0) {
      // The nearest batch sizes that micro_batch divides, and the nearest micro-batch sizes
      // that divide batch_size (1 always does).
      std::vector<std::string> batches;
      if (batch > micro) batches.push_back(absl::StrCat(batch / micro * micro));
      batches.push_back(absl::StrCat(batch / micro * micro + micro));
      int below = 1, above = 0;
      for (int size = 1; size <= batch; ++size) {
        if (batch % size != 0) continue;
        if (size < micro) below = size;
        if (size > micro && above == 0) above = size;
      }
      const std::string micros =
          above == 0 ? absl::StrCat(below) : absl::StrCat(below, " or ", above);
      return Error(
          "train.batch_size",
          absl::StrCat(batch, " is not a multiple of train.micro_batch (", micro,
                       "); a step accumulates whole micro-batches, so make batch_size a "
                       "multiple of micro_batch (the nearest values that fit: "
                       "train.batch_size: ",
                       absl::StrJoin(batches, " or "), ", or train.micro_batch: ", micros, ")"));
    }
    RETURN_IF_ERROR(CheckPipeline(r));
    WarnOfKeysWithoutEffect(r);
    if (r.train.seq_len > m.max_seq_len) {
      return Error("train.seq_len",
                   absl::StrCat(r.train.seq_len, " exceeds model.max_seq_len (", m.max_seq_len,
                                "); lower seq_len or raise max_seq_len"));
    }
    // One folder under run.out_dir: two unnamed runs would share their checkpoints, and a
    // path would write outside out_dir.
    if (r.run.name.empty() || r.run.name == "." || r.run.name == ".." ||
        r.run.name.find('/') != std::string::npos) {
      return Error("run.name", absl::StrCat("'", r.run.name,
                                            "' is not a folder name; the run's outputs go to "
                                            "<out_dir>/<name>, so give a name without '/'"));
    }
    if (r.run.out_dir.empty()) {
      return Error("run.out_dir",
                   "'' would put the run folder at the file system's root; give a folder (. for "
                   "the current one)");
    }
    // A constant schedule never reaches min_lr.
    if (r.train.min_lr > r.train.lr && r.train.schedule != "constant") {
      return Error("train.min_lr",
                   absl::StrCat(FormatDouble(r.train.min_lr), " is above train.lr (",
                                FormatDouble(r.train.lr),
                                "); the schedule decays from lr down to min_lr, so set "
                                "min_lr <= lr"));
    }
    // A run shorter than its warmup (a recipe's smoke test, --set train.steps=5) ends on the way
    // up, as Hugging Face's and Megatron-LM's schedules do: a warning, not an error.
    if (r.train.warmup_steps > r.train.steps) {
      LogWarn(
          "%s: %d is more than train.steps (%d): the run ends in its warmup, at %.0f%% of "
          "train.lr",
          Subject("train.warmup_steps"), r.train.warmup_steps, r.train.steps,
          100.0 * r.train.steps / r.train.warmup_steps);
    }
    if (r.data.format == "webdataset") {
      if (r.data.shards.empty()) {
        return Error("data.shards",
                     "no shards for data.format webdataset; give a pattern, e.g. "
                     "shards: \"data/train-{000000..000099}.tar\" under data:");
      }
      if (r.data.eos_id >= m.vocab_size) {
        return Error("data.eos_id", absl::StrCat(r.data.eos_id, " is not below model.vocab_size (",
                                                 m.vocab_size, "); pick a token id of the model"));
      }
      if (r.train.eval_every > 0 && r.data.val_shards.empty()) {
        return Error("train.eval_every",
                     absl::StrCat(r.train.eval_every,
                                  " asks for evaluations, but data.format webdataset has no "
                                  "data.val_shards; set them, or eval_every: 0"));
      }
    } else if (r.data.train.empty()) {
      return Error("data.train",
                   "no training files; list them, e.g. train: [data/fortunes.txt] under data:");
    }
    if (r.data.format == "text" && m.vocab_size < 256) {
      return Error("model.vocab_size",
                   absl::StrCat(m.vocab_size,
                                " is too small for data.format text, whose tokens are bytes "
                                "(0..255); set vocab_size >= 256"));
    }
    // data.val and data.val_fraction are the token files' (webdataset's data.val_shards above).
    if (r.data.format != "webdataset" && r.train.eval_every > 0 && r.data.val.empty() &&
        r.data.val_fraction == 0) {
      return Error("train.eval_every",
                   absl::StrCat(r.train.eval_every,
                                " asks for evaluations, but there is no validation data "
                                "(data.val is empty and data.val_fraction is 0); set one of "
                                "them, or eval_every: 0"));
    }
    return absl::OkStatus();
  }

  std::string source_name_;
  std::string source_text_;
  absl::flat_hash_map<std::string, Entry> entries_;  // by key path
  absl::flat_hash_map<std::string, YAML::Mark> seen_sections_;
};

}  // namespace

int Recipe::d_ff() const {
  if (model.d_ff > 0) return model.d_ff;
  if (model.family == "gpt2") return 4 * model.d_model;
  // Llama: two thirds of 4*d_model (SwiGLU has three matrices, not two), rounded up to a
  // multiple of 256 as in Meta's reference (multiple_of = 256).
  const int64_t hidden = int64_t{2} * 4 * model.d_model / 3;
  return static_cast<int>(256 * ((hidden + 255) / 256));
}

bool Recipe::bf16_params() const {
  return run.precision == "bf16" || (run.precision == "auto" && cuda());
}

std::string Recipe::matmul_precision() const {
  if (run.matmul_precision != "auto") return run.matmul_precision;
  return cuda() && bf16_params() ? "medium" : "highest";
}

absl::Status CheckNoTildePaths(const Recipe& recipe) {
  std::vector<std::pair<absl::string_view, absl::string_view>> paths = {
      {"run.out_dir", recipe.run.out_dir},
      {"data.tokenizer", recipe.data.tokenizer},
      {"data.shards", recipe.data.shards},
      {"data.val_shards", recipe.data.val_shards},
      {"train.init_from", recipe.train.init_from},
      {"train.export_to", recipe.train.export_to},
      {"checkpoint.dir", recipe.checkpoint.dir},
      {"checkpoint.resume", recipe.checkpoint.resume},
      {"logging.metrics_file", recipe.logging.metrics_file}};
  for (const std::string& file : recipe.data.train) paths.push_back({"data.train", file});
  for (const std::string& file : recipe.data.val) paths.push_back({"data.val", file});
  for (const auto& [key, path] : paths) {
    if (!absl::StartsWith(path, "~")) continue;
    return absl::InvalidArgumentError(
        absl::StrCat(key, ": '", path,
                     "' starts with '~', which only a shell expands: dtrain takes it as a folder "
                     "named '~'; write the full path"));
  }
  return absl::OkStatus();
}

absl::Status CheckMetricsAddress(const Recipe& recipe) {
  const std::string& address = recipe.logging.metrics_address;
  in6_addr parsed;  // room for either family's
  if (recipe.logging.metrics_port == 0 || address == "localhost" ||
      inet_pton(AF_INET, address.c_str(), &parsed) == 1 ||
      inet_pton(AF_INET6, address.c_str(), &parsed) == 1) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "logging.metrics_address: '", address,
      "' is no IP address (every node reads the same recipe, and a host name is one node's): "
      "give 0.0.0.0 (every interface), 127.0.0.1 (this host only), :: (every interface, IPv6 "
      "too) or one interface's address"));
}

std::string Recipe::run_dir() const { return absl::StrCat(run.out_dir, "/", run.name); }

std::string Recipe::checkpoint_dir() const {
  if (checkpoint.dir.empty()) return absl::StrCat(run_dir(), "/checkpoints");
  if (checkpoint.dir[0] == '/') return checkpoint.dir;
  return absl::StrCat(run_dir(), "/", checkpoint.dir);
}

absl::StatusOr<Recipe> ParseRecipe(const std::string& yaml_text, const std::string& source_name,
                                   const std::vector<std::string>& overrides) {
  Parser parser(source_name);
  return parser.Parse(yaml_text, overrides);
}

absl::StatusOr<Recipe> LoadRecipe(const std::string& path,
                                  const std::vector<std::string>& overrides) {
  // A recipe is a few KB of YAML; a device such as /dev/zero would fill the memory.
  constexpr size_t kMaxRecipeBytes = size_t{16} << 20;
  const absl::StatusOr<std::string> text = ReadWholeFile(path, kMaxRecipeBytes);
  if (absl::IsInvalidArgument(text.status())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the recipe path '", path, "' is a directory; give the recipe's YAML file inside it"));
  }
  if (absl::IsFailedPrecondition(text.status())) {
    return absl::InvalidArgumentError(
        absl::StrCat("the recipe '", path, "' holds more than ", kMaxRecipeBytes >> 20,
                     " MiB (a device such as /dev/zero?); a recipe is a YAML file of a few KB"));
  }
  if (!text.ok()) {
    return absl::Status(
        text.status().code(),
        absl::StrCat("cannot open recipe file '", path, "' (", text.status().message(),
                     "); check the path, or run 'dtrain train' with no file for "
                     "the built-in tiny recipe"));
  }
  return ParseRecipe(*text, path, overrides);
}

std::string ResolvedRecipeYaml(const Recipe& recipe) {
  Recipe copy = recipe;  // the bindings hand out mutable pointers
  std::string out = absl::StrCat("# Resolved recipe",
                                 recipe.source_path.empty() ? "" : " from " + recipe.source_path,
                                 ": every key, defaults filled in.\n");
  // Comments of a section start in one column, after its longest "key: value".
  constexpr size_t kMaxCommentColumn = 48;
  for (absl::string_view section : Sections()) {
    std::vector<std::pair<std::string, std::string>> lines;  // "  key: value", comment
    size_t column = 0;
    for (const KeySpec& key : Keys()) {
      if (SectionOf(key.path) != section) continue;
      lines.emplace_back(absl::StrCat("  ", NameOf(key.path), ": ", FormatValue(key.field(copy))),
                         key.allowed.empty()
                             ? std::string(key.doc)
                             : absl::StrCat(key.doc, " [", absl::StrJoin(key.allowed, "|"), "]"));
      column = std::max(column, lines.back().first.size());
    }
    column = std::min(column, kMaxCommentColumn);
    absl::StrAppend(&out, "\n", section, ":\n");
    for (const auto& [line, doc] : lines) {
      const size_t padding = line.size() < column ? column - line.size() : 0;
      absl::StrAppend(&out, line, std::string(padding + 2, ' '), "# ", doc, "\n");
    }
  }
  return out;
}

std::string RecipeSettings(const Recipe& recipe) {
  Recipe copy = recipe;  // the bindings hand out mutable pointers
  std::string out;
  for (const KeySpec& key : Keys()) {
    absl::StrAppend(&out, key.path, ": ", FormatValue(key.field(copy)), "\n");
  }
  return out;
}

std::string RecipeReferenceMarkdown() {
  Recipe defaults;
  const auto cell = [](absl::string_view text) {
    return absl::StrReplaceAll(text, {{"|", "\\|"}});
  };
  std::string out =
      "| key | type | default | meaning |\n"
      "|---|---|---|---|\n";
  for (const KeySpec& key : Keys()) {
    absl::StrAppend(&out, "| `", key.path, "` | ", cell(TypeName(key)), " | `",
                    cell(FormatValue(key.field(defaults))), "` | ", cell(key.doc), " |\n");
  }
  return out;
}

}  // namespace dtrain
