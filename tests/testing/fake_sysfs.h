// Fake sysfs trees (class/net, class/infiniband, bus/pci/devices) of an InfiniBand node, a RoCE
// node, an Ethernet-only node and PCI devices, laid out as the kernel lays them out, for the
// doctor's tests.
// Header-only because tests/CMakeLists.txt compiles only *_test.cc.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/testing/run_dtrain.h"

namespace dtrain::testing {

// A fake /sys laid out as the kernel lays out class/net, class/infiniband and bus/pci/devices.
class FakeSys {
 public:
  explicit FakeSys(const std::string& name) : root_(FreshTempDir(name)) {
    Write("class/net/lo/operstate", "unknown");
  }

  const std::string& root() const { return root_; }

  void Interface(const std::string& name, const std::string& state, const std::string& speed) {
    Write("class/net/" + name + "/operstate", state);
    Write("class/net/" + name + "/speed", speed);
  }

  void Port(const std::string& device, const std::string& state, const std::string& rate,
            const std::string& link_layer) {
    const std::string port = "class/infiniband/" + device + "/ports/1/";
    Write(port + "state", state);
    Write(port + "rate", rate);
    Write(port + "link_layer", link_layer);
  }

  void Gid(const std::string& device, int index, const std::string& gid, const std::string& type) {
    const std::string port = "class/infiniband/" + device + "/ports/1/";
    Write(port + "gids/" + std::to_string(index), gid);
    Write(port + "gid_attrs/types/" + std::to_string(index), type);
  }

  // A PCI function with its link: `width` lanes of `max_width`, speeds as sysfs writes them
  // ("32.0 GT/s PCIe").
  void PciDevice(const std::string& address, const std::string& vendor, const std::string& klass,
                 int width, int max_width, const std::string& speed, const std::string& max_speed,
                 int numa_node) {
    const std::string device = "bus/pci/devices/" + address + "/";
    Write(device + "vendor", vendor);
    Write(device + "class", klass);
    Write(device + "current_link_width", std::to_string(width));
    Write(device + "max_link_width", std::to_string(max_width));
    Write(device + "current_link_speed", speed);
    Write(device + "max_link_speed", max_speed);
    Write(device + "numa_node", std::to_string(numa_node));
  }

 private:
  void Write(const std::string& relative, const std::string& text) {
    const std::filesystem::path path = std::filesystem::path(root_) / relative;
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << text << "\n";
  }

  std::string root_;
};

inline constexpr char kLinkLocalGid[] = "fe80:0000:0000:0000:0e42:a1ff:fe5b:1c20";
inline constexpr char kIpv4Gid[] = "0000:0000:0000:0000:0000:ffff:0a00:0001";  // ::ffff:10.0.0.1

inline FakeSys InfinibandNode() {
  FakeSys sys("doctor_ib_node");
  sys.Interface("eth0", "up", "25000");
  sys.Interface("ib0", "up", "400000");
  sys.Port("mlx5_0", "4: ACTIVE", "400 Gb/sec (4X NDR)", "InfiniBand");
  sys.Gid("mlx5_0", 0, kLinkLocalGid, "IB/RoCE v1");
  return sys;
}

// A RoCE port with the usual four GIDs: v1 and v2 of the link-local address, then v1 and v2 of
// its IPv4 address, and an unused (zero) entry after them.
inline FakeSys RoceNode() {
  FakeSys sys("doctor_roce_node");
  sys.Interface("eth0", "up", "1000");
  sys.Interface("ens1f0np0", "up", "100000");
  sys.Port("mlx5_0", "4: ACTIVE", "100 Gb/sec (4X EDR)", "Ethernet");
  sys.Gid("mlx5_0", 0, kLinkLocalGid, "IB/RoCE v1");
  sys.Gid("mlx5_0", 1, kLinkLocalGid, "RoCE v2");
  sys.Gid("mlx5_0", 2, kIpv4Gid, "IB/RoCE v1");
  sys.Gid("mlx5_0", 3, kIpv4Gid, "RoCE v2");
  sys.Gid("mlx5_0", 4, "0000:0000:0000:0000:0000:0000:0000:0000", "");
  return sys;
}

inline FakeSys EthernetNode() {
  FakeSys sys("doctor_eth_node");
  sys.Interface("eth0", "up", "25000");
  sys.Interface("docker0", "down", "");
  return sys;
}

}  // namespace dtrain::testing
