// The CUDA backend on a GPU against the CPU backend: every Backend method on random data, the
// whole model trained 20 steps, and two GPU runs bit for bit. Built where the toolkit is (in
// dtrain_gpu_tests, ctest label gpu), skipped, saying why, where no GPU is.
//
// Tolerances, relative to max(1, |expected|): 1e-5 for the kernels (test_util.h derives it:
// both sides round every operation to fp32 and differ only in the order of short sums); 1e-4 for
// the GEMMs and what is built on them (cuBLASLt and OpenBLAS sum K products in different orders:
// about sqrt(K) * 2^-24 of the magnitude for random signs, below 2e-6 at K <= 256, well inside);
// 1e-4 for 20 training steps (fp32 on both sides with TF32 off; AdamW's normalised updates keep
// the differences of the order of the GEMMs', as the PyTorch comparison measures on CPU).
#include "core/backend/cuda/cuda_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "core/backend/cpu/cpu_backend.h"
#include "core/model/param_table.h"
#include "core/model/transformer.h"
#include "core/util/allocate.h"
#include "parallel/data_parallel.h"
#include "parallel/train_step.h"
#include "tests/core/backend/cuda/test_util.h"
#include "tests/testing/small_model.h"

namespace dtrain {
namespace {

using cuda::testing::RandomFloats;

// The backend on GPU 0, or null after skipping with the reason (no driver, no device).
std::unique_ptr<CudaBackend> GpuOrSkip(
    std::string* why, MatmulPrecision matmul_precision = MatmulPrecision::kHighest) {
  absl::StatusOr<std::unique_ptr<CudaBackend>> backend = CudaBackend::Create(0, matmul_precision);
  if (!backend.ok()) {
    *why = std::string(backend.status().message());
    return nullptr;
  }
  return *std::move(backend);
}

#define DTRAIN_GPU_OR_SKIP(name)                       \
  std::string why;                                     \
  std::unique_ptr<CudaBackend> name = GpuOrSkip(&why); \
  if (name == nullptr) GTEST_SKIP() << why

// Host values on both backends, read back after the work.
class Pair {
 public:
  Pair(CpuBackend& cpu, CudaBackend& gpu, const std::vector<float>& values)
      : gpu_backend_(gpu),
        cpu_(cpu.Allocate(values.size(), DataType::kF32)),
        gpu_(gpu.Allocate(values.size(), DataType::kF32)) {
    cpu.CopyFromHost(cpu_.data(), values.data(), cpu_.bytes());
    gpu.CopyFromHost(gpu_.data(), values.data(), gpu_.bytes());
  }
  float* cpu() const { return cpu_.floats(); }
  float* gpu() const { return gpu_.floats(); }
  std::vector<float> CpuValues() const { return {cpu_.floats(), cpu_.floats() + cpu_.size()}; }
  std::vector<float> GpuValues() const {
    std::vector<float> host(gpu_.size());
    gpu_backend_.CopyToHost(host.data(), gpu_.data(), gpu_.bytes());
    return host;
  }

 private:
  CudaBackend& gpu_backend_;
  DeviceBuffer cpu_, gpu_;
};

// Token ids (or targets) on the device, the same values the CPU side reads from the host.
class Ids {
 public:
  Ids(CudaBackend& gpu, std::vector<int32_t> values)
      : host_(std::move(values)), device_(gpu.Allocate(host_.size(), DataType::kF32)) {
    gpu.CopyFromHost(device_.data(), host_.data(), host_.size() * sizeof(int32_t));
  }
  const int32_t* cpu() const { return host_.data(); }
  const int32_t* gpu() const { return static_cast<const int32_t*>(device_.data()); }

 private:
  std::vector<int32_t> host_;
  DeviceBuffer device_;
};

// One double in the GPU's memory, as the backend's scalars are, starting at `initial`.
class DeviceScalar {
 public:
  DeviceScalar(CudaBackend& gpu, double initial)
      : gpu_(gpu), device_(gpu.Allocate(1, DataType::kF64)) {
    gpu.CopyFromHost(device_.data(), &initial, sizeof(initial));
  }
  double* get() const { return static_cast<double*>(device_.data()); }
  double Value() const { return ReadScalar(gpu_, get()); }

 private:
  CudaBackend& gpu_;
  DeviceBuffer device_;
};

void ExpectNear(const Pair& pair, double tolerance, const std::string& what) {
  const std::vector<float> expected = pair.CpuValues(), actual = pair.GpuValues();
  ASSERT_EQ(expected.size(), actual.size()) << what;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double scale = std::max(1.0, std::abs(static_cast<double>(expected[i])));
    ASSERT_LE(std::abs(static_cast<double>(actual[i]) - expected[i]), tolerance * scale)
        << what << " [" << i << "]: " << actual[i] << " vs " << expected[i];
  }
}

constexpr double kKernel = 1e-5, kGemm = 1e-4;

// Host values stored in bf16 on both backends (rounded to nearest even), read back widened.
class Bf16Pair {
 public:
  Bf16Pair(CpuBackend& cpu, CudaBackend& gpu, const std::vector<float>& values)
      : gpu_backend_(gpu),
        cpu_(cpu.Allocate(values.size(), DataType::kBF16)),
        gpu_(gpu.Allocate(values.size(), DataType::kBF16)) {
    std::vector<Bf16> rounded(values.size());
    for (size_t i = 0; i < values.size(); ++i) rounded[i] = cuda::FromFloat<Bf16>(values[i]);
    cpu.CopyFromHost(cpu_.data(), rounded.data(), cpu_.bytes());
    gpu.CopyFromHost(gpu_.data(), rounded.data(), gpu_.bytes());
  }
  Values cpu() const { return cpu_.values(); }
  Values gpu() const { return gpu_.values(); }
  // Both sides widened; the GPU's within `tolerance` of the CPU's relative to max(1, |cpu|), plus
  // one bf16 rounding either side of the float32 value may have taken (2^-8 of it).
  void ExpectNear(double tolerance, const std::string& what) const {
    std::vector<Bf16> expected(cpu_.size()), actual(gpu_.size());
    std::memcpy(expected.data(), cpu_.data(), cpu_.bytes());
    gpu_backend_.CopyToHost(actual.data(), gpu_.data(), gpu_.bytes());
    for (size_t i = 0; i < expected.size(); ++i) {
      const double e = cuda::ToFloat(expected[i]), a = cuda::ToFloat(actual[i]);
      const double bound = tolerance * std::max(1.0, std::abs(e)) + 0x1p-8 * std::abs(e);
      ASSERT_LE(std::abs(a - e), bound) << what << " [" << i << "]: " << a << " vs " << e;
    }
  }

 private:
  CudaBackend& gpu_backend_;
  DeviceBuffer cpu_, gpu_;
};

TEST(CudaBackendTest, GemmsAndLinearLayers) {
  DTRAIN_GPU_OR_SKIP(gpu);
  CpuBackend cpu(1);
  constexpr int m = 37, n = 29, k = 45;  // odd sizes: no tile fits exactly
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      Pair a(cpu, *gpu, RandomFloats(m * k, 1)), b(cpu, *gpu, RandomFloats(k * n, 2));
      Pair c(cpu, *gpu, RandomFloats(m * n, 3));
      const int lda = ta ? m : k, ldb = tb ? k : n;
      cpu.Gemm(ta, tb, m, n, k, 0.75f, a.cpu(), lda, b.cpu(), ldb, 0.5f, c.cpu(), n);
      gpu->Gemm(ta, tb, m, n, k, 0.75f, a.gpu(), lda, b.gpu(), ldb, 0.5f, c.gpu(), n);
      ExpectNear(c, kGemm, absl::StrCat("gemm ta=", ta, " tb=", tb));
    }
  }
  constexpr int rows = 23, in = 40, out = 33;
  Pair inp(cpu, *gpu, RandomFloats(rows * in, 4)), weight(cpu, *gpu, RandomFloats(out * in, 5));
  Pair bias(cpu, *gpu, RandomFloats(out, 6)), y(cpu, *gpu, std::vector<float>(rows * out));
  cpu.LinearForward(y.cpu(), inp.cpu(), weight.cpu(), bias.cpu(), rows, in, out);
  gpu->LinearForward(y.gpu(), inp.gpu(), weight.gpu(), bias.gpu(), rows, in, out);
  ExpectNear(y, kGemm, "linear forward (bias epilogue)");
  cpu.AddBias(y.cpu(), bias.cpu(), rows, out);
  gpu->AddBias(y.gpu(), bias.gpu(), rows, out);
  ExpectNear(y, kGemm, "add bias");
  Pair dout(cpu, *gpu, RandomFloats(rows * out, 7)), dinp(cpu, *gpu, std::vector<float>(rows * in));
  Pair dweight(cpu, *gpu, RandomFloats(out * in, 8)), dbias(cpu, *gpu, RandomFloats(out, 9));
  cpu.LinearBackward(dinp.cpu(), dweight.cpu(), dbias.cpu(), dout.cpu(), inp.cpu(), weight.cpu(),
                     rows, in, out);
  gpu->LinearBackward(dinp.gpu(), dweight.gpu(), dbias.gpu(), dout.gpu(), inp.gpu(), weight.gpu(),
                      rows, in, out);
  ExpectNear(dinp, kGemm, "linear dinp");
  ExpectNear(dweight, kGemm, "linear dweight (accumulated)");
  ExpectNear(dbias, kGemm, "linear dbias (accumulated)");
  EXPECT_TRUE(gpu->status().ok()) << gpu->status();
}

