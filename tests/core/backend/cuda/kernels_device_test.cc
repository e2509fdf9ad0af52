// The CUDA kernels themselves, on a GPU, against the CPU backend with the tolerances of the
// host tests (test_util.h): built where the toolkit is, skipped where no GPU is visible. The
// *_math_test.cc files check the same arithmetic on every machine.
#include <gtest/gtest.h>

#ifdef DTRAIN_HAVE_CUDA_KERNELS
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/backend/cpu/activation.h"
#include "core/backend/cpu/adamw.h"
#include "core/backend/cpu/attention.h"
#include "core/backend/cpu/elementwise.h"
#include "core/backend/cpu/norm.h"
#include "core/backend/cuda/flash_attention_math.h"
#include "core/backend/cuda/kernels.h"
#include "tests/core/backend/cuda/attention_bounds.h"
#include "tests/core/backend/cuda/mma_probe.h"
#include "tests/core/backend/cuda/test_util.h"
#endif

namespace dtrain::cuda {
namespace {

#ifdef DTRAIN_HAVE_CUDA_KERNELS
using testing::ExpectFloatMatches;
using testing::ExpectMatches;
using testing::Load;
using testing::RandomFloats;
using testing::Store;

bool HaveDevice() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

// A device copy of a host vector, copied back by Read after the stream's work.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::vector<T>& host) : size_(host.size()) {
    EXPECT_EQ(cudaMalloc(&data_, size_ * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data_, host.data(), size_ * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  explicit DeviceBuffer(size_t size) : DeviceBuffer(std::vector<T>(size)) {}
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() { return data_; }
  std::vector<T> Read() const {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<T> host(size_);
    EXPECT_EQ(cudaMemcpy(host.data(), data_, size_ * sizeof(T), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host;
  }

 private:
  size_t size_;
  T* data_ = nullptr;
};

// 45 values a row: rows are not whole 16-byte packs, so both load paths run.
constexpr int kRows = 7, kWidth = 45;

template <typename T>
void CheckActivations() {
  const std::vector<T> inp = Store<T>(RandomFloats(kRows * 2 * kWidth, 1, -6, 6));
  const std::vector<T> dout = Store<T>(RandomFloats(kRows * 2 * kWidth, 2));
  const size_t n = inp.size();
  DeviceBuffer<T> d_inp(inp), d_dout(dout), gelu(n), dgelu(n), swiglu(kRows * kWidth), dswiglu(n);
  GeluForward(gelu.get(), d_inp.get(), n, nullptr);
  GeluBackward(dgelu.get(), d_inp.get(), d_dout.get(), n, nullptr);
  SwiGluForward(swiglu.get(), d_inp.get(), kRows, kWidth, nullptr);
  SwiGluBackward(dswiglu.get(), d_inp.get(), d_dout.get(), kRows, kWidth, nullptr);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);

  const std::vector<float> x = Load(inp), dy = Load(dout);
  std::vector<float> gelu_cpu(n), dgelu_cpu(n), swiglu_cpu(kRows * kWidth), dswiglu_cpu(n);
  cpu::GeluForward(gelu_cpu.data(), x.data(), n, nullptr);
  cpu::GeluBackward(dgelu_cpu.data(), x.data(), dy.data(), n, nullptr);
  cpu::SwiGluForward(swiglu_cpu.data(), x.data(), kRows, kWidth, nullptr);
  cpu::SwiGluBackward(dswiglu_cpu.data(), x.data(), dy.data(), kRows, kWidth, nullptr);
  ExpectMatches(gelu.Read(), gelu_cpu, "gelu");
  ExpectMatches(dgelu.Read(), dgelu_cpu, "dgelu");
  ExpectMatches(swiglu.Read(), swiglu_cpu, "swiglu");
  ExpectMatches(dswiglu.Read(), dswiglu_cpu, "dswiglu");
}

TEST(CudaDeviceTest, Activations) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  CheckActivations<float>();
  CheckActivations<Bf16>();
}

// The fused residual add and LayerNorm, forward and backward, over enough rows that the
// parameter gradients' slices take two blocks a column (ColumnSlices).
template <typename T>
void CheckLayerNorm() {
  constexpr int c = 96, rows = 2 * kSlicesPerBlock * kRowsPerSlice - 5;
  constexpr float eps = 1e-5f;
  const std::vector<T> inp = Store<T>(RandomFloats(rows * c, 1));
  const std::vector<T> residual = Store<T>(RandomFloats(rows * c, 2));
  const std::vector<T> weight = Store<T>(RandomFloats(c, 3, 0.5, 1.5));
  const std::vector<T> bias = Store<T>(RandomFloats(c, 4));
  const std::vector<T> dout = Store<T>(RandomFloats(rows * c, 5));
  DeviceBuffer<T> d_inp(inp), d_residual(residual), d_weight(weight), d_bias(bias), d_dout(dout);
  DeviceBuffer<T> out(rows * c), residual_out(rows * c), dinp(rows * c);
  DeviceBuffer<float> mean(rows), rstd(rows), dweight(c), dbias(c);
  DeviceBuffer<ColumnGrads> slice_sums(static_cast<size_t>(ColumnSlices(rows)) * c);
  LayerNormForward(out.get(), mean.get(), rstd.get(), residual_out.get(), d_residual.get(),
                   d_inp.get(), d_weight.get(), d_bias.get(), rows, c, eps, nullptr);
  LayerNormBackward(dinp.get(), dweight.get(), dbias.get(), slice_sums.get(), d_dout.get(),
                    residual_out.get(), d_weight.get(), mean.get(), rstd.get(), rows, c, nullptr);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);

  std::vector<float> sum(rows * c);
  cpu::Add(sum.data(), Load(residual).data(), Load(inp).data(), sum.size(), nullptr);
  const std::vector<float> x = Load(Store<T>(sum)), w = Load(weight), dy = Load(dout);
  std::vector<float> out_cpu(rows * c), mean_cpu(rows), rstd_cpu(rows);
  cpu::LayerNormForward(out_cpu.data(), mean_cpu.data(), rstd_cpu.data(), x.data(), w.data(),
                        Load(bias).data(), rows, c, eps, nullptr);
  std::vector<float> dinp_cpu(rows * c), dweight_cpu(c), dbias_cpu(c);
  cpu::LayerNormBackward(dinp_cpu.data(), dweight_cpu.data(), dbias_cpu.data(), dy.data(), x.data(),
                         w.data(), mean_cpu.data(), rstd_cpu.data(), rows, c, nullptr);
  ExpectMatches(residual_out.Read(), sum, "residual_out");
  ExpectMatches(out.Read(), out_cpu, "out");
  ExpectFloatMatches(mean.Read(), mean_cpu, "mean");
  ExpectFloatMatches(rstd.Read(), rstd_cpu, "rstd");
  ExpectMatches(dinp.Read(), dinp_cpu, "dinp");
  ExpectFloatMatches(dweight.Read(), dweight_cpu, "dweight");
  ExpectFloatMatches(dbias.Read(), dbias_cpu, "dbias");
}

TEST(CudaDeviceTest, LayerNorm) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  CheckLayerNorm<float>();
  CheckLayerNorm<Bf16>();
}

// One warp's mma.sync, fragment loads and quad shuffles against the host's emulation of them
// (mma_probe.h), which the host tests of the tensor-core attention run on: the products within
// the difference of two fp32 sums of 16 terms (the tensor cores' order and rounding of the sum
// are unspecified), the quad reductions exact.
TEST(CudaDeviceTest, TheTensorCoresComputeWhatTheHostEmulates) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  const testing::ProbeCase probe = testing::MakeProbeCase();
  std::vector<float> emulated(testing::kProbeOutputs), device;
  testing::RunOnHostWarp([&](const testing::HostWarp& warp) {
    testing::MmaProbe(warp, probe.a.data(), probe.b.data(), probe.b_transposed.data(),
                      emulated.data());
  });
  ASSERT_EQ(testing::MmaProbeOnDevice(probe, &device), cudaSuccess);
  for (int i = 0; i < testing::kProbeProducts * 128; ++i) {
    EXPECT_NEAR(device[i], emulated[i], 2e-5) << "product " << i / 128 << " at " << i % 128;
  }
  for (int i = testing::kProbeProducts * 128; i < testing::kProbeOutputs; ++i) {
    EXPECT_EQ(device[i], emulated[i]) << "quad reduction " << i;
  }
}

