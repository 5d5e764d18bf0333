// ReLU, tanh and sigmoid on the GPU: cuDNN's activation forward and backward, in place. Their
// gradients need only the output, so the backward call is handed the output where cuDNN asks
// for the input too (which the forward pass overwrote), as in-place activations commonly do.
#include "worker/compute/cuda/gpu_layer.h"

namespace parasync::cuda {

namespace {

class ActivationLayer final : public GpuLayer {
 public:
  ActivationLayer(const LayerOp& op, const GpuContext& context) : op_(op), c_(context) {}
  ~ActivationLayer() override {
    if (desc_ != nullptr) cudnnDestroyActivationDescriptor(desc_);
  }

  Status Init() {
    cudnnActivationMode_t mode = CUDNN_ACTIVATION_RELU;
    if (op_.spec.activation == Activation::kTanh) mode = CUDNN_ACTIVATION_TANH;
    if (op_.spec.activation == Activation::kSigmoid) mode = CUDNN_ACTIVATION_SIGMOID;
    PARASYNC_CUDNN_RETURN(cudnnCreateActivationDescriptor(&desc_));
    PARASYNC_CUDNN_RETURN(cudnnSetActivationDescriptor(desc_, mode, CUDNN_NOT_PROPAGATE_NAN, 0.0));
    return Status::Ok();
  }

  compute::OpMemory buffer_use() const override { return {compute::Aliasing::kInPlace, true}; }

  Status Reserve(int rows) override {
    return tensor_.Set(rows, static_cast<int>(op_.out_size()), 1, 1);
  }

  Status Forward(const float* const* /*params*/, const float* x, float* y,
                 const GpuPass& /*pass*/) override {
    const float one = 1.0f, zero = 0.0f;
    PARASYNC_CUDNN_RETURN(cudnnActivationForward(c_.cudnn, desc_, &one, tensor_.get(), x, &zero,
                                                 tensor_.get(), y));
    return Status::Ok();
  }

  Status Backward(const float* const* /*params*/, const float* /*x*/, const float* y,
                  const float* dy, float* dx, float* const* /*grads*/,
                  const GpuPass& /*pass*/) override {
    if (dx == nullptr) return Status::Ok();
    const float one = 1.0f, zero = 0.0f;
    PARASYNC_CUDNN_RETURN(cudnnActivationBackward(c_.cudnn, desc_, &one, tensor_.get(), y,
                                                  tensor_.get(), dy, tensor_.get(), y, &zero,
                                                  tensor_.get(), dx));
    return Status::Ok();
  }

 private:
  const LayerOp op_;
  const GpuContext& c_;
  cudnnActivationDescriptor_t desc_ = nullptr;
  TensorDesc tensor_;  // [rows, size, 1, 1]
};

}  // namespace

Result<std::unique_ptr<GpuLayer>> MakeGpuActivationLayer(const LayerOp& op,
                                                         const GpuContext& context) {
  auto layer = std::make_unique<ActivationLayer>(op, context);
  PARASYNC_RETURN_IF_ERROR(layer->Init());
  return std::unique_ptr<GpuLayer>(std::move(layer));
}

}  // namespace parasync::cuda
