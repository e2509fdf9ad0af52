#include "core/model/hf_folder.h"

#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/data/tokenizer.h"
#include "core/data/tokenizers/load_tokenizer.h"
#include "core/io/safetensors.h"
#include "core/model/param_table.h"
#include "core/util/exit_codes.h"
#include "core/util/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/core/data/tokenizers/tokenizer_json.h"
#include "tests/testing/hf_test_models.h"
#include "tests/testing/run_dtrain.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using Json = nlohmann::json;

ModelConfig Gpt2Config() { return testing::HfTestConfig(ModelFamily::kGpt2); }
ModelConfig LlamaConfig() { return testing::HfTestConfig(ModelFamily::kLlama); }
using testing::DistinctParams;

TensorValuesFn ValuesOf(const std::vector<float>& params) {
  return [&params](const TensorEntry& entry) -> absl::StatusOr<const float*> {
    return params.data() + entry.offset;
  };
}

class HfFolderTest : public ::testing::Test {
 public:
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  void Write(const std::string& name, const std::string& text) const {
    fs::create_directories(fs::path(Path(name)).parent_path());
    std::ofstream(Path(name)) << text;
  }

 protected:
  void SetUp() override {
    dir_ = testing::FreshTempDir("hf_folder");
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  Json ReadJson(const std::string& name) const { return Json::parse(*ReadWholeFile(Path(name))); }

  fs::path dir_;
};

TEST_F(HfFolderTest, ExportedFolderLoadsBackBitForBitForBothFamilies) {
  for (const ModelConfig& config : {Gpt2Config(), LlamaConfig()}) {
    const ParamTable table(config, ModelSlice{});
    const std::vector<float> params = DistinctParams(table);
    const std::string folder = Path(FamilyName(config.family));
    ASSERT_TRUE(ExportHfFolder(config, table, ValuesOf(params), folder, "").ok());
    EXPECT_TRUE(fs::exists(folder + "/model.safetensors"));
    std::vector<float> loaded(table.total_numel(), -1.0f);
    const absl::Status status = ImportHfWeights(config, table, folder, loaded.data());
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(loaded, params) << FamilyName(config.family);
  }
}

TEST_F(HfFolderTest, ConfigJsonCarriesTheFieldsTransformersReads) {
  const Json gpt2 = Json::parse(HfConfigJson(Gpt2Config()));
  EXPECT_EQ(gpt2["model_type"], "gpt2");
  EXPECT_EQ(gpt2["architectures"], Json({"GPT2LMHeadModel"}));
  EXPECT_EQ(gpt2["n_embd"], 8);
  EXPECT_EQ(gpt2["n_inner"], 32);
  EXPECT_EQ(gpt2["n_positions"], 5);
  EXPECT_EQ(gpt2["layer_norm_epsilon"], 1e-5);  // the decimal, not float's 9.99999975e-06
  EXPECT_EQ(gpt2["tie_word_embeddings"], true);
  EXPECT_EQ(gpt2["torch_dtype"], "float32");
  const Json llama = Json::parse(HfConfigJson(LlamaConfig(), {.bos_id = 1, .eos_id = 2}));
  EXPECT_EQ(llama["architectures"], Json({"LlamaForCausalLM"}));
  EXPECT_EQ(llama["num_key_value_heads"], 2);
  EXPECT_EQ(llama["intermediate_size"], 12);
  EXPECT_EQ(llama["rms_norm_eps"], 1e-6);
  EXPECT_EQ(llama["rope_theta"], 500000.0);
  EXPECT_EQ(llama["tie_word_embeddings"], false);
  EXPECT_EQ(llama["bos_token_id"], 1);
  EXPECT_EQ(llama["eos_token_id"], 2);
}

TEST_F(HfFolderTest, ConfigMismatchNamesEveryFieldWithBothValuesAndTheFix) {
  ModelConfig saved = LlamaConfig();
  saved.n_layer = 3;
  saved.d_ff = 16;
  saved.rope_theta = 10000.0f;
  Write("cfg/config.json", HfConfigJson(saved));
  const absl::Status status = CheckHfConfig(LlamaConfig(), Path("cfg/config.json"));
  EXPECT_TRUE(absl::IsInvalidArgument(status));
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("config.json does not match the recipe's model"),
                    HasSubstr("model.n_layer is 2 but num_hidden_layers is 3 (set model.n_layer: "
                              "3)"),
                    HasSubstr("model.d_ff is 12 but intermediate_size is 16 (set model.d_ff: 16)"),
                    HasSubstr("model.rope_theta is 500000 but rope_theta is 10000 (set "
                              "model.rope_theta: 10000)")));
  // Another family's folder: the family alone, whose fix brings the folder's keys (the others
  // were compared with keys the recipe had not set).
  EXPECT_THAT(CheckHfConfig(Gpt2Config(), Path("cfg/config.json")).message(),
              AllOf(HasSubstr("model.family is gpt2 but model_type is \"llama\" (set model.family: "
                              "llama, or leave it unset"),
                    ::testing::Not(HasSubstr("model.n_layer is"))));

  // head_dim as hidden_size / num_attention_heads is no mismatch, whatever the recipe's width
  // (which its own fields report); another head_dim is a model dtrain cannot run.
  Json json = Json::parse(HfConfigJson(LlamaConfig()));
  json["head_dim"] = LlamaConfig().d_model / LlamaConfig().n_head;
  Write("cfg/config.json", json.dump());
  ModelConfig wider = LlamaConfig();
  wider.d_model *= 2;
  EXPECT_THAT(CheckHfConfig(wider, Path("cfg/config.json")).message(),
              AllOf(HasSubstr("model.d_model is"), ::testing::Not(HasSubstr("head_dim"))));
  json["head_dim"] = 2 * LlamaConfig().d_model / LlamaConfig().n_head;
  Write("cfg/config.json", json.dump());
  EXPECT_THAT(CheckHfConfig(LlamaConfig(), Path("cfg/config.json")).message(),
              HasSubstr(absl::StrCat("head_dim is ", json["head_dim"].dump(),
                                     " but hidden_size / num_attention_heads is ",
                                     LlamaConfig().d_model, " / ", LlamaConfig().n_head)));
}

