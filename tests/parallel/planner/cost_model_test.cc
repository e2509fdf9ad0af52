#include "parallel/planner/cost_model.h"

#include <algorithm>
#include <vector>

#include "core/model/transformer.h"
#include "gtest/gtest.h"
#include "parallel/pipeline_train_step.h"
#include "parallel/planner/catalog.h"
#include "tests/testing/configs.h"

namespace dtrain {
namespace {

// ZeRO paper (Rajbhandari et al. 2020), figure 1: 7.5B parameters, N_d = 64, K = 12.
TEST(CostModelTest, ModelStatesMatchZeroPaper) {
  const double psi = 7.5e9;
  const Precision mixed = Precision::MixedBf16();
  const auto gb = [&](Strategy strategy) {
    return ModelStateBytes(strategy, psi, 64, mixed, false).model_state_bytes() / 1e9;
  };
  EXPECT_DOUBLE_EQ(gb(Strategy::kDdp), 120.0);
  EXPECT_NEAR(gb(Strategy::kZero1), 31.4, 0.05);
  EXPECT_NEAR(gb(Strategy::kZero2), 16.6, 0.05);
  EXPECT_NEAR(gb(Strategy::kZero3), 1.88, 0.01);
  EXPECT_DOUBLE_EQ(gb(Strategy::kFsdp), gb(Strategy::kZero3));
}

TEST(CostModelTest, OffloadMovesOptimizerStatesToTheHost) {
  const MemoryEstimate memory =
      ModelStateBytes(Strategy::kZero2, 1e9, 8, Precision::MixedBf16(), /*offload=*/true);
  EXPECT_EQ(memory.optimizer_bytes, 0);
  EXPECT_DOUBLE_EQ(memory.host_bytes, 12e9 / 8);
  EXPECT_DOUBLE_EQ(memory.model_state_bytes(), 2e9 + 2e9 / 8);
}

TEST(CostModelTest, Fp32StatesAreSixteenBytesWithoutAMasterCopy) {
  const MemoryEstimate memory = ModelStateBytes(Strategy::kZero1, 1e6, 2, Precision::Fp32(), false);
  EXPECT_DOUBLE_EQ(memory.model_state_bytes(), 4e6 + 4e6 + 8e6 / 2);
}

// The pipeline's pieces add up to the model FLOPs the MFU counts (ModelConfig::flops_per_token),
// but for the final norm's 2 d_model parameters (a norm, not a matmul); recomputation adds to the
// blocks only.
TEST(CostModelTest, PipelinePiecesAddUpToTheModelFlops) {
  for (const char* config : {"gpt2-124m", "llama-7b"}) {
    const ModelConfig model = testing::ShippedModelConfig(config);
    const int s = 1024;
    const PipelineCosts none = PipelineFlopsPerToken(model, s, Recompute::kNone);
    ASSERT_EQ(static_cast<int>(none.blocks.size()), model.n_layer);
    double sum = none.embedding + none.head;
    for (double block : none.blocks) sum += block;
    EXPECT_NEAR(sum, model.flops_per_token(s), 6.0 * 2 * model.d_model) << config;
    EXPECT_EQ(none.embedding, 0);
    EXPECT_DOUBLE_EQ(none.head, 6.0 * model.vocab_size * model.d_model);
    const PipelineCosts full = PipelineFlopsPerToken(model, s, Recompute::kFull);
    EXPECT_DOUBLE_EQ(full.blocks[0], none.blocks[0] * 4 / 3);
    EXPECT_EQ(full.head, none.head);
  }
}

// nccl-tests: time = algbw-size x factor / busbw, factor 2(n-1)/n for all-reduce, (n-1)/n for
// all-gather and reduce-scatter; latency on top.
TEST(CostModelTest, CollectiveTimeFollowsBusBandwidth) {
  const ClusterSpec cluster = testing::CatalogCluster(4, "h100-sxm", "ib-ndr");
  const double gb = 1e9;
  const double in_node = CollectiveMs(Collective::kAllReduce, gb, 8, 8, cluster);
  EXPECT_NEAR(in_node, 1e3 * 2 * 7.0 / 8 * gb / 370e9, 0.05);
  // One rank per node: one NIC; eight per node: the node's eight NICs, capped by NVLink.
  const double one_per_node = CollectiveMs(Collective::kAllGather, gb, 4, 1, cluster);
  EXPECT_NEAR(one_per_node, 1e3 * 3.0 / 4 * gb / 48e9, 0.1);
  const double full_nodes = CollectiveMs(Collective::kReduceScatter, gb, 32, 8, cluster);
  EXPECT_NEAR(full_nodes, 1e3 * 31.0 / 32 * gb / 370e9, 0.2);
  EXPECT_EQ(CollectiveMs(Collective::kAllReduce, gb, 1, 1, cluster), 0);
}

Workload Gpt2Workload(int batch_size) {
  Workload workload;
  workload.model = testing::ShippedModelConfig("gpt2-350m");
  workload.batch_size = batch_size;
  workload.seq_len = 1024;
  return workload;
}

// The activations the planner charges a rank are what the trainer's model allocates
// (Transformer::ActivationBytes) at the workload's type, bf16, plus at tp = 1 one chunk of the
// fused classifier's logits: GPT-2 350M at micro-batches of 4 x 1024 tokens keeps all 4,096 rows
// of them on a GPU, in bf16 (GpuClassifierChunkRows(50257, 2) = 10,624), each 50,264 values apart
// (GpuLogitsStride), and 640 rows in float32 on the CPU (ClassifierChunkRows(50257)). Korthikanti
// et al.'s sbh(34 + 5as/h) a layer (REFERENCES.md 7), which counts Megatron's attention scores and
// dropout masks, is 3.56 times what a block keeps here: 16 bf16 values a token and channel (32
// bytes, its input and what its backward reads) and 20 float32 statistics a token (the norms' and
// the log-sum-exp's).
TEST(CostModelTest, ActivationsAreWhatTheTrainerAllocates) {
  const ClusterSpec cluster = testing::CatalogCluster(1, "a100-80gb", "ib-hdr");
  const Workload workload = Gpt2Workload(64);
  const ModelConfig& model = workload.model;
  const int b = 4, s = workload.seq_len;
  ASSERT_EQ(workload.precision.activation_bytes, 2);
  constexpr DataType kBf16 = DataType::kBF16;
  ASSERT_EQ(GpuClassifierChunkRows(model.vocab_size, 2), 10624);
  ASSERT_EQ(GpuLogitsStride(model.vocab_size), 50264);
  const double logits = 4096.0 * 50264 * 2;
  for (const Recompute recompute : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    const Layout layout{.dp = 8, .micro_batch = b, .recompute = recompute};
    const double arena = Transformer::ActivationBytes(model, b, s, recompute, {}, false, 1, kBf16);
    EXPECT_DOUBLE_EQ(EstimateLayout(workload, cluster, layout).memory.activation_bytes,
                     arena + logits)
        << RecomputeName(recompute);
  }
  // A micro-batch of 16 x 1024 tokens is two chunks on a GPU: one chunk's rows are counted.
  const Layout larger{.dp = 8, .micro_batch = 16};
  EXPECT_DOUBLE_EQ(
      EstimateLayout(workload, cluster, larger).memory.activation_bytes,
      Transformer::ActivationBytes(model, 16, s, Recompute::kNone, {}, false, 1, kBf16) +
          10624.0 * 50264 * 2);
  Workload on_cpu = workload;
  on_cpu.on_gpus = false;
  const Layout layout{.dp = 8, .micro_batch = b};
  EXPECT_DOUBLE_EQ(
      EstimateLayout(on_cpu, cluster, layout).memory.activation_bytes,
      Transformer::ActivationBytes(model, b, s, Recompute::kNone, {}, false, 1, kBf16) +
          640.0 * model.vocab_size * 4);
  // Tensor parallel, with and without sequence parallelism: a rank's share of the heads, the MLP
  // and the vocabulary (whose logits chunk is in the arena).
  for (const bool sp : {false, true}) {
    const Layout layout{.tp = 4, .dp = 2, .micro_batch = b, .sequence_parallel = sp};
    EXPECT_DOUBLE_EQ(
        EstimateLayout(workload, cluster, layout).memory.activation_bytes,
        Transformer::ActivationBytes(model, b, s, Recompute::kNone, {.tp_size = 4}, sp, 1, kBf16))
        << sp;
  }
  // A block's share: what one more block adds.
  ModelConfig fewer = model;
  --fewer.n_layer;
  const double block =
      Transformer::ActivationBytes(model, b, s, Recompute::kNone, {}, false, 1, kBf16) -
      Transformer::ActivationBytes(fewer, b, s, Recompute::kNone, {}, false, 1, kBf16);
  const double sbh = static_cast<double>(s) * b * model.d_model;
  EXPECT_DOUBLE_EQ(block, 32 * sbh + 20.0 * 4 * s * b);
  const double korthikanti = sbh * (34 + 5.0 * model.n_head * s / model.d_model);
  EXPECT_NEAR(korthikanti / block, 3.56, 0.01);
}

// The per-step traffic the communicator will be compared with: 2Ψ per step for DDP, 3 x 2Ψ per
// micro-batch for ZeRO-3, 4 all-reduces of b*s*h per layer per micro-batch for TP, 2 more for
// the vocabulary-parallel embedding and head (and the gradient norm's one double per step).
TEST(CostModelTest, TrafficPerStepFollowsTheStrategy) {
  const ClusterSpec cluster = testing::CatalogCluster(2, "a100-80gb", "ib-hdr");
  const Workload workload = Gpt2Workload(64);
  const double psi = static_cast<double>(workload.model.num_parameters());
  Layout ddp{.strategy = Strategy::kDdp, .dp = 16, .micro_batch = 2};
  const Estimate ddp_estimate = EstimateLayout(workload, cluster, ddp);
  EXPECT_EQ(ddp_estimate.micro_batches, 2);
  EXPECT_DOUBLE_EQ(ddp_estimate.dp.payload_bytes, 2 * psi);
  EXPECT_DOUBLE_EQ(ddp_estimate.dp.sent_bytes, 2 * psi * 2 * 15.0 / 16);

  Layout zero3 = ddp;
  zero3.strategy = Strategy::kZero3;
  EXPECT_DOUBLE_EQ(EstimateLayout(workload, cluster, zero3).dp.payload_bytes, 2 * 3 * 2 * psi);

  Layout tp{.strategy = Strategy::kDdp, .tp = 4, .dp = 4, .micro_batch = 4};
  const Estimate tp_estimate = EstimateLayout(workload, cluster, tp);
  const double per_all_reduce = 4.0 * 1024 * 1024 * 2;  // b*s*h bf16
  // Per micro-batch: 4 per layer, the embedding's and the head's, and the vocabulary-parallel
  // softmax's max, sum and target logit per token in float32.
  const double softmax_stats = 3.0 * 4 * 1024 * sizeof(float);
  EXPECT_DOUBLE_EQ(
      tp_estimate.tp.payload_bytes,
      tp_estimate.micro_batches * ((24 * 4 + 2) * per_all_reduce + softmax_stats) + sizeof(double));
  EXPECT_DOUBLE_EQ(tp_estimate.dp.payload_bytes, 2 * StageParams(workload.model, {.tp_size = 4}));
}

// The optimizer step reads and writes its bytes a parameter at the memory bandwidth's assumed
// fraction, over each rank's shard: all its parameters under ddp, 1/dp of them sharded (it was
// not costed, and ddp looked faster than zero1 where the update of every parameter on every rank
// costs more than zero1's gathers save). With offload the host does it instead.
TEST(CostModelTest, TheOptimizerStepIsTheShardsBytesAtTheMemoryBandwidth) {
  EXPECT_DOUBLE_EQ(Precision::Fp32().OptimizerStepBytes(), 28);
  EXPECT_DOUBLE_EQ(Precision::MixedBf16().OptimizerStepBytes(), 28);
  EXPECT_DOUBLE_EQ(Precision::Trainer(true).OptimizerStepBytes(), 30);
  const ClusterSpec cluster = testing::CatalogCluster(1, "h100-sxm", "ib-ndr");
  EXPECT_EQ(cluster.memory_gbps, 3350);
  Workload workload = Gpt2Workload(64);
  workload.precision = Precision::Trainer(true);
  const double psi = static_cast<double>(workload.model.num_parameters());
  const Layout ddp{.strategy = Strategy::kDdp, .dp = 8, .micro_batch = 8};
  const Estimate ddp_estimate = EstimateLayout(workload, cluster, ddp);
  EXPECT_NEAR(ddp_estimate.time.optimizer_ms, 1e3 * psi * 30 / (3350e9 * 0.8), 1e-9);
  Layout zero1 = ddp;
  zero1.strategy = Strategy::kZero1;
  const Estimate zero1_estimate = EstimateLayout(workload, cluster, zero1);
  EXPECT_NEAR(zero1_estimate.time.optimizer_ms, ddp_estimate.time.optimizer_ms / 8, 1e-9);
  EXPECT_NEAR(ddp_estimate.time.step_ms - ddp_estimate.time.optimizer_ms,
              ddp_estimate.time.compute_ms + ddp_estimate.dp.exposed_ms, 1e-9);
  Layout offload = zero1;
  offload.strategy = Strategy::kZero2;
  offload.offload = true;
  EXPECT_EQ(EstimateLayout(workload, cluster, offload).time.optimizer_ms, 0);
}

// Pipelined, the tensor-parallel traffic is the first stage's blocks' (4 per block and
// micro-batch, the embedding's, the gradient norm's double): 24 layers over 2 stages put 14 on the
// first (the head weighs about 4 blocks on the last), where 24 / 2 counted 12.
TEST(CostModelTest, TensorParallelTrafficCountsTheFirstStagesBlocks) {
  const ClusterSpec cluster = testing::CatalogCluster(2, "a100-80gb", "ib-hdr");
  const Workload workload = Gpt2Workload(64);
  const Layout layout{.strategy = Strategy::kDdp, .tp = 2, .pp = 2, .dp = 4, .micro_batch = 4};
  const StageAssignment assignment = *AssignStages(
      PipelineFlopsPerToken(workload.model, workload.seq_len, Recompute::kNone), 2, 1);
  int first_blocks = 0;
  for (const BlockSpan& chunk : StageChunks(assignment, 0)) first_blocks += chunk.count;
  ASSERT_EQ(first_blocks, 14);
  const Estimate estimate = EstimateLayout(workload, cluster, layout);
  const double per_all_reduce = 4.0 * 1024 * 1024 * 2;  // b*s*h bf16
  EXPECT_DOUBLE_EQ(estimate.tp.payload_bytes,
                   estimate.micro_batches * (4 * first_blocks + 1) * per_all_reduce +
                       sizeof(double));  // the gradient norm's
}

// More tp ranks than kv heads replicate them: each rank holds one kv head, whether the model has
// 8 of them or 2 (it counted a quarter of a head at 2).
TEST(CostModelTest, ReplicatedKvHeadsCountWholeOnEachRank) {
  const ModelConfig eight = testing::ShippedModelConfig("llama-70b");
  ModelConfig two = eight;
  two.n_kv_head = 2;
  const double per_layer_kv = 2.0 * eight.head_dim * eight.d_model;  // one k and v head
  for (const int tp : {1, 2, 8}) {
    const double difference =
        StageParams(eight, {.tp_size = tp}) - StageParams(two, {.tp_size = tp});
    // The heads a rank does not hold of 8, less those of 2: none when each rank holds one.
    const double held_of_eight = std::max(1, 8 / tp), held_of_two = std::max(1, 2 / tp);
    EXPECT_NEAR(difference, eight.n_layer * per_layer_kv * (held_of_eight - held_of_two), 1e-3)
        << "tp " << tp;
  }
}

// parallel.reduce_dtype sets the bytes a gradient moves in the data-parallel reductions, and
// nothing else: auto keeps the gradients' own type (float32 here), bf16 halves the traffic,
// fp32 doubles a mixed-precision plan's.
TEST(CostModelTest, ReduceDtypeSetsTheGradientTraffic) {
  Recipe recipe = testing::ShippedRecipe("gpt2-124m");
  const ClusterSpec cluster = testing::CatalogCluster(2, "a100-80gb", "ib-hdr");
  const Layout ddp{.strategy = Strategy::kDdp, .dp = 16, .micro_batch = 2};
  const auto traffic = [&](const char* reduce_dtype, Precision precision) {
    recipe.parallel.reduce_dtype = reduce_dtype;
    return EstimateLayout(WorkloadFromRecipe(recipe, precision), cluster, ddp);
  };
  const Estimate fp32 = traffic("auto", Precision::Fp32());
  const Estimate bf16 = traffic("bf16", Precision::Fp32());
  EXPECT_DOUBLE_EQ(bf16.dp.payload_bytes, fp32.dp.payload_bytes / 2);
  EXPECT_LT(bf16.dp.time_ms, fp32.dp.time_ms);
  EXPECT_DOUBLE_EQ(bf16.memory.grad_bytes, fp32.memory.grad_bytes);  // gradients stay float32
  EXPECT_DOUBLE_EQ(traffic("fp32", Precision::MixedBf16()).dp.payload_bytes,
                   2 * traffic("auto", Precision::MixedBf16()).dp.payload_bytes);
}

// bf16 parameters multiply on the bf16 tensor cores; float32 ones at run.matmul_precision:
// float32 (highest, and auto) or TF32 (high), whose peaks the compute time is divided by.
TEST(CostModelTest, GemmsRunAtThePeakOfTheirPrecision) {
  Recipe recipe = testing::ShippedRecipe("gpt2-124m");
  const ClusterSpec cluster = testing::CatalogCluster(1, "h100-sxm", "ib-ndr");
  const Layout ddp{.strategy = Strategy::kDdp, .dp = 1, .micro_batch = 8};
  const auto compute_ms = [&](const char* precision, const char* matmul_precision) {
    recipe.run.precision = precision;
    recipe.run.matmul_precision = matmul_precision;
    const Workload workload = GpuWorkloadFromRecipe(recipe);
    return EstimateLayout(workload, cluster, ddp).time.compute_ms;
  };
  const double bf16 = compute_ms("bf16", "auto");
  EXPECT_NEAR(compute_ms("fp32", "auto") / bf16, 989.0 / 67, 1e-9);
  EXPECT_NEAR(compute_ms("fp32", "highest") / bf16, 989.0 / 67, 1e-9);
  EXPECT_NEAR(compute_ms("fp32", "high") / bf16, 989.0 / 495, 1e-9);
  EXPECT_DOUBLE_EQ(compute_ms("fp32", "medium"), bf16);
  // An overridden bf16 peak moves the others in proportion.
  ClusterSection section;
  section.gpu = "a100-80gb";
  section.peak_tflops = 624;
  const absl::StatusOr<ClusterSpec> doubled = ResolveCluster(section);
  ASSERT_TRUE(doubled.ok()) << doubled.status();
  EXPECT_DOUBLE_EQ(doubled->GemmPeakTflops(MatmulPrecision::kHighest), 39);
  EXPECT_DOUBLE_EQ(doubled->GemmPeakTflops(MatmulPrecision::kHigh), 312);
}

TEST(CostModelTest, PipelineBubbleIsStagesMinusOneOverMicroBatches) {
  const ClusterSpec cluster = testing::CatalogCluster(4, "a100-80gb", "ib-hdr");
  const Workload workload = Gpt2Workload(256);
  const Layout layout{.pp = 4, .dp = 8, .micro_batch = 2};
  const Estimate estimate = EstimateLayout(workload, cluster, layout);
  EXPECT_EQ(estimate.micro_batches, 16);
  EXPECT_DOUBLE_EQ(estimate.time.bubble_ms, 3.0 / 16 * estimate.time.compute_ms);
  EXPECT_GT(estimate.pp.exposed_ms, 0);
}

// The mesh puts each stage's dp x tp ranks together: with stages of 4 ranks on nodes of 8, the
// boundary between stages 1 and 2 crosses nodes, the others stay inside one; stages of 3 ranks
// straddle a node's edge at boundary 1 (rank 5 sends to rank 8).
TEST(CostModelTest, StageBoundariesCrossNodesWhereTheirRanksStraddleANodesEdge) {
  EXPECT_FALSE(StageBoundaryCrossesNodes(0, 4, 8));
  EXPECT_TRUE(StageBoundaryCrossesNodes(1, 4, 8));
  EXPECT_FALSE(StageBoundaryCrossesNodes(2, 4, 8));
  EXPECT_FALSE(StageBoundaryCrossesNodes(0, 3, 8));
  EXPECT_TRUE(StageBoundaryCrossesNodes(1, 3, 8));
  EXPECT_TRUE(StageBoundaryCrossesNodes(0, 8, 8));  // a stage a node: every boundary
}

// Stages smaller than a node still send over the network where a boundary crosses one: pp 8 x
// dp 4 on 4 nodes of 8 (3 of its 7 boundaries cross) runs at the network's pace, as pp 4 x dp 8
// does (every boundary crosses), not at NVLink's (the estimate it had).
TEST(CostModelTest, PipelineSendsOverTheNetworkWhereStagesCrossNodes) {
  const ClusterSpec cluster = testing::CatalogCluster(4, "h100-sxm", "eth-25");
  const Workload workload = Gpt2Workload(256);
  const Estimate small_stages =
      EstimateLayout(workload, cluster, {.pp = 8, .dp = 4, .micro_batch = 2});
  const Estimate node_stages =
      EstimateLayout(workload, cluster, {.pp = 4, .dp = 8, .micro_batch = 2});
  // Per micro-batch and direction: one send of the same bytes at the same (network) speed.
  EXPECT_DOUBLE_EQ(small_stages.pp.time_ms / (2.0 * small_stages.micro_batches),
                   node_stages.pp.time_ms / (2.0 * node_stages.micro_batches));
  const double send_ms = small_stages.pp.time_ms / (2.0 * small_stages.micro_batches);
  // The warm-up crosses 3 boundaries at the network's pace and 4 at NVLink's, a fraction of it.
  EXPECT_GT(small_stages.pp.exposed_ms, 2.0 * (small_stages.micro_batches + 3) * send_ms);
  EXPECT_LT(small_stages.pp.exposed_ms, 2.0 * (small_stages.micro_batches + 7) * send_ms);
}

// A pipeline runs at the pace of its heaviest stage on the blocks the trainer assigns it: GPT-2
// 350M's first three stages hold 7 of the 24 blocks each, the last 3 and the head (3.8 blocks'
// FLOPs), so a micro-batch takes 7 blocks' time where the whole model takes 24 and the head's.
TEST(CostModelTest, APipelineRunsAtItsHeaviestStagesPace) {
  const Workload workload = Gpt2Workload(256);
  const Estimate whole = EstimateLayout(workload, testing::CatalogCluster(1, "a100-80gb", "ib-hdr"),
                                        {.dp = 8, .micro_batch = 2});
  const Estimate piped = EstimateLayout(workload, testing::CatalogCluster(4, "a100-80gb", "ib-hdr"),
                                        {.pp = 4, .dp = 8, .micro_batch = 2});
  ASSERT_EQ(whole.micro_batches, piped.micro_batches);
  const PipelineCosts costs =
      PipelineFlopsPerToken(workload.model, workload.seq_len, Recompute::kNone);
  const double block = costs.blocks[0];
  EXPECT_DOUBLE_EQ(piped.time.compute_ms / whole.time.compute_ms,
                   7 * block / (24 * block + costs.head));
}

// Interleaving v = 2 chunks per stage (Narayanan et al. 2021): the bubble is (p - 1) / (v m) of the
// compute, half 1F1B's; the first stage sends each micro-batch's activations out of both its
// chunks and the gradient into its second (2v - 1 = 3 messages, 1F1B's one); a slot holds one
// chunk, half a stage's layers.
TEST(CostModelTest, InterleavingDividesTheBubbleForMoreMessages) {
  const ClusterSpec cluster = testing::CatalogCluster(4, "a100-80gb", "ib-hdr");
  const Workload workload = Gpt2Workload(256);
  Layout layout{.pp = 4, .dp = 8, .micro_batch = 2};
  const Estimate one_f_one_b = EstimateLayout(workload, cluster, layout);
  layout.schedule = PipelineSchedule::kInterleaved;
  layout.virtual_stages = 2;
  const Estimate interleaved = EstimateLayout(workload, cluster, layout);
  EXPECT_DOUBLE_EQ(interleaved.time.bubble_ms, 3.0 / (2 * 16) * interleaved.time.compute_ms);
  // Of each one's compute (the two assignments' heaviest stages differ).
  EXPECT_DOUBLE_EQ(interleaved.time.bubble_ms / interleaved.time.compute_ms,
                   one_f_one_b.time.bubble_ms / one_f_one_b.time.compute_ms / 2);
  const double activations = static_cast<double>(workload.seq_len) * 2 * workload.model.d_model *
                             workload.precision.activation_bytes;
  EXPECT_DOUBLE_EQ(interleaved.pp.sent_bytes - one_f_one_b.pp.sent_bytes, 16 * 2 * activations);
  // Stage 0 holds Megatron's interleaved warm-up plus one: 2 (p - 1) + (v - 1) p + 1 = 11 slots
  // of its largest chunk, against 1F1B's 4 micro-batches of a whole stage.
  const PipelineShape shape{.schedule = PipelineSchedule::kInterleaved,
                            .stages = 4,
                            .virtual_stages = 2,
                            .micro_batches = 16};
  ASSERT_EQ(PipelineActivationSlots(shape, 0), 11);
  ASSERT_EQ(PipelineActivationSlots(shape, 3), 5);  // the last stage: (v - 1) p + 1
  // The trainer's assignment: the last chunk also carries the head, 3.8 blocks' FLOPs, and the
  // first stages, which hold the most, get the fewest blocks: stage 0 runs blocks 0 and 11-14,
  // stage 3 blocks 7-10 and 23 with the head.
  const ModelConfig& model = workload.model;
  const int s = workload.seq_len;
  const StageAssignment assignment =
      *AssignStages(PipelineFlopsPerToken(model, s, Recompute::kNone), 4, 2);
  ASSERT_EQ(assignment.first_block, (std::vector<int>{0, 1, 3, 7, 11, 15, 19, 23, 24}));
  const double chunk = Transformer::ActivationBytes(model, 2, s, Recompute::kNone,
                                                    {.chunks = StageChunks(assignment, 0)}, false,
                                                    11, DataType::kBF16);
  const double last = Transformer::ActivationBytes(model, 2, s, Recompute::kNone,
                                                   {.chunks = StageChunks(assignment, 3)}, false, 5,
                                                   DataType::kBF16);
  const double logits = 2048.0 * model.vocab_size * 2;  // the micro-batch's rows, in bf16
  EXPECT_DOUBLE_EQ(interleaved.memory.activation_bytes, std::max(chunk, last + logits));
}

// A stage keeps the activations of the micro-batches its schedule has in flight, as many slots as
// the trainer gives it (PipelineActivationSlots): 1F1B's first stage min(p, m) = 4 and its last
// one (plus a chunk of logits); GPipe every one of the m = 16 on each, the first stage, with the
// most blocks, the heaviest. Same bubble, so the same time: GPipe never pays.
TEST(CostModelTest, PipelineActivationsAreTheSchedulesMicroBatchesInFlight) {
  const ClusterSpec cluster = testing::CatalogCluster(4, "a100-80gb", "ib-hdr");
  const Workload workload = Gpt2Workload(256);
  const ModelConfig& model = workload.model;
  const int p = 4, m = 16, b = 2, s = workload.seq_len;
  // The trainer's assignment of GPT-2 350M's 24 blocks: the last stage also carries the head,
  // 3.8 blocks' FLOPs, and a chunk of logits.
  const StageAssignment assignment =
      *AssignStages(PipelineFlopsPerToken(model, s, Recompute::kNone), p, 1);
  ASSERT_EQ(assignment.first_block, (std::vector<int>{0, 7, 14, 21, 24}));
  const auto stage_bytes = [&](int stage, int slots) {
    return Transformer::ActivationBytes(model, b, s, Recompute::kNone,
                                        {.chunks = StageChunks(assignment, stage)}, false, slots,
                                        DataType::kBF16);
  };
  const double logits_bytes = 640.0 * model.vocab_size * 2;
  Layout layout{.pp = p, .dp = 8, .micro_batch = b};
  const Estimate one_f_one_b = EstimateLayout(workload, cluster, layout);
  ASSERT_EQ(one_f_one_b.micro_batches, m);
  EXPECT_DOUBLE_EQ(one_f_one_b.memory.activation_bytes,
                   std::max(stage_bytes(0, p), stage_bytes(3, 1) + logits_bytes));
  layout.schedule = PipelineSchedule::kGpipe;
  const Estimate gpipe = EstimateLayout(workload, cluster, layout);
  EXPECT_DOUBLE_EQ(gpipe.memory.activation_bytes, stage_bytes(0, m));
  EXPECT_DOUBLE_EQ(gpipe.time.step_ms, one_f_one_b.time.step_ms);
}

// Pipelined, the sharded strategies reduce-scatter a stage's gradient once per step, after its
// last backward, and ZeRO-3 / FSDP gather the stage once per step (DataParallelEngine::
// BeginPipelinedStep): Ψ of the stage gathered and Ψ reduce-scattered, in bf16, whatever the 16
// micro-batches. The stage's gathered parameters (bf16, from bf16 shards) and its whole gradient
// are held meanwhile: float32 accumulators and their reduce-scatter's bf16 copies, each with its
// 1/8 shard (up to the padding of each block to 8 slices).
TEST(CostModelTest, PipelinedShardingMovesTheStageOncePerStep) {
  const ClusterSpec cluster = testing::CatalogCluster(4, "a100-80gb", "ib-hdr");
  const Workload workload = Gpt2Workload(256);
  // The first stage, blocks 0-6 and the embedding, has the most (the assignment tested above).
  const double stage = StageParams(workload.model, {.chunks = {{0, 7}}});
  for (const Strategy strategy : {Strategy::kZero2, Strategy::kZero3, Strategy::kFsdp}) {
    const Layout layout{.strategy = strategy, .pp = 4, .dp = 8, .micro_batch = 2};
    const Estimate estimate = EstimateLayout(workload, cluster, layout);
    EXPECT_EQ(estimate.micro_batches, 16);
    EXPECT_DOUBLE_EQ(estimate.dp.payload_bytes, 2 * 2 * stage);
    const double gradient = (4 + 2) * (stage + stage / 8);
    const double held = gradient + (strategy == Strategy::kZero2 ? 0 : 2 * (stage + stage / 8));
    EXPECT_NEAR(estimate.memory.temporary_bytes, held, 1e-6 * held);
  }
}

TEST(CostModelTest, RecomputationTradesMemoryForTime) {
  const ClusterSpec cluster = testing::CatalogCluster(1, "a100-80gb", "ib-hdr");
  const Workload workload = Gpt2Workload(64);
  Layout layout{.dp = 8, .micro_batch = 8};
  const Estimate none = EstimateLayout(workload, cluster, layout);
  layout.recompute = Recompute::kFull;
  const Estimate full = EstimateLayout(workload, cluster, layout);
  EXPECT_LT(full.memory.activation_bytes, none.memory.activation_bytes / 4);
  EXPECT_GT(full.time.compute_ms, 1.2 * none.time.compute_ms);
  EXPECT_NEAR(full.time.mfu * full.time.step_ms, none.time.mfu * none.time.step_ms, 1e-9);
}

// A small model's step is well under a millisecond: one decimal would print every layout's as
// 0.1 ms and hide the 14% between them.
TEST(CostModelTest, SubMillisecondTimesKeepTwoSignificantDigits) {
  EXPECT_EQ(FormatMs(0.0678), "0.068");
  EXPECT_EQ(FormatMs(0.0781), "0.078");
  EXPECT_EQ(FormatMs(0), "0.0");
  EXPECT_EQ(FormatMs(2.04), "2.0");
  EXPECT_EQ(FormatMs(1234.56), "1234.6");
}

}  // namespace
}  // namespace dtrain
