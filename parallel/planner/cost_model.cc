#include "parallel/planner/cost_model.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/model/param_table.h"
#include "core/model/transformer.h"
#include "parallel/pipeline_train_step.h"

namespace dtrain {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// Parameters of the token (and, for gpt2, position) embedding, the untied output head and the
// final norm; the rest divides evenly over the blocks.
struct ParamSplit {
  double embedding = 0;
  double head = 0;  // 0 when tied to the embedding
  double final_norm = 0;
  double per_layer = 0;
  double kv_per_layer = 0;  // of per_layer: the key and value projections
};

ParamSplit SplitParams(const ModelConfig& model) {
  const double h = model.d_model;
  ParamSplit split;
  split.embedding =
      static_cast<double>(model.vocab_size) * h +
      (model.has_position_embedding() ? static_cast<double>(model.max_seq_len) * h : 0);
  split.head = model.tied_head() ? 0 : static_cast<double>(model.vocab_size) * h;
  split.final_norm = model.has_biases() ? 2 * h : h;
  split.per_layer = (static_cast<double>(model.num_parameters()) - split.embedding - split.head -
                     split.final_norm) /
                    model.n_layer;
  split.kv_per_layer = 2.0 * model.n_kv_head * model.head_dim * (h + (model.has_biases() ? 1 : 0));
  return split;
}

// GEMM efficiency at the layout's narrowest per-GPU matrix dimension (see CostAssumptions).
double GemmEfficiency(const Workload& workload, const Layout& layout,
                      const CostAssumptions& assumptions) {
  const double width = std::min(static_cast<double>(workload.model.d_model) / layout.tp,
                                static_cast<double>(layout.micro_batch) * workload.seq_len);
  return assumptions.gemm_peak_fraction * width / (width + assumptions.gemm_half_efficiency_width);
}

// The part of a step's communication the step waits for, when `total_ms` of it (in `calls`
// equal operations) can run behind `window_ms` of computation: all but the last operation
// overlaps, and whatever does not fit in the window is exposed too (DESIGN.md: buckets are
// reduced while earlier blocks are still in backward).
double ExposedMs(double total_ms, double window_ms, int calls) {
  if (total_ms <= 0) return 0;
  const double last_ms = total_ms / std::max(calls, 1);
  return std::min(total_ms, std::max(0.0, total_ms - window_ms) + last_ms);
}

// PipelineFlopsPerToken's terms.
double BlockFlopsPerToken(const ModelConfig& model, int seq_len, Recompute recompute) {
  const double s = seq_len, h = model.d_model;
  double flops = 6.0 * SplitParams(model).per_layer + 6.0 * s * h;
  // Full recomputation repeats the blocks' forward (a third of their training FLOPs), selective
  // only the attention scores' forward (Korthikanti et al.).
  if (recompute == Recompute::kFull) flops += flops / 3;
  if (recompute == Recompute::kSelective) flops += 2.0 * s * h;
  return flops;
}

double HeadFlopsPerToken(const ModelConfig& model) {
  return 6.0 * model.vocab_size * static_cast<double>(model.d_model);
}

double RingFactor(Collective collective, int group_size) {
  const double n = group_size;
  return collective == Collective::kAllReduce ? 2 * (n - 1) / n : (n - 1) / n;
}

// Bytes rank 0 sends in the ring all-reduce of `count` elements over `group` ranks: every chunk
// but its own in the reduce-scatter, every chunk but the next in the all-gather, the chunks as
// equal as can be (parallel/comm/gloo_communicator.cc). Exact for counts below the group size,
// where RingFactor's 2 (n - 1) / n is not.
double RankZeroAllReduceBytes(size_t count, size_t element_bytes, int group) {
  const auto chunk = [&](size_t c) { return count / group + (c < count % group ? 1 : 0); };
  return static_cast<double>(2 * count - chunk(0) - chunk(1)) * element_bytes;
}

// The data-parallel engine's sharding of `strategy`: its units of the assumed sizes, the
// precision's parameter and reduction types.
ShardingStrategy EngineSharding(Strategy strategy, const Precision& precision,
                                const CostAssumptions& assumptions) {
  ParallelSection parallel;
  parallel.strategy = std::string(StrategyName(strategy));
  parallel.bucket_mb = assumptions.bucket_mib;
  parallel.prefetch_bucket_mb = assumptions.prefetch_bucket_mib;
  parallel.reduce_dtype = precision.reduce_bytes == 2 ? "bf16" : "fp32";
  // Every Strategy has an engine.
  return ShardingStrategyFromRecipe(parallel, precision.param_bytes == 2).value();
}

}  // namespace

