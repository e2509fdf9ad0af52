// Checkpoints across parallel layouts: a state saved under tensor parallelism (tp x dp, DDP or
// ZeRO-3) loads under any other layout, each rank receiving exactly the whole model's values of
// the elements it holds. Ranks are threads with Gloo communicators over one in-memory store;
// the engines are filled directly (no training), so every value is a known function of its
// place in the whole model and the comparisons are exact (values are only copied).
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/backend/cpu/cpu_backend.h"
#include "core/checkpoint/reader.h"
#include "core/checkpoint/tools.h"
#include "core/model/param_table.h"
#include "gtest/gtest.h"
#include "parallel/checkpointing.h"
#include "parallel/data_parallel.h"
#include "parallel/sharding.h"
#include "tests/parallel/comm/test_store.h"
#include "tests/testing/checkpoint_v1.h"
#include "tests/testing/run_dtrain.h"
#include "tests/testing/tensor_parallel_ranks.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kStep = 5;
constexpr int64_t kConsumed = 40;  // sequences consumed by the saved run

struct Layout {
  int tp = 1;
  int dp = 1;
  std::string strategy = "ddp";
  bool async = false;
  std::string precision = "fp32";  // run.precision
};

std::string Name(const Layout& layout) {
  return absl::StrCat("tp", layout.tp, "_dp", layout.dp, "_", layout.strategy,
                      layout.precision == "bf16" ? "_bf16" : "");
}

// A vocabulary below 256 needs token data (text is bytes); these tests never read the data.
Recipe BaseRecipe(const std::string& family, const std::string& dir, int vocab = 256) {
  const std::string data = testing::WriteTempFile("ckpt_layouts.txt", "just a few bytes\n");
  absl::StatusOr<Recipe> recipe =
      ParseRecipe(absl::StrCat(R"(
run: {name: layouts, seed: 1, threads: 1}
model: {family: )",
                               family, family == "llama" ? ", n_kv_head: 2" : "", R"(, n_layer: 2,
        n_head: 4, d_model: 32, vocab_size: )",
                               vocab, R"(, max_seq_len: 16}
data: {format: )",
                               vocab < 256 ? "llmc" : "text", ", train: [", data, R"(]}
train: {steps: 10, warmup_steps: 1, batch_size: 8, micro_batch: 2, seq_len: 16}
checkpoint: {dir: )",
                               dir, R"(, keep_last: 3}
)"),
                  "layouts recipe");
  EXPECT_TRUE(recipe.ok()) << recipe.status();
  return recipe.ok() ? *recipe : Recipe{};
}

// The saved value of element `index` of `kind` of the whole model's tensor number `tensor`:
// distinct for every element of the state, and exact in float (below 2^24).
float Value(StateKind kind, size_t tensor, size_t index) {
  return static_cast<float>((static_cast<size_t>(kind) * 64 + tensor) * 32768 + index);
}

// Calls fn(kind, values, expected) for every element of `ranges` (HeldState's or SavedState's),
// `expected` being its value in the whole model's state (Value).
template <typename Fn>
void ForEachIn(const ParamTable& table, const std::vector<StateRange>& ranges, Fn fn) {
  const ParamTable whole(table.config(), ModelSlice{});
  for (const StateRange& range : ranges) {
    for (const TensorEntry& entry : table.entries()) {
      const size_t begin = std::max(range.begin, entry.offset);
      const size_t end = std::min(range.end, entry.offset + entry.numel);
      if (begin >= end) continue;
      size_t number = 0;
      while (whole.entries()[number].name != entry.name) ++number;
      ForEachGlobalRun(entry, begin - entry.offset, end - entry.offset,
                       [&](size_t local, size_t global, size_t count) {
                         float* values = range.values + (entry.offset + local - range.begin);
                         for (size_t i = 0; i < count; ++i) {
                           fn(range.kind, entry.name, values[i],
                              Value(range.kind, number, global + i));
                         }
                       });
    }
  }
}

class FixedLoader : public SequenceLoader {
 public:
  absl::Status Next(int, int32_t*, int32_t*) override {
    return absl::UnimplementedError("not read in this test");
  }
  LoaderState state() const override { return state_; }
  absl::Status Restore(const LoaderState& state) override {
    state_ = state;
    return absl::OkStatus();
  }

 private:
  LoaderState state_;
};

// The data cursor a saving rank of data-parallel index `dp_index` reports; its tensor-parallel
// peers read the same data and report the same.
std::string Cursor(int dp_index) { return absl::StrCat("stream ", dp_index, "\n"); }