// host_positions: documents packed into the rows, or empty for one document a row. qkv_offset:
// values before qkv in its device buffer (1: a view 2 or 4 bytes past a 16-byte boundary, as an
// arena's can be).
template <typename T>
void CheckAttention(const AttentionShape& shape, const std::vector<int32_t>& host_positions,
                    int qkv_offset = 0) {
  SCOPED_TRACE(::testing::Message() << "T " << shape.time << " D " << shape.head_dim
                                    << (host_positions.empty() ? "" : ", documents")
                                    << (qkv_offset == 0 ? "" : ", qkv off its alignment"));
  const size_t rows = static_cast<size_t>(shape.batch) * shape.time;
  const size_t out_size = rows * shape.heads * shape.head_dim;
  const size_t lse_size = static_cast<size_t>(shape.batch) * shape.heads * shape.time;
  const std::vector<T> qkv = Store<T>(RandomFloats(rows * shape.qkv_width(), 1));
  const std::vector<T> dout = Store<T>(RandomFloats(out_size, 2));
  std::vector<T> placed(qkv_offset);
  placed.insert(placed.end(), qkv.begin(), qkv.end());
  DeviceBuffer<T> qkv_buffer(placed), d_dout(dout), out(out_size), dqkv(qkv.size());
  const T* d_qkv = qkv_buffer.get() + qkv_offset;
  DeviceBuffer<float> lse(lse_size), deltas(lse_size);
  DeviceBuffer<int32_t> d_positions(host_positions.empty() ? std::vector<int32_t>{0}
                                                           : host_positions);
  const int32_t* positions = host_positions.empty() ? nullptr : d_positions.get();
  const int32_t* cpu_positions = host_positions.empty() ? nullptr : host_positions.data();
  ASSERT_EQ(AttentionForward(out.get(), lse.get(), d_qkv, shape, positions, nullptr), cudaSuccess);
  ASSERT_EQ(AttentionBackward(dqkv.get(), d_dout.get(), d_qkv, out.get(), lse.get(), deltas.get(),
                              shape, positions, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);

  std::vector<float> scratch(cpu::AttentionScratchSize(shape));
  std::vector<float> out_cpu(out_size), lse_cpu(lse_size), dqkv_cpu(qkv.size());
  cpu::AttentionForward(out_cpu.data(), lse_cpu.data(), Load(qkv).data(), shape, scratch.data(),
                        nullptr, cpu_positions);
  const std::vector<T> out_device = out.Read();
  const std::vector<float> lse_device = lse.Read();
  ExpectFloatMatches(lse_device, lse_cpu, "lse");
  cpu::AttentionBackward(dqkv_cpu.data(), Load(dout).data(), Load(qkv).data(),
                         Load(out_device).data(), lse_device.data(), shape, scratch.data(), nullptr,
                         cpu_positions);
  if constexpr (std::is_same_v<T, Bf16>) {
    if (FlashHeadDim(shape.head_dim)) {  // tensor cores (every GPU the build targets)
      const testing::AttentionSums sums = testing::AttentionAbsoluteSums(
          shape, Load(qkv), Load(dout), Load(out_device), cpu_positions);
      testing::ExpectWithinRounding(out_device, out_cpu, sums.out, "out");
      testing::ExpectWithinRounding(dqkv.Read(), dqkv_cpu, sums.dqkv, "dqkv");
      return;
    }
  }
  ExpectMatches(out_device, out_cpu, "out");
  ExpectMatches(dqkv.Read(), dqkv_cpu, "dqkv");
}

// D = 40 (4 lanes a row, one tile of 64 rows: T = 6) and D = 64 with T = 300 (five tiles, so the
// rows' state carries across tiles and the last tile is partial), grouped-query heads; each with
// one document a row and with documents packed into the rows (they cross the tiles' boundaries,
// and a block's rows see keys from before the block). In bf16, D = 64 (query tiles of 128 rows,
// the last partial) and D = 128 (T = 300: five tiles) run on tensor cores.
TEST(CudaDeviceTest, Attention) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  for (const AttentionShape& shape :
       {AttentionShape{.batch = 2, .time = 6, .heads = 4, .kv_heads = 2, .head_dim = 40},
        AttentionShape{.batch = 2, .time = 300, .heads = 4, .kv_heads = 2, .head_dim = 64},
        AttentionShape{.batch = 1, .time = 300, .heads = 4, .kv_heads = 1, .head_dim = 128}}) {
    const std::vector<int32_t> documents =
        testing::PackedPositions(shape.batch, shape.time, {3, 1, 50, 17, 2});
    for (const std::vector<int32_t>& positions : {std::vector<int32_t>{}, documents}) {
      CheckAttention<float>(shape, positions);
      CheckAttention<Bf16>(shape, positions);
    }
  }
  // The tensor-core kernels' copies of rows 2 bytes off their alignment, which cp.async cannot
  // take, T not a multiple of their tiles.
  CheckAttention<Bf16>({.batch = 2, .time = 150, .heads = 4, .kv_heads = 2, .head_dim = 64}, {}, 1);
}

