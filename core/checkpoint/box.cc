#include "core/checkpoint/box.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace {

// Elements of one step along each dimension of a row-major array of `lengths`.
std::vector<int64_t> Strides(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> strides(lengths.size(), 1);
  for (size_t d = lengths.size(); d-- > 1;) strides[d - 1] = strides[d] * lengths[d];
  return strides;
}

// Elements [begin, end) of the sub-tensor of dimensions [dim, ndim) at the index `prefix` of the
// dimensions before it (each of length 1 in the boxes emitted).
void Decompose(const std::vector<int64_t>& shape, size_t dim, std::vector<int64_t>& prefix,
               int64_t begin, int64_t end, std::vector<Box>& out) {
  if (begin >= end) return;
  int64_t stride = 1;  // elements of one index of `dim`
  for (size_t d = dim + 1; d < shape.size(); ++d) stride *= shape[d];
  const auto emit = [&](int64_t first, int64_t count) {
    Box box;
    box.offsets = prefix;
    box.lengths.assign(prefix.size(), 1);
    box.offsets.push_back(first);
    box.lengths.push_back(count);
    for (size_t d = dim + 1; d < shape.size(); ++d) {
      box.offsets.push_back(0);
      box.lengths.push_back(shape[d]);
    }
    out.push_back(std::move(box));
  };
  const auto descend = [&](int64_t index, int64_t sub_begin, int64_t sub_end) {
    prefix.push_back(index);
    Decompose(shape, dim + 1, prefix, sub_begin, sub_end, out);
    prefix.pop_back();
  };
  if (begin % stride == 0 && end % stride == 0) {
    emit(begin / stride, (end - begin) / stride);
    return;
  }
  const int64_t first = begin / stride, last = end / stride;
  if (first == last) {
    descend(first, begin - first * stride, end - first * stride);
    return;
  }
  int64_t whole_begin = first;
  if (begin % stride != 0) {
    descend(first, begin % stride, stride);
    ++whole_begin;
  }
  if (whole_begin < last) emit(whole_begin, last - whole_begin);
  if (end % stride != 0) descend(last, 0, end % stride);
}

}  // namespace

Box WholeBox(const std::vector<int64_t>& shape) {
  return Box{std::vector<int64_t>(shape.size(), 0), shape};
}

int64_t BoxNumel(const Box& box) {
  int64_t numel = 1;
  for (const int64_t length : box.lengths) numel *= length;
  return numel;
}

bool BoxInShape(const Box& box, const std::vector<int64_t>& shape) {
  if (box.offsets.size() != shape.size() || box.lengths.size() != shape.size()) return false;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (box.offsets[d] < 0 || box.lengths[d] <= 0 || box.lengths[d] > shape[d] - box.offsets[d]) {
      return false;
    }
  }
  return true;
}

std::vector<Box> FlatRangeToBoxes(const std::vector<int64_t>& shape, int64_t begin, int64_t end) {
  std::vector<Box> boxes;
  if (shape.empty()) {
    if (begin < end) boxes.push_back(Box{});
    return boxes;
  }
  std::vector<int64_t> prefix;
  Decompose(shape, 0, prefix, begin, end, boxes);
  return boxes;
}

int64_t FlatIndexOfFirst(const Box& box, const std::vector<int64_t>& shape) {
  const std::vector<int64_t> strides = Strides(shape);
  int64_t index = 0;
  for (size_t d = 0; d < shape.size(); ++d) index += box.offsets[d] * strides[d];
  return index;
}

int64_t FlatIndexOfLast(const Box& box, const std::vector<int64_t>& shape) {
  const std::vector<int64_t> strides = Strides(shape);
  int64_t index = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    index += (box.offsets[d] + box.lengths[d] - 1) * strides[d];
  }
  return index;
}

std::optional<Box> IntersectBoxes(const Box& a, const Box& b) {
  Box common;
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    const int64_t lo = std::max(a.offsets[d], b.offsets[d]);
    const int64_t hi = std::min(a.offsets[d] + a.lengths[d], b.offsets[d] + b.lengths[d]);
    if (hi <= lo) return std::nullopt;
    common.offsets.push_back(lo);
    common.lengths.push_back(hi - lo);
  }
  return common;
}

bool ContiguousInBox(const Box& inner, const Box& outer) {
  size_t d = 0;
  while (d < inner.lengths.size() && inner.lengths[d] == 1) ++d;
  for (++d; d < inner.lengths.size(); ++d) {
    if (inner.lengths[d] != outer.lengths[d]) return false;
  }
  return true;
}

int64_t PositionInBox(const std::vector<int64_t>& index, const Box& box) {
  const std::vector<int64_t> strides = Strides(box.lengths);
  int64_t position = 0;
  for (size_t d = 0; d < index.size(); ++d) position += (index[d] - box.offsets[d]) * strides[d];
  return position;
}

void CopyBoxRegion(const Box& region, const Box& src_box, const void* src, const Box& dst_box,
                   void* dst, size_t element_bytes) {
  const size_t ndim = region.lengths.size();
  if (ndim == 0) {
    std::memcpy(dst, src, element_bytes);
    return;
  }
  // Trailing dimensions the region spans whole in both boxes join the innermost run, so a region
  // of whole rows is one copy.
  size_t outer_dims = ndim - 1;
  int64_t run = region.lengths[outer_dims];
  while (outer_dims > 0 && region.lengths[outer_dims] == src_box.lengths[outer_dims] &&
         region.lengths[outer_dims] == dst_box.lengths[outer_dims]) {
    --outer_dims;
    run *= region.lengths[outer_dims];
  }
  const size_t run_bytes = static_cast<size_t>(run) * element_bytes;
  const char* from = static_cast<const char*>(src);
  char* to = static_cast<char*>(dst);
  const std::vector<int64_t> src_strides = Strides(src_box.lengths);
  const std::vector<int64_t> dst_strides = Strides(dst_box.lengths);
  std::vector<int64_t> index = region.offsets;  // the first element of the current run
  for (;;) {
    int64_t src_at = 0, dst_at = 0;
    for (size_t d = 0; d < ndim; ++d) {
      src_at += (index[d] - src_box.offsets[d]) * src_strides[d];
      dst_at += (index[d] - dst_box.offsets[d]) * dst_strides[d];
    }
    std::memcpy(to + dst_at * element_bytes, from + src_at * element_bytes, run_bytes);
    size_t d = outer_dims;
    while (d > 0) {
      --d;
      if (++index[d] < region.offsets[d] + region.lengths[d]) break;
      index[d] = region.offsets[d];
      if (d == 0) return;
    }
    if (outer_dims == 0) return;
  }
}

std::string BoxToString(const Box& box) {
  std::string text = "[";
  for (size_t d = 0; d < box.offsets.size(); ++d) {
    absl::StrAppend(&text, d == 0 ? "" : ", ", box.offsets[d], ":",
                    box.offsets[d] + box.lengths[d]);
  }
  return text + "]";
}

}  // namespace dtrain