// One rank of `layout` (world rank = dp index * tp + tp index, as mesh.h lays them out): saves
// the known state (`saved` null), or resumes what `saved` wrote and checks every held value and
// the data position. Failures go to gtest.
void RunRank(const Recipe& base, const Layout& layout, const Layout* saved, Communicator* world,
             Communicator* dp) {
  Recipe recipe = base;
  recipe.parallel.tp = layout.tp;
  recipe.parallel.strategy = layout.strategy;
  recipe.checkpoint.async = layout.async;
  recipe.checkpoint.interval = layout.async ? 1 : 0;  // async staging serves periodic saves
  recipe.run.precision = layout.precision;
  const int rank = world ? world->rank() : 0;
  const ModelConfig config = ModelConfigFromRecipe(recipe.model, recipe.d_ff());
  const ParamTable table(config, ModelSlice{.tp_rank = rank % layout.tp, .tp_size = layout.tp});
  absl::StatusOr<ShardingStrategy> strategy =
      ShardingStrategyFromRecipe(recipe.parallel, recipe.bf16_params());
  ASSERT_TRUE(strategy.ok()) << strategy.status();
  CpuBackend backend(1);
  DataParallelEngine engine(table, *strategy, recipe.train, backend, dp);
  absl::StatusOr<std::unique_ptr<TrainingCheckpoints>> checkpoints =
      TrainingCheckpoints::Create(recipe, table, engine, world);
  ASSERT_TRUE(checkpoints.ok()) << checkpoints.status();
  if (saved == nullptr) {
    ForEachIn(
        table, engine.HeldState(),
        [](StateKind, const std::string&, float& value, float expected) { value = expected; });
    engine.LoadedState();  // bf16 parameters: the values are the masters
    engine.SetOptimizerStep(kStep);
    absl::StatusOr<double> saved =
        (*checkpoints)->Save(kStep, 1e-3, LoaderState{kConsumed, Cursor(rank / layout.tp)}, "");
    ASSERT_TRUE(saved.ok()) << saved.status();
    ASSERT_TRUE((*checkpoints)->Finish().ok());
    return;
  }
  FixedLoader loader;
  absl::StatusOr<int64_t> step = (*checkpoints)->Resume(loader, /*restart_count=*/0);
  ASSERT_TRUE(step.ok()) << "rank " << rank << ": " << step.status();
  EXPECT_EQ(*step, kStep);
  EXPECT_EQ(engine.optimizer_step(), kStep);
  EXPECT_EQ(loader.state().consumed_sequences, kConsumed);
  // The same layout continues its own cursor; another merges one cursor per saved
  // data-parallel rank.
  std::string cursor;
  if (saved->tp == layout.tp && saved->dp == layout.dp) {
    cursor = Cursor(rank / layout.tp);
  } else {
    for (int d = 0; d < saved->dp; ++d) cursor += Cursor(d);
  }
  EXPECT_EQ(loader.state().cursor, cursor) << Name(layout) << " rank " << rank;
  // bf16 parameters held whole are bf16 copies of the float32 masters, which are this rank's
  // share of the saved state (SavedState; HeldState hands out a staging buffer to load them); a
  // shard is the masters.
  const bool copies =
      strategy->param_type == DataType::kBF16 && strategy->sharding != Sharding::kParameters;
  int wrong = 0;
  const auto check = [&](StateKind kind, const std::string& name, float& value, float expected) {
    if (value != expected && ++wrong <= 3) {
      ADD_FAILURE() << Name(layout) << " rank " << rank << ": " << StateTensorName(kind, name)
                    << " holds " << value << ", the saved state " << expected;
    }
  };
  ForEachIn(table, engine.HeldState(),
            [&](StateKind kind, const std::string& name, float& value, float expected) {
              if (!copies || kind != StateKind::kParameters) check(kind, name, value, expected);
            });
  if (copies) {
    ForEachIn(table, engine.SavedState(),
              [&](StateKind kind, const std::string& name, float& value, float expected) {
                if (kind == StateKind::kParameters) check(kind, name, value, expected);
              });
    // The model computes with every parameter's master rounded to bf16.
    const absl::StatusOr<std::vector<float>> masters = engine.GatherParameters();
    ASSERT_TRUE(masters.ok()) << masters.status();
    for (int region = -1; region <= table.last_region(); ++region) {
      const auto [begin, end] = table.BlockRange(region);
      const Bf16* values = engine.Acquire(region, Pass::kForward).as<Bf16>();
      for (size_t i = begin; i < end; ++i) {
        if (values[i - begin].bits != cuda::FromFloat<Bf16>((*masters)[i]).bits && ++wrong <= 3) {
          ADD_FAILURE() << Name(layout) << " rank " << rank << ": position " << i
                        << " computes with " << cuda::ToFloat(values[i - begin]) << ", its master "
                        << (*masters)[i];
        }
      }
      engine.Release(region, Pass::kForward);
    }
  }
  EXPECT_EQ(wrong, 0) << Name(layout) << " rank " << rank;
}