TEST(CudaBackendTest, NormsActivationsAndElementwise) {
  DTRAIN_GPU_OR_SKIP(gpu);
  CpuBackend cpu(1);
  constexpr int n = 19, c = 96, f = 45;
  Pair inp(cpu, *gpu, RandomFloats(n * c, 1)), weight(cpu, *gpu, RandomFloats(c, 2, 0.5, 1.5));
  Pair bias(cpu, *gpu, RandomFloats(c, 3)), out(cpu, *gpu, std::vector<float>(n * c));
  Pair mean(cpu, *gpu, std::vector<float>(n)), rstd(cpu, *gpu, std::vector<float>(n));
  cpu.LayerNormForward(out.cpu(), mean.cpu(), rstd.cpu(), inp.cpu(), weight.cpu(), bias.cpu(), n, c,
                       1e-5f);
  gpu->LayerNormForward(out.gpu(), mean.gpu(), rstd.gpu(), inp.gpu(), weight.gpu(), bias.gpu(), n,
                        c, 1e-5f);
  ExpectNear(out, kKernel, "layernorm out");
  ExpectNear(rstd, kKernel, "layernorm rstd");
  Pair dout(cpu, *gpu, RandomFloats(n * c, 4)), dinp(cpu, *gpu, RandomFloats(n * c, 5));
  Pair dweight(cpu, *gpu, RandomFloats(c, 6)), dbias(cpu, *gpu, RandomFloats(c, 7));
  cpu.LayerNormBackward(dinp.cpu(), dweight.cpu(), dbias.cpu(), dout.cpu(), inp.cpu(), weight.cpu(),
                        mean.cpu(), rstd.cpu(), n, c);
  gpu->LayerNormBackward(dinp.gpu(), dweight.gpu(), dbias.gpu(), dout.gpu(), inp.gpu(),
                         weight.gpu(), mean.gpu(), rstd.gpu(), n, c);
  ExpectNear(dinp, kKernel, "layernorm dinp");
  ExpectNear(dweight, kKernel, "layernorm dweight");
  ExpectNear(dbias, kKernel, "layernorm dbias");
  cpu.RmsNormForward(out.cpu(), rstd.cpu(), inp.cpu(), weight.cpu(), n, c, 1e-6f);
  gpu->RmsNormForward(out.gpu(), rstd.gpu(), inp.gpu(), weight.gpu(), n, c, 1e-6f);
  ExpectNear(out, kKernel, "rmsnorm out");
  cpu.RmsNormBackward(dinp.cpu(), dweight.cpu(), dout.cpu(), inp.cpu(), weight.cpu(), rstd.cpu(), n,
                      c);
  gpu->RmsNormBackward(dinp.gpu(), dweight.gpu(), dout.gpu(), inp.gpu(), weight.gpu(), rstd.gpu(),
                       n, c);
  ExpectNear(dinp, kKernel, "rmsnorm dinp");
  ExpectNear(dweight, kKernel, "rmsnorm dweight");
  // The residual add fused into each norm (the norm kernels' residual_out).
  Pair residual(cpu, *gpu, RandomFloats(n * c, 10)), sum(cpu, *gpu, std::vector<float>(n * c));
  cpu.AddLayerNormForward(sum.cpu(), out.cpu(), mean.cpu(), rstd.cpu(), residual.cpu(), inp.cpu(),
                          weight.cpu(), bias.cpu(), n, c, 1e-5f);
  gpu->AddLayerNormForward(sum.gpu(), out.gpu(), mean.gpu(), rstd.gpu(), residual.gpu(), inp.gpu(),
                           weight.gpu(), bias.gpu(), n, c, 1e-5f);
  ExpectNear(sum, kKernel, "residual + layernorm: sum");
  ExpectNear(out, kKernel, "residual + layernorm: out");
  ExpectNear(mean, kKernel, "residual + layernorm: mean");
  cpu.AddRmsNormForward(sum.cpu(), out.cpu(), rstd.cpu(), inp.cpu(), residual.cpu(), weight.cpu(),
                        n, c, 1e-6f);
  gpu->AddRmsNormForward(sum.gpu(), out.gpu(), rstd.gpu(), inp.gpu(), residual.gpu(), weight.gpu(),
                         n, c, 1e-6f);
  ExpectNear(sum, kKernel, "residual + rmsnorm: sum");
  ExpectNear(out, kKernel, "residual + rmsnorm: out");
  ExpectNear(rstd, kKernel, "residual + rmsnorm: rstd");

  Pair x(cpu, *gpu, RandomFloats(n * 2 * f, 8, -6, 6)), dy(cpu, *gpu, RandomFloats(n * 2 * f, 9));
  Pair y(cpu, *gpu, std::vector<float>(n * 2 * f)), dx(cpu, *gpu, std::vector<float>(n * 2 * f));
  const size_t values = n * 2 * f;
  cpu.GeluForward(y.cpu(), x.cpu(), values);
  gpu->GeluForward(y.gpu(), x.gpu(), values);
  ExpectNear(y, kKernel, "gelu");
  cpu.GeluBackward(dx.cpu(), x.cpu(), dy.cpu(), values);
  gpu->GeluBackward(dx.gpu(), x.gpu(), dy.gpu(), values);
  ExpectNear(dx, kKernel, "dgelu");
  cpu.SwiGluForward(y.cpu(), x.cpu(), n, f);
  gpu->SwiGluForward(y.gpu(), x.gpu(), n, f);
  ExpectNear(y, kKernel, "swiglu");
  cpu.SwiGluBackward(dx.cpu(), x.cpu(), dy.cpu(), n, f);
  gpu->SwiGluBackward(dx.gpu(), x.gpu(), dy.gpu(), n, f);
  ExpectNear(dx, kKernel, "dswiglu");

  cpu.Add(y.cpu(), x.cpu(), dy.cpu(), values);
  gpu->Add(y.gpu(), x.gpu(), dy.gpu(), values);
  ExpectNear(y, 0, "add");
  cpu.Scale(y.cpu(), 0.37f, values);
  gpu->Scale(y.gpu(), 0.37f, values);
  ExpectNear(y, 0, "scale");
  // Both add into their scalar, which starts at 2.
  double expected = 2;
  cpu.SumSquares(y.cpu(), values, &expected);
  const DeviceScalar actual(*gpu, 2);
  gpu->SumSquares(y.gpu(), values, actual.get());
  EXPECT_NEAR(actual.Value(), expected, kKernel * expected) << "sum of squares";
  cpu.Zero(y.cpu(), values - 3);
  gpu->Zero(y.gpu(), values - 3);
  ExpectNear(y, 0, "zero");

  Pair param(cpu, *gpu, RandomFloats(values, 10)), m(cpu, *gpu, RandomFloats(values, 11));
  Pair v(cpu, *gpu, RandomFloats(values, 12, 0, 1));
  // Two tensors, one without weight decay, a gap between them, and the bf16 copy.
  const std::vector<AdamWRange> ranges = {
      {.begin = 0, .end = 5, .decay = 1},
      {.begin = 7, .end = static_cast<int64_t>(values), .decay = 0}};
  DeviceBuffer cpu_ranges = cpu.Allocate(3 * ranges.size(), DataType::kI64);
  DeviceBuffer gpu_ranges = gpu->Allocate(3 * ranges.size(), DataType::kI64);
  cpu.CopyFromHost(cpu_ranges.data(), ranges.data(), cpu_ranges.bytes());
  gpu->CopyFromHost(gpu_ranges.data(), ranges.data(), gpu_ranges.bytes());
  Bf16Pair copy(cpu, *gpu, std::vector<float>(values));
  const AdamWStep settings{.lr = 1e-3f,
                           .beta1 = 0.9f,
                           .beta2 = 0.95f,
                           .eps = 1e-8f,
                           .weight_decay = 0.1f,
                           .step = 3,
                           .grad_scale = 0.8f};
  cpu.AdamW(param.cpu(), copy.cpu(), dy.cpu(), m.cpu(), v.cpu(), values,
            static_cast<const AdamWRange*>(cpu_ranges.data()), 2, settings);
  gpu->AdamW(param.gpu(), copy.gpu(), dy.gpu(), m.gpu(), v.gpu(), values,
             static_cast<const AdamWRange*>(gpu_ranges.data()), 2, settings);
  ExpectNear(param, kKernel, "adamw param");
  ExpectNear(m, kKernel, "adamw m");
  ExpectNear(v, kKernel, "adamw v");
  copy.ExpectNear(kKernel, "adamw bf16 copy");
  EXPECT_TRUE(gpu->status().ok()) << gpu->status();
}

