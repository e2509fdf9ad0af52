#include "core/data/packer.h"

#include <vector>

#include "gtest/gtest.h"

namespace dtrain {
namespace {

// Windows of seq_len + 1 from documents; the token stream is their concatenation with EOS.
std::vector<std::vector<int32_t>> Pack(const std::vector<std::vector<int32_t>>& docs, int seq_len,
                                       int eos_id) {
  Packer packer(seq_len, eos_id);
  std::vector<std::vector<int32_t>> windows;
  for (const std::vector<int32_t>& doc : docs) {
    int64_t position = 0;
    while (packer.Fill(doc, &position)) {
      std::vector<int32_t> inputs(seq_len), targets(seq_len);
      packer.Emit(inputs.data(), targets.data());
      inputs.push_back(targets.back());
      windows.push_back(inputs);
    }
    EXPECT_EQ(position, packer.Length(doc));
  }
  return windows;
}

TEST(PackerTest, ConcatenatesDocumentsWithEosAndSharesBoundaryTokens) {
  // Stream: 1 2 3 9 4 9 5 6 7 8 9 -> windows of 4 tokens, stride 3.
  EXPECT_EQ(Pack({{1, 2, 3}, {4}, {5, 6, 7, 8}}, 3, 9),
            (std::vector<std::vector<int32_t>>{{1, 2, 3, 9}, {9, 4, 9, 5}, {5, 6, 7, 8}}));
  EXPECT_EQ(Pack({{1, 2, 3}, {4}, {5, 6, 7, 8}}, 3, -1),
            (std::vector<std::vector<int32_t>>{{1, 2, 3, 4}, {4, 5, 6, 7}}));
}

TEST(PackerTest, CarriesLeftoversAcrossDocumentsAndLongDocumentsSpanWindows) {
  Packer packer(2, -1);
  std::vector<int32_t> doc = {1, 2, 3, 4, 5, 6};
  int64_t position = 0;
  int32_t in[2], out[2];
  ASSERT_TRUE(packer.Fill(doc, &position));
  packer.Emit(in, out);
  EXPECT_EQ(packer.carry(), std::vector<int32_t>{3});
  ASSERT_TRUE(packer.Fill(doc, &position));
  packer.Emit(in, out);
  EXPECT_EQ(in[0], 3);
  EXPECT_EQ(out[1], 5);
  EXPECT_FALSE(packer.Fill(doc, &position));  // 5 6 carried: needs one more token
  EXPECT_EQ(packer.carry(), (std::vector<int32_t>{5, 6}));
}

TEST(PackerTest, TokenDocumentsPackLikeTheirIds) {
  const std::vector<std::vector<int32_t>> docs = {{1, 2, 3}, {4}, {5, 6, 7, 8, 300, 9}, {}};
  for (int width : {2, 4}) {
    Packer packer(3, 9);
    std::vector<std::vector<int32_t>> windows;
    for (const std::vector<int32_t>& ids : docs) {
      TokenDocument document{.words = {}, .width = width};
      for (int32_t id : ids) document.words.append(reinterpret_cast<const char*>(&id), width);
      int64_t position = 0;
      while (packer.Fill(document, &position)) {
        std::vector<int32_t> inputs(3), targets(3);
        packer.Emit(inputs.data(), targets.data());
        inputs.push_back(targets.back());
        windows.push_back(inputs);
      }
      EXPECT_EQ(position, packer.Length(document));
    }
    EXPECT_EQ(windows, Pack(docs, 3, 9)) << width;
  }
}

}  // namespace
}  // namespace dtrain