// Runs every rank of `layout` on its own thread: a world communicator and a data-parallel one
// per tensor-parallel index (none for one rank).
void RunLayout(const Recipe& recipe, const Layout& layout, const Layout* saved) {
  const int world_size = layout.tp * layout.dp;
  if (world_size == 1) return RunRank(recipe, layout, saved, nullptr, nullptr);
  auto store = std::make_shared<testing::InMemoryStore>();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      std::unique_ptr<GlooCommunicator> world =
          testing::ConnectGlooGroup(store, "world", "world/", rank, world_size, absl::Seconds(30));
      std::unique_ptr<GlooCommunicator> dp;
      if (layout.dp > 1) {
        dp = testing::ConnectGlooGroup(store, "dp", absl::StrCat("dp", rank % layout.tp, "/"),
                                       rank / layout.tp, layout.dp, absl::Seconds(30));
      }
      if (world == nullptr || (layout.dp > 1 && dp == nullptr)) return;
      RunRank(recipe, layout, saved, world.get(), dp.get());
    });
  }
  for (std::thread& thread : threads) thread.join();
}

struct Case {
  std::string family;
  Layout saved;
  // 97: padded for tensor parallelism (to 128 at tp 2: rows 64 + 33; to 256 at tp 4: 64 + 33
  // and two ranks holding none), the padding never saved.
  int vocab = 256;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.family << "_" << Name(c.saved) << "_vocab" << c.vocab;
}

class CheckpointLayoutsTest : public ::testing::TestWithParam<Case> {};

TEST_P(CheckpointLayoutsTest, LoadsUnderEveryLayoutAsTheWholeModelsValues) {
  const Case& c = GetParam();
  const std::string dir = testing::TempPath(absl::StrCat(
      "ckpt_layouts_", c.family, "_", Name(c.saved), "_", c.saved.async, "_", c.vocab));
  fs::remove_all(dir);
  const Recipe recipe = BaseRecipe(c.family, dir, c.vocab);
  ASSERT_FALSE(HasFailure());
  RunLayout(recipe, c.saved, nullptr);
  ASSERT_FALSE(HasFailure());

  // The reader refuses chunks that overlap or leave gaps, so opening shows every tensor saved
  // exactly once, under the whole model's names and shapes.
  absl::StatusOr<CheckpointReader> reader =
      CheckpointReader::Open(absl::StrCat(dir, "/step-", kStep));
  ASSERT_TRUE(reader.ok()) << reader.status();
  const ModelConfig config = ModelConfigFromRecipe(recipe.model, recipe.d_ff());
  const ParamTable whole(config, ModelSlice{});
  EXPECT_EQ(reader->manifest().tensors.size(), 3 * whole.entries().size());
  for (const TensorEntry& entry : whole.entries()) {
    const TensorRecord* record = reader->manifest().FindTensor(entry.name);
    ASSERT_NE(record, nullptr) << entry.name;
    EXPECT_EQ(record->shape, entry.shape) << entry.name;
  }
  // A column block's rows stack into one box (with at most two partial rows at the ends of a
  // ZeRO slice), not a chunk per row.
  int column_block_chunks = 0;
  for (const ChunkRecord& chunk : reader->manifest().chunks) {
    column_block_chunks += chunk.tensor == "blocks.0.mlp.down.weight";
  }
  EXPECT_LE(column_block_chunks, 3 * c.saved.tp * c.saved.dp);
  EXPECT_EQ(reader->manifest().world.tp, c.saved.tp);
  EXPECT_EQ(reader->manifest().world.dp, c.saved.dp);

  for (const Layout& load :
       {Layout{1, 1, "ddp"}, Layout{4, 1, "zero1"}, Layout{2, 1, "zero3"}, Layout{1, 4, "zero3"},
        Layout{2, 2, "ddp"}, Layout{.dp = 2, .strategy = "zero2", .precision = "bf16"}}) {
    SCOPED_TRACE(absl::StrCat("loaded as ", Name(load)));
    RunLayout(recipe, load, &c.saved);
  }
}

