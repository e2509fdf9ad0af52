// Attention test helpers: documents packed into rows, and the tolerance of the tensor-core
// attention (flash_attention_math.h) against the CPU backend's fp32 attention on the same bf16
// inputs, element by element. The kernels round P (forward, dv) and dS (dq, dk) to bf16 before
// multiplying, each by at most u = 2^-8 of itself, so an output that sums w_j x_j moves by at most
// u * sum_j |w_j x_j| =: u * A; the fp32 sums add kFloatTolerance * max(1, |y|) as for the other
// kernels (test_util.h), and rounding the output to bf16 another u of its value:
//   |kernel - cpu| <= u A + f + u (|y| + u A + f),   f = kFloatTolerance * max(1, |y|).
// A is computed here in double from the inputs.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/backend/backend.h"
#include "core/backend/cuda/bf16.h"
#include "core/backend/cuda/positions_math.h"
#include "gtest/gtest.h"
#include "tests/core/backend/cuda/test_util.h"

namespace dtrain::cuda::testing {

// Documents of the given lengths, in turn, packed into each of `batch` rows of `time` tokens
// (the last one cut at the row's end): each token's position in its document.
inline std::vector<int32_t> PackedPositions(int batch, int time, const std::vector<int>& lengths) {
  std::vector<int32_t> positions;
  for (int b = 0; b < batch; ++b) {
    for (int t = 0, doc = b, position = 0; t < time; ++t, ++position) {
      if (position == lengths[doc % lengths.size()]) {
        position = 0;
        ++doc;
      }
      positions.push_back(position);
    }
  }
  return positions;
}

// A of every element of out (B, T, H*D) and of dqkv (B, T, qkv_width), from qkv, dout and the
// kernel's own out (the backward's delta reads it), all as fp32 values of bf16.
struct AttentionSums {
  std::vector<double> out, dqkv;
};

inline AttentionSums AttentionAbsoluteSums(const AttentionShape& shape,
                                           const std::vector<float>& qkv,
                                           const std::vector<float>& dout,
                                           const std::vector<float>& out,
                                           const int32_t* positions) {
  const int time = shape.time, d = shape.head_dim, width = shape.qkv_width();
  const int out_width = shape.heads * d, group = shape.heads / shape.kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  AttentionSums sums{std::vector<double>(out.size()), std::vector<double>(qkv.size())};
  for (int b = 0; b < shape.batch; ++b) {
    const size_t row0 = static_cast<size_t>(b) * time;
    const int32_t* row_positions = positions == nullptr ? nullptr : positions + row0;
    const auto at = [&](size_t row, int head, int i) {
      return (row0 + row) * width + head * d + i;
    };
    for (int h = 0; h < shape.heads; ++h) {
      const int k_head = shape.heads + h / group, v_head = k_head + shape.kv_heads;
      for (int t = 0; t < time; ++t) {
        const RowRange keys = VisibleKeys(row_positions, t);
        std::vector<double> p(time), ds(time);
        double max = -INFINITY, sum = 0, delta = 0;
        for (int s = keys.begin; s < keys.end; ++s) {
          double dot = 0;
          for (int i = 0; i < d; ++i) dot += double{qkv[at(t, h, i)]} * qkv[at(s, k_head, i)];
          p[s] = scale * dot;
          max = std::max(max, p[s]);
        }
        for (int s = keys.begin; s < keys.end; ++s) sum += p[s] = std::exp(p[s] - max);
        const size_t out_row = (row0 + t) * out_width + h * d;
        for (int i = 0; i < d; ++i) delta += double{dout[out_row + i]} * out[out_row + i];
        for (int s = keys.begin; s < keys.end; ++s) {
          p[s] /= sum;
          double dp = 0;
          for (int i = 0; i < d; ++i) dp += double{dout[out_row + i]} * qkv[at(s, v_head, i)];
          ds[s] = p[s] * (dp - delta);
        }
        for (int s = keys.begin; s < keys.end; ++s) {
          for (int i = 0; i < d; ++i) {
            sums.out[out_row + i] += p[s] * std::abs(qkv[at(s, v_head, i)]);
            sums.dqkv[at(t, h, i)] += scale * std::abs(ds[s] * qkv[at(s, k_head, i)]);
            sums.dqkv[at(s, k_head, i)] += scale * std::abs(ds[s] * qkv[at(t, h, i)]);
            sums.dqkv[at(s, v_head, i)] += p[s] * std::abs(dout[out_row + i]);
          }
        }
      }
    }
  }
  return sums;
}

// A bf16 output of the tensor-core kernels against the CPU's fp32 `expected`, within the bound
// above for the absolute sums `sums`.
inline void ExpectWithinRounding(const std::vector<Bf16>& actual,
                                 const std::vector<float>& expected,
                                 const std::vector<double>& sums, const char* what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  ASSERT_EQ(sums.size(), expected.size()) << what;
  const double u = std::ldexp(1.0, -8);
  for (size_t i = 0; i < actual.size(); ++i) {
    const double y = std::abs(double{expected[i]});
    const double f = kFloatTolerance * std::max(1.0, y);
    const double bound = u * sums[i] + f + u * (y + u * sums[i] + f);
    ASSERT_NEAR(ToFloat(actual[i]), expected[i], bound) << what << "[" << i << "]";
  }
}

}  // namespace dtrain::cuda::testing
