// The NVIDIA GPUs a process on this machine may use, found without nvidia-smi, the driver's
// libraries or the CUDA runtime (so a CPU-only machine, or a login node, answers too): the
// driver's /proc/driver/nvidia/gpus/<PCI bus id> entries, one per GPU, narrowed by
// CUDA_VISIBLE_DEVICES as the CUDA runtime narrows them.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "launch/environment.h"

namespace dtrain {

struct GpuInventory {
  int installed = 0;  // the driver's GPU entries
  int visible = 0;    // of them, those CUDA_VISIBLE_DEVICES leaves to this process
  // What was read, for messages: "2 GPUs in /proc/driver/nvidia/gpus, CUDA_VISIBLE_DEVICES=1".
  std::string description;
};

// The GPUs CUDA shows of CUDA_VISIBLE_DEVICES `list` on a machine with `installed` (-1: unknown,
// no index is out of range): its entries up to the first that names no GPU, as CUDA reads it (an
// index below `installed` not listed before, or a GPU-/MIG- UUID not listed before, which only
// the driver could check further: counted, GPU- ones up to `installed`); empty, Slurm's
// "NoDevFiles" or a machine without GPUs, none.
int CountVisibleGpus(const std::string& list, int installed);

// Reads `proc_root`/driver/nvidia/gpus (no such folder: no driver, no GPU). CUDA_VISIBLE_DEVICES
// from `env`: unset, every GPU; otherwise CountVisibleGpus of it.
GpuInventory FindGpus(const EnvironmentMap& env, const std::string& proc_root = "/proc");

// `--nproc-per-node`'s value, as torchrun's: a positive count; "gpu", one worker per visible GPU;
// "auto", that or 1 where none is; "cpu", 1 (whose threads use the cores; torchrun's is a process
// per core). InvalidArgument naming the flag and the fix for anything else, or "gpu" where no GPU
// is visible.
absl::StatusOr<int> ParseProcessesPerNode(const std::string& value, const GpuInventory& gpus);

// A PyTorchJob's nprocPerNode words, which `dtrain launch` turns into a count itself: "auto",
// "gpu" or "cpu" (launch/launcher.cc).
bool IsProcessesPerNodeWord(absl::string_view value);

}  // namespace dtrain
