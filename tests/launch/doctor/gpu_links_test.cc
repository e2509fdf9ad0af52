#include "launch/doctor/gpu_links.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_sysfs.h"

namespace dtrain::doctor {
namespace {

using ::testing::HasSubstr;

constexpr char kGen5[] = "32.0 GT/s PCIe";
constexpr char kGen1[] = "2.5 GT/s PCIe";

// Two H100s on NUMA node 0 and 1, one of them trained at x8; each GPU's HDMI audio function, an
// NVSwitch (class 0x068000) and a NIC beside them.
testing::FakeSys GpuNode() {
  testing::FakeSys sys("doctor_gpu_node");
  sys.PciDevice("0000:18:00.0", "0x10de", "0x030200", 16, 16, kGen5, kGen5, 0);
  sys.PciDevice("0000:18:00.1", "0x10de", "0x040300", 16, 16, kGen5, kGen5, 0);
  sys.PciDevice("0000:9a:00.0", "0x10de", "0x030200", 8, 16, kGen5, kGen5, 1);
  sys.PciDevice("0000:05:00.0", "0x10de", "0x068000", 4, 4, kGen5, kGen5, 0);
  sys.PciDevice("0000:3b:00.0", "0x15b3", "0x020000", 16, 16, kGen5, kGen5, 0);
  return sys;
}

GpuInventory DriverGpus(int count) {
  GpuInventory gpus;
  gpus.installed = gpus.visible = count;
  return gpus;
}

TEST(GpuLinksTest, OnlyNvidiaDisplayControllersAreGpus) {
  const std::vector<PcieGpu> gpus = ReadPcieGpus(GpuNode().root());
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].address, "0000:18:00.0");
  EXPECT_EQ(gpus[1].address, "0000:9a:00.0");
  EXPECT_EQ(gpus[1].width, 8);
  EXPECT_EQ(gpus[1].max_width, 16);
  EXPECT_EQ(gpus[1].max_speed, kGen5);
  EXPECT_EQ(gpus[1].numa_node, 1);
  EXPECT_TRUE(ReadPcieGpus(testing::FakeSys("doctor_no_pci").root()).empty());
}

TEST(GpuLinksTest, NarrowLinkWarnsAndNamesTheGpu) {
  const std::vector<CheckResult> results =
      GpuLinkChecks(ReadPcieGpus(GpuNode().root()), DriverGpus(2));
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].name, "gpu.pcie.0000:18:00.0");
  EXPECT_EQ(results[0].verdict, Verdict::kOk);
  EXPECT_EQ(results[0].detail, "x16 of x16, 32.0 GT/s PCIe of 32.0 GT/s PCIe, NUMA node 0");
  EXPECT_EQ(results[1].verdict, Verdict::kWarn);
  EXPECT_THAT(results[1].detail, HasSubstr("x8 of x16"));
  EXPECT_THAT(results[1].detail, HasSubstr("50% of its bandwidth"));
  EXPECT_THAT(results[1].fix, HasSubstr("lspci -vv -s 0000:9a:00.0"));
}

TEST(GpuLinksTest, SlowIdleLinkIsInformation) {
  testing::FakeSys sys("doctor_idle_gpu");
  sys.PciDevice("0000:18:00.0", "0x10de", "0x030000", 16, 16, kGen1, kGen5, -1);
  const std::vector<CheckResult> results = GpuLinkChecks(ReadPcieGpus(sys.root()), DriverGpus(1));
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].verdict, Verdict::kInfo);
  EXPECT_THAT(results[0].detail, HasSubstr("2.5 GT/s PCIe of 32.0 GT/s PCIe; an idle GPU"));
  EXPECT_THAT(results[0].detail, ::testing::Not(HasSubstr("NUMA")));
}

TEST(GpuLinksTest, GpusTheDriverLostAreCounted) {
  const std::vector<PcieGpu> gpus = ReadPcieGpus(GpuNode().root());
  const std::vector<CheckResult> lost = GpuLinkChecks(gpus, DriverGpus(1));
  ASSERT_EQ(lost.size(), 3u);
  EXPECT_EQ(lost[0].name, "gpu.driver");
  EXPECT_EQ(lost[0].verdict, Verdict::kWarn);
  EXPECT_EQ(lost[0].detail, "the driver lists 1 of the 2 NVIDIA GPUs on the PCI bus");
  EXPECT_THAT(lost[0].fix, HasSubstr("Xid 79"));
  EXPECT_THAT(GpuLinkChecks(gpus, DriverGpus(0))[0].fix, HasSubstr("load the NVIDIA driver"));
  EXPECT_TRUE(GpuLinkChecks({}, DriverGpus(0)).empty());
}

}  // namespace
}  // namespace dtrain::doctor