// Llama's 2 kv heads are replicated over pairs of ranks at tp 4, split at tp 2.
INSTANTIATE_TEST_SUITE_P(
    Layouts, CheckpointLayoutsTest,
    ::testing::Values(Case{"gpt2", {2, 2, "zero3"}}, Case{"gpt2", {2, 2, "ddp", true}},
                      Case{"llama", {2, 2, "zero3"}}, Case{"llama", {2, 2, "ddp"}},
                      Case{"llama", {4, 1, "ddp", true}}, Case{"gpt2", {4, 1, "zero3"}},
                      Case{"gpt2", {2, 2, "zero3"}, 97}, Case{"llama", {4, 1, "ddp"}, 97},
                      // bf16 parameters: the checkpoint holds the masters, which every float32
                      // layout above loads exactly.
                      Case{"gpt2", {.dp = 2, .strategy = "zero2", .precision = "bf16"}},
                      Case{"llama", {.tp = 2, .strategy = "ddp", .precision = "bf16"}},
                      Case{"gpt2", {.dp = 2, .strategy = "fsdp", .precision = "bf16"}}),
    [](const ::testing::TestParamInfo<Case>& info) {
      return absl::StrCat(info.param.family, "_", Name(info.param.saved),
                          info.param.saved.async ? "_async" : "",
                          info.param.vocab != 256 ? absl::StrCat("_vocab", info.param.vocab) : "");
    });

// A version 1 checkpoint (before tensor parallelism: flat ranges of each tensor, here saved by
// two ZeRO-3 ranks) loads under tensor parallelism too.
TEST(CheckpointLayoutsVersion1Test, LoadsUnderTensorParallelism) {
  const std::string dir = testing::TempPath("ckpt_layouts_v1");
  fs::remove_all(dir);
  const Recipe recipe = BaseRecipe("llama", dir);
  ASSERT_FALSE(HasFailure());
  const Layout saved{1, 2, "zero3"};
  RunLayout(recipe, saved, nullptr);
  ASSERT_FALSE(HasFailure());
  testing::RewriteAsVersion1(absl::StrCat(dir, "/step-", kStep));
  for (const Layout& load : {Layout{2, 1, "ddp"}, Layout{4, 1, "zero3"}, Layout{2, 2, "zero3"}}) {
    SCOPED_TRACE(absl::StrCat("loaded as ", Name(load)));
    RunLayout(recipe, load, &saved);
  }
}

// `dtrain ckpt inspect` and `export` read the whole model's tensors, whatever layout saved them.
// (Export reads the saved recipe, so this needs a recipe check that accepts parallel.tp > 1.)

// The tensor bytes of a safetensors file (after its header, whose metadata names the folder).
std::string SafetensorsData(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  uint64_t header = 0;
  if (bytes.size() < sizeof(header)) return "";
  std::memcpy(&header, bytes.data(), sizeof(header));
  return bytes.size() < sizeof(header) + header ? "" : bytes.substr(sizeof(header) + header);
}

// With vocabulary 97 the tp 2 and tp 4 checkpoints hold no padded row: their exports are the
// single process's bytes, shapes (97, C) included.
TEST(CheckpointLayoutsExportTest, ATensorParallelCheckpointExportsAsTheSameModel) {
  for (const int vocab : {256, 97}) {
    SCOPED_TRACE(absl::StrCat("vocab ", vocab));
    std::vector<std::string> exported;
    for (const Layout& layout : {Layout{1, 1, "ddp"}, Layout{2, 2, "zero3"}, Layout{4, 1, "ddp"}}) {
      const std::string dir =
          testing::TempPath(absl::StrCat("ckpt_layouts_export_", Name(layout), "_", vocab));
      fs::remove_all(dir);
      const Recipe recipe = BaseRecipe("llama", dir, vocab);
      ASSERT_FALSE(HasFailure());
      RunLayout(recipe, layout, nullptr);
      ASSERT_FALSE(HasFailure());
      const InspectReport report = InspectCheckpoints(dir);
      EXPECT_TRUE(report.valid) << report.text;
      exported.push_back(dir + ".safetensors");
      const absl::StatusOr<std::string> status =
          ExportCheckpoint(dir, exported.back(), "safetensors");
      ASSERT_TRUE(status.ok()) << Name(layout) << ": " << status.status();
    }
    const std::string whole = SafetensorsData(exported[0]);
    EXPECT_GT(whole.size(), 10000u);
    for (size_t i = 1; i < exported.size(); ++i) {
      EXPECT_TRUE(whole == SafetensorsData(exported[i])) << exported[i];
    }
  }
}

}  // namespace
}  // namespace dtrain
