// The CPU backend's bf16 Values, the reference for the GPU's bf16 kernels: every method that
// takes Values, run once on float32 buffers and once on bf16 buffers of the same (bf16-exact)
// values, must give in bf16 the float32 run's outputs rounded to nearest even, bit for bit, and
// the same float32 parameter gradients and statistics, bit for bit: the bf16 run widens its
// inputs (and the outputs it accumulates into) and runs the same float32 kernels in the same
// order. An output read where it is only written, or written where it accumulates, or a tensor
// widened at a wrong size, breaks the equality. And GPT-2's GELU fused into the linear layers
// (LinearGeluForward, LinearBackwardThroughGelu) is in float32 the layer and the GELU one after
// the other, bit for bit; in bf16, the float32 sums go through the GELU before any rounding.
#include "core/backend/cpu/cpu_backend.h"

#include <cstdint>
#include <vector>

#include "core/backend/cpu/classifier.h"
#include "gtest/gtest.h"
#include "tests/core/backend/cpu/test_util.h"

namespace dtrain {
namespace {

// One tensor of the two runs: float32 values that bf16 holds exactly, and the same in bf16.
// Outputs start from random values too, so that an accumulating output must keep them. A test
// passes a call only tensors that no earlier call wrote (the float32 run's outputs are not
// rounded), so that both runs give every call the same inputs.
class Both {
 public:
  Both(size_t n, unsigned seed, double lo = -1, double hi = 1) : f_(n), b_(n) {
    const std::vector<double> values = cpu::testing::RandomVector(n, seed, lo, hi);
    for (size_t i = 0; i < n; ++i) {
      b_[i] = cuda::FromFloat<Bf16>(static_cast<float>(values[i]));
      f_[i] = cuda::ToFloat(b_[i]);
    }
  }
  // The run's buffer: bf16 or float32.
  Values operator()(bool bf16) { return bf16 ? Values(b_.data()) : Values(f_.data()); }

  // The bf16 run's values are the float32 run's rounded.
  void ExpectRounded(const char* what) const {
    for (size_t i = 0; i < f_.size(); ++i) {
      ASSERT_EQ(b_[i].bits, cuda::FromFloat<Bf16>(f_[i]).bits)
          << what << "[" << i << "]: " << f_[i] << " rounds to " << cuda::ToFloat(b_[i]);
    }
  }

 private:
  std::vector<float> f_;
  std::vector<Bf16> b_;
};

// A float32 output of the two runs (a parameter gradient, a statistic), equal bit for bit.
class Floats {
 public:
  Floats(size_t n, unsigned seed) {
    runs_[0] = cpu::testing::ToFloat(cpu::testing::RandomVector(n, seed));
    runs_[1] = runs_[0];
  }
  float* operator()(bool bf16) { return runs_[bf16].data(); }
  const std::vector<float>& Values() const { return runs_[0]; }
  void ExpectEqual(const char* what) const { EXPECT_EQ(runs_[0], runs_[1]) << what; }

