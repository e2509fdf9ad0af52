// What one parallel layout costs: per-GPU memory, communication per step and step time.
//
// Pure arithmetic over a workload (model, batch, precision), a resolved cluster and a layout;
// no I/O, thread-safe. Formulas and figures come from REFERENCES.md section 7 (ZeRO, Megatron-LM,
// nccl-tests) and are cited where used in cost_model.cc; activations are the trainer's own. Units
// are in the names: bytes, GB/s (1e9 bytes/s), ms, GiB (2^30 bytes).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/strings/string_view.h"
#include "core/model/model_config.h"
#include "core/model/recompute.h"
#include "core/recipe/recipe.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/stage_assignment.h"
#include "parallel/planner/catalog.h"
#include "parallel/sharding.h"

namespace dtrain {

// Bytes in a GiB: the planner states memory in GiB.
inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The data-parallel engine, in the recipe's order of increasing sharding. zero3 and fsdp shard
// the same state (DESIGN.md: one family) and cost the same here.
enum class Strategy { kDdp, kZero1, kZero2, kZero3, kFsdp };

absl::string_view StrategyName(Strategy strategy);  // the recipe's spelling: "zero2"

// Bytes per parameter of each model state. The defaults are the ZeRO paper's mixed precision
// (MixedBf16): bf16 parameters and gradients, K = 12 bytes of fp32 master weights and Adam
// moments. Full fp32 (dtrain's CPU backend) keeps 4 + 4 bytes and K = 8 (the two moments).
// dtrain's own, which the planner plans with, is Trainer.
struct Precision {
  double param_bytes = 2;
  double grad_bytes = 2;
  double optimizer_bytes = 12;  // K
  double activation_bytes = 2;  // per activation element
  double reduce_bytes = 2;      // per gradient element in the data-parallel reductions
  double gather_bytes = 2;      // per parameter element in the data-parallel all-gathers
  // The 4 bytes of float32 master a parameter has in K are its shard under ZeRO-3 and FSDP, not
  // a copy apart: dtrain's bf16 parameters round the shard as each unit is gathered (a shard is
  // then 4 bytes a parameter, counted as parameters; param_bytes sizes the gathered units).
  bool shard_is_master = false;

  static Precision MixedBf16() { return {}; }
  static Precision Fp32() { return {4, 4, 8, 4, 4, 4}; }
  // What dtrain's trainer holds and sends: Fp32, or at bf16 (run.precision) bf16 parameters and
  // activations for compute with float32 gradients, float32 masters (K = 12; under ZeRO-3 and
  // FSDP the shard itself, 4 bytes, rounded as each unit is gathered) and all-gathers of 2
  // bytes.
  static Precision Trainer(bool bf16_params) {
    return bf16_params ? Precision{2, 4, 12, 2, 4, 2, /*shard_is_master=*/true} : Fp32();
  }

  // Bytes AdamW reads and writes in device memory per parameter it updates: the gradient and
  // the optimizer state read, the state and the parameters written, and the parameters read
  // too where they are the float32 masters themselves (K holds no copy of them: 4-byte
  // parameters). 28 at Fp32 and MixedBf16, 30 at Trainer(bf16).
  double OptimizerStepBytes() const {
    const bool params_are_masters = param_bytes >= 4;
    return grad_bytes + optimizer_bytes + (params_are_masters ? param_bytes : 0) + optimizer_bytes +
           param_bytes;
  }
};

// What is trained: the model, the global batch and the precision.
struct Workload {
  ModelConfig model;
  int batch_size = 1;  // sequences per optimizer step across all ranks (train.batch_size)
  int seq_len = 1;
  Precision precision;
  MatmulPrecision matmul = MatmulPrecision::kMedium;  // whose peak the GEMMs run at
  // The classifier chunks the memory estimates count: the CUDA backend's, else the CPU's
  // (StageActivationBytes).
  bool on_gpus = true;
};

// The model and batch of a recipe in `precision`, the gradients reduced at parallel.reduce_dtype
// (auto: in the parameters' type), the GEMMs on the bf16 tensor cores for bf16 parameters, and
// for float32 ones at run.matmul_precision (auto: highest, float32); on_gpus where run.device is
// cuda.
Workload WorkloadFromRecipe(const Recipe& recipe, Precision precision);
// What `dtrain plan` plans: the recipe on GPUs, whatever run.device it names: the trainer's
// precision at bf16 unless run.precision is fp32 (auto is bf16 on cuda), and the CUDA backend's
// classifier chunks.
Workload GpuWorkloadFromRecipe(const Recipe& recipe);

// One way to run the workload. World ranks form a dp x pp x tp grid, tp innermost (DESIGN.md).
struct Layout {
  Strategy strategy = Strategy::kDdp;
  int tp = 1;
  int pp = 1;
  int dp = 1;
  int micro_batch = 1;  // sequences per forward/backward on one rank
  // The pipeline's order of forwards and backwards (pp > 1): how many micro-batches' activations
  // a stage holds at once; and its model chunks per stage (interleaved schedules: a bubble
  // virtual_stages times smaller for as many times the point-to-point messages).
  PipelineSchedule schedule = PipelineSchedule::kOneFOneB;
  int virtual_stages = 1;
  Recompute recompute = Recompute::kNone;
  bool sequence_parallel = false;  // Megatron sequence parallelism in the TP group (tp > 1)
  bool offload = false;            // optimizer states and step on the host (ZeRO-Offload)

