#include "core/io/safetensors.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace {

// Whether an error message contains `part`, printing the message when not.
::testing::AssertionResult HasText(absl::string_view message, absl::string_view part) {
  if (absl::StrContains(message, part)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << message << "\" lacks \"" << part << "\"";
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "safetensors_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // A file with a hand-made header, for the corruption cases.
  std::string WriteRaw(const std::string& name, const std::string& header,
                       const std::string& data) const {
    const std::string path = Path(name);
    std::ofstream out(path, std::ios::binary);
    const uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
    out << header << data;
    return path;
  }

  std::filesystem::path dir_;
};

TEST_F(SafetensorsTest, RoundTripsF32I32AndMetadata) {
  const std::vector<float> weights = {1.5f, -2.0f, 3.25f, 0.0f, 1e-8f, 7.0f};
  const std::vector<int32_t> ids = {3, -1, 2147483647, 0};
  const std::string path = Path("t.safetensors");
  ASSERT_TRUE(WriteSafetensors(path,
                               {{{"w", DType::kF32, {2, 3}}, weights.data()},
                                {{"ids", DType::kI32, {4}}, ids.data()}},
                               {{"step", "12"}, {"format", "pt"}})
                  .ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  absl::StatusOr<SafetensorsContents> contents = ReadSafetensors(path);
  ASSERT_TRUE(contents.ok()) << contents.status();
  EXPECT_EQ(contents->floats.at("w"), weights);
  EXPECT_EQ(contents->ints.at("ids"), ids);
  EXPECT_EQ(contents->shapes.at("w"), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(contents->shapes.at("ids"), (std::vector<int64_t>{4}));
  EXPECT_EQ(contents->metadata.at("step"), "12");
  EXPECT_EQ(contents->metadata.at("format"), "pt");

  // The data section starts 8-byte aligned.
  std::ifstream in(path, std::ios::binary);
  uint64_t header_bytes = 0;
  in.read(reinterpret_cast<char*>(&header_bytes), 8);
  EXPECT_EQ((8 + header_bytes) % 8, 0u);
}

TEST_F(SafetensorsTest, ReaderListsTensorsInFileOrder) {
  const float a[2] = {1, 2};
  const int64_t b[1] = {5};
  const std::string path = Path("order.safetensors");
  ASSERT_TRUE(
      WriteSafetensors(path, {{{"z", DType::kF32, {2}}, a}, {{"a", DType::kI64, {}}, b}}).ok());
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_EQ(reader->tensors().size(), 2u);
  EXPECT_EQ(reader->tensors()[0].spec.name, "z");
  EXPECT_EQ(reader->tensors()[1].spec.name, "a");
  int64_t value = 0;
  ASSERT_TRUE(reader->ReadInt64("a", &value).ok());
  EXPECT_EQ(value, 5);
  float wrong[1];
  EXPECT_TRUE(HasText(reader->ReadFloat32("a", wrong).message(), "'a' is I64"));
  EXPECT_TRUE(
      HasText(reader->ReadFloat32("missing", wrong).message(), "no tensor named 'missing'"));
}

// A slice of a tensor reads as the same elements of the whole, in every floating type, across the
// reader's conversion buffer (2^20 elements) too; a slice past the end is an error.
TEST_F(SafetensorsTest, ASliceReadsAsThatPartOfTheWhole) {
  constexpr size_t kCount = (size_t{1} << 20) + 5;
  std::vector<uint16_t> bf16(kCount);
  std::vector<double> f64(kCount);
  std::vector<float> f32(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    bf16[i] = static_cast<uint16_t>(0x3F80 + i % 127);  // 1.0 up to 1.98
    f64[i] = static_cast<double>(i) + 0.25;
    f32[i] = static_cast<float>(i) * 0.5f;
  }
  const std::string path = Path("slices.safetensors");
  const int64_t n = static_cast<int64_t>(kCount);
  ASSERT_TRUE(WriteSafetensors(path, {{{"bf16", DType::kBF16, {n}}, bf16.data()},
                                      {{"f64", DType::kF64, {n}}, f64.data()},
                                      {{"f32", DType::kF32, {n}}, f32.data()}})
                  .ok());
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  for (const char* name : {"bf16", "f64", "f32"}) {
    std::vector<float> whole(kCount);
    ASSERT_TRUE(reader->ReadFloat32(name, whole.data()).ok()) << name;
    for (const auto& [begin, count] : std::vector<std::pair<size_t, size_t>>{
             {0, 3}, {(size_t{1} << 20) - 2, 7}, {5, kCount - 5}, {kCount, 0}}) {
      std::vector<float> slice(count);
      ASSERT_TRUE(reader->ReadFloat32Slice(name, begin, count, slice.data()).ok()) << name;
      EXPECT_TRUE(std::equal(slice.begin(), slice.end(), whole.begin() + begin))
          << name << " [" << begin << ", " << begin + count << ")";
    }
    size_t wrong = 0;
    for (size_t i = 0; i < kCount; ++i) {
      const float expected = absl::string_view(name) == "bf16"
                                 ? 1.0f + static_cast<float>(i % 127) / 128  // exact in bf16
                             : absl::string_view(name) == "f64" ? static_cast<float>(f64[i])
                                                                : f32[i];
      wrong += whole[i] != expected;
    }
    EXPECT_EQ(wrong, 0u) << name;
    float out[2];
    EXPECT_EQ(reader->ReadFloat32Slice(name, kCount - 1, 2, out).message(),
              absl::StrCat(path, ": tensor '", name, "' has ", kCount, " elements, not [",
                           kCount - 1, ", ", kCount + 1, ")"));
  }
}

TEST_F(SafetensorsTest, UnfinishedWriterLeavesNoFile) {
  const std::string path = Path("partial.safetensors");
  {
    absl::StatusOr<SafetensorsWriter> writer =
        SafetensorsWriter::Create(path, {{"a", DType::kF32, {1}}, {"b", DType::kF32, {1}}});
    ASSERT_TRUE(writer.ok());
    const float one = 1;
    ASSERT_TRUE(writer->WriteTensor("a", &one).ok());
    EXPECT_TRUE(HasText(writer->Finish().message(), "before tensor 'b'"));
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

// The file goes where a link leads, and the link stays; a FIFO (or a device) stays what it is.
TEST_F(SafetensorsTest, AWriteThroughALinkKeepsTheLinkAndAFifoIsRefused) {
  const float one = 1;
  const std::string link = Path("link.safetensors");
  std::filesystem::create_symlink("target.safetensors", link);
  ASSERT_TRUE(WriteSafetensors(link, {{{"a", DType::kF32, {1}}, &one}}).ok());
  EXPECT_TRUE(std::filesystem::is_symlink(link));
  EXPECT_TRUE(std::filesystem::is_regular_file(Path("target.safetensors")));

  const std::string fifo = Path("fifo.safetensors");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  EXPECT_TRUE(HasText(WriteSafetensors(fifo, {{{"a", DType::kF32, {1}}, &one}}).message(),
                      fifo + " is a FIFO, not a regular file"));
  EXPECT_TRUE(std::filesystem::is_fifo(fifo));
  EXPECT_FALSE(std::filesystem::exists(fifo + ".tmp"));
}

TEST_F(SafetensorsTest, WritingOutOfOrderIsAnError) {
  absl::StatusOr<SafetensorsWriter> writer = SafetensorsWriter::Create(
      Path("x.safetensors"), {{"a", DType::kF32, {1}}, {"b", DType::kF32, {1}}});
  ASSERT_TRUE(writer.ok());
  const float one = 1;
  EXPECT_TRUE(HasText(writer->WriteTensor("b", &one).message(), "expected 'a'"));
}

TEST_F(SafetensorsTest, DuplicateNamesAreRejected) {
  EXPECT_TRUE(HasText(SafetensorsWriter::Create(Path("d.safetensors"),
                                                {{"a", DType::kF32, {1}}, {"a", DType::kF32, {1}}})
                          .status()
                          .message(),
                      "'a' is declared twice"));
}

TEST_F(SafetensorsTest, CorruptHeaderIsAnError) {
  const std::string path = WriteRaw("bad.safetensors", "{\"a\": [1, 2", "");
  const absl::Status status = SafetensorsReader::Open(path).status();
  EXPECT_TRUE(HasText(status.message(), path));
  EXPECT_TRUE(HasText(status.message(), "not a JSON object"));
}

TEST_F(SafetensorsTest, HeaderLengthBeyondFileIsAnError) {
  const std::string path = Path("short.safetensors");
  {
    std::ofstream out(path, std::ios::binary);
    const uint64_t n = 1000;
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << "{}";
  }
  EXPECT_TRUE(
      HasText(SafetensorsReader::Open(path).status().message(), "header length 1000 does not fit"));
}

TEST_F(SafetensorsTest, OffsetsBeyondFileAreAnError) {
  const std::string path =
      WriteRaw("trunc.safetensors", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
               std::string(4, '\0'));
  const absl::Status status = SafetensorsReader::Open(path).status();
  EXPECT_TRUE(HasText(status.message(), path));
  EXPECT_TRUE(HasText(status.message(), "tensor 'w' ends at data byte 8 beyond the 4 bytes"));
}

TEST_F(SafetensorsTest, SizeThatDisagreesWithShapeIsAnError) {
  const std::string path =
      WriteRaw("size.safetensors", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
               std::string(8, '\0'));
  EXPECT_TRUE(HasText(SafetensorsReader::Open(path).status().message(),
                      "tensor 'w': data_offsets [0,8] hold 8 bytes but F32 [3] needs 3 * 4"));
}

TEST_F(SafetensorsTest, OverlappingTensorsAreAnError) {
  const std::string path = WriteRaw("overlap.safetensors",
                                    R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                    std::string(12, '\0'));
  EXPECT_TRUE(HasText(SafetensorsReader::Open(path).status().message(),
                      "tensor 'b' starts at data byte 4, overlapping tensor 'a'"));
}

TEST_F(SafetensorsTest, TrailingBytesAreAnError) {
  const std::string path =
      WriteRaw("gap.safetensors", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
               std::string(8, '\0'));
  EXPECT_TRUE(HasText(SafetensorsReader::Open(path).status().message(),
                      "tensors cover 4 bytes of data but the file holds 8"));
}

TEST_F(SafetensorsTest, UnknownDTypeIsAnError) {
  const std::string path =
      WriteRaw("dtype.safetensors", R"({"a":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})",
               std::string(1, '\0'));
  EXPECT_TRUE(HasText(SafetensorsReader::Open(path).status().message(),
                      "tensor 'a': unknown dtype 'F8_E4M3'"));
}

TEST_F(SafetensorsTest, ConvertsHalfAndBFloat16ToFloat32) {
  // 1, -2, 0.5, 65504 (largest half), 2^-24 (smallest subnormal), -0, +inf.
  const uint16_t half[] = {0x3c00, 0xc000, 0x3800, 0x7bff, 0x0001, 0x8000, 0x7c00};
  // 1, -3, 0.15625, 3.3895e38 (largest bfloat16).
  const uint16_t bf16[] = {0x3f80, 0xc040, 0x3e20, 0x7f7f};
  const std::string path = Path("half.safetensors");
  ASSERT_TRUE(
      WriteSafetensors(path, {{{"h", DType::kF16, {7}}, half}, {{"b", DType::kBF16, {2, 2}}, bf16}})
          .ok());
  absl::StatusOr<SafetensorsContents> contents = ReadSafetensors(path);
  ASSERT_TRUE(contents.ok()) << contents.status();
  const std::vector<float>& h = contents->floats.at("h");
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], -2.0f);
  EXPECT_EQ(h[2], 0.5f);
  EXPECT_EQ(h[3], 65504.0f);
  EXPECT_EQ(h[4], std::ldexp(1.0f, -24));
  EXPECT_EQ(h[5], 0.0f);
  EXPECT_TRUE(std::signbit(h[5]));
  EXPECT_EQ(h[6], std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7e00)));
  EXPECT_EQ(HalfToFloat(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  const std::vector<float>& b = contents->floats.at("b");
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[1], -3.0f);
  EXPECT_EQ(b[2], 0.15625f);
  EXPECT_EQ(b[3], std::ldexp(255.0f, 120));  // 0x7f7f, the largest bf16: widening is exact
}

TEST_F(SafetensorsTest, NarrowsI64ToInt32OnlyWhenItFits) {
  const int64_t fits[] = {-5, 1LL << 30};
  const int64_t too_big[] = {1LL << 40};
  const std::string path = Path("i64.safetensors");
  ASSERT_TRUE(WriteSafetensors(
                  path, {{{"fits", DType::kI64, {2}}, fits}, {{"big", DType::kI64, {1}}, too_big}})
                  .ok());
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok());
  int32_t out[2];
  ASSERT_TRUE(reader->ReadInt32("fits", out).ok());
  EXPECT_EQ(out[0], -5);
  EXPECT_EQ(out[1], 1 << 30);
  EXPECT_TRUE(HasText(reader->ReadInt32("big", out).message(), "'big' element 0"));
}

}  // namespace
}  // namespace dtrain
