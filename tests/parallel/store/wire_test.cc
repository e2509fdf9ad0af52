#include "parallel/store/wire.h"

#include <gtest/gtest.h>

namespace dtrain {
namespace {

TEST(StoreWireTest, FieldsRoundTripLittleEndian) {
  const std::string frame =
      FrameWriter(StoreMessage::kAdd).U8(7).U32(0x01020304).I64(-2).Bytes("key").Raw("xy").Finish();
  // length = type(1) + u8(1) + u32(4) + i64(8) + size(4) + "key"(3) + "xy"(2) = 23.
  EXPECT_EQ(frame.substr(0, 4), std::string("\x17\0\0\0", 4));
  EXPECT_EQ(frame.substr(6, 4), "\x04\x03\x02\x01");

  absl::StatusOr<std::optional<FrameView>> parsed = ParseFrame(frame, 1024);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_TRUE(parsed->has_value());
  EXPECT_EQ((*parsed)->type, StoreMessage::kAdd);
  EXPECT_EQ((*parsed)->frame_bytes, frame.size());
  FrameReader reader((*parsed)->payload);
  EXPECT_EQ(*reader.U8(), 7);
  EXPECT_EQ(*reader.U32(), 0x01020304u);
  EXPECT_EQ(*reader.I64(), -2);
  EXPECT_EQ(*reader.Bytes(16), "key");
  EXPECT_EQ(*reader.Raw(2), "xy");
  EXPECT_TRUE(reader.ExpectEnd().ok());
  EXPECT_FALSE(reader.U8().ok());
}

TEST(StoreWireTest, IncompleteFramesWaitForMoreBytes) {
  const std::string frame = FrameWriter(StoreMessage::kPing).Finish();
  for (size_t size = 0; size < frame.size(); ++size) {
    absl::StatusOr<std::optional<FrameView>> parsed = ParseFrame(frame.substr(0, size), 1024);
    ASSERT_TRUE(parsed.ok());
    EXPECT_FALSE(parsed->has_value()) << size;
  }
}

TEST(StoreWireTest, RejectsZeroAndOversizeLengths) {
  EXPECT_FALSE(ParseFrame(std::string(4, '\0'), 1024).ok());
  const std::string huge("\xff\xff\xff\xff", 4);
  absl::StatusOr<std::optional<FrameView>> parsed = ParseFrame(huge, 1024);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("1024"), std::string::npos) << parsed.status();
}

TEST(StoreWireTest, ReaderRejectsOversizeAndTruncatedStrings) {
  const std::string frame = FrameWriter(StoreMessage::kSet).Bytes("abcdef").Finish();
  FrameReader limited(std::string_view(frame).substr(kFrameHeaderBytes + 1));
  EXPECT_FALSE(limited.Bytes(5).ok());

  const std::string payload = frame.substr(kFrameHeaderBytes + 1);
  FrameReader truncated(std::string_view(payload).substr(0, payload.size() - 1));
  EXPECT_FALSE(truncated.Bytes(100).ok());

  const std::string with_trailing = payload + "!";
  FrameReader trailing(with_trailing);
  EXPECT_TRUE(trailing.Bytes(100).ok());
  EXPECT_FALSE(trailing.ExpectEnd().ok());
}

TEST(StoreWireTest, MaxFrameFitsTheLargestRequest) {
  StoreWireLimits limits;
  limits.max_key_bytes = 10;
  limits.max_value_bytes = 100;
  limits.max_wait_keys = 2;
  const std::string compare_set = FrameWriter(StoreMessage::kCompareSet)
                                      .Bytes(std::string(10, 'k'))
                                      .Bytes(std::string(100, 'e'))
                                      .Bytes(std::string(100, 'd'))
                                      .Finish();
  EXPECT_EQ(compare_set.size() - kFrameHeaderBytes, MaxFrameBytes(limits));
}

}  // namespace
}  // namespace dtrain
