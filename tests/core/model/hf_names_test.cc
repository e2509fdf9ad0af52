#include "core/model/hf_names.h"

#include <stdlib.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "core/io/safetensors.h"
#include "core/model/param_table.h"
#include "core/util/exit_codes.h"
#include "gtest/gtest.h"
#include "tests/testing/hf_test_models.h"

namespace dtrain {
namespace {

::testing::AssertionResult HasText(absl::string_view message, absl::string_view part) {
  if (absl::StrContains(message, part)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << message << "\" lacks \"" << part << "\"";
}

ModelConfig Gpt2Config() { return testing::HfTestConfig(ModelFamily::kGpt2); }
ModelConfig LlamaConfig() { return testing::HfTestConfig(ModelFamily::kLlama); }
using testing::DistinctParams;

class HfNamesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "hf_names_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // Rewrites `from` into `to` with names renamed by `rename` ("" drops the tensor), `extra`
  // tensors appended (all F32 of shape {1}) and `copies` (name -> the source's tensor it copies,
  // times `scale`).
  template <typename Rename>
  void Rewrite(const std::string& from, const std::string& to, Rename rename,
               const std::vector<std::string>& extra = {},
               const std::map<std::string, std::string>& copies = {}, float scale = 1) {
    absl::StatusOr<SafetensorsContents> contents = ReadSafetensors(from);
    ASSERT_TRUE(contents.ok()) << contents.status();
    std::vector<TensorData> tensors;
    for (const auto& [name, values] : contents->floats) {
      const std::string new_name = rename(name);
      if (new_name.empty()) continue;
      tensors.push_back({{new_name, DType::kF32, contents->shapes.at(name)}, values.data()});
    }
    const float zero = 0;
    for (const std::string& name : extra) tensors.push_back({{name, DType::kF32, {1}}, &zero});
    std::vector<std::vector<float>> copied;
    copied.reserve(copies.size());
    for (const auto& [name, source] : copies) {
      copied.push_back(contents->floats.at(source));
      for (float& value : copied.back()) value *= scale;
      tensors.push_back({{name, DType::kF32, contents->shapes.at(source)}, copied.back().data()});
    }
    ASSERT_TRUE(WriteSafetensors(to, tensors).ok());
  }

  std::filesystem::path dir_;
};

TEST_F(HfNamesTest, MapsLlamaFusedTensorsToTheirParts) {
  const ModelConfig config = LlamaConfig();
  const ParamTable table(config, ModelSlice{});
  absl::StatusOr<std::vector<HfTensor>> qkv =
      HfTensorsFor(config, *table.Find("blocks.1.attn.qkv.weight"));
  ASSERT_TRUE(qkv.ok()) << qkv.status();
  ASSERT_EQ(qkv->size(), 3u);
  EXPECT_EQ((*qkv)[0].name, "model.layers.1.self_attn.q_proj.weight");
  EXPECT_EQ((*qkv)[0].shape, (std::vector<int64_t>{8, 8}));
  EXPECT_EQ((*qkv)[1].name, "model.layers.1.self_attn.k_proj.weight");
  EXPECT_EQ((*qkv)[1].shape, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ((*qkv)[1].row_begin, 8);
  EXPECT_EQ((*qkv)[2].name, "model.layers.1.self_attn.v_proj.weight");
  EXPECT_EQ((*qkv)[2].row_begin, 12);

  absl::StatusOr<std::vector<HfTensor>> up =
      HfTensorsFor(config, *table.Find("blocks.0.mlp.up.weight"));
  ASSERT_TRUE(up.ok()) << up.status();
  ASSERT_EQ(up->size(), 2u);
  EXPECT_EQ((*up)[0].name, "model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ((*up)[1].name, "model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ((*up)[1].row_begin, 12);
  EXPECT_EQ((*up)[1].shape, (std::vector<int64_t>{12, 8}));
}

TEST_F(HfNamesTest, MapsGpt2Conv1DWeightsTransposed) {
  const ModelConfig config = Gpt2Config();
  const ParamTable table(config, ModelSlice{});
  absl::StatusOr<std::vector<HfTensor>> fc =
      HfTensorsFor(config, *table.Find("blocks.0.mlp.up.weight"));
  ASSERT_TRUE(fc.ok()) << fc.status();
  ASSERT_EQ(fc->size(), 1u);
  EXPECT_EQ((*fc)[0].name, "h.0.mlp.c_fc.weight");
  EXPECT_EQ((*fc)[0].shape, (std::vector<int64_t>{8, 32}));  // (in, out)
  EXPECT_TRUE((*fc)[0].transposed);
  absl::StatusOr<std::vector<HfTensor>> bias =
      HfTensorsFor(config, *table.Find("blocks.0.mlp.up.bias"));
  ASSERT_TRUE(bias.ok());
  EXPECT_EQ((*bias)[0].shape, (std::vector<int64_t>{32}));
  EXPECT_FALSE((*bias)[0].transposed);
}

TEST_F(HfNamesTest, RejectsATensorParallelSlice) {
  const ModelConfig config = Gpt2Config();
  const ParamTable table(config, ModelSlice{.tp_rank = 0, .tp_size = 2});
  EXPECT_TRUE(
      HasText(HfTensorsFor(config, *table.Find("blocks.0.mlp.up.weight")).status().message(),
              "tensor-parallel slice"));
}

TEST_F(HfNamesTest, Gpt2ExportImportRoundTripsAndTransposes) {
  const ModelConfig config = Gpt2Config();
  const ParamTable table(config, ModelSlice{});
  const std::vector<float> params = DistinctParams(table);
  const std::string path = Path("gpt2.safetensors");
  ASSERT_TRUE(ExportHfSafetensors(config, table, params.data(), path, {{"step", "3"}}).ok());

  absl::StatusOr<SafetensorsContents> file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata.at("format"), "pt");
  EXPECT_EQ(file->metadata.at("step"), "3");
  EXPECT_EQ(file->floats.count("lm_head.weight"), 0u);  // tied to wte
  EXPECT_EQ(file->floats.size(), 4u + 12u * 2u);
  // c_attn.weight is (C, 3C): element [c][r] is our qkv row r, column c.
  const TensorEntry& qkv = *table.Find("blocks.1.attn.qkv.weight");
  const int64_t c = 5, r = 17;
  EXPECT_EQ(file->shapes.at("h.1.attn.c_attn.weight"), (std::vector<int64_t>{8, 24}));
  EXPECT_EQ(file->floats.at("h.1.attn.c_attn.weight")[c * 24 + r], params[qkv.offset + r * 8 + c]);

  std::vector<float> imported(table.total_numel(), -1.0f);
  const absl::Status status = ImportHfSafetensors(config, table, path, imported.data());
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(imported, params);
}

TEST_F(HfNamesTest, LlamaExportImportRoundTripsAndSplits) {
  const ModelConfig config = LlamaConfig();
  const ParamTable table(config, ModelSlice{});
  const std::vector<float> params = DistinctParams(table);
  const std::string path = Path("llama.safetensors");
  ASSERT_TRUE(ExportHfSafetensors(config, table, params.data(), path).ok());

  absl::StatusOr<SafetensorsContents> file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->floats.size(), 3u + 9u * 2u);
  // k_proj row 0 is qkv row H*D; up_proj row 0 is mlp.up row F.
  const TensorEntry& qkv = *table.Find("blocks.0.attn.qkv.weight");
  const std::vector<float>& k = file->floats.at("model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(
      std::vector<float>(k.begin(), k.begin() + 8),
      std::vector<float>(params.begin() + qkv.offset + 8 * 8, params.begin() + qkv.offset + 9 * 8));
  const TensorEntry& up = *table.Find("blocks.1.mlp.up.weight");
  EXPECT_EQ(file->floats.at("model.layers.1.mlp.up_proj.weight")[3],
            params[up.offset + 12 * 8 + 3]);
  EXPECT_EQ(file->floats.at("model.layers.1.mlp.gate_proj.weight")[3], params[up.offset + 3]);
  EXPECT_EQ(file->floats.at("lm_head.weight")[0], params[table.Find("head.weight")->offset]);

  std::vector<float> imported(table.total_numel(), -1.0f);
  const absl::Status status = ImportHfSafetensors(config, table, path, imported.data());
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(imported, params);
}

TEST_F(HfNamesTest, Gpt2ImportAcceptsLMHeadModelNamesAndBuffers) {
  const ModelConfig config = Gpt2Config();
  const ParamTable table(config, ModelSlice{});
  const std::vector<float> params = DistinctParams(table);
  ASSERT_TRUE(ExportHfSafetensors(config, table, params.data(), Path("plain.safetensors")).ok());
  // GPT2LMHeadModel's state_dict: prefixed names, the attention buffers, and the tied head.
  Rewrite(Path("plain.safetensors"), Path("prefixed.safetensors"),
          [](const std::string& name) { return "transformer." + name; },
          {"transformer.h.0.attn.bias", "transformer.h.1.attn.masked_bias"},
          {{"lm_head.weight", "wte.weight"}});
  std::vector<float> imported(table.total_numel());
  const absl::Status status =
      ImportHfSafetensors(config, table, Path("prefixed.safetensors"), imported.data());
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(imported, params);
}

// A head trained untied would be dropped by the import: it is refused, as a usage error.
TEST_F(HfNamesTest, Gpt2HeadThatDiffersFromTheEmbeddingIsRefused) {
  const ModelConfig config = Gpt2Config();
  const ParamTable table(config, ModelSlice{});
  const std::vector<float> params = DistinctParams(table);
  ASSERT_TRUE(ExportHfSafetensors(config, table, params.data(), Path("plain.safetensors")).ok());
  const std::string path = Path("untied.safetensors");
  Rewrite(
      Path("plain.safetensors"), path, [](const std::string& name) { return name; }, {},
      {{"lm_head.weight", "wte.weight"}}, 0.5f);
  std::vector<float> imported(table.total_numel());
  const absl::Status status = ImportHfSafetensors(config, table, path, imported.data());
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_TRUE(HasText(status.message(),
                      path + ": lm_head.weight differs from wte.weight: dtrain's GPT-2 ties its "
                             "output head to the token embedding"))
      << status;
  EXPECT_EQ(ExitCodeOf(status), kExitUsage);
}

TEST_F(HfNamesTest, MissingTensorIsAnError) {
  const ModelConfig config = LlamaConfig();
  const ParamTable table(config, ModelSlice{});
  const std::vector<float> params = DistinctParams(table);
  ASSERT_TRUE(ExportHfSafetensors(config, table, params.data(), Path("full.safetensors")).ok());
  const std::string path = Path("missing.safetensors");
  Rewrite(Path("full.safetensors"), path, [](const std::string& name) {
    return name == "model.layers.1.self_attn.v_proj.weight" ? std::string() : name;
  });
  std::vector<float> imported(table.total_numel());
  const absl::Status status = ImportHfSafetensors(config, table, path, imported.data());
  EXPECT_TRUE(HasText(status.message(), path));
  EXPECT_TRUE(HasText(status.message(), "missing 1 tensor(s)"));
  EXPECT_TRUE(HasText(status.message(), "model.layers.1.self_attn.v_proj.weight"));
}

TEST_F(HfNamesTest, UnexpectedTensorIsAnError) {
  const ModelConfig config = LlamaConfig();
  const ParamTable table(config, ModelSlice{});
  const std::vector<float> params = DistinctParams(table);
  ASSERT_TRUE(ExportHfSafetensors(config, table, params.data(), Path("full.safetensors")).ok());
  const std::string path = Path("extra.safetensors");
  Rewrite(
      Path("full.safetensors"), path, [](const std::string& name) { return name; },
      {"model.layers.2.input_layernorm.weight", "model.layers.0.self_attn.rotary_emb.inv_freq"});
  std::vector<float> imported(table.total_numel());
  const absl::Status status = ImportHfSafetensors(config, table, path, imported.data());
  EXPECT_TRUE(HasText(status.message(), "1 unexpected tensor(s)"));
  EXPECT_TRUE(HasText(status.message(), "model.layers.2.input_layernorm.weight"));
}

TEST_F(HfNamesTest, WrongShapeIsAnError) {
  ModelConfig config = Gpt2Config();
  const ParamTable table(config, ModelSlice{});
  const std::vector<float> params = DistinctParams(table);
  const std::string path = Path("gpt2.safetensors");
  ASSERT_TRUE(ExportHfSafetensors(config, table, params.data(), path).ok());
  // The same checkpoint read into a model with a longer context.
  config.max_seq_len = 7;
  const ParamTable longer(config, ModelSlice{});
  std::vector<float> imported(longer.total_numel());
  const absl::Status status = ImportHfSafetensors(config, longer, path, imported.data());
  EXPECT_TRUE(HasText(status.message(), path));
  EXPECT_TRUE(HasText(status.message(), "tensor 'wpe.weight' has shape [5, 8], expected [7, 8]"));
}

TEST_F(HfNamesTest, WrongFamilyReportsMissingTensors) {
  const ModelConfig gpt2 = Gpt2Config();
  const ParamTable gpt2_table(gpt2, ModelSlice{});
  const std::vector<float> params = DistinctParams(gpt2_table);
  const std::string path = Path("gpt2.safetensors");
  ASSERT_TRUE(ExportHfSafetensors(gpt2, gpt2_table, params.data(), path).ok());
  const ModelConfig llama = LlamaConfig();
  const ParamTable llama_table(llama, ModelSlice{});
  std::vector<float> imported(llama_table.total_numel());
  const absl::Status status = ImportHfSafetensors(llama, llama_table, path, imported.data());
  EXPECT_TRUE(HasText(status.message(), "missing 21 tensor(s) of the llama model"));
  EXPECT_TRUE(HasText(status.message(), "and 16 more"));
}

}  // namespace
}  // namespace dtrain
