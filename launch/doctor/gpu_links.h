// The NVIDIA GPUs on this node's PCI bus and their PCIe links, read from sysfs
// (<sys>/bus/pci/devices/*: vendor 0x10de, class 0x03xxxx, so not the GPUs' audio functions or
// NVSwitches), whether or not the driver is loaded. A GPU whose link trained narrower than its
// maximum (x8 of x16: a badly seated card, a damaged riser) moves host data at a fraction of the
// speed; the sysfs root is a parameter so that tests fake such a node.
#pragma once

#include <string>
#include <vector>

#include "launch/doctor/check.h"
#include "launch/gpus.h"

namespace dtrain::doctor {

struct PcieGpu {
  std::string address;  // e.g. "0000:17:00.0"
  int width = -1;       // current_link_width, lanes; -1 unknown
  int max_width = -1;   // max_link_width
  std::string speed;    // current_link_speed, e.g. "32.0 GT/s PCIe"
  std::string max_speed;
  int numa_node = -1;  // -1: the platform does not say
};

// By address; a missing folder is an empty list.
std::vector<PcieGpu> ReadPcieGpus(const std::string& sys_root);

// One "gpu.pcie.<address>" line per GPU (a narrower link than its maximum is a warning; a slower
// one is information, since an idle GPU lowers its link speed to save power), and a warning when
// the driver (`driver`, from /proc) lists fewer GPUs than the bus has. Nothing without a GPU on
// the bus: node.gpus says so.
std::vector<CheckResult> GpuLinkChecks(const std::vector<PcieGpu>& gpus,
                                       const GpuInventory& driver);

}  // namespace dtrain::doctor
