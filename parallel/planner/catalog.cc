// Figures and their sources. Where a vendor publishes a number (peak FLOP/s, memory) it is used
// as published (dense, no sparsity); bandwidths are nccl-tests/rccl-tests all-reduce busbw as
// commonly measured, which is what a training step sees, not the signalling rate.
#include "parallel/planner/catalog.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace dtrain {

const std::vector<GpuSpec>& GpuCatalog() {
  // Peaks (dense bf16, dense TF32, float32) and memory bandwidth: NVIDIA A100/H100/H200 and L40S
  // datasheets, AMD MI300X datasheet. Memory: the capacity nvidia-smi / rocm-smi reports (81559 MiB
  // on an H100 80GB), which is what an allocator can have. Host bandwidth: practical cudaMemcpy
  // over PCIe Gen4 x16 (~25 GB/s) or Gen5 x16 (~50 GB/s).
  static const auto* const gpus = new std::vector<GpuSpec>{
      {"a100-40gb", "NVIDIA A100 SXM4 40GB", 40.0, 312, 156, 19.5, 1555, "nvlink3", 25},
      {"a100-80gb", "NVIDIA A100 SXM4 80GB", 80.0, 312, 156, 19.5, 2039, "nvlink3", 25},
      {"h100-sxm", "NVIDIA H100 SXM5 80GB", 79.6, 989, 495, 67, 3350, "nvlink4", 50},
      {"h100-pcie", "NVIDIA H100 PCIe 80GB", 79.6, 756, 378, 51, 2000, "pcie5", 50},
      {"h200", "NVIDIA H200 SXM 141GB", 140.4, 989, 495, 67, 4800, "nvlink4", 50},
      {"l40s", "NVIDIA L40S 48GB", 45.0, 362, 183, 91.6, 864, "pcie4", 25},
      {"mi300x", "AMD Instinct MI300X 192GB", 191.5, 1307, 654, 163.4, 5300, "xgmi", 50,
       /*cuda=*/false},
  };
  return *gpus;
}

const std::vector<LinkSpec>& LinkCatalog() {
  // Intra-node busbw: REFERENCES.md 7 (A100 NVSwitch ~230 GB/s, H100 NVLink ~370 GB/s without
  // NVLS); PCIe through a switch and MI300X Infinity Fabric are typical rccl/nccl-tests results
  // and vary with the board, so override them with your own measurement.
  // Network busbw per NIC: REFERENCES.md 7 (HDR 200G ~24 GB/s, NDR 400G 46-49 GB/s, 100G
  // Ethernet ~12 GB/s); RoCE reaches ~90% of line rate; sockets over 25 GbE ~2.5 GB/s.
  // Latencies: one ring hop, small messages: ~1.5 us over NVLink, ~3 us PCIe and InfiniBand,
  // ~5 us RoCE, ~30 us TCP sockets.
  static const auto* const links = new std::vector<LinkSpec>{
      {"nvlink3", "NVLink 3 + NVSwitch (A100)", Transport::kNvlink, 230, 1.5},
      {"nvlink4", "NVLink 4 + NVSwitch (H100, H200)", Transport::kNvlink, 370, 1.5},
      {"xgmi", "Infinity Fabric (MI300X)", Transport::kNvlink, 300, 1.5},
      {"pcie4", "PCIe Gen4 peer-to-peer", Transport::kPcie, 20, 3},
      {"pcie5", "PCIe Gen5 peer-to-peer", Transport::kPcie, 40, 3},
      {"ib-hdr100", "InfiniBand HDR100 100 Gb/s, one NIC", Transport::kInfiniband, 12, 3},
      {"ib-hdr", "InfiniBand HDR 200 Gb/s, one NIC", Transport::kInfiniband, 24, 3},
      {"ib-ndr", "InfiniBand NDR 400 Gb/s, one NIC", Transport::kInfiniband, 48, 3},
      {"roce-100", "RoCE v2 100 Gb/s, one NIC", Transport::kRoce, 11, 5},
      {"roce-200", "RoCE v2 200 Gb/s, one NIC", Transport::kRoce, 22, 5},
      {"roce-400", "RoCE v2 400 Gb/s, one NIC", Transport::kRoce, 44, 5},
      {"eth-25", "Ethernet 25 Gb/s, TCP sockets", Transport::kSocket, 2.5, 30},
      {"eth-100", "Ethernet 100 Gb/s, TCP sockets", Transport::kSocket, 12, 30},
  };
  return *links;
}

const GpuSpec* FindGpu(absl::string_view name) {
  for (const GpuSpec& gpu : GpuCatalog()) {
    if (gpu.name == name) return &gpu;
  }
  return nullptr;
}

const LinkSpec* FindLink(absl::string_view name) {
  for (const LinkSpec& link : LinkCatalog()) {
    if (link.name == name) return &link;
  }
  return nullptr;
}