  int world_size() const { return tp * pp * dp; }
  // Sequences of one micro-batch on every data-parallel rank, in 64 bits: a cluster of 2^30 GPUs
  // at a micro-batch of 64 overflows an int (a division by the 0 it wrapped to ended `dtrain
  // plan`).
  int64_t sequences_per_micro_step() const { return int64_t{dp} * micro_batch; }
  friend bool operator==(const Layout&, const Layout&) = default;
};

// The figures the estimates rest on that are not properties of the hardware. Defaults are the
// stated assumptions printed in the plan's footer.
struct CostAssumptions {
  // Fraction of the dense peak that a training step's computation sustains: its large bf16
  // GEMMs, its attention and the memory-bound kernels between them, which are not costed apart.
  // Published end-to-end MFUs on H100 (REFERENCES-PARALLEL.md 3), in the planner's FLOP count:
  // Megatron-LM (MCore) 41-48% in its own count, about 38-45% in this one; torchtitan's Llama 3
  // 8B 34-39% in its count (about 30-35% here); llm.c 46-56% at GPT-2's small shapes. 0.45 for
  // the computation alone, before communication and bubbles, puts a well-overlapped layout near
  // Megatron's (0.55 gave 53% for Llama 7B on one node, above every published figure).
  double gemm_peak_fraction = 0.45;
  // A GEMM's efficiency falls as its smallest dimension shrinks; at this width (d_model / tp or
  // micro-batch tokens) it is half of gemm_peak_fraction: efficiency = f * w / (w + this).
  double gemm_half_efficiency_width = 128;
  // A micro-batch of small GEMMs is bound by its kernels' launches, not by its FLOPs: a block
  // runs about kernels_per_block kernels a micro-batch, forward and backward (llm.c's GPT-2 about
  // 10 and 20), each taking at least kernel_launch_us of the GPU's time (a CUDA launch's cost).
  // A model of a few million parameters then plans no pipeline stages that save no time.
  double kernels_per_block = 30;
  double kernel_launch_us = 3;
  // The engine's units (parallel.bucket_mb, prefetch_bucket_mb): gradient buckets of ddp and
  // zero1/2 (PyTorch DDP's default), parameter units of zero3.
  double bucket_mib = 25;
  double prefetch_bucket_mib = 50;
  // CUDA context, NCCL and cuBLAS workspaces that every rank holds besides the model.
  double runtime_gib = 1.5;
  // Optimizer updates a node's CPUs do per second with offload: DeepSpeed's CPU-Adam order of
  // magnitude on a two-socket server (memory-bandwidth bound, ~28 bytes per parameter).
  double host_adam_params_per_s = 4e9;
  // Fraction of the device memory bandwidth that the optimizer step's streaming kernels (a
  // multi-tensor AdamW) sustain.
  double memory_bandwidth_fraction = 0.8;
};

// Bytes on one GPU (host_bytes: in host memory for that GPU's rank).
struct MemoryEstimate {
  double param_bytes = 0;
  double grad_bytes = 0;
  double optimizer_bytes = 0;
  double activation_bytes = 0;
  double temporary_bytes = 0;  // the engine's step buffers (EstimateStepBuffers)
  double runtime_bytes = 0;
  double host_bytes = 0;