absl::string_view StrategyName(Strategy strategy) {
  switch (strategy) {
    case Strategy::kDdp:
      return "ddp";
    case Strategy::kZero1:
      return "zero1";
    case Strategy::kZero2:
      return "zero2";
    case Strategy::kZero3:
      return "zero3";
    case Strategy::kFsdp:
      return "fsdp";
  }
  return "?";
}

Workload GpuWorkloadFromRecipe(const Recipe& recipe) {
  Workload workload =
      WorkloadFromRecipe(recipe, Precision::Trainer(recipe.run.precision != "fp32"));
  workload.on_gpus = true;
  return workload;
}

Workload WorkloadFromRecipe(const Recipe& recipe, Precision precision) {
  Workload workload;
  workload.on_gpus = recipe.cuda();
  workload.model = ModelConfigFromRecipe(recipe.model, recipe.d_ff());
  workload.batch_size = recipe.train.batch_size;
  workload.seq_len = recipe.train.seq_len;
  // auto: in the parameters' type, as PyTorch FSDP reduces in param_dtype.
  precision.reduce_bytes = recipe.parallel.reduce_dtype == "bf16"   ? 2
                           : recipe.parallel.reduce_dtype == "fp32" ? 4
                                                                    : precision.param_bytes;
  workload.precision = precision;
  const std::string& asked = recipe.run.matmul_precision;
  workload.matmul = precision.param_bytes < 4
                        ? MatmulPrecision::kMedium
                        : ParseMatmulPrecision(asked == "auto" ? "highest" : asked)
                              .value_or(MatmulPrecision::kHighest);
  return workload;
}

MemoryEstimate ModelStateBytes(Strategy strategy, double params, int dp, const Precision& precision,
                               bool offload) {
  const double p = precision.param_bytes * params;
  const double g = precision.grad_bytes * params;
  const double k = precision.optimizer_bytes * params;
  MemoryEstimate memory;
  switch (strategy) {
    case Strategy::kDdp:
      memory = {.param_bytes = p, .grad_bytes = g, .optimizer_bytes = k};
      break;
    case Strategy::kZero1:
      memory = {.param_bytes = p, .grad_bytes = g, .optimizer_bytes = k / dp};
      break;
    case Strategy::kZero2:
      memory = {.param_bytes = p, .grad_bytes = g / dp, .optimizer_bytes = k / dp};
      break;
    case Strategy::kZero3:
    case Strategy::kFsdp: {
      const double masters = precision.shard_is_master ? sizeof(float) * params : 0;
      const double shard = precision.shard_is_master ? masters : p;
      memory = {
          .param_bytes = shard / dp, .grad_bytes = g / dp, .optimizer_bytes = (k - masters) / dp};
      break;
    }
  }
  if (offload) {
    memory.host_bytes = memory.optimizer_bytes;
    memory.optimizer_bytes = 0;
  }
  return memory;
}

double StageActivationBytes(const ModelConfig& model, int micro_batch, int seq_len,
                            Recompute recompute, const ModelSlice& slice, bool sequence_parallel,
                            int activation_slots, double value_bytes, bool on_gpus) {
  const DataType type = value_bytes == 2 ? DataType::kBF16 : DataType::kF32;
  const double arena = Transformer::ActivationBytes(model, micro_batch, seq_len, recompute, slice,
                                                    sequence_parallel, activation_slots, type);
  const bool has_head = ChunksOf(model, slice).back().end() == model.n_layer;
  if (!has_head || slice.tp_size != 1) return arena;
  const double logit_bytes = on_gpus ? value_bytes : sizeof(float);
  const int rows = on_gpus
                       ? GpuClassifierChunkRows(model.vocab_size, static_cast<size_t>(logit_bytes))
                       : ClassifierChunkRows(model.vocab_size);
  const int stride = on_gpus ? GpuLogitsStride(model.vocab_size) : model.vocab_size;
  return arena +
         std::min<double>(static_cast<double>(micro_batch) * seq_len, rows) * stride * logit_bytes;
}

