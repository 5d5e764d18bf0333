// ComputeBackend: the one interface behind which the worker's math runs, on the CPU
// (worker/compute/cpu) or a GPU (worker/compute/cuda). The training loop sees only this.
//
// A backend instance is used by one thread at a time (the training thread); it may keep
// scratch buffers between calls. A backend runs one Model (worker/model/model.h), layer by
// layer; parameters and gradients cross this interface as host float arrays in the order and
// shapes of Model::variables().
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>

#include "common/status.h"
#include "worker/model/model.h"

namespace parasync {

struct EvalResult {
  double loss_sum = 0.0;  // sum over examples of the cross-entropy loss
  // Examples predicted right: the first arg-max logit equals the label (softmax), or the
  // logit is > 0 exactly when the label is 1 (sigmoid).
  int64_t correct = 0;
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

  // Forward and backward pass of the model on one batch, in training mode.
  //  params: one host array per variable, in Model::variables() order (not owned, read only).
  //  x: batch * input_size() floats, example after example (images [C, H, W]);
  //  labels: batch values the loss accepts (Model::CheckLabelsFit).
  //  seed: draws dropout masks; the same seed gives the same masks (the trainer mixes the
  //        run's seed, its rank and the step).
  //  grads: one host array per variable, same sizes as params; overwritten with the
  //         gradient of the MEAN loss over the batch.
  // Returns the mean loss, or InvalidArgument for a bad label, id or batch.
  virtual Result<float> ForwardBackward(std::span<const float* const> params, const float* x,
                                        const uint8_t* labels, int batch, uint64_t seed,
                                        std::span<float* const> grads) = 0;

  // Forward pass only (inference mode: no dropout), over n examples (processed in chunks of
  // the backend's choosing). `logits`, if given, receives n * outputs() floats: each
  // example's logits (what a ranking metric such as AUC needs).
  virtual Result<EvalResult> Evaluate(std::span<const float* const> params, const float* x,
                                      const uint8_t* labels, int64_t n,
                                      float* logits = nullptr) = 0;
};

// The CPU backend (oneDNN primitives). Fails with InvalidArgument for a model it cannot run,
// Internal when oneDNN refuses a layer.
Result<std::unique_ptr<ComputeBackend>> CreateCpuBackend(const Model& model);

// Sizes the CPU backend's thread pool (oneDNN's OpenMP threads) for the whole process, and
// makes every thread of it, the caller included, flush denormals to zero (common/denormals.h).
// Call from the thread that will compute, before the first pass; keep 1 when several
// processes share a machine.
void SetCpuComputeThreads(int threads);

// Whether the calling thread and every thread of the CPU backend's pool flush denormals to
// zero (for the worker's start-up line and the tests).
bool CpuComputeThreadsFlushDenormals();

// What the CPU backend computes with, for a benchmark to print beside its figures: oneDNN's
// version, its CPU runtime and the instruction set it dispatches to, and the threads
// SetCpuComputeThreads() gave it, e.g. "oneDNN 2.6.3 (OpenMP runtime, AVX2 kernels), 2
// thread(s), denormals flushed to zero". The CPU backend calls no BLAS: oneDNN has every
// primitive it runs.
std::string DescribeCpuCompute();

}  // namespace parasync