// The bf16 copies of the gradient reductions: the same bits as the CPU's rounding, and back.
TEST(CudaBackendTest, Bf16CopiesMatchTheCpu) {
  DTRAIN_GPU_OR_SKIP(gpu);
  CpuBackend cpu(1);
  const size_t n = 100003;
  const std::vector<float> values = RandomFloats(n, 11, -50, 50);
  std::vector<Bf16> expected(n), rounded_gpu(n);
  cpu.Convert(expected.data(), values.data(), n);
  DeviceBuffer x = gpu->Allocate(n, DataType::kF32);
  DeviceBuffer rounded = gpu->Allocate(n, DataType::kBF16);
  gpu->CopyFromHost(x.data(), values.data(), x.bytes());
  gpu->Convert(rounded.values(), x.values(), n);
  gpu->CopyToHost(rounded_gpu.data(), rounded.data(), rounded.bytes());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(rounded_gpu[i].bits, expected[i].bits) << i;
  gpu->Convert(x.values(), rounded.values(), n);
  std::vector<float> widened(n), widened_cpu(n);
  gpu->CopyToHost(widened.data(), x.data(), x.bytes());
  cpu.Convert(widened_cpu.data(), expected.data(), n);
  EXPECT_EQ(widened, widened_cpu);
  EXPECT_TRUE(gpu->status().ok()) << gpu->status();
}

// Memory comes from the device's pool, which keeps a freed block; more than the GPU has throws
// OutOfMemory naming the bytes asked (after the pool gave back its free blocks), and the backend
// works on afterwards; Holds answers for the live blocks only.
TEST(CudaBackendTest, MemoryComesFromAPoolAndRunningOutIsNamed) {
  DTRAIN_GPU_OR_SKIP(gpu);
  const size_t count = size_t{64} << 20;  // 256 MiB
  void* first = nullptr;
  {
    DeviceBuffer buffer = gpu->Allocate(count, DataType::kF32);
    first = buffer.data();
    EXPECT_TRUE(gpu->Holds(first, count * sizeof(float)));
  }
  EXPECT_FALSE(gpu->Holds(first, 4));
  gpu->Synchronize();
  cudaMemPool_t pool = nullptr;
  ASSERT_EQ(cudaDeviceGetDefaultMemPool(&pool, 0), cudaSuccess);
  uint64_t reserved = 0;
  ASSERT_EQ(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved),
            cudaSuccess);
  EXPECT_GE(reserved, count * sizeof(float)) << "the pool keeps the freed block";
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  EXPECT_GE(gpu->AvailableMemory().bytes, static_cast<double>(free_bytes + reserved))
      << "what the pool keeps is the backend's to allocate";
  const size_t too_many = static_cast<size_t>(gpu->AvailableMemory().bytes) * 2 / sizeof(float);
  try {
    DeviceBuffer huge = gpu->Allocate(too_many, DataType::kF32);
    ADD_FAILURE() << "allocating twice the GPU's memory succeeded";
  } catch (const OutOfMemory& oom) {
    EXPECT_NE(std::string(oom.what()).find(std::to_string(too_many * sizeof(float)) + " bytes"),
              std::string::npos)
        << oom.what();
  }
  const std::vector<float> values = RandomFloats(1000, 7);
  CpuBackend cpu(1);
  Pair pair(cpu, *gpu, values);
  EXPECT_EQ(pair.GpuValues(), values);
  EXPECT_TRUE(gpu->status().ok()) << gpu->status();
}

// Copies from the host of up to a staging slot return without waiting for the stream: the host
// reuses its buffer at once, more copies are issued than there are slots, and each arrives; a
// larger copy (which waits) arrives too.
TEST(CudaBackendTest, CopiesFromTheHostArriveWhileTheHostReusesItsBuffer) {
  DTRAIN_GPU_OR_SKIP(gpu);
  constexpr int kCopies = 20;
  constexpr size_t kValues = 1000;
  const DeviceBuffer device = gpu->Allocate(kCopies * kValues, DataType::kF32);
  std::vector<float> host(kValues);
  for (int i = 0; i < kCopies; ++i) {
    std::fill(host.begin(), host.end(), static_cast<float>(i));
    gpu->CopyFromHost(device.floats() + i * kValues, host.data(), kValues * sizeof(float));
  }
  const std::vector<float> large(size_t{1} << 19, 7.0f);  // 2 MiB
  const DeviceBuffer large_device = gpu->Allocate(large.size(), DataType::kF32);
  gpu->CopyFromHost(large_device.data(), large.data(), large_device.bytes());
  std::vector<float> arrived(kCopies * kValues), large_arrived(large.size());
  gpu->CopyToHost(arrived.data(), device.data(), device.bytes());
  gpu->CopyToHost(large_arrived.data(), large_device.data(), large_device.bytes());
  ASSERT_TRUE(gpu->status().ok()) << gpu->status();
  for (size_t i = 0; i < arrived.size(); ++i) {
    ASSERT_EQ(arrived[i], static_cast<float>(i / kValues)) << i;
  }
  EXPECT_EQ(large_arrived, large);
}

// Rows of 13 tokens holding documents [0, 5), [5, 6), [6, 13), then [0, 9), [9, 13).
const std::vector<int32_t> kDocuments = {0, 1, 2, 3, 4, 0, 0, 1, 2, 3, 4, 5, 6,
                                         0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2, 3};