namespace {

bool IsNetwork(const LinkSpec& link) {
  return link.transport != Transport::kNvlink && link.transport != Transport::kPcie;
}

std::string NetworkNames() {
  std::vector<absl::string_view> names;
  for (const LinkSpec& link : LinkCatalog()) {
    if (IsNetwork(link)) names.push_back(link.name);
  }
  return absl::StrJoin(names, ", ");
}

std::string GpuNames() {
  std::vector<absl::string_view> names;
  for (const GpuSpec& gpu : GpuCatalog()) names.push_back(gpu.name);
  return absl::StrJoin(names, ", ");
}

}  // namespace

const char* TransportName(Transport transport) {
  switch (transport) {
    case Transport::kNvlink:
      return "NVLink";
    case Transport::kPcie:
      return "PCIe";
    case Transport::kInfiniband:
      return "InfiniBand";
    case Transport::kRoce:
      return "RoCE";
    case Transport::kSocket:
      return "TCP sockets";
  }
  return "unknown";
}

std::string CatalogText() {
  std::string out =
      "GPUs (dense peaks bf16 / TF32 / float32, memory and its bandwidth, link between the GPUs "
      "of a node):\n";
  for (const GpuSpec& gpu : GpuCatalog()) {
    absl::StrAppendFormat(&out,
                          "  %-10s %-28s %5.0f / %4.0f / %5.1f TFLOP/s %6.1f GiB %5.0f GB/s  %s\n",
                          gpu.name, gpu.description, gpu.peak_tflops, gpu.tf32_tflops,
                          gpu.fp32_tflops, gpu.memory_gib, gpu.memory_gbps, gpu.intra_link);
  }
  absl::StrAppend(&out, "Links (all-reduce busbw, latency per hop; networks per NIC):\n");
  for (const LinkSpec& link : LinkCatalog()) {
    absl::StrAppendFormat(&out, "  %-10s %-36s %6.1f GB/s %5.1f us\n", link.name, link.description,
                          link.busbw_gbps, link.latency_us);
  }
  return out;
}

double ClusterSpec::GemmPeakTflops(MatmulPrecision precision) const {
  switch (precision) {
    case MatmulPrecision::kHighest:
      return fp32_tflops;
    case MatmulPrecision::kHigh:
      return tf32_tflops;
    case MatmulPrecision::kMedium:
      return peak_tflops;
  }
  return peak_tflops;
}

absl::StatusOr<ClusterSpec> ResolveCluster(const ClusterSection& cluster) {
  const GpuSpec* gpu = FindGpu(cluster.gpu);
  if (gpu == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cluster.gpu: '", cluster.gpu, "' is not in the catalog; use one of ", GpuNames(),
        ", and set cluster.gpu_memory_gib, cluster.peak_tflops and cluster.memory_gbps for "
        "the closest one if yours is missing"));
  }
  const LinkSpec* network = FindLink(cluster.network);
  if (network == nullptr || !IsNetwork(*network)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cluster.network: '", cluster.network, "' is not a network in the catalog; use one of ",
        NetworkNames(), ", and set cluster.inter_gbps to your measured busbw if none fits"));
  }
  const LinkSpec* intra = FindLink(gpu->intra_link);  // the catalog names only its own links
  const auto pick = [](double override_value, double catalog_value) {
    return override_value > 0 ? override_value : catalog_value;
  };
  ClusterSpec spec;
  spec.nodes = cluster.nodes;
  spec.gpus_per_node = cluster.gpus_per_node;
  spec.gpu_name = std::string(gpu->name);
  spec.gpu_memory_gib = pick(cluster.gpu_memory_gib, gpu->memory_gib);
  spec.peak_tflops = pick(cluster.peak_tflops, gpu->peak_tflops);
  spec.tf32_tflops = spec.peak_tflops * gpu->tf32_tflops / gpu->peak_tflops;
  spec.fp32_tflops = spec.peak_tflops * gpu->fp32_tflops / gpu->peak_tflops;
  spec.memory_gbps = pick(cluster.memory_gbps, gpu->memory_gbps);
  spec.host_gbps = gpu->host_gbps;
  spec.intra_name = std::string(intra->name);
  spec.intra_transport = intra->transport;
  spec.intra_gbps = pick(cluster.intra_gbps, intra->busbw_gbps);
  spec.intra_latency_us = pick(cluster.intra_latency_us, intra->latency_us);
  spec.network_name = std::string(network->name);
  spec.network_transport = network->transport;
  spec.nic_gbps = pick(cluster.inter_gbps, network->busbw_gbps);
  spec.inter_latency_us = pick(cluster.inter_latency_us, network->latency_us);
  // RDMA fabrics give each GPU its own adapter (rail-optimised, as DGX nodes); a TCP network's
  // node has one data interface, the one NCCL_SOCKET_IFNAME names.
  const int default_nics = network->transport == Transport::kSocket ? 1 : cluster.gpus_per_node;
  spec.nics_per_node = cluster.nics_per_node > 0 ? cluster.nics_per_node : default_nics;
  return spec;
}

}  // namespace dtrain