// transformers' own config.json leaves defaults out and may use features dtrain lacks.
TEST_F(HfFolderTest, ConfigDefaultsAndUnsupportedFeatures) {
  Json json = Json::parse(HfConfigJson(LlamaConfig()));
  json.erase("num_key_value_heads");  // absent: as many kv heads as heads (4, not 2)
  json["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  json["max_position_embeddings"] = 4;
  Write("cfg/config.json", json.dump());
  const absl::Status status = CheckHfConfig(LlamaConfig(), Path("cfg/config.json"));
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("model.n_kv_head is 2 but num_key_value_heads is 4"),
                    HasSubstr("rope_scaling is {\"factor\":8.0,\"rope_type\":\"llama3\"}: dtrain "
                              "implements plain RoPE"),
                    HasSubstr("model.max_seq_len is 5 but max_position_embeddings is 4")));

  // transformers reads rope_type (or its older key, type) "default" as plain RoPE.
  for (const char* key : {"rope_type", "type"}) {
    json = Json::parse(HfConfigJson(LlamaConfig()));
    json["rope_scaling"] = {{key, "default"}};
    Write("cfg/config.json", json.dump());
    const absl::Status plain = CheckHfConfig(LlamaConfig(), Path("cfg/config.json"));
    EXPECT_TRUE(plain.ok()) << key << ": " << plain;
  }

  Json gpt2 = Json::parse(HfConfigJson(Gpt2Config()));
  gpt2["n_inner"] = nullptr;  // null: 4 * n_embd = 32, which Gpt2Config has
  Write("cfg/config.json", gpt2.dump());
  EXPECT_TRUE(CheckHfConfig(Gpt2Config(), Path("cfg/config.json")).ok());
  gpt2["activation_function"] = "relu";
  Write("cfg/config.json", gpt2.dump());
  EXPECT_THAT(CheckHfConfig(Gpt2Config(), Path("cfg/config.json")).message(),
              HasSubstr("activation_function is \"relu\": dtrain's GPT-2 uses GELU's tanh"));
}

