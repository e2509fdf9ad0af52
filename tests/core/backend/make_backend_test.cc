// run.device: cuda on a machine without a GPU, through the binary as a user runs it: one error at
// start, exit 2, nothing written. The binary never links CUDA (tests/integration/
// no_cuda_libraries.sh); the CUDA module, where the build has it, loads and finds no GPU.
#include "core/backend/make_backend.h"

#include <cblas.h>

#include <filesystem>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "core/backend/cpu/cpu_backend.h"
#include "core/backend/cuda_module.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/run_dtrain.h"

namespace dtrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

bool MachineHasGpu() {
  std::error_code error;
  return !std::filesystem::is_empty("/proc/driver/nvidia/gpus", error) && !error;
}

// The lines of a run's stderr that report an error.
int ErrorLines(const std::string& stderr_text) {
  int errors = 0;
  for (absl::string_view line : absl::StrSplit(stderr_text, '\n')) {
    if (absl::StartsWith(line, "error:")) ++errors;
  }
  return errors;
}

TEST(MakeBackendTest, CpuAndUnknownDevices) {
  absl::StatusOr<std::unique_ptr<Backend>> cpu = MakeBackend("cpu", 2, 0);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_NE(dynamic_cast<CpuBackend*>(cpu->get()), nullptr);
  EXPECT_TRUE(CheckDevice("cpu", 7).ok());
  const absl::StatusOr<std::unique_ptr<Backend>> tpu = MakeBackend("tpu", 2, 0);
  EXPECT_EQ(tpu.status().code(), absl::StatusCode::kInvalidArgument);
}

// run.threads bounds OpenBLAS's GEMMs too (they ran on every core at run.threads 1); 0 leaves
// OpenBLAS its own count.
TEST(MakeBackendTest, CpuThreadsBoundOpenBlas) {
  const int own = openblas_get_num_threads();
  ASSERT_TRUE(MakeBackend("cpu", 1, 0).ok());
  EXPECT_EQ(openblas_get_num_threads(), 1);
  ASSERT_TRUE(MakeBackend("cpu", 3, 0).ok());
  EXPECT_EQ(openblas_get_num_threads(), 3);
  ASSERT_TRUE(MakeBackend("cpu", 0, 0).ok());
  EXPECT_EQ(openblas_get_num_threads(), 3);
  openblas_set_num_threads(own);
}

// One worker per GPU takes the GPU of its local rank; a worker its launcher bound to one GPU
// (Slurm's --gpus-per-task=1: CUDA_VISIBLE_DEVICES names one device) takes that one whatever its
// local rank; a local rank without a GPU of its own is an error naming the counts and the fix.
TEST(MakeBackendTest, EachLocalRankTakesItsOwnGpu) {
  EXPECT_EQ(*GpuOfLocalRank(0, 8, nullptr), 0);
  EXPECT_EQ(*GpuOfLocalRank(5, 8, "0,1,2,3,4,5,6,7"), 5);
  EXPECT_EQ(*GpuOfLocalRank(3, 1, "2"), 0);
  EXPECT_EQ(*GpuOfLocalRank(3, 1, "GPU-5e1f"), 0);
  for (const char* visible : {static_cast<const char*>(nullptr), "", "0,1"}) {
    const absl::StatusOr<int> none = GpuOfLocalRank(2, visible == nullptr ? 1 : 2, visible);
    EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(none.status().message(), ::testing::HasSubstr("local rank 2 needs a GPU"));
    EXPECT_THAT(none.status().message(), ::testing::HasSubstr("--nproc-per-node gpu"));
  }
}

TEST(MakeBackendTest, CudaWithoutAGpuIsOneErrorAtStart) {
  if (MachineHasGpu()) GTEST_SKIP() << "this machine has a GPU: the GPU tests cover it";
  const std::string out_dir = testing::FreshTempDir("cuda_no_gpu_runs");
  const testing::Outcome outcome =
      testing::RunDtrain("train --set run.device=cuda --set run.out_dir=" + out_dir);
  EXPECT_EQ(outcome.exit_code, 2) << outcome.stderr_text;
  EXPECT_EQ(ErrorLines(outcome.stderr_text), 1) << outcome.stderr_text;
#ifdef DTRAIN_HAVE_NCCL  // the build made the CUDA module: it loads and finds no GPU
  EXPECT_THAT(outcome.stderr_text, AllOf(HasSubstr("run.device is cuda but no GPU was found"),
                                         HasSubstr("set run.device: cpu")));
#else
  EXPECT_THAT(outcome.stderr_text, HasSubstr("libdtrain_cuda.so does not exist"));
#endif
  EXPECT_FALSE(std::filesystem::exists(out_dir)) << "a failed start wrote " << out_dir;
}

// A binary installed without its module says which file it looked for, and why it is needed.
TEST(MakeBackendTest, MissingModuleIsNamed) {
  std::string dir = testing::FreshTempDir("cuda_lone_binary");
  std::filesystem::create_directories(dir);
  dir = std::filesystem::canonical(dir).string();  // as /proc/self/exe names it
  const std::string binary = dir + "/dtrain";
  std::filesystem::copy_file(DTRAIN_BINARY, binary);
  const std::string out_dir = dir + "/runs";
  const std::string command = binary + " train --set run.device=cuda --set run.out_dir=" + out_dir +
                              " 2>&1; echo \"exit $?\"";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) output.append(buffer, n);
  pclose(pipe);
  EXPECT_THAT(output, AllOf(HasSubstr(dir + "/libdtrain_cuda.so does not exist"),
                            HasSubstr("or set run.device: cpu"), HasSubstr("exit 2")));
  EXPECT_FALSE(std::filesystem::exists(out_dir));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dtrain