TEST(CudaDeviceTest, AdamWAndSumSquares) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  constexpr size_t n = 3 * 4096 + 123;
  const std::vector<float> param = RandomFloats(n, 1), grad = RandomFloats(n, 2);
  DeviceBuffer<float> d_param(param), d_grad(grad), m(n), v(n);
  DeviceBuffer<Bf16> copy(n);
  // One range of every value, decayed; the gradient halved on the way in.
  const AdamWRange all{.begin = 0, .end = static_cast<int64_t>(n), .decay = 1};
  DeviceBuffer<AdamWRange> ranges(std::vector<AdamWRange>{all});
  const AdamWCoefficients k = cpu::MakeAdamWCoefficients<float>(1e-2, 0.9, 0.95, 1e-8, 0.1, 1, 0.5);
  AdamW(d_param.get(), copy.get(), d_grad.get(), m.get(), v.get(), n, ranges.get(), 1, k, nullptr);
  // SumSquares adds into its double, here 0.5 to start with; AddSum too.
  DeviceBuffer<double> sum_squares(std::vector<double>{0.5});
  DeviceBuffer<float> block_sums(SumSquaresBlocks(n));
  SumSquares(sum_squares.get(), block_sums.get(), d_grad.get(), n, nullptr);
  DeviceBuffer<double> total(std::vector<double>{0.25});
  AddSum(total.get(), d_param.get(), n, nullptr);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);

  std::vector<float> param_cpu = param, m_cpu(n), v_cpu(n);
  cpu::AdamW(param_cpu.data(), grad.data(), m_cpu.data(), v_cpu.data(), n, k, nullptr);
  ExpectFloatMatches(d_param.Read(), param_cpu, "param");
  ExpectFloatMatches(m.Read(), m_cpu, "m");
  ExpectFloatMatches(v.Read(), v_cpu, "v");
  testing::ExpectBf16Matches(copy.Read(), param_cpu, "bf16 copy");
  const double expected = 0.5 + cpu::SumSquares(grad.data(), n, nullptr);
  EXPECT_NEAR(sum_squares.Read()[0], expected, 1e-5 * expected);
  double param_sum = 0.25;  // of the updated parameters, within the AdamW tolerance each
  for (const float p : param_cpu) param_sum += p;
  EXPECT_NEAR(total.Read()[0], param_sum, 1e-5 * n);
}
#endif

}  // namespace
}  // namespace dtrain::cuda