// Rope, attention and the embeddings, forward and backward, with one document a row (documents
// empty) or with documents packed into the rows.
void CheckPositionKernels(CpuBackend& cpu, CudaBackend& gpu,
                          const std::vector<int32_t>& documents) {
  SCOPED_TRACE(documents.empty() ? "one document a row" : "documents");
  const Ids document_ids(gpu, documents);
  const int32_t* cpu_positions = documents.empty() ? nullptr : document_ids.cpu();
  const int32_t* gpu_positions = documents.empty() ? nullptr : document_ids.gpu();
  const AttentionShape shape{.batch = 2, .time = 13, .heads = 4, .kv_heads = 2, .head_dim = 16};
  const size_t rows = static_cast<size_t>(shape.batch) * shape.time;
  const size_t qkv_values = rows * shape.qkv_width(), out_values = rows * shape.heads * 16;
  Pair qkv(cpu, gpu, RandomFloats(qkv_values, 1));
  cpu.RopeForward(qkv.cpu(), shape, 10000.0f, 3, cpu_positions);
  gpu.RopeForward(qkv.gpu(), shape, 10000.0f, 3, gpu_positions);
  ExpectNear(qkv, kKernel, "rope forward");
  Pair out(cpu, gpu, std::vector<float>(out_values));
  Pair lse(cpu, gpu, std::vector<float>(rows * shape.heads));
  cpu.AttentionForward(out.cpu(), lse.cpu(), qkv.cpu(), shape, cpu_positions);
  gpu.AttentionForward(out.gpu(), lse.gpu(), qkv.gpu(), shape, gpu_positions);
  ExpectNear(out, kKernel, "attention out");
  ExpectNear(lse, kKernel, "attention lse");
  Pair dout(cpu, gpu, RandomFloats(out_values, 2)), dqkv(cpu, gpu, std::vector<float>(qkv_values));
  cpu.AttentionBackward(dqkv.cpu(), dout.cpu(), qkv.cpu(), out.cpu(), lse.cpu(), shape,
                        cpu_positions);
  gpu.AttentionBackward(dqkv.gpu(), dout.gpu(), qkv.gpu(), out.gpu(), lse.gpu(), shape,
                        gpu_positions);
  ExpectNear(dqkv, kKernel, "attention dqkv");
  cpu.RopeBackward(dqkv.cpu(), shape, 10000.0f, 3, cpu_positions);
  gpu.RopeBackward(dqkv.gpu(), shape, 10000.0f, 3, gpu_positions);
  ExpectNear(dqkv, kKernel, "rope backward");

  constexpr int b = 2, t = 13, c = 40, v = 97, vocab_begin = 10, vocab_end = 90;
  std::vector<int32_t> token_values(b * t);
  for (int i = 0; i < b * t; ++i) token_values[i] = (i * 37) % v;
  const Ids tokens(gpu, token_values);
  Pair table(cpu, gpu, RandomFloats((vocab_end - vocab_begin) * c, 3));
  Pair position_table(cpu, gpu, RandomFloats(t * c, 4));
  Pair emb(cpu, gpu, std::vector<float>(b * t * c));
  cpu.EmbeddingForward(emb.cpu(), tokens.cpu(), table.cpu(), position_table.cpu(), b, t, c,
                       vocab_begin, vocab_end, cpu_positions);
  gpu.EmbeddingForward(emb.gpu(), tokens.gpu(), table.gpu(), position_table.gpu(), b, t, c,
                       vocab_begin, vocab_end, gpu_positions);
  ExpectNear(emb, kKernel, "embedding forward");
  Pair demb(cpu, gpu, RandomFloats(b * t * c, 5));
  cpu.EmbeddingBackward(table.cpu(), position_table.cpu(), demb.cpu(), tokens.cpu(), b, t, c,
                        vocab_begin, vocab_end, cpu_positions);
  gpu.EmbeddingBackward(table.gpu(), position_table.gpu(), demb.gpu(), tokens.gpu(), b, t, c,
                        vocab_begin, vocab_end, gpu_positions);
  ExpectNear(table, kKernel, "embedding dtoken (accumulated)");
  ExpectNear(position_table, kKernel, "embedding dposition (accumulated)");
}

// The embedding's backward on a long micro-batch whose tokens repeat about 80 times each: the ids
// sorted on the device (CUB's stable radix sort) keep each token's rows in row order, and each
// entry sums them in float32 from its old value as the CPU does, so both tables equal the CPU's
// bit for bit (a vocabulary-parallel slice, tokens outside it skipped; one document per row, and
// packed documents).
TEST(CudaBackendTest, EmbeddingBackwardSumsEachTokensRowsInTheCpusOrder) {
  DTRAIN_GPU_OR_SKIP(gpu);
  CpuBackend cpu(1);
  constexpr int b = 8, t = 512, c = 96, v = 50, vocab_begin = 5, vocab_end = 45;
  std::vector<int32_t> token_values(b * t), position_values(b * t);
  for (int i = 0; i < b * t; ++i) {
    token_values[i] = (i * 7919 + i / 3) % v;
    position_values[i] = i % t % 100;  // documents of 100 tokens
  }
  const Ids tokens(*gpu, token_values), positions(*gpu, position_values);
  for (const Ids* documents : {static_cast<const Ids*>(nullptr), &positions}) {
    Pair table(cpu, *gpu, RandomFloats((vocab_end - vocab_begin) * c, 10));
    Pair position_table(cpu, *gpu, RandomFloats(t * c, 11));
    Pair demb(cpu, *gpu, RandomFloats(b * t * c, 12));
    cpu.EmbeddingBackward(table.cpu(), position_table.cpu(), demb.cpu(), tokens.cpu(), b, t, c,
                          vocab_begin, vocab_end, documents ? documents->cpu() : nullptr);
    gpu->EmbeddingBackward(table.gpu(), position_table.gpu(), demb.gpu(), tokens.gpu(), b, t, c,
                           vocab_begin, vocab_end, documents ? documents->gpu() : nullptr);
    EXPECT_EQ(table.GpuValues(), table.CpuValues()) << "token table, documents " << !!documents;
    EXPECT_EQ(position_table.GpuValues(), position_table.CpuValues())
        << "position table, documents " << !!documents;
  }
  EXPECT_TRUE(gpu->status().ok()) << gpu->status();
}

TEST(CudaBackendTest, AttentionRopeEmbeddingAndClassifier) {
  DTRAIN_GPU_OR_SKIP(gpu);
  CpuBackend cpu(1);
  CheckPositionKernels(cpu, *gpu, {});
  CheckPositionKernels(cpu, *gpu, kDocuments);

  constexpr int b = 2, t = 13, c = 40, v = 97, vocab_begin = 10;
  std::vector<int32_t> target_values(b * t);
  for (int i = 0; i < b * t; ++i) {
    target_values[i] = i % 7 == 3 ? -1 : (i * 53 + 5) % v;  // some rows ignored
  }
  const Ids targets(*gpu, target_values);
  const int n = b * t;
  Pair x(cpu, *gpu, RandomFloats(n * c, 6)), head(cpu, *gpu, RandomFloats(v * c, 7));
  Pair dx(cpu, *gpu, std::vector<float>(n * c)), dhead(cpu, *gpu, RandomFloats(v * c, 8));
  double loss_cpu = 3;
  cpu.ClassifierForwardBackward(dx.cpu(), dhead.cpu(), x.cpu(), head.cpu(), targets.cpu(), n, c, v,
                                0.25f, &loss_cpu);
  const DeviceScalar loss_gpu(*gpu, 3);
  gpu->ClassifierForwardBackward(dx.gpu(), dhead.gpu(), x.gpu(), head.gpu(), targets.gpu(), n, c, v,
                                 0.25f, loss_gpu.get());
  EXPECT_NEAR(loss_gpu.Value(), loss_cpu, kGemm * loss_cpu) << "classifier loss";
  ExpectNear(dx, kGemm, "classifier dx");
  ExpectNear(dhead, kGemm, "classifier dweight (accumulated)");

  // The vocabulary-parallel phases, on the logits of rows [vocab_begin, vocab_begin + 30).
  constexpr int local_v = 30;
  Pair logits(cpu, *gpu, RandomFloats(n * local_v, 9, -4, 4));
  Pair max(cpu, *gpu, std::vector<float>(n)), sums(cpu, *gpu, std::vector<float>(n));
  Pair target_logits(cpu, *gpu, std::vector<float>(n));
  cpu.ClassifierRowMax(max.cpu(), logits.cpu(), n, local_v);
  gpu->ClassifierRowMax(max.gpu(), logits.gpu(), n, local_v);
  ExpectNear(max, 0, "row max");
  cpu.ClassifierExpSums(logits.cpu(), sums.cpu(), target_logits.cpu(), max.cpu(), targets.cpu(), n,
                        local_v, vocab_begin);
  gpu->ClassifierExpSums(logits.gpu(), sums.gpu(), target_logits.gpu(), max.gpu(), targets.gpu(), n,
                         local_v, vocab_begin);
  ExpectNear(logits, kKernel, "exp");
  ExpectNear(sums, kKernel, "exp sums");
  ExpectNear(target_logits, kKernel, "target logits");
  double loss_sum_cpu = 1;
  cpu.ClassifierLossSum(max.cpu(), sums.cpu(), target_logits.cpu(), targets.cpu(), n,
                        &loss_sum_cpu);
  const DeviceScalar loss_sum_gpu(*gpu, 1);
  gpu->ClassifierLossSum(max.gpu(), sums.gpu(), target_logits.gpu(), targets.gpu(), n,
                         loss_sum_gpu.get());
  EXPECT_NEAR(loss_sum_gpu.Value(), loss_sum_cpu, 1e-4);
  cpu.ClassifierLogitsBackward(logits.cpu(), sums.cpu(), targets.cpu(), n, local_v, vocab_begin,
                               0.5f);
  gpu->ClassifierLogitsBackward(logits.gpu(), sums.gpu(), targets.gpu(), n, local_v, vocab_begin,
                                0.5f);
  ExpectNear(logits, kKernel, "dlogits");
  EXPECT_TRUE(gpu->status().ok()) << gpu->status();
}

