#include "parallel/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/backend/cpu/cpu_backend.h"
#include "core/model/init.h"
#include "core/model/sampler.h"
#include "core/model/transformer.h"
#include "gtest/gtest.h"
#include "tests/parallel/comm/test_store.h"
#include "tests/testing/flat_parameters.h"
#include "tests/testing/small_model.h"
#include "tests/testing/tensor_parallel_ranks.h"

namespace dtrain {
namespace {

constexpr int kBatch = 2, kTime = 7;
constexpr uint64_t kSeed = 11;

std::vector<int32_t> Tokens(int vocab, int salt) {
  return testing::PatternTokens(kBatch * kTime, vocab, salt);
}

// What one model (whole or one tensor-parallel rank) computed.
struct RankResult {
  double loss = 0;
  std::vector<float> grads;
  double eval_loss = 0;                    // ForwardLoss after the step
  std::vector<float> logits, last_logits;  // ForwardLogits (b, t, V) and (b, V)
  std::vector<int32_t> sample;             // Generate from the inputs at temperature 1
  CommStats step;                          // the tp group's collectives in ForwardBackward
};

// One training micro-batch (and, under kFull, its recomputation) on the model `table` holds,
// then evaluation, logits and sampling. `tp` is the communicator under `tensor_parallel` (null
// without one).
// With `documents`, each row packs two documents (SFT): positions restart at the cut, and the
// model attends within each.
RankResult TrainOneStep(const ModelConfig& config, const ParamTable& table, Recompute recompute,
                        TensorParallelOps* tensor_parallel, const Communicator* tp = nullptr,
                        bool sequence_parallel = false, bool documents = false) {
  CpuBackend backend(1);
  testing::FlatParameters parameters(table, backend);
  testing::InitDistinctParameters(config, table, kSeed, parameters.params().data());
  Transformer model(config, table, parameters, backend, kBatch, kTime, recompute, tensor_parallel,
                    sequence_parallel);
  // The memory estimate knows the rank's local sizes (and the replicated kv heads' scratch, the
  // sequence-parallel rows).
  EXPECT_EQ(Transformer::ActivationBytes(config, kBatch, kTime, recompute, table.slice(),
                                         sequence_parallel),
            static_cast<double>(model.activation_bytes()));
  const auto inputs = Tokens(config.vocab_size, 1), targets = Tokens(config.vocab_size, 2);
  std::vector<int32_t> document_positions = {0, 1, 2, 0, 1, 2, 3, 0, 1, 0, 1, 2, 3, 4};
  const int32_t* positions = documents ? document_positions.data() : nullptr;
  RankResult result;
  result.loss = testing::ForwardBackwardLoss(model, inputs.data(), targets.data(), kBatch, kTime,
                                             0.25f, positions);
  result.grads.assign(parameters.grads().begin(), parameters.grads().end());
  if (tp != nullptr) result.step = tp->stats();
  // Evaluation and sampling run the same vocabulary-parallel phases without gradients.
  result.eval_loss = model.ForwardLoss(inputs.data(), targets.data(), kBatch, kTime, positions);
  result.logits.resize(static_cast<size_t>(kBatch) * kTime * config.vocab_size);
  model.ForwardLogits(inputs.data(), kBatch, kTime, false, result.logits.data(), positions);
  result.last_logits.resize(static_cast<size_t>(kBatch) * config.vocab_size);
  model.ForwardLogits(inputs.data(), kBatch, kTime, true, result.last_logits.data(), positions);
  SamplingOptions sampling;
  sampling.max_new_tokens = 6;
  sampling.temperature = 1.0f;
  result.sample = Generate(model, {inputs.begin(), inputs.begin() + kTime}, kTime, sampling);
  return result;
}

struct Case {
  ModelFamily family;
  int tp;
  Recompute recompute;
  int vocab = 61;  // the small model's: all of it on rank 0, the other ranks' slots padding
  bool sequence_parallel = false;
  bool documents = false;  // packed SFT documents (positions)
};

class TensorParallelTest : public ::testing::TestWithParam<Case> {};

// A model split over tp ranks (threads here, each with Gloo communicators for the tensor-
// parallel group and, when kv heads are replicated, for the ranks sharing one) gives the whole
// model's loss and, on every rank, its slice of the whole model's gradients: the f and g
// all-reduces sit where Megatron puts them, row-parallel biases count once, and replicated kv
// heads sum their gradients over the ranks that hold them.
//
// Tolerance: both sides compute the same sums of float products, in another order (a rank's
// partial GEMM over its heads or MLP columns, then the all-reduce), so they differ by float32
// rounding, a few units of 2^-24 relative to the magnitudes summed, compounded through 3
// blocks: 1e-5 of the model's largest gradient, as for micro-batch accumulation in
// transformer_test.cc.
TEST_P(TensorParallelTest, ShardsGiveTheWholeModelsLossAndGradients) {
  const Case c = GetParam();
  ModelConfig config = testing::SmallModelConfig(c.family);  // llama: 2 kv heads
  config.vocab_size = c.vocab;
  ASSERT_TRUE(CheckTensorParallel(config, c.tp).ok());
  const ParamTable whole(config, ModelSlice{});
  const RankResult reference =
      TrainOneStep(config, whole, c.recompute, nullptr, nullptr, false, c.documents);
  float max_abs = 0;
  for (float g : reference.grads) max_abs = std::max(max_abs, std::abs(g));
  ASSERT_GT(max_abs, 0);

  std::vector<RankResult> results(c.tp);
  const std::vector<std::unique_ptr<ParamTable>> tables = testing::RunTensorParallelRanks(
      config, c.tp, [&](const ParamTable& table, TensorParallelOps* ops, const Communicator& tp) {
        results[table.slice().tp_rank] =
            TrainOneStep(config, table, c.recompute, ops, &tp, c.sequence_parallel, c.documents);
      });

  // The tp group's collectives in one ForwardBackward of L blocks (one classifier chunk). Plain
  // tp: an all-reduce per f and g, 4 per block (5 under kFull, whose recomputed forward sums the
  // attention output again), and 4 for the vocabulary: the embedding's g, the head's f, each
  // row's max and its sums. Sequence parallel: each f and g becomes a reduce-scatter or an
  // all-gather (kFull's recomputation gathers both norm outputs and reduce-scatters the
  // attention output: 3 per block), the final norm's output is gathered for the head and
  // d(embedding output) for the embedding's backward, and the norms' weight gradients are summed
  // once per block and once for the final norm.
  const int64_t layers = config.n_layer;
  const int64_t full = c.recompute == Recompute::kFull ? 1 : 0;
  for (int rank = 0; rank < c.tp; ++rank) {
    SCOPED_TRACE(::testing::Message() << "rank " << rank);
    const CommStats& step = results[rank].step;
    if (c.sequence_parallel) {
      EXPECT_EQ(step.reduce_scatter.calls, 4 * layers + 2 + full * layers);
      EXPECT_EQ(step.all_gather.calls, 4 * layers + 2 + 2 * full * layers);
      EXPECT_EQ(step.all_reduce.calls, layers + 3);
    } else {
      EXPECT_EQ(step.all_reduce.calls, 4 * layers + 4 + full * layers);
      EXPECT_EQ(step.reduce_scatter.calls + step.all_gather.calls, 0);
    }
  }

  for (int rank = 0; rank < c.tp; ++rank) {
    SCOPED_TRACE(::testing::Message() << "rank " << rank);
    EXPECT_NEAR(results[rank].loss, reference.loss, 1e-6 * reference.loss);
    EXPECT_NEAR(results[rank].eval_loss, reference.eval_loss, 1e-6 * reference.eval_loss);
    // Logits of order 1 from sums of C = 32 products, each side rounded differently: 1e-5.
    ASSERT_EQ(results[rank].logits.size(), reference.logits.size());
    for (size_t i = 0; i < reference.logits.size(); ++i) {
      ASSERT_NEAR(results[rank].logits[i], reference.logits[i], 1e-5) << "logit " << i;
    }
    for (size_t i = 0; i < reference.last_logits.size(); ++i) {
      ASSERT_NEAR(results[rank].last_logits[i], reference.last_logits[i], 1e-5) << "logit " << i;
    }
    // Every rank samples the same real tokens (the sampler draws from the V real logits only).
    EXPECT_EQ(results[rank].sample, results[0].sample);
    for (int32_t token : results[rank].sample) EXPECT_LT(token, c.vocab);
    ASSERT_EQ(results[rank].grads.size(), tables[rank]->total_numel());
    for (const TensorEntry& entry : tables[rank]->entries()) {
      const TensorEntry& global = *whole.Find(entry.name);
      ForEachGlobalRun(entry, 0, entry.numel, [&](size_t local, size_t g, size_t count) {
        for (size_t i = 0; i < count; ++i) {
          ASSERT_NEAR(results[rank].grads[entry.offset + local + i],
                      reference.grads[global.offset + g + i], 1e-5 * max_abs)
              << entry.name << " local " << local + i;
        }
      });
    }
  }
  // The ranks' counted ranges add up to the whole model's squared gradient norm. Each counted
  // gradient a is within delta = 1e-5 max_abs of its whole-model b (checked above), so
  // |sum a^2 - sum b^2| = |sum (a - b)(a + b)| <= delta sum (2 |b| + delta).
  double sum_squares = 0, reference_sum_squares = 0, bound = 0;
  const double delta = 1e-5 * max_abs;
  for (float g : reference.grads) {
    reference_sum_squares += static_cast<double>(g) * g;
    bound += delta * (2 * std::abs(g) + delta);
  }
  for (int rank = 0; rank < c.tp; ++rank) {
    for (const auto& [begin, end] : tables[rank]->CountedRanges()) {
      for (size_t i = begin; i < end; ++i) {
        sum_squares += static_cast<double>(results[rank].grads[i]) * results[rank].grads[i];
      }
    }
  }
  EXPECT_NEAR(sum_squares, reference_sum_squares, bound);
  // Replicated tensors (norms, row-parallel biases, embeddings, head) get the same gradient
  // on every rank, bit for bit: the same kernels see the same all-reduced inputs.
  for (const TensorEntry& entry : tables[0]->entries()) {
    if (entry.shape != entry.global_shape) continue;
    for (int rank = 1; rank < c.tp; ++rank) {
      const TensorEntry& other = *tables[rank]->Find(entry.name);
      if (other.shape != entry.shape) continue;  // a vocabulary all in rank 0's slot
      ASSERT_TRUE(std::equal(results[0].grads.begin() + entry.offset,
                             results[0].grads.begin() + entry.offset + entry.numel,
                             results[rank].grads.begin() + other.offset))
          << entry.name << " rank " << rank;
    }
  }
}

// A vocabulary of 349,526 at tp 2 gives slots of 174,784 columns, for which the classifier's
// chunks are 128 rows (ClassifierChunkRows): a micro-batch of 10 x 16 = 160 tokens runs
// two chunks, each with its own max and sums all-reduced, and still gives the whole model's loss
// and head gradient. (A tiny model otherwise: 1 block, d_model 8.) Tolerance as in
// ShardsGiveTheWholeModelsLossAndGradients.
TEST(TensorParallelChunksTest, TheClassifierRunsInSeveralChunksOfRows) {
  ModelConfig config = testing::SmallModelConfig(ModelFamily::kGpt2);
  config.n_layer = 1;
  config.n_head = 2;
  config.n_kv_head = 2;
  config.head_dim = 4;
  config.d_model = 8;
  config.d_ff = 16;
  config.vocab_size = 349526;
  const int b = 10, t = 16;
  ASSERT_EQ(ClassifierChunkRows(LocalDimsOf(config, {.tp_rank = 0, .tp_size = 2}).vocab_slot), 128);
  std::vector<int32_t> inputs(b * t), targets(b * t);
  for (int i = 0; i < b * t; ++i) {
    inputs[i] = (i * 7919) % config.vocab_size;
    targets[i] = i % 13 == 0 ? -1 : (i * 104729 + 3) % config.vocab_size;
  }
  struct Result {
    double loss = 0, eval_loss = 0;
    std::vector<float> grads;
  };
  auto run = [&](const ParamTable& table, TensorParallelOps* ops) {
    CpuBackend backend(1);
    testing::FlatParameters parameters(table, backend);
    InitParameters(config, table, kSeed, 0, table.total_numel(), parameters.params().data());
    Transformer model(config, table, parameters, backend, b, t, Recompute::kNone, ops);
    Result result;
    result.loss = testing::ForwardBackwardLoss(model, inputs.data(), targets.data(), b, t, 0.5f);
    result.eval_loss = model.ForwardLoss(inputs.data(), targets.data(), b, t);
    result.grads.assign(parameters.grads().begin(), parameters.grads().end());
    return result;
  };
  const ParamTable whole(config, ModelSlice{});
  const Result reference = run(whole, nullptr);
  float max_abs = 0;
  for (float g : reference.grads) max_abs = std::max(max_abs, std::abs(g));
  std::vector<Result> results(2);
  const auto tables = testing::RunTensorParallelRanks(
      config, 2, [&](const ParamTable& table, TensorParallelOps* ops, const Communicator&) {
        results[table.slice().tp_rank] = run(table, ops);
      });
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(::testing::Message() << "rank " << rank);
    EXPECT_NEAR(results[rank].loss, reference.loss, 1e-6 * reference.loss);
    EXPECT_NEAR(results[rank].eval_loss, reference.eval_loss, 1e-6 * reference.eval_loss);
    const TensorEntry& entry = *tables[rank]->Find("embed.tokens");
    const TensorEntry& global = *whole.Find("embed.tokens");
    ForEachGlobalRun(entry, 0, entry.numel, [&](size_t local, size_t g, size_t count) {
      for (size_t i = 0; i < count; ++i) {
        ASSERT_NEAR(results[rank].grads[entry.offset + local + i],
                    reference.grads[global.offset + g + i], 1e-5 * max_abs)
            << "embed.tokens local " << local + i;
      }
    });
  }
}

// Hooks built without the kv replica group for a model that replicates kv heads: the first
// ReduceKvReplicas is an error naming both keys, kept for the caller, and the hooks do nothing
// afterwards (every later collective would be out of step with the other ranks).
TEST(CommTensorParallelTest, MissingKvReplicaGroupIsKeptAsTheStepsError) {
  testing::RunRanksInThreads(1, absl::Seconds(20), [](Communicator& comm) {
    CommTensorParallel ops(comm, nullptr);
    std::vector<float> x = {1.0f, 2.0f};
    ops.ReduceForward(x.data(), x.size());
    EXPECT_TRUE(ops.Settle().ok());
    ops.ReduceKvReplicas(x.data(), x.size());
    const absl::Status kept = ops.Settle();
    EXPECT_EQ(kept.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(kept.message().find("model.n_kv_head"), std::string::npos) << kept;
    EXPECT_NE(kept.message().find("parallel.tp"), std::string::npos) << kept;
    ops.ReduceBackward(x.data(), x.size());
    EXPECT_EQ(ops.Settle().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(x, (std::vector<float>{1.0f, 2.0f}));
  });
}

// Sequence parallelism's reduce-scatter plus all-gather of an (N, C) activation moves the same
// bytes through the tensor-parallel group as the all-reduce it replaces (a ring all-reduce is a
// reduce-scatter then an all-gather), and the hooks compute the sum and the gather.
TEST(CommTensorParallelTest, SequenceParallelMovesTheAllReducesBytes) {
  constexpr int kRanks = 4;
  constexpr size_t kOwn = 6;  // elements of one rank's rows
  testing::RunRanksInThreads(kRanks, absl::Seconds(30), [](Communicator& comm) {
    CommTensorParallel ops(comm, nullptr);
    const int rank = comm.rank();
    std::vector<float> partial(kRanks * kOwn);
    for (size_t i = 0; i < partial.size(); ++i) partial[i] = static_cast<float>(i + rank);
    std::vector<float> summed = partial;
    ops.ReduceForward(summed.data(), summed.size());
    const CommStats after_all_reduce = comm.stats();

    std::vector<float> own(kOwn), gathered(kRanks * kOwn);
    ops.ScatterRows(partial.data(), own.data(), kOwn);
    ops.GatherRows(own.data(), gathered.data(), kOwn);
    ASSERT_TRUE(ops.Settle().ok());
    EXPECT_EQ(gathered, summed);
    const CommStats stats = comm.stats();
    const int64_t sp_sent = stats.reduce_scatter.bytes_sent + stats.all_gather.bytes_sent;
    const int64_t sp_received =
        stats.reduce_scatter.bytes_received + stats.all_gather.bytes_received;
    EXPECT_GT(after_all_reduce.all_reduce.bytes_sent, 0);
    EXPECT_EQ(sp_sent, after_all_reduce.all_reduce.bytes_sent);
    EXPECT_EQ(sp_received, after_all_reduce.all_reduce.bytes_received);
    EXPECT_EQ(stats.reduce_scatter.calls, 1);
    EXPECT_EQ(stats.all_gather.calls, 1);
    // Gathering in place: this rank's rows already sit at their place in the output.
    std::vector<float> in_place(kRanks * kOwn, -1.0f);
    std::copy(own.begin(), own.end(), in_place.begin() + rank * kOwn);
    ops.GatherRows(in_place.data() + rank * kOwn, in_place.data(), kOwn);
    EXPECT_EQ(in_place, summed);
    // A replicated parameter's gradient from each rank's rows: summed over the group.
    std::vector<float> grad = {static_cast<float>(rank), 1.0f};
    ops.SumRowGradients(grad.data(), grad.size());
    EXPECT_EQ(grad, (std::vector<float>{6.0f, 4.0f}));
  });
}

INSTANTIATE_TEST_SUITE_P(
    Models, TensorParallelTest,
    ::testing::Values(Case{ModelFamily::kGpt2, 2, Recompute::kNone},
                      Case{ModelFamily::kGpt2, 4, Recompute::kFull},
                      Case{ModelFamily::kLlama, 2, Recompute::kNone},  // kv heads split
                      Case{ModelFamily::kLlama, 4, Recompute::kNone},  // kv heads replicated
                      Case{ModelFamily::kLlama, 4, Recompute::kSelective},
                      // Vocabulary 97, padded to 128 (tp 2: rows 64 + 33) or 256 (tp 4: 64 + 33
                      // and two ranks holding no real row).
                      Case{ModelFamily::kGpt2, 2, Recompute::kNone, 97},
                      Case{ModelFamily::kGpt2, 4, Recompute::kNone, 97},
                      Case{ModelFamily::kLlama, 2, Recompute::kNone, 97},
                      Case{ModelFamily::kLlama, 4, Recompute::kFull, 97},
                      // Sequence parallel: 14 tokens split evenly over 2 ranks, padded over 4.
                      Case{ModelFamily::kGpt2, 2, Recompute::kNone, 61, true},
                      // Packed documents (SFT): positions and document-aware attention.
                      Case{ModelFamily::kLlama, 2, Recompute::kNone, 61, false, true},
                      Case{ModelFamily::kGpt2, 2, Recompute::kSelective, 61, true, true},
                      Case{ModelFamily::kGpt2, 2, Recompute::kSelective, 61, true},
                      Case{ModelFamily::kGpt2, 4, Recompute::kFull, 97, true},
                      Case{ModelFamily::kLlama, 2, Recompute::kFull, 61, true},
                      Case{ModelFamily::kLlama, 4, Recompute::kNone, 97, true},
                      Case{ModelFamily::kLlama, 4, Recompute::kSelective, 61, true}),
    [](const auto& info) {
      return absl::StrCat(FamilyName(info.param.family), "_tp", info.param.tp, "_",
                          RecomputeName(info.param.recompute), "_vocab", info.param.vocab,
                          info.param.sequence_parallel ? "_sp" : "",
                          info.param.documents ? "_documents" : "");
    });

}  // namespace
}  // namespace dtrain
