// Geometry of checkpoint chunks: a box is a rectangular part of a row-major tensor, an offset and
// a length per dimension; its elements are stored in the row-major order of the box. A flat
// element range [begin, end) of a tensor (what a data-parallel shard of the flat parameter buffer
// holds) is at most 2 * ndim - 1 boxes: partial innermost runs at both ends and whole sub-blocks
// in between. A column- or row-sliced tensor-parallel shard is one box.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dtrain {

struct Box {
  std::vector<int64_t> offsets;
  std::vector<int64_t> lengths;

  bool operator==(const Box&) const = default;
};

// The box of a whole tensor of `shape`.
Box WholeBox(const std::vector<int64_t>& shape);

// Elements of `box` (1 for the zero-dimensional box of a scalar).
int64_t BoxNumel(const Box& box);

// True when `box` lies inside a tensor of `shape` with every length positive.
bool BoxInShape(const Box& box, const std::vector<int64_t>& shape);

// The boxes that cover elements [begin, end) of a row-major tensor of `shape`, each once, in
// flat order (box i + 1's elements follow box i's). Requires 0 <= begin <= end <= numel.
std::vector<Box> FlatRangeToBoxes(const std::vector<int64_t>& shape, int64_t begin, int64_t end);

// The row-major position in a tensor of `shape` of the box's first element.
int64_t FlatIndexOfFirst(const Box& box, const std::vector<int64_t>& shape);
// ... and of its last element.
int64_t FlatIndexOfLast(const Box& box, const std::vector<int64_t>& shape);

// The common part of two boxes of one tensor; nullopt when they do not overlap.
std::optional<Box> IntersectBoxes(const Box& a, const Box& b);

// True when `inner` (inside `outer`) occupies one contiguous run of `outer`'s storage, so it can
// be read straight into it; its first element is then at element PositionInBox(inner's offsets).
bool ContiguousInBox(const Box& inner, const Box& outer);
// The position in `box`'s row-major storage of the tensor element at `index`.
int64_t PositionInBox(const std::vector<int64_t>& index, const Box& box);

// Copies the elements of `region` (inside both boxes) from `src`, holding `src_box`'s elements,
// to `dst`, holding `dst_box`'s; elements are `element_bytes` wide.
void CopyBoxRegion(const Box& region, const Box& src_box, const void* src, const Box& dst_box,
                   void* dst, size_t element_bytes);

// "[1:2, 0:768]" (per dimension, start:stop), for messages.
std::string BoxToString(const Box& box);

}  // namespace dtrain