// The kernels on bf16 Values (run.precision bf16) against the CPU backend's reference, which
// widens the same bf16 inputs, computes in float32 and rounds: the bf16 outputs within one
// rounding of each other (tolerances as for float32 otherwise), the float32 parameter gradients
// and statistics as for float32. The classifier keeps bf16 logits on both, and a logit the two
// round apart moves its probability by 2^-8 of the logit: 1e-2 for its outputs.
TEST(CudaBackendTest, Bf16ValuesMatchTheCpuReference) {
  DTRAIN_GPU_OR_SKIP(gpu);
  CpuBackend cpu(1);
  constexpr int n = 26, c = 64, f = 48;
  Bf16Pair inp(cpu, *gpu, RandomFloats(n * c, 1)), weight(cpu, *gpu, RandomFloats(f * c, 2));
  Bf16Pair bias(cpu, *gpu, RandomFloats(f, 3)), y(cpu, *gpu, std::vector<float>(n * f));
  cpu.LinearForward(y.cpu(), inp.cpu(), weight.cpu(), bias.cpu(), n, c, f);
  gpu->LinearForward(y.gpu(), inp.gpu(), weight.gpu(), bias.gpu(), n, c, f);
  y.ExpectNear(kGemm, "linear forward");
  Pair logits(cpu, *gpu, std::vector<float>(n * f));  // float32 out of bf16 inputs
  cpu.LinearForward(logits.cpu(), inp.cpu(), weight.cpu(), nullptr, n, c, f);
  gpu->LinearForward(logits.gpu(), inp.gpu(), weight.gpu(), nullptr, n, c, f);
  ExpectNear(logits, kGemm, "linear forward into float32");
  Bf16Pair dout(cpu, *gpu, RandomFloats(n * f, 4)), dinp(cpu, *gpu, std::vector<float>(n * c));
  Pair dweight(cpu, *gpu, RandomFloats(f * c, 5)), dbias(cpu, *gpu, RandomFloats(f, 6));
  cpu.LinearBackward(dinp.cpu(), dweight.cpu(), dbias.cpu(), dout.cpu(), inp.cpu(), weight.cpu(), n,
                     c, f);
  gpu->LinearBackward(dinp.gpu(), dweight.gpu(), dbias.gpu(), dout.gpu(), inp.gpu(), weight.gpu(),
                      n, c, f);
  dinp.ExpectNear(kGemm, "linear dinp");
  ExpectNear(dweight, kGemm, "linear dweight (float32, accumulated)");
  ExpectNear(dbias, kGemm, "linear dbias (float32, accumulated)");

  Bf16Pair norm_weight(cpu, *gpu, RandomFloats(c, 7, 0.5, 1.5)),
      norm_bias(cpu, *gpu, RandomFloats(c, 8));
  Bf16Pair normed(cpu, *gpu, std::vector<float>(n * c)), dnorm(cpu, *gpu, RandomFloats(n * c, 9));
  Pair mean(cpu, *gpu, std::vector<float>(n)), rstd(cpu, *gpu, std::vector<float>(n));
  Pair dnorm_weight(cpu, *gpu, RandomFloats(c, 10)), dnorm_bias(cpu, *gpu, RandomFloats(c, 11));
  cpu.LayerNormForward(normed.cpu(), mean.cpu(), rstd.cpu(), inp.cpu(), norm_weight.cpu(),
                       norm_bias.cpu(), n, c, 1e-5f);
  gpu->LayerNormForward(normed.gpu(), mean.gpu(), rstd.gpu(), inp.gpu(), norm_weight.gpu(),
                        norm_bias.gpu(), n, c, 1e-5f);
  normed.ExpectNear(kKernel, "layernorm out");
  ExpectNear(rstd, kKernel, "layernorm rstd");
  cpu.LayerNormBackward(dinp.cpu(), dnorm_weight.cpu(), dnorm_bias.cpu(), dnorm.cpu(), inp.cpu(),
                        norm_weight.cpu(), mean.cpu(), rstd.cpu(), n, c);
  gpu->LayerNormBackward(dinp.gpu(), dnorm_weight.gpu(), dnorm_bias.gpu(), dnorm.gpu(), inp.gpu(),
                         norm_weight.gpu(), mean.gpu(), rstd.gpu(), n, c);
  dinp.ExpectNear(kKernel, "layernorm dinp (accumulated)");
  ExpectNear(dnorm_weight, kKernel, "layernorm dweight (float32)");
  ExpectNear(dnorm_bias, kKernel, "layernorm dbias (float32)");
  // The residual add fused in: the sum rounded to bf16 once, then normalised as stored.
  Bf16Pair residual(cpu, *gpu, RandomFloats(n * c, 20)), sum(cpu, *gpu, std::vector<float>(n * c));
  cpu.AddLayerNormForward(sum.cpu(), normed.cpu(), mean.cpu(), rstd.cpu(), residual.cpu(),
                          inp.cpu(), norm_weight.cpu(), norm_bias.cpu(), n, c, 1e-5f);
  gpu->AddLayerNormForward(sum.gpu(), normed.gpu(), mean.gpu(), rstd.gpu(), residual.gpu(),
                           inp.gpu(), norm_weight.gpu(), norm_bias.gpu(), n, c, 1e-5f);
  sum.ExpectNear(kKernel, "residual + layernorm: sum");
  normed.ExpectNear(kKernel, "residual + layernorm: out");
  cpu.AddRmsNormForward(sum.cpu(), normed.cpu(), rstd.cpu(), residual.cpu(), inp.cpu(),
                        norm_weight.cpu(), n, c, 1e-6f);
  gpu->AddRmsNormForward(sum.gpu(), normed.gpu(), rstd.gpu(), residual.gpu(), inp.gpu(),
                         norm_weight.gpu(), n, c, 1e-6f);
  sum.ExpectNear(kKernel, "residual + rmsnorm: sum");
  normed.ExpectNear(kKernel, "residual + rmsnorm: out");

  Bf16Pair x(cpu, *gpu, RandomFloats(n * 2 * f, 12, -4, 4)), dy(cpu, *gpu, RandomFloats(n * f, 13));
  Bf16Pair act(cpu, *gpu, std::vector<float>(n * f)),
      dact(cpu, *gpu, std::vector<float>(n * 2 * f));
  cpu.SwiGluForward(act.cpu(), x.cpu(), n, f);
  gpu->SwiGluForward(act.gpu(), x.gpu(), n, f);
  act.ExpectNear(kKernel, "swiglu");
  cpu.SwiGluBackward(dact.cpu(), x.cpu(), dy.cpu(), n, f);
  gpu->SwiGluBackward(dact.gpu(), x.gpu(), dy.gpu(), n, f);
  dact.ExpectNear(kKernel, "dswiglu");
  cpu.GeluBackward(act.cpu(), x.cpu(), dy.cpu(), static_cast<size_t>(n) * f);
  gpu->GeluBackward(act.gpu(), x.gpu(), dy.gpu(), static_cast<size_t>(n) * f);
  act.ExpectNear(kKernel, "dgelu");

  const AttentionShape shape{.batch = 2, .time = 13, .heads = 4, .kv_heads = 2, .head_dim = 16};
  const size_t rows = static_cast<size_t>(shape.batch) * shape.time;
  const size_t qkv_values = rows * shape.qkv_width(), out_values = rows * shape.heads * 16;
  Bf16Pair qkv(cpu, *gpu, RandomFloats(qkv_values, 14)),
      out(cpu, *gpu, std::vector<float>(out_values));
  Pair lse(cpu, *gpu, std::vector<float>(rows * shape.heads));
  cpu.RopeForward(qkv.cpu(), shape, 10000.0f, 0, nullptr);
  gpu->RopeForward(qkv.gpu(), shape, 10000.0f, 0, nullptr);
  qkv.ExpectNear(kKernel, "rope");
  cpu.AttentionForward(out.cpu(), lse.cpu(), qkv.cpu(), shape, nullptr);
  gpu->AttentionForward(out.gpu(), lse.gpu(), qkv.gpu(), shape, nullptr);
  out.ExpectNear(kKernel, "attention out");
  ExpectNear(lse, kKernel, "attention lse");
  Bf16Pair dattn(cpu, *gpu, RandomFloats(out_values, 15)),
      dqkv(cpu, *gpu, std::vector<float>(qkv_values));
  cpu.AttentionBackward(dqkv.cpu(), dattn.cpu(), qkv.cpu(), out.cpu(), lse.cpu(), shape, nullptr);
  gpu->AttentionBackward(dqkv.gpu(), dattn.gpu(), qkv.gpu(), out.gpu(), lse.gpu(), shape, nullptr);
  dqkv.ExpectNear(kKernel, "attention dqkv");

  constexpr int v = 97, t = 13, b = 2;
  std::vector<int32_t> token_values(b * t), target_values(b * t);
  for (int i = 0; i < b * t; ++i) {
    token_values[i] = (i * 37) % v;
    target_values[i] = i % 7 == 3 ? -1 : (i * 53 + 5) % v;
  }
  const Ids tokens(*gpu, token_values), targets(*gpu, target_values);
  Bf16Pair table(cpu, *gpu, RandomFloats(v * c, 16)), positions(cpu, *gpu, RandomFloats(t * c, 17));
  Bf16Pair emb(cpu, *gpu, std::vector<float>(b * t * c));
  cpu.EmbeddingForward(emb.cpu(), tokens.cpu(), table.cpu(), positions.cpu(), b, t, c, 0, v,
                       nullptr);
  gpu->EmbeddingForward(emb.gpu(), tokens.gpu(), table.gpu(), positions.gpu(), b, t, c, 0, v,
                        nullptr);
  emb.ExpectNear(kKernel, "embedding");
  Pair dtable(cpu, *gpu, RandomFloats(v * c, 18)), dpositions(cpu, *gpu, RandomFloats(t * c, 19));
  cpu.EmbeddingBackward(dtable.cpu(), dpositions.cpu(), dinp.cpu(), tokens.cpu(), b, t, c, 0, v,
                        nullptr);
  gpu->EmbeddingBackward(dtable.gpu(), dpositions.gpu(), dinp.gpu(), tokens.gpu(), b, t, c, 0, v,
                         nullptr);
  EXPECT_EQ(dtable.GpuValues(), dtable.CpuValues()) << "float32 sums of the same bf16 rows";
  EXPECT_EQ(dpositions.GpuValues(), dpositions.CpuValues());

  Bf16Pair dx(cpu, *gpu, std::vector<float>(n * c));
  Pair dhead(cpu, *gpu, RandomFloats(v * c, 20));
  double loss_cpu = 0;
  cpu.ClassifierForwardBackward(dx.cpu(), dhead.cpu(), inp.cpu(), table.cpu(), targets.cpu(), n, c,
                                v, 0.25f, &loss_cpu);
  const DeviceScalar loss_gpu(*gpu, 0);
  gpu->ClassifierForwardBackward(dx.gpu(), dhead.gpu(), inp.gpu(), table.gpu(), targets.gpu(), n, c,
                                 v, 0.25f, loss_gpu.get());
  EXPECT_NEAR(loss_gpu.Value(), loss_cpu, 1e-3 * loss_cpu) << "classifier loss";
  dx.ExpectNear(1e-2, "classifier dx");
  ExpectNear(dhead, 1e-2, "classifier dweight (float32, accumulated)");
  EXPECT_TRUE(gpu->status().ok()) << gpu->status();
}

