#include "launch/doctor/gpu_links.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace dtrain::doctor {
namespace {

namespace fs = std::filesystem;

constexpr char kNvidiaVendor[] = "0x10de";
constexpr char kDisplayClass[] = "0x03";  // display controllers: VGA 0x0300xx, 3D 0x0302xx

std::string ReadAttribute(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return "";
  return std::string(absl::StripAsciiWhitespace(line));
}

int ReadInt(const fs::path& path) {
  int value = -1;
  return absl::SimpleAtoi(ReadAttribute(path), &value) ? value : -1;
}

// "16.0 GT/s PCIe" -> 16.0; 0 when unknown.
double GigaTransfers(const std::string& speed) {
  double value = 0;
  const std::string number = speed.substr(0, speed.find(' '));
  return absl::SimpleAtod(number, &value) ? value : 0;
}

std::string WidthText(int width) { return width < 0 ? "x?" : absl::StrCat("x", width); }

std::string SpeedText(const std::string& speed) { return speed.empty() ? "speed unknown" : speed; }

}  // namespace

std::vector<PcieGpu> ReadPcieGpus(const std::string& sys_root) {
  std::vector<PcieGpu> gpus;
  std::error_code error;
  for (fs::directory_iterator it(fs::path(sys_root) / "bus/pci/devices", error), end;
       !error && it != end; it.increment(error)) {
    const fs::path device = it->path();
    if (ReadAttribute(device / "vendor") != kNvidiaVendor ||
        !absl::StartsWith(ReadAttribute(device / "class"), kDisplayClass)) {
      continue;
    }
    gpus.push_back(
        PcieGpu{device.filename().string(), ReadInt(device / "current_link_width"),
                ReadInt(device / "max_link_width"), ReadAttribute(device / "current_link_speed"),
                ReadAttribute(device / "max_link_speed"), ReadInt(device / "numa_node")});
  }
  std::sort(gpus.begin(), gpus.end(),
            [](const PcieGpu& a, const PcieGpu& b) { return a.address < b.address; });
  return gpus;
}

std::vector<CheckResult> GpuLinkChecks(const std::vector<PcieGpu>& gpus,
                                       const GpuInventory& driver) {
  std::vector<CheckResult> results;
  if (gpus.empty()) return results;
  if (driver.installed < static_cast<int>(gpus.size())) {
    results.push_back(CheckResult{
        "gpu.driver", Verdict::kWarn,
        absl::StrCat("the driver lists ", driver.installed, " of the ", gpus.size(),
                     " NVIDIA GPUs on the PCI bus"),
        driver.installed == 0
            ? "load the NVIDIA driver (nvidia-smi should list every GPU)"
            : "a GPU the driver lost (dmesg: Xid 79, 'fallen off the bus') needs a node reboot "
              "or a reseat; drain the node meanwhile"});
  }
  for (const PcieGpu& gpu : gpus) {
    std::string detail = absl::StrCat(WidthText(gpu.width), " of ", WidthText(gpu.max_width), ", ",
                                      SpeedText(gpu.speed), " of ", SpeedText(gpu.max_speed));
    if (gpu.numa_node >= 0) absl::StrAppend(&detail, ", NUMA node ", gpu.numa_node);
    CheckResult result{absl::StrCat("gpu.pcie.", gpu.address), Verdict::kOk, detail, ""};
    if (gpu.width >= 0 && gpu.max_width > 0 && gpu.width < gpu.max_width) {
      result.verdict = Verdict::kWarn;
      absl::StrAppend(&result.detail,
                      "; the link trained narrower than the card allows, so "
                      "host copies and GPUDirect run at ",
                      100 * gpu.width / gpu.max_width, "% of its bandwidth");
      result.fix =
          absl::StrCat("reseat the GPU or replace its riser or cable (lspci -vv -s ", gpu.address,
                       " shows LnkSta against LnkCap); drain the node "
                       "meanwhile");
    } else if (GigaTransfers(gpu.speed) < GigaTransfers(gpu.max_speed)) {
      result.verdict = Verdict::kInfo;
      absl::StrAppend(&result.detail,
                      "; an idle GPU lowers its link speed to save power: check under load "
                      "(nvidia-smi -q -d PCI, Link Gen Current)");
    }
    results.push_back(std::move(result));
  }
  return results;
}

}  // namespace dtrain::doctor