// save_pretrained splits large models into shards listed by model.safetensors.index.json.
TEST_F(HfFolderTest, ShardedFolderLoadsEveryTensorFromItsShard) {
  const ModelConfig config = LlamaConfig();
  const ParamTable table(config, ModelSlice{});
  const std::vector<float> params = DistinctParams(table);
  ASSERT_TRUE(ExportHfFolder(config, table, ValuesOf(params), Path("whole"), "").ok());
  absl::StatusOr<SafetensorsContents> whole = ReadSafetensors(Path("whole/model.safetensors"));
  ASSERT_TRUE(whole.ok()) << whole.status();

  fs::create_directories(Path("sharded"));
  fs::copy_file(Path("whole/config.json"), Path("sharded/config.json"));
  std::vector<TensorData> shards[2];
  Json weight_map;
  for (const auto& [name, values] : whole->floats) {
    const int shard = absl::StrContains(name, "layers.1.") ? 1 : 0;
    shards[shard].push_back({{name, DType::kF32, whole->shapes.at(name)}, values.data()});
    weight_map[name] = absl::StrCat("model-0000", shard + 1, "-of-00002.safetensors");
  }
  for (int shard = 0; shard < 2; ++shard) {
    ASSERT_TRUE(WriteSafetensors(
                    Path(absl::StrCat("sharded/model-0000", shard + 1, "-of-00002.safetensors")),
                    shards[shard], {{"format", "pt"}})
                    .ok());
  }
  Write("sharded/model.safetensors.index.json", Json({{"weight_map", weight_map}}).dump());
  std::vector<float> loaded(table.total_numel(), -1.0f);
  const absl::Status status = ImportHfWeights(config, table, Path("sharded"), loaded.data());
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(loaded, params);

  // A shard gone: its tensors are named as missing, for the folder.
  fs::remove(Path("sharded/model-00002-of-00002.safetensors"));
  EXPECT_THAT(ImportHfWeights(config, table, Path("sharded"), loaded.data()).message(),
              HasSubstr("model-00002-of-00002.safetensors"));
}