void ExpectNear(const Bf16Pair& pair, double tolerance, const std::string& what) {
  pair.ExpectNear(tolerance, what);
}

// The classifier over GPT-2's vocabulary, where a row is 50,257 logits: about 25 16-byte packs
// for each thread of a row's block in bf16 and 49 in float32, the row's last pack partly past its
// end. Targets include an ignored row and both ends of the vocabulary.
template <typename PairT>
void CheckClassifierOverGpt2sVocabulary(CpuBackend& cpu, CudaBackend& gpu, double tolerance) {
  constexpr int n = 6, c = 16, v = 50257;
  const Ids targets(gpu, {0, -1, v - 1, 12345, 50000, 7});
  PairT x(cpu, gpu, RandomFloats(n * c, 21));
  PairT head(cpu, gpu, RandomFloats(static_cast<size_t>(v) * c, 22, -0.5, 0.5));
  PairT dx(cpu, gpu, std::vector<float>(n * c));
  Pair dhead(cpu, gpu, RandomFloats(static_cast<size_t>(v) * c, 23));
  double loss_cpu = 0;
  cpu.ClassifierForwardBackward(dx.cpu(), dhead.cpu(), x.cpu(), head.cpu(), targets.cpu(), n, c, v,
                                0.25f, &loss_cpu);
  const DeviceScalar loss_gpu(gpu, 0);
  gpu.ClassifierForwardBackward(dx.gpu(), dhead.gpu(), x.gpu(), head.gpu(), targets.gpu(), n, c, v,
                                0.25f, loss_gpu.get());
  EXPECT_NEAR(loss_gpu.Value(), loss_cpu, tolerance * loss_cpu) << "classifier loss";
  ExpectNear(dx, tolerance, "classifier dx");
  ExpectNear(dhead, tolerance, "classifier dweight (accumulated)");
  EXPECT_TRUE(gpu.status().ok()) << gpu.status();
}

// The vocabulary-parallel phases on the logits of GPT-2's last rank at tp 2: vocabulary rows
// [25152, 50257) (the slots are 25,152 rows, a multiple of 64), 25,105 a row, so that the rows
// after the first start off the 16-byte boundaries. tolerance: the exponentials' and the
// gradients' (bf16 adds its rounding in Bf16Pair::ExpectNear).
template <typename PairT>
void CheckVocabularyPhasesOfGpt2sLastTpRank(CpuBackend& cpu, CudaBackend& gpu, double tolerance) {
  constexpr int n = 4, local_v = 25105, vocab_begin = 25152;
  const Ids targets(gpu, {-1, vocab_begin, 3, vocab_begin + local_v - 1});
  PairT logits(cpu, gpu, RandomFloats(static_cast<size_t>(n) * local_v, 24, -4, 4));
  Pair max(cpu, gpu, std::vector<float>(n)), sums(cpu, gpu, std::vector<float>(n));
  Pair target_logits(cpu, gpu, std::vector<float>(n));
  cpu.ClassifierRowMax(max.cpu(), logits.cpu(), n, local_v);
  gpu.ClassifierRowMax(max.gpu(), logits.gpu(), n, local_v);
  ExpectNear(max, 0, "row max");
  cpu.ClassifierExpSums(logits.cpu(), sums.cpu(), target_logits.cpu(), max.cpu(), targets.cpu(), n,
                        local_v, vocab_begin);
  gpu.ClassifierExpSums(logits.gpu(), sums.gpu(), target_logits.gpu(), max.gpu(), targets.gpu(), n,
                        local_v, vocab_begin);
  ExpectNear(logits, tolerance, "exp");
  ExpectNear(sums, kGemm, "exp sums of 25,105 terms");
  ExpectNear(target_logits, 0, "target logits");
  cpu.ClassifierLogitsBackward(logits.cpu(), sums.cpu(), targets.cpu(), n, local_v, vocab_begin,
                               0.5f);
  gpu.ClassifierLogitsBackward(logits.gpu(), sums.gpu(), targets.gpu(), n, local_v, vocab_begin,
                               0.5f);
  ExpectNear(logits, tolerance, "dlogits");
  EXPECT_TRUE(gpu.status().ok()) << gpu.status();
}

TEST(CudaBackendTest, TheClassifierOverGpt2sVocabularyMatchesTheCpu) {
  DTRAIN_GPU_OR_SKIP(gpu);
  CpuBackend cpu(1);
  CheckClassifierOverGpt2sVocabulary<Pair>(cpu, *gpu, kGemm);
  // The tolerances of Bf16ValuesMatchTheCpuReference's classifier.
  CheckClassifierOverGpt2sVocabulary<Bf16Pair>(cpu, *gpu, 1e-2);

  CheckVocabularyPhasesOfGpt2sLastTpRank<Pair>(cpu, *gpu, kKernel);
  CheckVocabularyPhasesOfGpt2sLastTpRank<Bf16Pair>(cpu, *gpu, kKernel);
}

