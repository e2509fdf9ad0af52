#include "core/backend/cuda/adamw_math.h"

#include <vector>

#include "core/backend/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/core/backend/cuda/test_util.h"

namespace dtrain::cuda {
namespace {

using testing::ExpectBf16Matches;
using testing::ExpectFloatMatches;

constexpr size_t kValues = 61;
constexpr int kPack = 4;  // the kernel's values a thread: a 16-byte pack of floats
constexpr float kLr = 3e-2f, kBeta1 = 0.9f, kBeta2 = 0.95f, kEps = 1e-8f, kWeightDecay = 0.1f;

// A unit's tensors as the optimizer hands them over: decayed and exempt ranges, starting and
// ending inside packs, with values between them (and after the last) that no range holds.
const std::vector<AdamWRange> kRanges = {
    {.begin = 0, .end = 9, .decay = 1},   {.begin = 9, .end = 14, .decay = 0},
    {.begin = 17, .end = 18, .decay = 1}, {.begin = 18, .end = 31, .decay = 0},
    {.begin = 33, .end = 57, .decay = 1},
};

// Three steps: AdamWValues over every pack of the values, as the kernel's threads run them,
// against the CPU backend's AdamW over the same ranges, the gradient scaled by 0.75: the
// parameters and moments within the CUDA tolerance, the bf16 copy of each updated value against
// the CPU's, and every value outside the ranges (and its copy) untouched.
TEST(CudaAdamWTest, RangesOfAUnitMatchCpuBackend) {
  const std::vector<float> start = testing::RandomFloats(kValues, 1);
  std::vector<float> param = start, m(kValues), v(kValues);
  std::vector<float> param_cpu = param, m_cpu = m, v_cpu = v;
  const Bf16 untouched = FromFloat<Bf16>(-7.0f);
  std::vector<Bf16> copy(kValues, untouched), copy_cpu(kValues, untouched);
  CpuBackend cpu(1);
  for (int step = 1; step <= 3; ++step) {
    const std::vector<float> grad = testing::RandomFloats(kValues, 10 + step);
    const AdamWStep settings{.lr = kLr,
                             .beta1 = kBeta1,
                             .beta2 = kBeta2,
                             .eps = kEps,
                             .weight_decay = kWeightDecay,
                             .step = step,
                             .grad_scale = 0.75f};
    const AdamWCoefficients k = cpu::MakeAdamWCoefficients<float>(
        kLr, kBeta1, kBeta2, kEps, kWeightDecay, step, settings.grad_scale);
    for (size_t first = 0; first < kValues; first += kPack) {
      // The thread's pack, values past the end loaded as zeros as LoadPack does.
      float p[kPack] = {}, g[kPack] = {}, mp[kPack] = {}, vp[kPack] = {};
      for (size_t j = 0; j < kPack && first + j < kValues; ++j) {
        p[j] = param[first + j];
        g[j] = grad[first + j];
        mp[j] = m[first + j];
        vp[j] = v[first + j];
      }
      Bf16 pack_copy[kPack];
      bool updated[kPack];
      AdamWValues<kPack>(p, pack_copy, updated, g, mp, vp, first, kValues, kRanges.data(),
                         static_cast<int>(kRanges.size()), k);
      for (size_t j = 0; j < kPack && first + j < kValues; ++j) {
        param[first + j] = p[j];
        m[first + j] = mp[j];
        v[first + j] = vp[j];
        if (updated[j]) copy[first + j] = pack_copy[j];
      }
    }
    cpu.AdamW(param_cpu.data(), Values(copy_cpu.data()), grad.data(), m_cpu.data(), v_cpu.data(),
              kValues, kRanges.data(), static_cast<int>(kRanges.size()), settings);
    ExpectFloatMatches(param, param_cpu, "param");
    ExpectFloatMatches(m, m_cpu, "m");
    ExpectFloatMatches(v, v_cpu, "v");
    std::vector<float> updated_cpu;
    std::vector<Bf16> updated_copy;
    size_t next = 0;
    for (const AdamWRange& range : kRanges) {
      for (; next < static_cast<size_t>(range.begin); ++next) {
        EXPECT_EQ(param[next], start[next]) << "value " << next << " lies in no range";
        EXPECT_EQ(copy[next].bits, untouched.bits) << "copy " << next;
        EXPECT_EQ(copy_cpu[next].bits, untouched.bits) << "CPU copy " << next;
      }
      for (; next < static_cast<size_t>(range.end); ++next) {
        updated_cpu.push_back(param_cpu[next]);
        updated_copy.push_back(copy[next]);
        EXPECT_EQ(copy_cpu[next].bits, FromFloat<Bf16>(param_cpu[next]).bits) << "CPU copy";
      }
    }
    for (; next < kValues; ++next) EXPECT_EQ(param[next], start[next]) << "past the ranges";
    ExpectBf16Matches(updated_copy, updated_cpu, "bf16 copy");
  }
}

// A range without decay is the CPU's update at weight decay 0; the gradient scale is the
// gradient's.
TEST(CudaAdamWTest, DecayAndGradScaleAreTheCpuCoefficients) {
  const float grad = 2.0f, scaled = 1.0f;
  for (const bool decay : {true, false}) {
    float param = 0.5f, m = 0, v = 0, param_cpu = 0.5f, m_cpu = 0, v_cpu = 0;
    AdamWValue(&param, nullptr, &grad, &m, &v, 0,
               cpu::MakeAdamWCoefficients<float>(kLr, kBeta1, kBeta2, kEps, kWeightDecay, 1, 0.5),
               decay);
    cpu::AdamW(&param_cpu, &scaled, &m_cpu, &v_cpu, 1,
               cpu::MakeAdamWCoefficients<float>(kLr, kBeta1, kBeta2, kEps,
                                                 decay ? kWeightDecay : 0.0, 1, 1.0),
               nullptr);
    // Within rounding (the CPU's vector code may fuse multiply-adds); decay moves p by 1.5e-3.
    EXPECT_NEAR(param, param_cpu, 1e-6) << "decay " << decay;
    EXPECT_NEAR(m, m_cpu, 1e-6);
    EXPECT_NEAR(v, v_cpu, 1e-6);
  }
}

}  // namespace
}  // namespace dtrain::cuda
