// The CUDA compute backend: a model's forward and backward passes on one GPU, layer by layer,
// with cuDNN (convolution, pooling, activations), cuBLAS (dense layers) and the kernels of
// kernels.cu for the rest. Lives in the CUDA module (libparasync_cuda.so); the worker reaches
// it through cuda_module.h.
#pragma once

#include <memory>

#include "common/status.h"
#include "worker/compute/backend.h"
#include "worker/model/model.h"

namespace parasync::cuda {

// A backend on GPU `device`; Unavailable/Internal with the CUDA or cuBLAS reason when the
// device cannot be set up, NotSupported for a model with layers it does not have yet.
Result<std::unique_ptr<ComputeBackend>> CreateCudaBackend(const Model& model, int device);

}  // namespace parasync::cuda