// GPT-2's MLP with its GELU fused into the GEMMs on values held in PairT (Pair: float32,
// Bf16Pair), F wide, against the CPU backend: at a width that is a multiple of 8 cuBLASLt's
// GELU_AUX(_BIAS) and DGELU epilogues (whose GELU is the same tanh approximation), otherwise the
// GEMM and the GELU kernel apart. The parameter gradients are float32 either way. Apart, in
// bf16, the GELU and its gradient take pre rounded first, where the CPU's take the float32 sums:
// one more rounding (2^-8), times the GELU's slope (at most 1.13), within 1e-2.
template <typename PairT>
void ExpectGeluFusedAsOnTheCpu(CpuBackend& cpu, CudaBackend& gpu, int f) {
  constexpr int n = 26, c = 64;
  const std::string at = absl::StrCat(" (F ", f, ")");
  const double gelu_tolerance = std::is_same_v<PairT, Bf16Pair> && f % 8 != 0 ? 1e-2 : kGemm;
  PairT inp(cpu, gpu, RandomFloats(n * c, 1)), weight(cpu, gpu, RandomFloats(f * c, 2));
  PairT bias(cpu, gpu, RandomFloats(f, 3)), pre(cpu, gpu, std::vector<float>(n * f)),
      act(cpu, gpu, std::vector<float>(n * f));
  for (const bool biased : {true, false}) {
    const ConstValues b_cpu = biased ? bias.cpu() : nullptr, b_gpu = biased ? bias.gpu() : nullptr;
    cpu.LinearGeluForward(act.cpu(), pre.cpu(), inp.cpu(), weight.cpu(), b_cpu, n, c, f);
    gpu.LinearGeluForward(act.gpu(), pre.gpu(), inp.gpu(), weight.gpu(), b_gpu, n, c, f);
    ExpectNear(pre, kGemm, absl::StrCat("linear + gelu: pre", at, biased ? "" : ", no bias"));
    ExpectNear(act, gelu_tolerance,
               absl::StrCat("linear + gelu: out", at, biased ? "" : ", no bias"));
  }
  // The down-projection (F -> C) of act, carried back through the GELU at pre.
  PairT down(cpu, gpu, RandomFloats(c * f, 4)), dout(cpu, gpu, RandomFloats(n * c, 5));
  PairT dpre(cpu, gpu, std::vector<float>(n * f));
  Pair ddown(cpu, gpu, RandomFloats(c * f, 6)), ddown_bias(cpu, gpu, RandomFloats(c, 7));
  cpu.LinearBackwardThroughGelu(dpre.cpu(), ddown.cpu(), ddown_bias.cpu(), dout.cpu(), act.cpu(),
                                pre.cpu(), down.cpu(), n, f, c);
  gpu.LinearBackwardThroughGelu(dpre.gpu(), ddown.gpu(), ddown_bias.gpu(), dout.gpu(), act.gpu(),
                                pre.gpu(), down.gpu(), n, f, c);
  ExpectNear(dpre, gelu_tolerance, "dpre through the gelu" + at);
  ExpectNear(ddown, kGemm, "dweight (float32, accumulated)" + at);
  ExpectNear(ddown_bias, kGemm, "dbias (float32, accumulated)" + at);
  EXPECT_TRUE(gpu.status().ok()) << gpu.status();
}

TEST(CudaBackendTest, GeluFusedIntoTheGemmsMatchesTheCpu) {
  DTRAIN_GPU_OR_SKIP(gpu);
  CpuBackend cpu(1);
  for (const int f : {48, 45}) {
    ExpectGeluFusedAsOnTheCpu<Pair>(cpu, *gpu, f);
    ExpectGeluFusedAsOnTheCpu<Bf16Pair>(cpu, *gpu, f);
  }
}

// A bias one value past a 16-byte boundary, as a small model's flat parameters place some: the
// GEMM runs without the bias epilogue and adds it after, and the GELU runs apart.
template <typename PairT>
void ExpectOddBiasAsOnTheCpu(CpuBackend& cpu, CudaBackend& gpu) {
  constexpr int n = 26, c = 64, f = 48;
  PairT inp(cpu, gpu, RandomFloats(n * c, 1)), weight(cpu, gpu, RandomFloats(f * c, 2));
  PairT bias(cpu, gpu, RandomFloats(f + 1, 3)), out(cpu, gpu, std::vector<float>(n * f)),
      pre(cpu, gpu, std::vector<float>(n * f));
  cpu.LinearForward(out.cpu(), inp.cpu(), weight.cpu(), bias.cpu() + 1, n, c, f);
  gpu.LinearForward(out.gpu(), inp.gpu(), weight.gpu(), bias.gpu() + 1, n, c, f);
  ExpectNear(out, kGemm, "linear, bias at an odd offset");
  cpu.LinearGeluForward(out.cpu(), pre.cpu(), inp.cpu(), weight.cpu(), bias.cpu() + 1, n, c, f);
  gpu.LinearGeluForward(out.gpu(), pre.gpu(), inp.gpu(), weight.gpu(), bias.gpu() + 1, n, c, f);
  ExpectNear(pre, kGemm, "linear + gelu, bias at an odd offset: pre");
  // Apart, in bf16, the GELU takes pre rounded (as ExpectGeluFusedAsOnTheCpu's odd widths).
  ExpectNear(out, std::is_same_v<PairT, Bf16Pair> ? 1e-2 : kGemm,
             "linear + gelu, bias at an odd offset: out");
  EXPECT_TRUE(gpu.status().ok()) << gpu.status();
}

TEST(CudaBackendTest, ABiasOffTheVectorAlignmentIsAddedAfterTheGemm) {
  DTRAIN_GPU_OR_SKIP(gpu);
  CpuBackend cpu(1);
  ExpectOddBiasAsOnTheCpu<Pair>(cpu, *gpu);
  ExpectOddBiasAsOnTheCpu<Bf16Pair>(cpu, *gpu);
}

// 20 steps of the small model on `backend`: the losses, gradient norms and final parameters.
struct Trajectory {
  std::vector<double> losses, norms;
  std::vector<float> params;
};

// documents: each row packs documents of 5 and 11 tokens (first row) or 9 and 7 (second), whose
// first two targets are masked as an SFT prompt's are. `param_type`: run.precision's.
Trajectory Train(Backend& backend, ModelFamily family, bool documents = false,
                 DataType param_type = DataType::kF32) {
  constexpr int kSteps = 20, kMicroBatch = 2, kSeqLen = 16, kMicroBatches = 2;
  const ModelConfig config = testing::SmallModelConfig(family);
  TrainSection train;
  train.steps = kSteps;
  train.batch_size = kMicroBatch * kMicroBatches;
  train.micro_batch = kMicroBatch;
  train.seq_len = kSeqLen;
  train.lr = 3e-3;
  train.warmup_steps = 2;
  train.grad_clip = 0.5;  // active on early steps
  const ParamTable table(config, ModelSlice{});
  DataParallelEngine engine(table, ShardingStrategy{.param_type = param_type}, train, backend,
                            nullptr);
  engine.InitParameters(config, 42);
  Transformer model(config, table, engine, backend, kMicroBatch, kSeqLen, Recompute::kNone);
  Trajectory trajectory;
  for (int step = 0; step < kSteps; ++step) {
    int salt = step % 2 * 10;
    const MicroBatchSource source = [&](int32_t* inputs, int32_t* targets, int32_t* positions) {
      const std::vector<int32_t> tokens =
          testing::PatternTokens(kMicroBatch * kSeqLen + 1, config.vocab_size, salt++);
      std::copy(tokens.begin(), tokens.end() - 1, inputs);
      std::copy(tokens.begin() + 1, tokens.end(), targets);
      if (!documents) return absl::OkStatus();
      for (int row = 0; row < kMicroBatch; ++row) {
        const int first_length = row % 2 == 0 ? 5 : 9;
        for (int t = 0; t < kSeqLen; ++t) {
          const int position = t < first_length ? t : t - first_length;
          positions[row * kSeqLen + t] = position;
          if (position < 2) targets[row * kSeqLen + t] = -1;
        }
      }
      return absl::OkStatus();
    };
    absl::StatusOr<StepResult> result =
        TrainStep(model, engine, train, step, kMicroBatches, source, nullptr, documents);
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) return trajectory;
    trajectory.losses.push_back(result->loss);
    trajectory.norms.push_back(result->grad_norm);
  }
  absl::StatusOr<std::vector<float>> params = engine.GatherParameters();
  EXPECT_TRUE(params.ok()) << params.status();
  if (params.ok()) trajectory.params = *std::move(params);
  return trajectory;
}

void ExpectClose(const std::vector<double>& actual, const std::vector<double>& expected,
                 const char* what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], 1e-4 * std::max(1.0, std::abs(expected[i])))
        << what << " at step " << i + 1;
  }
}

