#include "core/checkpoint/box.h"

#include <cstdint>
#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace {

// The flat positions in a tensor of `shape` of `box`'s elements, in the box's row-major order.
std::vector<int64_t> FlatPositions(const Box& box, const std::vector<int64_t>& shape) {
  std::vector<int64_t> positions;
  std::vector<int64_t> index = box.offsets;
  for (int64_t n = 0; n < BoxNumel(box); ++n) {
    int64_t flat = 0;
    for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + index[d];
    positions.push_back(flat);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++index[d] < box.offsets[d] + box.lengths[d]) break;
      index[d] = box.offsets[d];
    }
  }
  return positions;
}

TEST(BoxTest, AFlatRangeIsAPartialRowWholeRowsAndAPartialRow) {
  const std::vector<Box> boxes = FlatRangeToBoxes({3, 4}, 2, 11);
  ASSERT_EQ(boxes.size(), 3u);
  EXPECT_EQ(BoxToString(boxes[0]), "[0:1, 2:4]");
  EXPECT_EQ(BoxToString(boxes[1]), "[1:2, 0:4]");
  EXPECT_EQ(BoxToString(boxes[2]), "[2:3, 0:3]");
  // Whole rows are one box.
  EXPECT_THAT(FlatRangeToBoxes({3, 4}, 4, 12), ::testing::ElementsAre(Box{{1, 0}, {2, 4}}));
}

TEST(BoxTest, FlatRangesOfEveryShapeBecomeBoxesCoveringExactlyTheRange) {
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{
           {}, {7}, {3, 4}, {2, 3, 4}, {2, 1, 3, 5}, {1, 5}, {4, 1}}) {
    int64_t numel = 1;
    for (const int64_t n : shape) numel *= n;
    const Box whole = WholeBox(shape);
    for (int64_t begin = 0; begin <= numel; ++begin) {
      for (int64_t end = begin; end <= numel; ++end) {
        const std::vector<Box> boxes = FlatRangeToBoxes(shape, begin, end);
        EXPECT_LE(boxes.size(), std::max<size_t>(1, 2 * shape.size() - 1));
        std::vector<int64_t> covered;
        for (const Box& box : boxes) {
          ASSERT_TRUE(BoxInShape(box, shape)) << BoxToString(box);
          // Each box is one run of the tensor, as a flat range's piece must be.
          EXPECT_TRUE(ContiguousInBox(box, whole)) << BoxToString(box);
          EXPECT_EQ(FlatIndexOfFirst(box, shape), begin + static_cast<int64_t>(covered.size()));
          for (const int64_t p : FlatPositions(box, shape)) covered.push_back(p);
          EXPECT_EQ(FlatIndexOfLast(box, shape), covered.back());
        }
        std::vector<int64_t> expected(static_cast<size_t>(end - begin));
        std::iota(expected.begin(), expected.end(), begin);
        ASSERT_EQ(covered, expected)
            << "shape rank " << shape.size() << " [" << begin << ", " << end << ")";
      }
    }
  }
}

TEST(BoxTest, IntersectionIsTheCommonPartOrNothing) {
  const Box rows{{1, 0}, {2, 6}};     // rows 1..2 of a (4, 6) tensor
  const Box columns{{0, 4}, {4, 2}};  // columns 4..5
  EXPECT_EQ(IntersectBoxes(rows, columns), (Box{{1, 4}, {2, 2}}));
  EXPECT_EQ(IntersectBoxes(rows, rows), rows);
  // Touching boxes share no element.
  EXPECT_EQ(IntersectBoxes(Box{{0, 0}, {1, 6}}, rows), std::nullopt);
  EXPECT_EQ(IntersectBoxes(Box{{0, 0}, {4, 4}}, columns), std::nullopt);
  EXPECT_EQ(IntersectBoxes(Box{}, Box{}), Box{});  // a scalar with itself
}

TEST(BoxTest, ContiguityAndPositionInABox) {
  const Box outer{{0, 2}, {3, 4}};
  EXPECT_TRUE(ContiguousInBox(Box{{1, 2}, {2, 4}}, outer));   // whole rows of it
  EXPECT_TRUE(ContiguousInBox(Box{{1, 3}, {1, 2}}, outer));   // part of one row
  EXPECT_FALSE(ContiguousInBox(Box{{0, 2}, {2, 2}}, outer));  // parts of two rows
  EXPECT_EQ(PositionInBox({1, 3}, outer), 5);
  EXPECT_EQ(PositionInBox({0, 2}, outer), 0);
}

// Copies between every pair of `boxes` of a (3, 4, 5) tensor whose elements are `T` holding their
// flat positions; checks the region arrives and nothing else changes.
template <typename T>
void ExpectRegionCopies(const std::vector<Box>& boxes) {
  const std::vector<int64_t> shape = {3, 4, 5};
  for (const Box& src_box : boxes) {
    std::vector<T> src;
    for (const int64_t p : FlatPositions(src_box, shape)) src.push_back(static_cast<T>(p));
    for (const Box& dst_box : boxes) {
      const std::optional<Box> region = IntersectBoxes(src_box, dst_box);
      if (!region) continue;
      std::vector<T> dst(static_cast<size_t>(BoxNumel(dst_box)), static_cast<T>(-1));
      CopyBoxRegion(*region, src_box, src.data(), dst_box, dst.data(), sizeof(T));
      const std::vector<int64_t> in_region = FlatPositions(*region, shape);
      const std::vector<int64_t> positions = FlatPositions(dst_box, shape);
      for (size_t i = 0; i < positions.size(); ++i) {
        const bool inside =
            std::find(in_region.begin(), in_region.end(), positions[i]) != in_region.end();
        EXPECT_EQ(dst[i], inside ? static_cast<T>(positions[i]) : static_cast<T>(-1))
            << BoxToString(src_box) << " -> " << BoxToString(dst_box) << " element " << i;
      }
    }
  }
}

TEST(BoxTest, CopyingARegionMovesExactlyItsElementsBetweenAnyTwoBoxes) {
  const std::vector<Box> boxes = {Box{{0, 0, 0}, {3, 4, 5}}, Box{{1, 1, 0}, {2, 3, 5}},
                                  Box{{0, 2, 1}, {3, 2, 3}}, Box{{2, 0, 0}, {1, 4, 5}},
                                  Box{{0, 1, 4}, {2, 3, 1}}, Box{{1, 0, 2}, {1, 1, 3}}};
  ExpectRegionCopies<float>(boxes);
  ExpectRegionCopies<uint16_t>(boxes);  // the width of a bf16 element
}

}  // namespace
}  // namespace dtrain
