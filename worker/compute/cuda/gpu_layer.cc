#include "worker/compute/cuda/gpu_layer.h"

namespace parasync::cuda {

Status CudaError(cudaError_t rc, const char* call) {
  return Status::Internal(std::string(call) + " failed: " + cudaGetErrorString(rc) + " (" +
                          cudaGetErrorName(rc) + ")");
}

Status CublasError(cublasStatus_t rc, const char* call) {
  return Status::Internal(std::string(call) + " failed: " + cublasGetStatusString(rc) +
                          " (cuBLAS status " + std::to_string(static_cast<int>(rc)) + ")");
}

Status CudnnError(cudnnStatus_t rc, const char* call) {
  return Status::Internal(std::string(call) + " failed: " + cudnnGetErrorString(rc) +
                          " (cuDNN status " + std::to_string(static_cast<int>(rc)) + ")");
}

Status DescribeBatch(TensorDesc* desc, int rows, const std::vector<int64_t>& shape) {
  if (shape.size() == 3) {
    return desc->Set(rows, static_cast<int>(shape[0]), static_cast<int>(shape[1]),
                     static_cast<int>(shape[2]));
  }
  return desc->Set(rows, static_cast<int>(shape[0]), 1, 1);
}

namespace {

// Flatten: the NCHW batch already is the flat [rows, C*H*W] one.
class FlattenLayer final : public GpuLayer {
 public:
  compute::OpMemory buffer_use() const override { return {compute::Aliasing::kView, false}; }
  Status Forward(const float* const*, const float*, float*, const GpuPass&) override {
    return Status::Ok();
  }
  Status Backward(const float* const*, const float*, const float*, const float*, float*,
                  float* const*, const GpuPass&) override {
    return Status::Ok();
  }
};

}  // namespace

Result<std::unique_ptr<GpuLayer>> MakeGpuLayer(const LayerOp& op, uint32_t op_index,
                                               const GpuContext& context) {
  switch (op.spec.kind) {
    case LayerKind::kDense: return MakeGpuDenseLayer(op, context);
    case LayerKind::kConv2d: return MakeGpuConv2dLayer(op, context);
    case LayerKind::kMaxPool2d:
    case LayerKind::kAvgPool2d: return MakeGpuPoolLayer(op, context);
    case LayerKind::kFlatten: return std::unique_ptr<GpuLayer>(std::make_unique<FlattenLayer>());
    case LayerKind::kActivation: return MakeGpuActivationLayer(op, context);
    case LayerKind::kDropout: return MakeGpuDropoutLayer(op, op_index, context);
    case LayerKind::kEmbedding: return MakeGpuEmbeddingLayer(op, context);
  }
  return Status::NotSupported("the CUDA backend has no layer '" + op.spec.name + "'");
}

}  // namespace parasync::cuda