// Pretraining rows, and SFT's documents packed into the rows.
TEST(CudaBackendTest, TwentyTrainingStepsMatchTheCpuBackend) {
  DTRAIN_GPU_OR_SKIP(gpu);
  for (const ModelFamily family : {ModelFamily::kGpt2, ModelFamily::kLlama}) {
    for (const bool documents : {false, true}) {
      SCOPED_TRACE(::testing::Message() << FamilyName(family) << (documents ? ", documents" : ""));
      CpuBackend cpu(1);
      const Trajectory expected = Train(cpu, family, documents);
      const Trajectory actual = Train(*gpu, family, documents);
      ASSERT_TRUE(gpu->status().ok()) << gpu->status();
      ExpectClose(actual.losses, expected.losses, "loss");
      ExpectClose(actual.norms, expected.norms, "gradient norm");
      ASSERT_EQ(actual.params.size(), expected.params.size());
      for (size_t i = 0; i < actual.params.size(); ++i) {
        ASSERT_NEAR(actual.params[i], expected.params[i],
                    1e-4 * std::max(1.0f, std::abs(expected.params[i])))
            << "parameter " << i;
      }
    }
  }
}

// run.matmul_precision high and medium: cuBLASLt's TF32 and bf16 tensor cores against the CPU
// backend's rounded inputs (matmul_precision.h). The tensor cores may truncate their inputs where
// the CPU rounds them to nearest (TF32 reads the top 10 mantissa bits), so each value is bounded
// by its products' magnitudes: within 3 x 2^-p of sum |a||b| (p = 10 for TF32, 7 for bf16; a
// truncated product is off by up to 2 x 2^-p, a rounded one 2^-p) beside the float32 GEMMs' 1e-4.
// The forward differs from the float32 product somewhere, or the tensor cores never ran. Then 20
// training steps, where a value that lands on the other side of a rounding boundary moves by up
// to 2^-p and training carries it on: 1e-2.
TEST(CudaBackendTest, TensorCorePrecisionsMatchTheCpuRounding) {
  for (const MatmulPrecision precision : {MatmulPrecision::kHigh, MatmulPrecision::kMedium}) {
    SCOPED_TRACE(MatmulPrecisionName(precision));
    std::string why;
    const std::unique_ptr<CudaBackend> gpu = GpuOrSkip(&why, precision);
    if (gpu == nullptr) GTEST_SKIP() << why;
    const double unit = precision == MatmulPrecision::kHigh ? 0x1p-10 : 0x1p-7;
    CpuBackend cpu(1, precision);
    constexpr int n = 64, in = 96, out = 80;
    const std::vector<float> xs = RandomFloats(n * in, 1), ws = RandomFloats(out * in, 2);
    const std::vector<float> dys = RandomFloats(n * out, 4);
    // sum |a||b| over each output's products: y (n, out), dx (n, in), dw (out, in), db (out).
    std::vector<double> y_size(n * out), dx_size(n * in), dw_size(out * in), db_size(out);
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < out; ++j) {
        const double dy = std::abs(dys[i * out + j]);
        db_size[j] += dy;
        for (int k = 0; k < in; ++k) {
          y_size[i * out + j] += std::abs(xs[i * in + k]) * std::abs(ws[j * in + k]);
          dx_size[i * in + k] += dy * std::abs(ws[j * in + k]);
          dw_size[j * in + k] += dy * std::abs(xs[i * in + k]);
        }
      }
    }
    const auto expect_within_rounding = [&](const Pair& pair, const std::vector<double>& size,
                                            const std::string& what) {
      const std::vector<float> expected = pair.CpuValues(), actual = pair.GpuValues();
      for (size_t i = 0; i < expected.size(); ++i) {
        const double bound =
            kGemm * std::max(1.0, std::abs(static_cast<double>(expected[i]))) + 3 * unit * size[i];
        ASSERT_LE(std::abs(static_cast<double>(actual[i]) - expected[i]), bound)
            << what << " [" << i << "]: " << actual[i] << " vs " << expected[i];
      }
    };
    Pair x(cpu, *gpu, xs), w(cpu, *gpu, ws);
    Pair bias(cpu, *gpu, RandomFloats(out, 3)), y(cpu, *gpu, std::vector<float>(n * out));
    cpu.LinearForward(y.cpu(), x.cpu(), w.cpu(), bias.cpu(), n, in, out);
    gpu->LinearForward(y.gpu(), x.gpu(), w.gpu(), bias.gpu(), n, in, out);
    expect_within_rounding(y, y_size, "linear forward");
    CpuBackend exact(1);
    exact.LinearForward(y.cpu(), x.cpu(), w.cpu(), bias.cpu(), n, in, out);
    const std::vector<float> float32 = y.CpuValues(), tensor_cores = y.GpuValues();
    double largest_difference = 0;
    for (size_t i = 0; i < float32.size(); ++i) {
      largest_difference =
          std::max(largest_difference, std::abs(static_cast<double>(tensor_cores[i] - float32[i])));
    }
    EXPECT_GT(largest_difference, kGemm) << "the GEMM ran in float32, not on the tensor cores";
    Pair dy(cpu, *gpu, dys), dx(cpu, *gpu, std::vector<float>(n * in));
    Pair dw(cpu, *gpu, std::vector<float>(out * in)), db(cpu, *gpu, std::vector<float>(out));
    cpu.LinearBackward(dx.cpu(), dw.cpu(), db.cpu(), dy.cpu(), x.cpu(), w.cpu(), n, in, out);
    gpu->LinearBackward(dx.gpu(), dw.gpu(), db.gpu(), dy.gpu(), x.gpu(), w.gpu(), n, in, out);
    expect_within_rounding(dx, dx_size, "linear dinp");
    expect_within_rounding(dw, dw_size, "linear dweight");
    expect_within_rounding(db, db_size, "linear dbias");
    const Trajectory expected = Train(cpu, ModelFamily::kLlama);
    const Trajectory actual = Train(*gpu, ModelFamily::kLlama);
    ASSERT_TRUE(gpu->status().ok()) << gpu->status();
    ASSERT_EQ(actual.losses.size(), expected.losses.size());
    for (size_t i = 0; i < expected.losses.size(); ++i) {
      EXPECT_NEAR(actual.losses[i], expected.losses[i], 1e-2 * expected.losses[i]) << "step " << i;
    }
  }
}

// run.precision bf16, cuda's default: bf16 parameters and activations on the GPU's bf16 kernels
// as in the CPU backend's reference, which widens, computes in float32 and rounds. The backends'
// float32 sums in other orders put a few values on the other side of a bf16 rounding boundary,
// which moves them by 2^-8 and training carries it on (CPU against CPU in another order: 1.3e-4
// of the losses and 1.9e-3 of the norms, DataParallelParamDtypeTest): losses within 1e-3, norms
// 2e-2.
TEST(CudaBackendTest, Bf16ParametersTrainAsOnTheCpu) {
  DTRAIN_GPU_OR_SKIP(gpu);
  CpuBackend cpu(1);
  const Trajectory expected = Train(cpu, ModelFamily::kGpt2, false, DataType::kBF16);
  const Trajectory actual = Train(*gpu, ModelFamily::kGpt2, false, DataType::kBF16);
  ASSERT_TRUE(gpu->status().ok()) << gpu->status();
  ASSERT_EQ(actual.losses.size(), expected.losses.size());
  for (size_t i = 0; i < expected.losses.size(); ++i) {
    EXPECT_NEAR(actual.losses[i], expected.losses[i], 1e-3 * expected.losses[i]) << "step " << i;
    EXPECT_NEAR(actual.norms[i], expected.norms[i], 2e-2 * expected.norms[i]) << "step " << i;
  }
  EXPECT_NE(expected.losses, Train(cpu, ModelFamily::kGpt2).losses) << "nothing was rounded";
}

TEST(CudaBackendTest, TwoGpuRunsAreBitIdentical) {
  DTRAIN_GPU_OR_SKIP(gpu);
  const Trajectory first = Train(*gpu, ModelFamily::kLlama);
  const Trajectory second = Train(*gpu, ModelFamily::kLlama);
  ASSERT_TRUE(gpu->status().ok()) << gpu->status();
  EXPECT_EQ(first.losses, second.losses);
  EXPECT_EQ(first.norms, second.norms);
  EXPECT_EQ(first.params, second.params);
}

}  // namespace
}  // namespace dtrain
