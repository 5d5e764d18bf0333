// Chooses and creates the compute backend for --device.
//
// The CUDA backend lives in a separate module, libparasync_cuda.so, loaded with dlopen()
// only when asked for. Two reasons: the CPU build and a CPU-only machine never need the CUDA
// libraries, and cuBLAS's large thread-local storage is not loaded into the process before
// the metrics server has created its threads (see docs/dependencies.md).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "common/status.h"
#include "worker/compute/backend.h"
#include "worker/model/model.h"

namespace parasync {

struct DeviceChoice {
  enum class Kind { kAuto, kCpu, kCuda } kind = Kind::kAuto;
  std::optional<int> gpu;  // "cuda:N"; unset: chosen by local rank
};

// Parses "auto", "cpu", "cuda" or "cuda:N"; InvalidArgument otherwise.
Result<DeviceChoice> ParseDevice(const std::string& text);

// The GPU a worker uses among `count` (> 0): the one --device names, else its local rank
// (its index among the workers on this machine, as Horovod's local_rank) modulo the count,
// so N workers on an N-GPU machine get one GPU each. InvalidArgument for a named GPU that
// does not exist.
Result<int> PickGpu(const DeviceChoice& device, int local_rank, int count);

// The local rank from $LOCAL_RANK (as torchrun and others set it): 0 when unset,
// InvalidArgument when it is not a non-negative integer.
Result<int> LocalRankFromEnvironment();

// Creates the backend. kCpu: the CPU backend. kCuda: the CUDA backend on PickGpu()'s GPU,
// or Unavailable ("no GPU") / NotSupported with the reason. kAuto: CUDA when the module
// loads and a GPU is present, else CPU. `*why` says which was picked and why.
Result<std::unique_ptr<ComputeBackend>> CreateBackend(const DeviceChoice& device,
                                                      const Model& model, int local_rank,
                                                      std::string* why);

}  // namespace parasync