double CollectiveMs(Collective collective, double bytes, int group_size, int ranks_per_node,
                    const ClusterSpec& cluster) {
  if (group_size <= 1 || bytes <= 0) return 0;
  const bool crosses_nodes = group_size > ranks_per_node;
  // Between nodes a group's ring passes each node's NICs once per channel, so the node-level
  // traffic equals one rank's and the group gets its nodes' NIC bandwidth in proportion to the
  // GPUs it has there (all groups communicate at once); NVLink caps it.
  const double busbw_gbps =
      crosses_nodes ? std::min(cluster.intra_gbps, cluster.inter_gbps_per_gpu() * ranks_per_node)
                    : cluster.intra_gbps;
  const double latency_us = crosses_nodes ? cluster.inter_latency_us : cluster.intra_latency_us;
  // NCCL runs all-reduce as a tree when latency dominates (2 log2 n hops) and all-gather /
  // reduce-scatter as a ring (n - 1 hops).
  const double hops = collective == Collective::kAllReduce
                          ? 2 * std::ceil(std::log2(static_cast<double>(group_size)))
                          : group_size - 1;
  const double transfer_s = RingFactor(collective, group_size) * bytes / (busbw_gbps * 1e9);
  return 1e3 * transfer_s + 1e-3 * hops * latency_us;
}

PipelineCosts PipelineFlopsPerToken(const ModelConfig& model, int seq_len, Recompute recompute) {
  return {
      .embedding = 0,
      .blocks = std::vector<double>(model.n_layer, BlockFlopsPerToken(model, seq_len, recompute)),
      .head = HeadFlopsPerToken(model)};
}

double StageParams(const ModelConfig& model, const ModelSlice& slice) {
  const ParamSplit split = SplitParams(model);
  const std::vector<BlockSpan> chunks = ChunksOf(model, slice);
  // More tp ranks than kv heads replicate each kv head on tp / n_kv_head of them, each rank
  // holding one head (LocalDimsOf).
  const int kv_replicas = std::max(1, slice.tp_size / model.n_kv_head);
  const double per_layer = split.per_layer + (kv_replicas - 1) * split.kv_per_layer;
  double params = 0;
  for (const BlockSpan& chunk : chunks) params += per_layer * chunk.count;
  // The embedding with the first block; the final norm and the head with the last, or for a
  // tied head a copy of the embedding on a later stage (Megatron-LM keeps one on each end and
  // all-reduces its gradients).
  const bool first = chunks.front().first == 0;
  if (first) params += split.embedding;
  if (chunks.back().end() == model.n_layer) {
    const double head_copy = static_cast<double>(model.vocab_size) * model.d_model;
    params += split.final_norm + (!model.tied_head() ? split.head : first ? 0 : head_copy);
  }
  return params / slice.tp_size;
}

double StepBufferMemo::Bytes(const ModelConfig& model, const ModelSlice& slice,
                             const ShardingStrategy& sharding, int dp, bool pipelined) {
  std::string key = absl::StrCat(slice.tp_rank, "/", slice.tp_size, " ", sharding.name, " ",
                                 sharding.unit_bytes, " ", static_cast<int>(sharding.param_type),
                                 static_cast<int>(sharding.reduce_type), " ", dp, pipelined, ":");
  for (const BlockSpan& chunk : slice.chunks)
    absl::StrAppend(&key, chunk.first, "+", chunk.count, ",");
  const auto [it, added] = bytes_.try_emplace(std::move(key), 0);
  if (added) {
    it->second =
        EstimateStepBuffers(ParamTable(model, slice), sharding, dp, pipelined).total_bytes();
  }
  return it->second;
}

