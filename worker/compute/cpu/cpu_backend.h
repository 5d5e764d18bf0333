// The CPU backend's seam for tests: the backend built with each of its layers passed through
// a wrapper first. tests/worker/cpu_backend_test.cc wraps one layer at a time so that its
// backward pass is wrong and requires the gradient check to notice. Production code calls
// CreateCpuBackend (worker/compute/backend.h), which wraps nothing; nothing here is global.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "common/status.h"
#include "worker/compute/backend.h"
#include "worker/compute/cpu/cpu_layer.h"
#include "worker/model/model.h"

namespace parasync::cpu {

// Given the layer made for op `op_index` of the model (owned), returns the layer the backend
// runs in its place (which may wrap it, or be it).
using LayerWrapper = std::function<std::unique_ptr<CpuLayer>(
    const LayerOp& op, uint32_t op_index, std::unique_ptr<CpuLayer> layer)>;

// As CreateCpuBackend, with every layer passed through `wrap` (called once per op, in order,
// before this returns; not kept).
Result<std::unique_ptr<ComputeBackend>> CreateCpuBackendWrappingLayers(const Model& model,
                                                                       const LayerWrapper& wrap);

}  // namespace parasync::cpu