// transformers saves a Llama with tie_word_embeddings (Llama 3.2 1B) without lm_head.weight:
// dtrain's head starts as the embedding. Without the flag the missing head stays an error; with
// it, a stored head must equal the embedding.
TEST_F(HfFolderTest, TiedLlamaHeadStartsAsTheEmbedding) {
  const ModelConfig config = LlamaConfig();
  const ParamTable table(config, ModelSlice{});
  const std::vector<float> params = DistinctParams(table);
  ASSERT_TRUE(ExportHfFolder(config, table, ValuesOf(params), Path("tied"), "").ok());
  absl::StatusOr<SafetensorsContents> whole = ReadSafetensors(Path("tied/model.safetensors"));
  ASSERT_TRUE(whole.ok()) << whole.status();
  std::vector<TensorData> tensors;
  for (const auto& [name, values] : whole->floats) {
    if (name != "lm_head.weight") {
      tensors.push_back({{name, DType::kF32, whole->shapes.at(name)}, values.data()});
    }
  }
  ASSERT_TRUE(WriteSafetensors(Path("tied/model.safetensors"), tensors, {{"format", "pt"}}).ok());
  std::vector<float> loaded(table.total_numel(), -1.0f);
  EXPECT_THAT(ImportHfWeights(config, table, Path("tied"), loaded.data()).message(),
              HasSubstr("no lm_head.weight, as a Llama saved with tie_word_embeddings has none: "
                        "give its Hugging Face folder, whose config.json says "
                        "\"tie_word_embeddings\": true"));

  Json json = Json::parse(HfConfigJson(config));
  json["tie_word_embeddings"] = true;
  Write("tied/config.json", json.dump());
  const absl::Status status = ImportHfWeights(config, table, Path("tied"), loaded.data());
  ASSERT_TRUE(status.ok()) << status;
  const TensorEntry* embed = table.Find("embed.tokens");
  const TensorEntry* head = table.Find("head.weight");
  ASSERT_NE(embed, nullptr);
  ASSERT_NE(head, nullptr);
  EXPECT_TRUE(std::equal(loaded.begin() + head->offset, loaded.begin() + head->offset + head->numel,
                         params.begin() + embed->offset));
  EXPECT_TRUE(std::equal(loaded.begin() + embed->offset,
                         loaded.begin() + embed->offset + embed->numel,
                         params.begin() + embed->offset));

  // Tied, an lm_head.weight of its own must be the embedding's copy: transformers would load
  // one over the other, so one that differs is refused by name.
  const std::vector<int64_t>& head_shape = whole->shapes.at("lm_head.weight");
  const auto write_with_head = [&](const std::vector<float>& head_values) {
    std::vector<TensorData> with_head = tensors;
    with_head.push_back({{"lm_head.weight", DType::kF32, head_shape}, head_values.data()});
    return WriteSafetensors(Path("tied/model.safetensors"), with_head, {{"format", "pt"}});
  };
  ASSERT_TRUE(write_with_head(whole->floats.at("lm_head.weight")).ok());
  EXPECT_FALSE(std::equal(params.begin() + head->offset,
                          params.begin() + head->offset + head->numel,
                          params.begin() + embed->offset));
  EXPECT_THAT(ImportHfWeights(config, table, Path("tied"), loaded.data()).message(),
              HasSubstr("lm_head.weight differs from model.embed_tokens.weight, but config.json "
                        "says \"tie_word_embeddings\": true"));
  ASSERT_TRUE(write_with_head(whole->floats.at("model.embed_tokens.weight")).ok());
  std::fill(loaded.begin(), loaded.end(), -1.0f);
  const absl::Status with_copy = ImportHfWeights(config, table, Path("tied"), loaded.data());
  ASSERT_TRUE(with_copy.ok()) << with_copy;
  EXPECT_TRUE(std::equal(loaded.begin() + head->offset, loaded.begin() + head->offset + head->numel,
                         params.begin() + embed->offset));
  EXPECT_TRUE(HfLlamaTiesHead(config, Path("tied")).value());
  EXPECT_FALSE(HfLlamaTiesHead(config, Path("tied/model.safetensors")).value());
}

TEST_F(HfFolderTest, FolderErrorsSayWhatIsMissing) {
  const ModelConfig config = Gpt2Config();
  const ParamTable table(config, ModelSlice{});
  std::vector<float> loaded(table.total_numel());
  fs::create_directories(Path("empty"));
  EXPECT_THAT(ImportHfWeights(config, table, Path("empty"), loaded.data()).message(),
              HasSubstr("is a folder without config.json"));
  Write("bin/config.json", HfConfigJson(config));
  Write("bin/pytorch_model.bin", "x");
  EXPECT_THAT(ImportHfWeights(config, table, Path("bin"), loaded.data()).message(),
              AllOf(HasSubstr("has config.json but no model.safetensors"),
                    HasSubstr("no pytorch_model.bin")));
  Write("bad/config.json", "{not json");
  EXPECT_THAT(ImportHfWeights(config, table, Path("bad"), loaded.data()).message(),
              HasSubstr("bad/config.json is not valid JSON"));
  // A config.json that matches the recipe beside weights of another model: the folder is at
  // fault, not the recipe (the fix said to change model.*).
  ModelConfig wider = config;
  wider.d_model *= 2;
  const ParamTable wider_table(wider, ModelSlice{});
  ASSERT_TRUE(
      ExportHfFolder(wider, wider_table, ValuesOf(DistinctParams(wider_table)), Path("mixed"), "")
          .ok());
  Write("mixed/config.json", HfConfigJson(config));
  EXPECT_THAT(ImportHfWeights(config, table, Path("mixed"), loaded.data()).message(),
              HasSubstr("the folder's config.json, which the recipe matches, does not describe "
                        "its weights: save the folder again"));
}

