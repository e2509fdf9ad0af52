// libFuzzer target: arbitrary bytes through the tar reader, the sample grouper and the token
// decoder. Must never crash, hang or allocate beyond the input's size (members are capped at
// 1 MiB here). Built and run by tests/fuzz/CMakeLists.txt (ctest: fuzz.tar, 60 s).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/data/sample_grouper.h"
#include "core/data/shard_source.h"
#include "core/data/tar_reader.h"
#include "core/data/token_decode.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<dtrain::ByteSource> source =
      dtrain::MemorySource(std::string(reinterpret_cast<const char*>(data), size), "fuzz.tar");
  dtrain::TarReader reader(source.get(), /*max_member_bytes=*/1 << 20);
  dtrain::SampleGrouper grouper(&reader);
  dtrain::Sample sample;
  std::vector<int32_t> tokens;
  while (true) {
    absl::StatusOr<bool> more = grouper.Next(&sample);
    if (!more.ok() || !*more) break;
    (void)dtrain::DecodeSampleTokens(sample, 1 << 16, &tokens);
  }
  return 0;
}
