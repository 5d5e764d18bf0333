// ComputeBackend: the one interface behind which the worker's math runs, on the CPU
// (worker/compute/cpu) or a GPU (worker/compute/cuda). The training loop sees only this.
//
// A backend instance is used by one thread at a time (the training thread); it may keep
// scratch buffers between calls. Parameters and gradients cross this interface as host
// float arrays in the order and shapes of MlpVariables() (worker/model/mlp.h).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>

#include "common/status.h"
#include "worker/model/mlp.h"

namespace parasync {

struct EvalResult {
  double loss_sum = 0.0;  // sum over examples of the cross-entropy loss
  int64_t correct = 0;    // examples whose arg-max logit equals the label
  int64_t count = 0;
  // The figures the chief logs and eval-only prints, computed one way for both.
  double accuracy() const { return static_cast<double>(correct) / static_cast<double>(count); }
  double mean_loss() const { return loss_sum / static_cast<double>(count); }
};

class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;

  // "cpu" or "cuda:N (GPU name)"; for logs.
  virtual std::string name() const = 0;

  // Host memory for the arrays that cross this interface every step: the pulled parameters,
  // the gradients to push, the batch. The CUDA backend returns page-locked memory, which its
  // copies read and write asynchronously (overlapping compute); any other memory works too,
  // only slower. The CPU backend returns plain memory. Zero-filled; nullptr if out of
  // memory. Drop every buffer before the backend.
  virtual std::shared_ptr<void> AllocateHost(size_t bytes) {
    return std::shared_ptr<void>(std::calloc(bytes == 0 ? 1 : bytes, 1), std::free);
  }

  // Forward and backward pass of the MLP on one batch.
  //  params: one host array per variable, in MlpVariables() order (not owned, read only).
  //  x: batch * widths[0] floats, row-major; labels: batch values in [0, widths.back()).
  //  grads: one host array per variable, same sizes as params; overwritten with the
  //         gradient of the MEAN loss over the batch.
  // Returns the mean cross-entropy loss, or InvalidArgument for a bad label or batch.
  virtual Result<float> ForwardBackward(std::span<const float* const> params, const float* x,
                                        const uint8_t* labels, int batch,
                                        std::span<float* const> grads) = 0;

  // Forward pass only, over n examples (processed in chunks of the backend's choosing).
  virtual Result<EvalResult> Evaluate(std::span<const float* const> params, const float* x,
                                      const uint8_t* labels, int64_t n) = 0;
};

// The CPU backend (OpenBLAS sgemm). Fails with InvalidArgument for a bad spec.
Result<std::unique_ptr<ComputeBackend>> CreateCpuBackend(const MlpSpec& spec);

}  // namespace parasync