 private:
  std::vector<float> runs_[2];
};

constexpr int kN = 37, kC = 24, kF = 40;  // rows, channels, hidden width
constexpr bool kRuns[] = {false, true};

// A freed large block serves the next allocation of its size (the engine's unit buffers come and
// go each step; glibc's heap fragmented under them), zeroed as every allocation is, and the
// backend holds it again only while it is allocated.
TEST(CpuBackendTest, FreedLargeBlocksServeTheNextAllocationOfTheirSizeZeroed) {
  CpuBackend backend(1);
  const size_t count = 1 << 16;  // 256 KiB of floats
  DeviceBuffer first = backend.Allocate(count, DataType::kF32);
  void* const block = first.data();
  static_cast<float*>(block)[7] = 3.0f;
  first.Reset();
  EXPECT_FALSE(backend.Holds(block, sizeof(float)));
  DeviceBuffer other_size = backend.Allocate(count / 2, DataType::kF32);
  EXPECT_NE(other_size.data(), block);
  DeviceBuffer again = backend.Allocate(count, DataType::kF32);
  EXPECT_EQ(again.data(), block);
  EXPECT_TRUE(backend.Holds(block, count * sizeof(float)));
  EXPECT_EQ(static_cast<const float*>(again.data())[7], 0.0f);
}

TEST(CpuBackendBf16Test, LinearLayers) {
  CpuBackend backend(2);
  Both inp(kN * kC, 1), weight(kF * kC, 2), bias(kF, 3), out(kN * kF, 4), dout(kN * kF, 5),
      dinp(kN * kC, 6), biased(kN * kF, 7), gelu_pre(kN * kF, 11), gelu_out(kN * kF, 12),
      pre(kN * kC, 13, -3, 3), dpre(kN * kC, 14);
  Floats dweight(kF * kC, 8), dbias(kF, 9), logits(kN * kF, 10), dweight2(kF * kC, 15),
      dbias2(kF, 16);
  for (const bool bf16 : kRuns) {
    backend.LinearForward(out(bf16), inp(bf16), weight(bf16), bias(bf16), kN, kC, kF);
    // bf16 inputs into a float32 output: the vocabulary-parallel logits.
    backend.LinearForward(logits(bf16), inp(bf16), weight(bf16), nullptr, kN, kC, kF);
    backend.AddBias(biased(bf16), bias(bf16), kN, kF);
    backend.LinearBackward(dinp(bf16), dweight(bf16), dbias(bf16), dout(bf16), inp(bf16),
                           weight(bf16), kN, kC, kF);
    // The GELU fused in: in bf16 from the float32 sums, rounded once.
    backend.LinearGeluForward(gelu_out(bf16), gelu_pre(bf16), inp(bf16), weight(bf16), bias(bf16),
                              kN, kC, kF);
    backend.LinearBackwardThroughGelu(dpre(bf16), dweight2(bf16), dbias2(bf16), dout(bf16),
                                      inp(bf16), pre(bf16), weight(bf16), kN, kC, kF);
  }
  out.ExpectRounded("out");
  logits.ExpectEqual("logits");
  biased.ExpectRounded("out + bias");
  dinp.ExpectRounded("dinp");
  dweight.ExpectEqual("dweight");
  dbias.ExpectEqual("dbias");
  gelu_pre.ExpectRounded("linear + gelu: pre");
  gelu_out.ExpectRounded("linear + gelu: out");
  dpre.ExpectRounded("dpre through the gelu");
  dweight2.ExpectEqual("dweight under dpre");
  dbias2.ExpectEqual("dbias under dpre");
}

// In float32 the fused layers are the layer and the GELU run one after the other, bit for bit.
TEST(CpuBackendTest, GeluFusedLayersAreTheLayerThenTheGelu) {
  CpuBackend backend(2);
  auto random = [](size_t n, unsigned seed) {
    return cpu::testing::ToFloat(cpu::testing::RandomVector(n, seed, -2, 2));
  };
  const std::vector<float> inp = random(kN * kC, 1), weight = random(kF * kC, 2),
                           bias = random(kF, 3), dout = random(kN * kF, 4),
                           pre = random(kN * kC, 5);
  std::vector<float> fused_pre(kN * kF), fused_out(kN * kF), pre_ref(kN * kF), out_ref(kN * kF);
  backend.LinearGeluForward(fused_out.data(), fused_pre.data(), inp.data(), weight.data(),
                            bias.data(), kN, kC, kF);
  backend.LinearForward(pre_ref.data(), inp.data(), weight.data(), bias.data(), kN, kC, kF);
  backend.GeluForward(out_ref.data(), pre_ref.data(), pre_ref.size());
  EXPECT_EQ(fused_pre, pre_ref);
  EXPECT_EQ(fused_out, out_ref);

  std::vector<float> dpre(kN * kC), dinp_ref(kN * kC), dpre_ref(kN * kC);
  std::vector<float> dweight = random(kF * kC, 6), dbias = random(kF, 7);
  std::vector<float> dweight_ref = dweight, dbias_ref = dbias;
  backend.LinearBackwardThroughGelu(dpre.data(), dweight.data(), dbias.data(), dout.data(),
                                    inp.data(), pre.data(), weight.data(), kN, kC, kF);
  backend.LinearBackward(dinp_ref.data(), dweight_ref.data(), dbias_ref.data(), dout.data(),
                         inp.data(), weight.data(), kN, kC, kF);
  backend.GeluBackward(dpre_ref.data(), pre.data(), dinp_ref.data(), dpre_ref.size());
  EXPECT_EQ(dpre, dpre_ref);
  EXPECT_EQ(dweight, dweight_ref);
  EXPECT_EQ(dbias, dbias_ref);
}

TEST(CpuBackendBf16Test, Norms) {
  CpuBackend backend(2);
  Both inp(kN * kC, 1), weight(kC, 2, 0.5, 1.5), bias(kC, 3), out(kN * kC, 4), dout(kN * kC, 5),
      dinp(kN * kC, 6), rms_out(kN * kC, 7), rms_dinp(kN * kC, 8);
  Floats mean(kN, 9), rstd(kN, 10), dweight(kC, 11), dbias(kC, 12), rms_rstd(kN, 13),
      rms_dweight(kC, 14);
  for (const bool bf16 : kRuns) {
    backend.LayerNormForward(out(bf16), mean(bf16), rstd(bf16), inp(bf16), weight(bf16), bias(bf16),
                             kN, kC, 1e-5f);
    backend.LayerNormBackward(dinp(bf16), dweight(bf16), dbias(bf16), dout(bf16), inp(bf16),
                              weight(bf16), mean(bf16), rstd(bf16), kN, kC);
    backend.RmsNormForward(rms_out(bf16), rms_rstd(bf16), inp(bf16), weight(bf16), kN, kC, 1e-5f);
    backend.RmsNormBackward(rms_dinp(bf16), rms_dweight(bf16), dout(bf16), inp(bf16), weight(bf16),
                            rms_rstd(bf16), kN, kC);
  }
  out.ExpectRounded("layernorm out");
  mean.ExpectEqual("mean");
  rstd.ExpectEqual("rstd");
  dinp.ExpectRounded("layernorm dinp (accumulated)");
  dweight.ExpectEqual("layernorm dweight");
  dbias.ExpectEqual("layernorm dbias");
  rms_out.ExpectRounded("rmsnorm out");
  rms_rstd.ExpectEqual("rmsnorm rstd");
  rms_dinp.ExpectRounded("rmsnorm dinp (accumulated)");
  rms_dweight.ExpectEqual("rmsnorm dweight");
}

TEST(CpuBackendBf16Test, ActivationsAndElementwise) {
  CpuBackend backend(2);
  const size_t n = kN * kF;
  Both x(2 * n, 1, -3, 3), dy(n, 2), gelu(n, 3), dgelu(n, 4), swiglu(n, 5), dswiglu(2 * n, 6),
      sum(n, 7), scaled(n, 8), zeroed(n, 9);
  for (const bool bf16 : kRuns) {
    backend.GeluForward(gelu(bf16), x(bf16), n);
    backend.GeluBackward(dgelu(bf16), x(bf16), dy(bf16), n);
    backend.SwiGluForward(swiglu(bf16), x(bf16), kN, kF);
    backend.SwiGluBackward(dswiglu(bf16), x(bf16), dy(bf16), kN, kF);
    backend.Add(sum(bf16), x(bf16), dy(bf16), n);
    backend.Scale(scaled(bf16), 0.3f, n);
    backend.Zero(zeroed(bf16), n);
  }
  gelu.ExpectRounded("gelu");
  dgelu.ExpectRounded("dgelu");
  swiglu.ExpectRounded("swiglu");
  dswiglu.ExpectRounded("dswiglu");
  sum.ExpectRounded("add");
  scaled.ExpectRounded("scale");
  zeroed.ExpectRounded("zero");
}

TEST(CpuBackendBf16Test, RopeAndAttention) {
  CpuBackend backend(2);
  const AttentionShape shape = {.batch = 2, .time = 19, .heads = 4, .kv_heads = 2, .head_dim = 8};
  const size_t tokens = static_cast<size_t>(shape.batch) * shape.time;
  const size_t qkv_count = tokens * shape.qkv_width();
  const size_t out_count = tokens * shape.heads * shape.head_dim;
  // Two documents in each row: positions restart at token 7.
  std::vector<int32_t> positions(tokens);
  for (size_t i = 0; i < tokens; ++i) {
    const int t = static_cast<int>(i % shape.time);
    positions[i] = t < 7 ? t : t - 7;
  }
  Both rope(qkv_count, 1), drope(qkv_count, 2), qkv(qkv_count, 3), out(out_count, 4),
      saved_out(out_count, 5), dout(out_count, 6), dqkv(qkv_count, 7);
  Floats lse(static_cast<size_t>(shape.batch) * shape.heads * shape.time, 8);
  for (const bool bf16 : kRuns) {
    backend.RopeForward(rope(bf16), shape, 10000.0f, 3, positions.data());
    backend.RopeBackward(drope(bf16), shape, 10000.0f, 3, nullptr);
    backend.AttentionForward(out(bf16), lse(bf16), qkv(bf16), shape, positions.data());
    backend.AttentionBackward(dqkv(bf16), dout(bf16), qkv(bf16), saved_out(bf16), lse(bf16), shape,
                              positions.data());
  }
  rope.ExpectRounded("rope (in place)");
  out.ExpectRounded("attention out");
  lse.ExpectEqual("lse");
  dqkv.ExpectRounded("attention dqkv");
  drope.ExpectRounded("rope backward (in place)");
}

TEST(CpuBackendBf16Test, EmbeddingAndVocabularyParallelClassifier) {
  CpuBackend backend(2);
  constexpr int kB = 2, kT = 9, kVocab = 50, kVocabBegin = 10, kVocabEnd = 40;
  const int n = kB * kT;
  std::vector<int32_t> tokens(n), targets(n);
  for (int i = 0; i < n; ++i) {
    tokens[i] = (i * 7) % kVocab;  // some outside the rows [10, 40)
    targets[i] = i % 5 == 0 ? -1 : (i * 11) % kVocab;
  }
  Both wte(static_cast<size_t>(kVocabEnd - kVocabBegin) * kC, 1), wpe(kT * kC, 2), emb(n * kC, 3),
      demb(n * kC, 4), vocab_logits(n * kVocab, 5, -4, 4), vocab_dlogits(n * kVocab, 6, -4, 4);
  Floats dwte(static_cast<size_t>(kVocabEnd - kVocabBegin) * kC, 7), dwpe(kT * kC, 8), max(n, 9),
      sums(n, 10), target_logits(n, 11);
  for (const bool bf16 : kRuns) {
    backend.EmbeddingForward(emb(bf16), tokens.data(), wte(bf16), wpe(bf16), kB, kT, kC,
                             kVocabBegin, kVocabEnd, nullptr);
    backend.EmbeddingBackward(dwte(bf16), dwpe(bf16), demb(bf16), tokens.data(), kB, kT, kC,
                              kVocabBegin, kVocabEnd, nullptr);
    backend.ClassifierRowMax(max(bf16), vocab_logits(bf16), n, kVocab);
    backend.ClassifierExpSums(vocab_logits(bf16), sums(bf16), target_logits(bf16), max(bf16),
                              targets.data(), n, kVocab, 0);
    backend.ClassifierLogitsBackward(vocab_dlogits(bf16), sums(bf16), targets.data(), n, kVocab, 0,
                                     0.25f);
  }
  emb.ExpectRounded("embedding out");
  dwte.ExpectEqual("dtoken_embedding");
  dwpe.ExpectEqual("dposition_embedding");
  max.ExpectEqual("vocabulary-parallel max");
  vocab_logits.ExpectRounded("vocabulary-parallel exponentials (in place)");
  sums.ExpectEqual("vocabulary-parallel sums");
  target_logits.ExpectEqual("vocabulary-parallel target logits");
  vocab_dlogits.ExpectRounded("vocabulary-parallel dlogits (in place)");
}

// The fused classifier keeps bf16 logits for bf16 inputs, as the CUDA backend does: the float32
// kernel with its logits and their gradient rounded to bf16 (cpu::ClassifierForwardBackward's
// bf16_logits) on the same widened inputs, and not the float32 run, whose logits are exact.
TEST(CpuBackendBf16Test, FusedClassifierRoundsItsLogitsToBf16) {
  CpuBackend backend(2);
  constexpr int kVocab = 50, kRows = 18;
  std::vector<int32_t> targets(kRows);
  for (int i = 0; i < kRows; ++i) targets[i] = i % 5 == 0 ? -1 : (i * 11) % kVocab;
  Both x(kRows * kC, 1, -2, 2), head(kVocab * kC, 2, -2, 2), dx(kRows * kC, 3);
  Floats dhead(kVocab * kC, 4);
  double loss = 0, float32_loss = 0;
  backend.ClassifierForwardBackward(dx(true), dhead(true), x(true), head(true), targets.data(),
                                    kRows, kC, kVocab, 0.25f, &loss);
  backend.ClassifierForwardBackward(dx(false), dhead(false), x(false), head(false), targets.data(),
                                    kRows, kC, kVocab, 0.25f, &float32_loss);
  // The reference starts from the same dweight as the bf16 run did.
  std::vector<float> expected_dx(kRows * kC), scratch(kRows * kVocab);
  std::vector<float> expected_dhead = Floats(kVocab * kC, 4).Values();
  const double expected_loss = cpu::ClassifierForwardBackward(
      expected_dx.data(), expected_dhead.data(), x(false).as<float>(), head(false).as<float>(),
      targets.data(), kRows, kC, kVocab, 0.25f, kRows, scratch.data(), nullptr,
      MatmulPrecision::kHighest, /*bf16_logits=*/true);
  EXPECT_EQ(loss, expected_loss);
  EXPECT_NE(loss, float32_loss) << "the bf16 run's logits were not rounded";
  const Bf16* dx_bf16 = dx(true).as<Bf16>();
  for (int i = 0; i < kRows * kC; ++i) {
    ASSERT_EQ(dx_bf16[i].bits, cuda::FromFloat<Bf16>(expected_dx[i]).bits) << "dx[" << i << "]";
  }
  EXPECT_EQ(std::vector<float>(dhead(true), dhead(true) + kVocab * kC), expected_dhead);
}

}  // namespace
}  // namespace dtrain