// GPT-2's original files become GPT2Tokenizer's vocab.json + merges.txt, its <|endoftext|> the
// special tokens and config.json's bos/eos ids.
// GPT-2's tokenizer files for a byte-level vocabulary of 258: the 256 bytes, "ab" (256) and
// <|endoftext|> (257). Returns the path of vocab.bpe.
std::string WriteGpt2Tokenizer(const HfFolderTest& test, const std::string& dir) {
  Json encoder = testing::TokenizerJson({{"a", "b"}})["model"]["vocab"];
  encoder["<|endoftext|>"] = 257;
  test.Write(dir + "/encoder.json", encoder.dump());
  test.Write(dir + "/vocab.bpe", "#version: 0.2\na b\n");
  return test.Path(dir + "/vocab.bpe");
}

TEST_F(HfFolderTest, ExportCopiesTheTokenizerUnderTheNamesAutoTokenizerReads) {
  ModelConfig config = Gpt2Config();
  config.vocab_size = 258;
  const ParamTable table(config, ModelSlice{});
  const std::vector<float> params = DistinctParams(table);
  const absl::Status status = ExportHfFolder(config, table, ValuesOf(params), Path("out"),
                                             WriteGpt2Tokenizer(*this, "gpt2tok"));
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(*ReadWholeFile(Path("out/merges.txt")), "#version: 0.2\na b\n");
  EXPECT_EQ(ReadJson("out/vocab.json")["<|endoftext|>"], 257);
  EXPECT_EQ(ReadJson("out/tokenizer_config.json")["tokenizer_class"], "GPT2Tokenizer");
  EXPECT_EQ(ReadJson("out/tokenizer_config.json")["model_max_length"], 5);
  EXPECT_EQ(ReadJson("out/special_tokens_map.json")["eos_token"], "<|endoftext|>");
  EXPECT_EQ(ReadJson("out/config.json")["eos_token_id"], 257);

  // A tokenizer.json's special tokens come from its added_tokens; a folder's own
  // tokenizer_config.json (with its chat template) is kept as it is.
  Write("fast/tokenizer.json",
        R"({"added_tokens": [{"id": 7, "content": "<|begin_of_text|>", "special": true},
                             {"id": 8, "content": "<|end_of_text|>", "special": true}],
            "model": {"type": "BPE"}})");
  Write("fast/tokenizer_config.json", R"({"chat_template": "x"})");
  absl::StatusOr<HfSpecialTokens> tokens = CopyHfTokenizer(Path("fast"), Path("out"), 5);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(tokens->bos_id, 7);
  EXPECT_EQ(tokens->eos_id, 8);
  EXPECT_EQ(ReadJson("out/tokenizer_config.json")["chat_template"], "x");
  EXPECT_EQ(ReadJson("out/special_tokens_map.json")["bos_token"], "<|begin_of_text|>");

  EXPECT_THAT(CopyHfTokenizer(Path("nothing.txt"), Path("out"), 5).status().message(),
              HasSubstr("nothing.txt does not exist"));
  fs::create_directories(Path("none"));
  EXPECT_THAT(CopyHfTokenizer(Path("none"), Path("out"), 5).status().message(),
              HasSubstr("holds no tokenizer.json, tokenizer.model"));
}

