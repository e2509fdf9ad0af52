// RowPacks (pack_math.h), the rows of the classifier's and the norms' kernels.
#include "core/backend/cuda/pack_math.h"

#include <cstdint>
#include <vector>

#include "core/backend/cuda/bf16.h"
#include "gtest/gtest.h"

namespace dtrain::cuda {
namespace {

// A row's packs, wherever it starts: each value of the row in exactly one pack, of the thread
// Owner names; every pack wholly inside the row on a 16-byte boundary, so one vector load; and a
// thread's packs from First to Last.
template <typename T>
void CheckRowPacks() {
  constexpr int kThreadsHere = 64, kP = kPackSize<T>;
  constexpr int64_t n = 1000;
  std::vector<Pack<T>> buffer(n / kP + 2);  // 16-byte aligned storage
  for (int offset = 0; offset < kP; ++offset) {
    SCOPED_TRACE(::testing::Message() << "offset " << offset);
    const T* row = buffer[0].values + offset;
    const RowPacks<T, kThreadsHere> packs(row, n);
    EXPECT_EQ(packs.skew, offset);
    std::vector<int> holder(n, -1);
    for (int t = 0; t < kThreadsHere; ++t) {
      int64_t last = packs.First(t) - packs.kStride;
      for (int64_t i = packs.First(t); i < n; i += packs.kStride) {
        last = i;
        if (i >= 0 && i + kP <= n) {
          EXPECT_TRUE(IsWholePack(row, static_cast<size_t>(i), n)) << i;
        }
        for (int k = 0; k < kP; ++k) {
          if (!packs.Holds(i, k)) continue;
          EXPECT_EQ(holder[i + k], -1) << "value " << i + k << " in two packs";
          holder[i + k] = t;
        }
      }
      EXPECT_EQ(packs.Last(t), last) << "thread " << t;
    }
    for (int64_t j = 0; j < n; ++j) ASSERT_EQ(packs.Owner(j), holder[j]) << "value " << j;
  }
}

TEST(RowPacksTest, PacksAreAlignedWhereverTheRowStarts) {
  CheckRowPacks<float>();
  CheckRowPacks<Bf16>();
}

}  // namespace
}  // namespace dtrain::cuda