  double model_state_bytes() const { return param_bytes + grad_bytes + optimizer_bytes; }
  double device_bytes() const {
    return model_state_bytes() + activation_bytes + temporary_bytes + runtime_bytes;
  }
};

// One link class's traffic in one optimizer step, seen from one rank.
struct Traffic {
  double payload_bytes = 0;  // sum of the array sizes handed to collectives or sends
  double sent_bytes = 0;     // bytes this rank puts on the wire (ring algorithms)
  double time_ms = 0;        // total time of those operations, overlapped or not
  double exposed_ms = 0;     // the part the step waits for
};

struct TimeEstimate {
  double compute_ms = 0;    // forward + backward + recomputation at the assumed GEMM efficiency
  double bubble_ms = 0;     // pipeline fill and drain
  double optimizer_ms = 0;  // the optimizer step on the GPU, bound by its memory bandwidth
  double offload_ms = 0;    // host copies and the optimizer step on the host
  double step_ms = 0;
  double mfu =
      0;  // model FLOPs (no recomputation) / (step time x the GEMMs' peak, Workload::matmul)
  double compute_fraction = 0;  // compute_ms / step_ms
  double tokens_per_s = 0;      // whole cluster
};

struct Estimate {
  MemoryEstimate memory;  // the most loaded pipeline stage
  Traffic dp;             // data-parallel group (all-reduce, reduce-scatter, all-gather)
  Traffic tp;             // tensor-parallel group (all-reduces inside a node)
  Traffic pp;             // point-to-point sends between pipeline stages
  TimeEstimate time;
  int micro_batches = 1;  // per pipeline per step
};

// ---- The formulas, exposed for tests and for comparing with measurements. ----

// Model-state bytes per GPU for `params` parameters on a rank (after TP and PP division) with
// `dp` data-parallel ranks (ZeRO paper, section 5): DDP (p+g+K)Ψ, ZeRO-1 (p+g)Ψ + KΨ/N_d,
// ZeRO-2 pΨ + (g+K)Ψ/N_d, ZeRO-3/FSDP (p+g+K)Ψ/N_d. With offload, the K part is on the host.
MemoryEstimate ModelStateBytes(Strategy strategy, double params, int dp, const Precision& precision,
                               bool offload);

// Activation bytes a rank holding `slice` keeps with `activation_slots` micro-batches of
// micro_batch x seq_len tokens in flight, at `value_bytes` an activation (4: float32, 2: bf16):
// the trainer's activation arena (Transformer::ActivationBytes: every tensor backward reads, the
// attention's log-sum-exp but never its (B, H, T, T) scores, the float32 statistics, and the
// backward scratch), and on the rank with the head at tp = 1 the fused classifier's logits of
// one chunk of rows: the CUDA backend's (GpuClassifierChunkRows, in the activations' type) when
// on_gpus, else the CPU backend's (ClassifierChunkRows, float32). The sizes Korthikanti et al. 2022
// give (REFERENCES.md 7) count the attention scores and dropout masks of Megatron-LM, which dtrain
// never holds: at GPT-2's shapes and T 1024, 3.35 times what a block keeps.
double StageActivationBytes(const ModelConfig& model, int micro_batch, int seq_len,
                            Recompute recompute, const ModelSlice& slice, bool sequence_parallel,
                            int activation_slots, double value_bytes, bool on_gpus);

enum class Collective { kAllReduce, kAllGather, kReduceScatter };

// Time of one collective on an array of `bytes` (nccl-tests' algbw convention) over a group of
// `group_size` ranks with `ranks_per_node` of them in each node.
double CollectiveMs(Collective collective, double bytes, int group_size, int ranks_per_node,
                    const ClusterSpec& cluster);

// Training FLOPs per token of each piece a pipeline stage holds, as EstimateLayout counts them:
// forward and backward of every block (6 per matmul parameter plus attention) with what
// `recompute` repeats, and of the head's output projection. The embedding is a lookup with no
// matmul: 0 (what the first stage carries more is memory, which StageParams counts). The
// stage assignment balances on these (parallel/pipeline/stage_assignment.h).
PipelineCosts PipelineFlopsPerToken(const ModelConfig& model, int seq_len, Recompute recompute);

// Parameters a rank holding `slice` keeps: its blocks, the embedding with the first block, and
// with the last the final norm and the head (for a tied head, a copy of the embedding when the
// first block is on another stage), over slice.tp_size ranks.
double StageParams(const ModelConfig& model, const ModelSlice& slice);

// Whether the sends over pipeline stage boundary `boundary` (stage boundary to boundary + 1)
// cross a node's edge for some rank, where each stage is `stage_ranks` consecutive ranks (dp x tp,
// the mesh's stages outermost) on nodes of `gpus_per_node`.
bool StageBoundaryCrossesNodes(int boundary, int stage_ranks, int gpus_per_node);

// Milliseconds for reports: one decimal from 1 ms up (and 0), two significant digits below
// ("0.068"), where one decimal would print a small model's whole step as 0.1.
std::string FormatMs(double ms);

// The step buffers (EstimateStepBuffers) of the stages one search costs, each worked out once:
// its layouts share stages (a tp size and blocks) and engines. For one workload's model; not
// thread-safe.
class StepBufferMemo {
 public:
  double Bytes(const ModelConfig& model, const ModelSlice& slice, const ShardingStrategy& sharding,
               int dp, bool pipelined);

 private:
  std::map<std::string, double> bytes_;
};

// The whole estimate. Precondition: the layout is valid for the workload and cluster
// (search.h's CheckLayout). `memo`, when given, keeps the stages' step buffers between calls.
Estimate EstimateLayout(const Workload& workload, const ClusterSpec& cluster, const Layout& layout,
                        const CostAssumptions& assumptions = {}, StepBufferMemo* memo = nullptr);

}  // namespace dtrain
