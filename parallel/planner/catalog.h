// The planner's catalog of GPUs and links, and the cluster a recipe describes resolved against it.
//
// Every figure is a published or commonly measured number, cited in catalog.cc; a recipe's
// `cluster` section overrides any of them. Bandwidths are nccl-tests bus bandwidths (busbw) of an
// all-reduce, in GB/s (1e9 bytes per second), so one number serves every collective
// (REFERENCES.md 7). The tables are immutable and safe to read from any thread.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/backend/matmul_precision.h"
#include "core/recipe/recipe.h"

namespace dtrain {

// How NCCL reaches the other nodes: decides the environment `dtrain plan` recommends.
enum class Transport {
  kNvlink,  // inside a node: NVLink / NVSwitch, or AMD Infinity Fabric
  kPcie,    // inside a node: peer-to-peer over PCIe
  kInfiniband,
  kRoce,    // RDMA over Converged Ethernet (v2)
  kSocket,  // plain TCP sockets over Ethernet
};

// "NVLink", "PCIe", "InfiniBand", "RoCE" or "TCP sockets".
const char* TransportName(Transport transport);

struct LinkSpec {
  absl::string_view name;         // catalog key, e.g. "ib-ndr"
  absl::string_view description;  // e.g. "InfiniBand NDR 400 Gb/s, one NIC"
  Transport transport;
  double busbw_gbps;  // all-reduce bus bandwidth in GB/s (per NIC for networks)
  double latency_us;  // one hop of a ring, small messages
};

struct GpuSpec {
  absl::string_view name;         // catalog key, e.g. "h100-sxm"
  absl::string_view description;  // e.g. "NVIDIA H100 SXM5 80GB"
  double memory_gib;              // capacity the driver reports (nvidia-smi / rocm-smi)
  double peak_tflops;             // dense bf16 tensor-core peak
  double tf32_tflops;             // dense TF32 tensor-core peak
  double fp32_tflops;             // float32 peak (CUDA cores; AMD's vector units)
  double memory_gbps;             // device memory (HBM, GDDR) bandwidth, GB/s
  absl::string_view intra_link;   // LinkSpec name of the links between GPUs of one node
  double host_gbps;               // practical host<->device copy bandwidth (PCIe), GB/s
  bool cuda = true;  // dtrain's GPU backend runs it (CUDA, NCCL); false: planned to compare only
};

const std::vector<GpuSpec>& GpuCatalog();
const std::vector<LinkSpec>& LinkCatalog();  // intra-node links and networks

// nullptr when the name is not in the catalog.
const GpuSpec* FindGpu(absl::string_view name);
const LinkSpec* FindLink(absl::string_view name);

// The catalog as text: one line per GPU and per link with its figures, for `dtrain plan --catalog`.
std::string CatalogText();

// A cluster with every figure resolved: catalog values with the recipe's overrides applied.
struct ClusterSpec {
  int nodes = 1;
  int gpus_per_node = 8;
  std::string gpu_name;  // catalog key
  double gpu_memory_gib = 0;
  double peak_tflops = 0;  // dense bf16
  double tf32_tflops = 0;  // the catalog's, in its proportion to the bf16 peak
  double fp32_tflops = 0;  // likewise
  double memory_gbps = 0;
  double host_gbps = 0;
  std::string intra_name;  // catalog key of the intra-node link
  Transport intra_transport = Transport::kNvlink;
  double intra_gbps = 0;
  double intra_latency_us = 0;
  std::string network_name;  // catalog key of the network
  Transport network_transport = Transport::kInfiniband;
  double nic_gbps = 0;  // one NIC
  double inter_latency_us = 0;
  int nics_per_node = 0;  // resolved: never 0

  int world_size() const { return nodes * gpus_per_node; }
  // The peak of GEMMs at `precision`: float32 (highest), TF32 (high) or bf16 (medium, and
  // run.precision bf16's GEMMs).
  double GemmPeakTflops(MatmulPrecision precision) const;
  // Bandwidth of the network that one GPU gets when every GPU of a node communicates across
  // nodes at once: the node's NICs shared by its GPUs.
  double inter_gbps_per_gpu() const { return nic_gbps * nics_per_node / gpus_per_node; }
};

// Resolves `cluster` against the catalog. An unknown name is InvalidArgument naming the key
// (cluster.gpu / cluster.network) and the catalog's names.
absl::StatusOr<ClusterSpec> ResolveCluster(const ClusterSection& cluster);

}  // namespace dtrain
