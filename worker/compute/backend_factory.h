// Chooses and creates the compute backend for --device.
//
// The CUDA backend lives in a separate module, libparasync_cuda.so, loaded with dlopen()
// only when asked for. Two reasons: the CPU build and a CPU-only machine never need the CUDA
// libraries, and cuBLAS's large thread-local storage is not loaded into the process before
// the metrics server has created its threads (see shared/DEPENDENCIES.md).
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "worker/compute/backend.h"
#include "worker/model/mlp.h"

namespace parasync {

struct DeviceChoice {
  enum class Kind { kAuto, kCpu, kCuda } kind = Kind::kAuto;
  int gpu = 0;  // for kCuda: "cuda:N"
};

// Parses "auto", "cpu", "cuda" or "cuda:N"; InvalidArgument otherwise.
Result<DeviceChoice> ParseDevice(const std::string& text);

// Creates the backend. kCpu: the CPU backend. kCuda: the CUDA backend, or Unavailable
// ("no GPU") / NotSupported with the reason. kAuto: CUDA when the module loads and a GPU is
// present, else CPU; `*why` says which was picked and why.
Result<std::unique_ptr<ComputeBackend>> CreateBackend(const DeviceChoice& device,
                                                      const MlpSpec& spec, std::string* why);

}  // namespace parasync