Estimate EstimateLayout(const Workload& workload, const ClusterSpec& cluster, const Layout& layout,
                        const CostAssumptions& assumptions, StepBufferMemo* memo) {
  const ModelConfig& model = workload.model;
  const Precision& precision = workload.precision;
  const int t = layout.tp, p = layout.pp, dp = layout.dp, b = layout.micro_batch;
  const int s = workload.seq_len, h = model.d_model;
  const int v = layout.virtual_stages;
  const int m = static_cast<int>(workload.batch_size / layout.sequences_per_micro_step());
  const bool sp = layout.sequence_parallel;
  Estimate estimate;
  estimate.micro_batches = m;

  // ---- Memory of the most loaded stage. ----
  // Each stage on the blocks the trainer assigns it. It holds the schedule's micro-batches in
  // flight, as many activation slots as the trainer gives it (PipelineActivationSlots), each of
  // its largest model chunk: under 1F1B min(p, m) on the first stage and one on the last; under
  // GPipe every micro-batch of the step on each; interleaved, Megatron's warm-up of chunks.
  const PipelineShape shape{
      .schedule = layout.schedule, .stages = p, .virtual_stages = v, .micro_batches = m};
  // A valid layout (the precondition) gives every model chunk a block.
  const StageAssignment assignment =
      p == 1 ? StageAssignment{}
             : AssignStages(PipelineFlopsPerToken(model, s, layout.recompute), p, v).value();
  const ShardingStrategy sharding = EngineSharding(layout.strategy, precision, assumptions);
  const auto stage_memory = [&](const ModelSlice& slice, double params, int activation_slots) {
    MemoryEstimate memory = ModelStateBytes(layout.strategy, params, dp, precision, layout.offload);
    memory.activation_bytes =
        StageActivationBytes(model, b, s, layout.recompute, slice, sp, activation_slots,
                             precision.activation_bytes, workload.on_gpus);
    // The engine's units of the stage's tables, held at once in a step.
    StepBufferMemo local;
    memory.temporary_bytes = (memo ? *memo : local).Bytes(model, slice, sharding, dp, p > 1);
    return memory;
  };
  // The parameters of the stage with the most: what its data-parallel group moves.
  double params = 0;
  MemoryEstimate& memory = estimate.memory;
  for (int stage = 0; stage < p; ++stage) {
    ModelSlice slice{.tp_size = t};
    if (p > 1) slice.chunks = StageChunks(assignment, stage);
    const double stage_params = StageParams(model, slice);
    params = std::max(params, stage_params);
    const MemoryEstimate stage_estimate =
        stage_memory(slice, stage_params, p == 1 ? 1 : PipelineActivationSlots(shape, stage));
    if (stage_estimate.device_bytes() > memory.device_bytes()) memory = stage_estimate;
  }
  memory.runtime_bytes = assumptions.runtime_gib * kGiB;

  // ---- Compute. ----
  // Model FLOPs per token: 6 per matmul parameter plus attention (ModelConfig, the definition
  // the trainer's MFU uses). A pipeline runs at the pace of its heaviest stage on the blocks the
  // trainer assigns it (the whole model without one).
  const double tokens = static_cast<double>(workload.batch_size) * s;
  const double model_flops = model.flops_per_token(s) * tokens / layout.world_size();
  int heaviest = 0;
  for (int stage = 1; stage < p; ++stage) {
    if (assignment.StageCost(stage) > assignment.StageCost(heaviest)) heaviest = stage;
  }
  const std::vector<BlockSpan> heaviest_chunks =
      p == 1 ? ChunksOf(model, {}) : StageChunks(assignment, heaviest);
  int heaviest_blocks = 0;
  for (const BlockSpan& chunk : heaviest_chunks) heaviest_blocks += chunk.count;
  // The blocks of the stage that sets the pace: its FSDP units.
  const int layers = heaviest_blocks;
  const double head_flops_per_token =
      heaviest_chunks.back().end() == model.n_layer ? HeadFlopsPerToken(model) : 0;
  const double stage_flops_per_token =
      heaviest_blocks * BlockFlopsPerToken(model, s, Recompute::kNone) + head_flops_per_token;
  const double executed_flops_per_token =
      heaviest_blocks * BlockFlopsPerToken(model, s, layout.recompute) + head_flops_per_token;
  const double peak_flops = cluster.GemmPeakTflops(workload.matmul) * 1e12;
  const double flops_per_ms = 1e-3 * peak_flops * t * GemmEfficiency(workload, layout, assumptions);
  const double micro_batch_tokens = static_cast<double>(b) * s;
  // A recomputed forward launches its blocks' kernels again, in the proportion of its FLOPs.
  const double launch_ms = 1e-3 * assumptions.kernel_launch_us * assumptions.kernels_per_block *
                           heaviest_blocks * BlockFlopsPerToken(model, s, layout.recompute) /
                           BlockFlopsPerToken(model, s, Recompute::kNone);
  const double micro_batch_ms =
      std::max(micro_batch_tokens * executed_flops_per_token / flops_per_ms, launch_ms);
  const double forward_ms = micro_batch_ms * stage_flops_per_token / 3 / executed_flops_per_token;
  const double backward_ms = micro_batch_ms - forward_ms;  // includes the recomputed forward
  TimeEstimate& time = estimate.time;
  time.compute_ms = m * micro_batch_ms;
  // Pipeline bubble: p - 1 micro-batch slots, (p - 1) / m of the compute, under GPipe and 1F1B
  // alike; interleaving v chunks makes each slot a chunk's, (p - 1) / (v m) (Narayanan et al.
  // 2021).
  time.bubble_ms = (p - 1) * micro_batch_ms / v;

  // ---- Data-parallel traffic. ----
  // Mesh order tp, dp, pp: a dp group has min(dp, gpus_per_node / tp) ranks in one node.
  const int dp_per_node = std::max(1, std::min(dp, cluster.gpus_per_node / t));
  const double grad_bytes = params * precision.grad_bytes;
  const double reduced_bytes = params * precision.reduce_bytes;  // on the wire
  const double param_bytes = params * precision.gather_bytes;    // on the wire
  // Records `times` repetitions of `calls` equal collectives over `bytes` in total; returns the
  // time of one repetition.
  const auto record = [&](Collective kind, double bytes, int calls, int times) {
    const double ms = calls * CollectiveMs(kind, bytes / calls, dp, dp_per_node, cluster);
    estimate.dp.payload_bytes += times * bytes;
    estimate.dp.sent_bytes += times * bytes * RingFactor(kind, dp);
    estimate.dp.time_ms += times * ms;
    return ms;
  };
  if (dp > 1) {
    const int buckets =
        std::max(1, static_cast<int>(std::ceil(grad_bytes / (assumptions.bucket_mib * kMiB))));
    // ZeRO paper section 7: DDP and ZeRO-1/2 move 2Ψ per rank, ZeRO-3 3Ψ (all-gather forward,
    // all-gather and reduce-scatter backward). Gradients reduce once per step under DDP and
    // ZeRO-1 (accumulated locally), once per micro-batch under ZeRO-2 and ZeRO-3, whose
    // gradients are sharded; each overlaps that micro-batch's backward. The parameter
    // all-gather after the optimizer step waits. Pipelined (p > 1), every strategy reduces once
    // per step, after the stage's last backward, and ZeRO-3 keeps the stage gathered from the
    // first forward: one all-gather per step (torchtitan), 2Ψ of the stage per rank.
    const int reductions = p > 1 ? 1 : m;
    double& exposed = estimate.dp.exposed_ms;
    switch (layout.strategy) {
      case Strategy::kDdp:
        exposed = ExposedMs(record(Collective::kAllReduce, reduced_bytes, buckets, 1), backward_ms,
                            buckets);
        break;
      case Strategy::kZero1:
        exposed = ExposedMs(record(Collective::kReduceScatter, reduced_bytes, buckets, 1),
                            backward_ms, buckets) +
                  record(Collective::kAllGather, param_bytes, buckets, 1);
        break;
      case Strategy::kZero2:
        exposed = reductions * ExposedMs(record(Collective::kReduceScatter, reduced_bytes, buckets,
                                                reductions),
                                         backward_ms, buckets) +
                  record(Collective::kAllGather, param_bytes, buckets, 1);
        break;
      case Strategy::kZero3:
      case Strategy::kFsdp: {
        // One unit per block, prefetched one ahead of the compute.
        const double forward_gather_ms =
            record(Collective::kAllGather, param_bytes, layers, reductions);
        const double backward_comm_ms =
            (p > 1 ? 0 : record(Collective::kAllGather, param_bytes, layers, m)) +
            record(Collective::kReduceScatter, reduced_bytes, layers, reductions);
        exposed = reductions * (ExposedMs(forward_gather_ms, forward_ms, layers) +
                                ExposedMs(backward_comm_ms, backward_ms, layers));
        break;
      }
    }
  }

  // ---- Tensor-parallel traffic: never overlapped. ----
  // Every collective of a step inside the tp group and its subgroups, one line per kind
  // (Megatron-LM's f and g). Each records `calls` equal all-reduces of `bytes` in total over
  // `group` ranks of one node.
  const auto record_tp = [&](Collective kind, double bytes, double calls, int group) {
    estimate.tp.payload_bytes += bytes;
    estimate.tp.sent_bytes += bytes * RingFactor(kind, group);
    estimate.tp.time_ms += calls * CollectiveMs(kind, bytes / calls, group, group, cluster);
  };
  // An all-reduce, or under sequence parallelism its reduce-scatter and all-gather halves (the
  // same bytes, in twice the calls).
  const auto record_f_g = [&](double bytes, double calls) {
    if (!sp) return record_tp(Collective::kAllReduce, bytes, calls, t);
    record_tp(Collective::kReduceScatter, bytes, calls, t);
    record_tp(Collective::kAllGather, bytes, calls, t);
  };
  if (t > 1) {
    // Pipelined, the estimate is the first stage's: its blocks, the embedding, not the head.
    const bool first_stage = true, last_stage = p == 1;
    int first_stage_blocks = model.n_layer;
    if (p > 1) {
      first_stage_blocks = 0;
      for (const BlockSpan& chunk : StageChunks(assignment, 0)) first_stage_blocks += chunk.count;
    }
    const double block_calls = static_cast<double>(m) * first_stage_blocks;  // x micro-batches
    const double activation = static_cast<double>(s) * b * h * precision.activation_bytes;
    const double kv_rows = 2.0 * model.head_dim * h * precision.grad_bytes;  // one k and v head
    const int kv_replicas = LocalDimsOf(model, ModelSlice{.tp_size = t}).kv_replicas;
    // g forward: the partial outputs of attn.out and mlp.down.
    record_f_g(2 * block_calls * activation, 2 * block_calls);
    // f backward: the input gradients of qkv and mlp.up.
    record_f_g(2 * block_calls * activation, 2 * block_calls);
    // Full recomputation repeats attn.out's g; not mlp.down's, whose sum is the block's output,
    // which backward does not need (Transformer::BlockForward with no output). Under sequence
    // parallelism it also gathers the mlp's norm output again.
    if (layout.recompute == Recompute::kFull) {
      record_f_g(block_calls * activation, block_calls);
      if (sp) record_tp(Collective::kAllGather, block_calls * activation, block_calls, t);
    }
    // tp > n_kv_head replicates each kv head on tp / n_kv_head ranks, which sum its weight
    // gradient rows (their subgroup's links are the tp group's).
    if (kv_replicas > 1) {
      record_tp(Collective::kAllReduce, block_calls * kv_rows, block_calls, kv_replicas);
    }
    // Sequence parallelism: the norms' weight (and bias) gradients from each rank's rows,
    // summed per block and for the final norm (LayerNorm: weight and bias; RMSNorm: weight).
    const double norm_vectors = model.family == ModelFamily::kGpt2 ? 2 : 1;
    if (sp) {
      record_tp(Collective::kAllReduce, 2 * norm_vectors * h * precision.grad_bytes * block_calls,
                block_calls, t);
    }
    // The vocabulary-parallel embedding's g (first stage) and head's f (last stage); under
    // sequence parallelism the head's input is gathered and d(embedding output) too, which is
    // the other half of each.
    if (first_stage) record_f_g(m * activation, m);
    if (last_stage) {
      record_f_g(m * activation, m);
      if (sp) {
        record_tp(Collective::kAllReduce, norm_vectors * h * precision.grad_bytes * m, m, t);
      }
      // The vocabulary-parallel softmax: each token's max, then its sum of exponentials and
      // target logit, in float32 (Transformer::Classifier), in as many calls as chunks of rows.
      const int slot = LocalDimsOf(model, ModelSlice{.tp_size = t}).vocab_slot;
      const double chunks = std::ceil(static_cast<double>(s) * b / ClassifierChunkRows(slot));
      const double tokens = static_cast<double>(m) * s * b;
      record_tp(Collective::kAllReduce, 3 * tokens * sizeof(float), 2 * m * chunks, t);
    }
    // The gradient norm's partial sums of squares: one double per step (data_parallel.cc).
    record_tp(Collective::kAllReduce, sizeof(double), 1, t);
    estimate.tp.exposed_ms = estimate.tp.time_ms;
  }

  // ---- Pipeline traffic. ----
  // Each micro-batch sends its activation forward and its gradient back: the rank's rows of the
  // residual stream, b*s*h (b*s*h / t under sequence parallelism; dtrain does not split whole
  // rows over the tp group as Megatron's scatter/gather does). The mesh puts the stages
  // outermost, each stage's dp x tp ranks consecutive, so a stage boundary's sends cross the
  // network where its ranks straddle a node's edge (StageBoundaryCrossesNodes). Under 1F1B and
  // GPipe, m + p - 1 slots each wait for one send each way (interleaved: m v + p - 1, of chunks):
  // the warm-up's over each boundary in turn, the rest at the pace of the slowest boundary (with
  // interleaving, the last stage's back to the first is a boundary too). The bytes are the first
  // stage's, as the tp traffic's (PipelineTrainStep): each micro-batch's activations out of
  // its v chunks and the gradients into its v - 1 chunks after the first, GPT-2's tied
  // embedding gradient swapped with the last stage, and the step's loss and squared norm summed
  // over the stages.
  if (p > 1) {
    const double bytes = static_cast<double>(s) * b * h * precision.activation_bytes / (sp ? t : 1);
    const auto send_ms = [&](bool across_nodes) {
      const double gbps = across_nodes ? cluster.inter_gbps_per_gpu() : cluster.intra_gbps;
      const double latency_us = across_nodes ? cluster.inter_latency_us : cluster.intra_latency_us;
      return 1e3 * bytes / (gbps * 1e9) + 1e-3 * latency_us;
    };
    double warm_up_ms = 0, slowest_ms = v > 1 ? send_ms(cluster.nodes > 1) : 0;
    for (int boundary = 0; boundary + 1 < p; ++boundary) {
      const double ms = send_ms(StageBoundaryCrossesNodes(boundary, t * dp, cluster.gpus_per_node));
      warm_up_ms += ms;
      slowest_ms = std::max(slowest_ms, ms);
    }
    const double tied_bytes =
        model.tied_head()
            ? static_cast<double>(LocalDimsOf(model, ModelSlice{.tp_size = t}).vocab_rows()) * h *
                  precision.grad_bytes
            : 0;
    // The loss sum (with its unused partner, SumOverRanks) and the squared norm, in doubles.
    const double sends = static_cast<double>(m) * (2 * v - 1);
    estimate.pp.payload_bytes = sends * bytes + tied_bytes + 3 * sizeof(double);
    estimate.pp.sent_bytes = sends * bytes + tied_bytes +
                             RankZeroAllReduceBytes(2, sizeof(double), p) +
                             RankZeroAllReduceBytes(1, sizeof(double), p);
    estimate.pp.time_ms = 2.0 * m * v * slowest_ms;
    estimate.pp.exposed_ms = 2.0 * (m * v * slowest_ms + warm_up_ms);
  }

  // ---- The optimizer step: each rank updates its shard (all its parameters under ddp), on the
  // GPU at its memory bandwidth, or with offload on the node's CPUs after the gradients come
  // down and before the parameters go up. ----
  const double shard = layout.strategy == Strategy::kDdp ? params : params / dp;
  if (layout.offload) {
    const double copy_bytes = shard * (precision.grad_bytes + precision.param_bytes);
    const double adam_params_per_s = assumptions.host_adam_params_per_s / cluster.gpus_per_node;
    time.offload_ms = 1e3 * (copy_bytes / (cluster.host_gbps * 1e9) + shard / adam_params_per_s);
  } else {
    time.optimizer_ms = 1e3 * shard * precision.OptimizerStepBytes() /
                        (cluster.memory_gbps * 1e9 * assumptions.memory_bandwidth_fraction);
  }

  time.step_ms = time.compute_ms + time.bubble_ms + estimate.dp.exposed_ms +
                 estimate.tp.exposed_ms + estimate.pp.exposed_ms + time.optimizer_ms +
                 time.offload_ms;
  time.mfu = model_flops / (time.step_ms * 1e-3 * peak_flops);
  time.compute_fraction = time.compute_ms / time.step_ms;
  time.tokens_per_s = tokens / (time.step_ms * 1e-3);
  return estimate;
}

bool StageBoundaryCrossesNodes(int boundary, int stage_ranks, int gpus_per_node) {
  // Rank r sends to r + stage_ranks, for r over the stage's stage_ranks consecutive ranks from
  // `first`: another node's where r's place in its node is at least gpus_per_node - stage_ranks.
  const int64_t first = static_cast<int64_t>(boundary) * stage_ranks;
  return stage_ranks >= gpus_per_node ||
         first % gpus_per_node + 2 * stage_ranks - 1 >= gpus_per_node;
}

std::string FormatMs(double ms) {
  return ms >= 1 || ms == 0 ? absl::StrFormat("%.1f", ms) : absl::StrFormat("%.2g", ms);
}

}  // namespace dtrain
