#include "core/util/allocate.h"

#include <cstddef>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

struct Buffer {
  explicit Buffer(size_t bytes) { values.reserve(bytes); }
  std::vector<char> values;
};

TEST(AllocateTest, ConstructsWhenMemoryIsThere) {
  absl::StatusOr<std::unique_ptr<Buffer>> buffer = AllocateOrError<Buffer>("allocating", 64, 64);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_GE((*buffer)->values.capacity(), 64u);
}

// 2^62 bytes is more than any machine's address space: operator new throws bad_alloc.
TEST(AllocateTest, AllocationFailureIsAnErrorNamingPhaseAndBytes) {
  const size_t bytes = size_t{1} << 62;
  absl::StatusOr<std::unique_ptr<Buffer>> buffer =
      AllocateOrError<Buffer>("allocating activations", static_cast<double>(bytes), bytes);
  ASSERT_FALSE(buffer.ok());
  EXPECT_EQ(buffer.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(
      std::string(buffer.status().message()),
      AllOf(HasSubstr("out of memory allocating activations"), HasSubstr("about 4.29e+09 GiB")));
}

// A device backend's OutOfMemory says what the device had: the message carries it after the phase.
struct DeviceBuffer {
  DeviceBuffer() { throw OutOfMemory("cudaMalloc of 4096 bytes on GPU 1 with 0.001 GiB free"); }
};

TEST(AllocateTest, OutOfDeviceMemoryNamesBytesAskedAndFree) {
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> buffer =
      AllocateOrError<DeviceBuffer>("allocating parameters", 4096.0);
  ASSERT_FALSE(buffer.ok());
  EXPECT_EQ(buffer.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(buffer.status().message()),
              AllOf(HasSubstr("out of memory allocating parameters"),
                    HasSubstr("cudaMalloc of 4096 bytes on GPU 1 with 0.001 GiB free")));
}

}  // namespace
}  // namespace dtrain
