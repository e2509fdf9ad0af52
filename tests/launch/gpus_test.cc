#include "launch/gpus.h"

#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/run_dtrain.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A /proc with the driver's entries of three GPUs, as the NVIDIA driver lays them out.
std::string ProcWithThreeGpus() {
  const std::string root = testing::FreshTempDir("gpus_proc");
  for (const char* bus : {"0000:07:00.0", "0000:0a:00.0", "0000:85:00.0"}) {
    std::filesystem::create_directories(std::filesystem::path(root) / "driver/nvidia/gpus" / bus);
  }
  return root;
}

// CUDA_VISIBLE_DEVICES narrows the installed GPUs as the CUDA runtime does: its entries up to the
// first that names no GPU (an index out of range, or listed twice), UUIDs counted once each, GPU
// ones up to the installed count; on a machine without GPUs, none (two GPU- UUIDs started two
// workers there).
TEST(GpusTest, CudaVisibleDevicesNarrowsTheDriversGpus) {
  const std::string proc = ProcWithThreeGpus();
  const GpuInventory all = FindGpus({}, proc);
  EXPECT_EQ(all.installed, 3);
  EXPECT_EQ(all.visible, 3);
  EXPECT_THAT(all.description, HasSubstr("3 GPUs in " + proc + "/driver/nvidia/gpus"));
  const std::pair<const char*, int> cases[] = {{"1,0", 2},
                                               {"2", 1},
                                               {"1,5,0", 1},
                                               {"0,0,1", 1},
                                               {"x,0", 0},
                                               {"", 0},
                                               {"-1", 0},
                                               {"NoDevFiles", 0},
                                               {"GPU-8a3f,MIG-1c2d", 2},
                                               {"GPU-8a3f,GPU-8a3f", 1},
                                               {"GPU-1,GPU-2,GPU-3,GPU-4", 3},
                                               {"MIG-1,MIG-2,MIG-3,MIG-4", 4}};
  for (const auto& [list, visible] : cases) {
    const GpuInventory gpus = FindGpus({{"CUDA_VISIBLE_DEVICES", list}}, proc);
    EXPECT_EQ(gpus.installed, 3) << list;
    EXPECT_EQ(gpus.visible, visible) << list;
    EXPECT_THAT(gpus.description, HasSubstr(std::string("CUDA_VISIBLE_DEVICES=") + list));
  }
  // No driver: no folder, no GPU, whatever CUDA_VISIBLE_DEVICES names.
  const GpuInventory none = FindGpus({}, testing::FreshTempDir("gpus_no_driver"));
  EXPECT_EQ(none.installed, 0);
  EXPECT_EQ(FindGpus({{"CUDA_VISIBLE_DEVICES", "GPU-8a3f,GPU-9b4e"}},
                     testing::FreshTempDir("gpus_no_driver"))
                .visible,
            0);
  EXPECT_EQ(none.visible, 0);
}

// As torchrun's: a count, gpu, auto (refused on the flag before, though a PyTorchJob's
// nprocPerNode took it) or cpu.
TEST(GpusTest, ProcessesPerNodeIsACountOrOnePerGpu) {
  const GpuInventory gpus = FindGpus({{"CUDA_VISIBLE_DEVICES", "0,2"}}, ProcWithThreeGpus());
  EXPECT_EQ(*ParseProcessesPerNode("gpu", gpus), 2);
  EXPECT_EQ(*ParseProcessesPerNode("4", gpus), 4);
  EXPECT_EQ(*ParseProcessesPerNode("auto", gpus), 2);
  EXPECT_EQ(*ParseProcessesPerNode("auto", GpuInventory{}), 1);
  EXPECT_EQ(*ParseProcessesPerNode("cpu", gpus), 1);
  for (const char* bad : {"0", "-2", "two", "gpus", ""}) {
    const absl::StatusOr<int> count = ParseProcessesPerNode(bad, gpus);
    EXPECT_EQ(count.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(count.status().message(), HasSubstr("gpu for one per visible GPU, auto")) << bad;
  }
  const absl::StatusOr<int> none = ParseProcessesPerNode("gpu", GpuInventory{});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.status().message(), HasSubstr("no NVIDIA GPU is visible here"));
}

// `dtrain launch --nproc-per-node gpu` where no GPU is visible (CUDA_VISIBLE_DEVICES empty hides
// any the machine has) exits 2 before any worker starts, naming what it read and the fix.
TEST(GpusTest, LaunchWithOneWorkerPerGpuAndNoneVisibleExits2) {
  const testing::Outcome outcome =
      testing::RunDtrain("launch --nproc-per-node gpu", "env CUDA_VISIBLE_DEVICES=");
  EXPECT_EQ(outcome.exit_code, 2) << outcome.stderr_text;
  EXPECT_THAT(outcome.stderr_text,
              HasSubstr("--nproc-per-node gpu: no NVIDIA GPU is visible here"));
  EXPECT_THAT(outcome.stderr_text, HasSubstr("CUDA_VISIBLE_DEVICES=)"));
  EXPECT_THAT(outcome.stderr_text, HasSubstr("e.g. --nproc-per-node 2"));
  EXPECT_THAT(outcome.stderr_text, Not(HasSubstr("started rank")));
  const testing::Outcome zero = testing::RunDtrain("launch --nproc-per-node 0");
  EXPECT_EQ(zero.exit_code, 2);
  EXPECT_THAT(zero.stderr_text, HasSubstr("--nproc-per-node 0: give a positive number"));
}

}  // namespace
}  // namespace dtrain