// A run on bytes exports a tokenizer of one token per byte, which dtrain's loader (as
// transformers', in tests/reference/test_hf_folders.py) encodes as the bytes themselves.
TEST_F(HfFolderTest, ABytesExportShipsATokenizerWhoseIdsAreTheBytes) {
  ModelConfig config = Gpt2Config();
  config.vocab_size = 256;
  const ParamTable table(config, ModelSlice{});
  const std::vector<float> params = DistinctParams(table);
  const absl::Status status =
      ExportHfFolder(config, table, ValuesOf(params), Path("out"), ByteTokenizer().name());
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(ReadJson("out/tokenizer_config.json")["tokenizer_class"], "PreTrainedTokenizerFast");
  EXPECT_EQ(ReadJson("out/tokenizer_config.json")["model_max_length"], config.max_seq_len);
  EXPECT_TRUE(ReadJson("out/config.json")["eos_token_id"].is_null());
  absl::StatusOr<std::unique_ptr<Tokenizer>> loaded = LoadTokenizer(Path("out"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->vocab_size(), 256);
  std::string text = "naïve café 北京 \t\n  x";
  for (int byte = 0; byte < 256; ++byte) text.push_back(static_cast<char>(byte));
  std::vector<int32_t> ids;
  ASSERT_TRUE((*loaded)->Encode(text, &ids).ok());
  std::vector<int32_t> bytes;
  ASSERT_TRUE(ByteTokenizer().Encode(text, &bytes).ok());
  EXPECT_EQ(ids, bytes);
  EXPECT_EQ(*(*loaded)->Decode(ids), text);

  // A model with fewer rows than bytes cannot take it.
  config.vocab_size = 200;
  const ParamTable small(config, ModelSlice{});
  EXPECT_THAT(ExportHfFolder(config, small, ValuesOf(DistinctParams(small)), Path("small"),
                             ByteTokenizer().name())
                  .message(),
              HasSubstr("has a vocabulary of 256, more than the model's 200"));
}

// An export into the folder of an earlier one leaves none of its model and tokenizer files,
// which transformers would read beside the new ones (an old tokenizer.json wins over a new
// vocab.json pair; a sharded index over a new model.safetensors), and keeps the folder's others.
TEST_F(HfFolderTest, AnExportReplacesAnEarlierOnesFiles) {
  ModelConfig config = Gpt2Config();
  config.vocab_size = 258;
  const ParamTable table(config, ModelSlice{});
  const std::vector<float> params = DistinctParams(table);
  ASSERT_TRUE(ExportHfFolder(config, table, ValuesOf(params), Path("again"), "").ok());
  Write("again/tokenizer.json", R"({"model": {"type": "BPE"}})");
  Write("again/generation_config.json", R"({"eos_token_id": 0})");
  Write("again/model.safetensors.index.json", R"({"weight_map": {}})");
  Write("again/model-00001-of-00002.safetensors", "stale");
  Write("again/README.md", "the user's");
  ASSERT_TRUE(ExportHfFolder(config, table, ValuesOf(params), Path("again"),
                             WriteGpt2Tokenizer(*this, "gpt2tok_again"))
                  .ok());
  for (const char* stale : {"tokenizer.json", "generation_config.json",
                            "model.safetensors.index.json", "model-00001-of-00002.safetensors"}) {
    EXPECT_FALSE(fs::exists(Path(std::string("again/") + stale))) << stale;
  }
  EXPECT_TRUE(fs::exists(Path("again/vocab.json")));
  EXPECT_EQ(*ReadWholeFile(Path("again/README.md")), "the user's");
  // Without a tokenizer, the last export's tokenizer files go too.
  ASSERT_TRUE(ExportHfFolder(config, table, ValuesOf(params), Path("again"), "").ok());
  for (const char* gone : {"vocab.json", "merges.txt", "tokenizer_config.json"}) {
    EXPECT_FALSE(fs::exists(Path(std::string("again/") + gone))) << gone;
  }
  std::vector<float> loaded(table.total_numel());
  ASSERT_TRUE(ImportHfWeights(config, table, Path("again"), loaded.data()).ok());
  EXPECT_EQ(loaded, params);

  // A tokenizer from the folder itself would be removed before its copy: refused, the folder
  // untouched.
  ASSERT_TRUE(ExportHfFolder(config, table, ValuesOf(params), Path("again"),
                             WriteGpt2Tokenizer(*this, "gpt2tok_again"))
                  .ok());
  const absl::Status own =
      ExportHfFolder(config, table, ValuesOf(params), Path("again"), Path("again/vocab.json"));
  EXPECT_THAT(own.message(), HasSubstr("lies in the model folder"));
  EXPECT_TRUE(fs::exists(Path("again/vocab.json")));
  EXPECT_TRUE(fs::exists(Path("again/config.json")));
}

// A folder of another model (a downloaded one, or the user's files under those names) is not the
// export's to replace: refused, exit 2, naming the files, every one of them left as it was. An
// empty folder, one of other files, or an earlier export (marked in its model.safetensors) is.
TEST_F(HfFolderTest, AnExportRefusesAnotherModelsFolder) {
  const ModelConfig config = Gpt2Config();
  const ParamTable table(config, ModelSlice{});
  const std::vector<float> params = DistinctParams(table);
  const float one = 1;
  Write("theirs/config.json", "{}");
  ASSERT_TRUE(
      WriteSafetensors(Path("theirs/model.safetensors"), {{{"w", DType::kF32, {1}}, &one}}).ok());
  Write("theirs/tokenizer.json", "{}");
  Write("theirs/notes.txt", "the user's");
  const absl::Status refused = ExportHfFolder(config, table, ValuesOf(params), Path("theirs"), "");
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ExitCodeOf(refused), kExitUsage);
  EXPECT_EQ(refused.message(),
            absl::StrCat(Path("theirs"),
                         " holds a model folder that dtrain did not export (config.json, "
                         "model.safetensors, tokenizer.json), which the export would replace: "
                         "give an empty or new folder, or remove them (an export by dtrain before "
                         "it marked its weights is refused too)"));
  EXPECT_EQ(*ReadWholeFile(Path("theirs/tokenizer.json")), "{}");
  EXPECT_EQ(*ReadWholeFile(Path("theirs/config.json")), "{}");
  EXPECT_TRUE(SafetensorsReader::Open(Path("theirs/model.safetensors"))->Find("w") != nullptr);

  Write("others/notes.txt", "the user's");
  EXPECT_TRUE(CheckReplaceableModelFolder(Path("others")).ok());
  EXPECT_TRUE(CheckReplaceableModelFolder(Path("absent")).ok());
  ASSERT_TRUE(ExportHfFolder(config, table, ValuesOf(params), Path("others"), "").ok());
  EXPECT_EQ(*ReadWholeFile(Path("others/notes.txt")), "the user's");
  EXPECT_TRUE(CheckReplaceableModelFolder(Path("others")).ok());

  // An export cut short after its weights (the tokenizer's copy failed) is the retry's to replace.
  Write("cut/tokenizer.json", "{}");
  ASSERT_TRUE(
      ExportHfSafetensors(config, table, params.data(), Path("cut/model.safetensors")).ok());
  EXPECT_TRUE(CheckReplaceableModelFolder(Path("cut")).ok());

  // A weights file may replace weights, not another kind of file.
  Write("recipe.yaml", "run: {}\n");
  const absl::Status file = ExportHfSafetensors(config, table, params.data(), Path("recipe.yaml"));
  EXPECT_EQ(ExitCodeOf(file), kExitUsage);
  EXPECT_THAT(file.message(), HasSubstr("recipe.yaml exists and is no safetensors file"));
  EXPECT_EQ(*ReadWholeFile(Path("recipe.yaml")), "run: {}\n");
  EXPECT_TRUE(
      ExportHfSafetensors(config, table, params.data(), Path("theirs/model.safetensors")).ok());
}

// A tokenizer with ids the model has no embedding row for is refused before anything is
// written: the folder would load in transformers and fail at its first forward pass.
TEST_F(HfFolderTest, ExportRefusesATokenizerLargerThanTheVocabulary) {
  ModelConfig config = Gpt2Config();
  config.vocab_size = 257;
  const ParamTable table(config, ModelSlice{});
  const std::vector<float> params = DistinctParams(table);
  const absl::Status status = ExportHfFolder(config, table, ValuesOf(params), Path("out"),
                                             WriteGpt2Tokenizer(*this, "gpt2tok"));
  EXPECT_THAT(status.message(), HasSubstr("has a vocabulary of 258, more than the model's 257"));
  EXPECT_FALSE(fs::exists(Path("out")));
}

}  // namespace
}  // namespace dtrain
