// Max and average pooling on the GPU: cuDNN's pooling forward and backward (average
// excluding padding, as the CPU backend and TensorFlow's `same`). cuDNN pads evenly, so an
// uneven `same` padding is NotSupported here.
#include "worker/compute/cuda/gpu_layer.h"

namespace parasync::cuda {

namespace {

class PoolLayer final : public GpuLayer {
 public:
  PoolLayer(const LayerOp& op, const GpuContext& context) : op_(op), c_(context) {}
  ~PoolLayer() override {
    if (desc_ != nullptr) cudnnDestroyPoolingDescriptor(desc_);
  }

  Status Init() {
    const cudnnPoolingMode_t mode = op_.spec.kind == LayerKind::kMaxPool2d
                                        ? CUDNN_POOLING_MAX
                                        : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
    const int k = op_.spec.kernel, s = op_.spec.stride, pad = op_.pad_begin;
    PARASYNC_CUDNN_RETURN(cudnnCreatePoolingDescriptor(&desc_));
    PARASYNC_CUDNN_RETURN(
        cudnnSetPooling2dDescriptor(desc_, mode, CUDNN_NOT_PROPAGATE_NAN, k, k, pad, pad, s, s));
    return Status::Ok();
  }

  // cuDNN's pooling backward reads the output (a max pool finds its maxima by it).
  compute::OpMemory buffer_use() const override { return {compute::Aliasing::kNone, true}; }

  Status Reserve(int rows) override {
    PARASYNC_RETURN_IF_ERROR(DescribeBatch(&x_, rows, op_.in));
    return DescribeBatch(&y_, rows, op_.out);
  }

  Status Forward(const float* const* /*params*/, const float* x, float* y,
                 const GpuPass& /*pass*/) override {
    const float one = 1.0f, zero = 0.0f;
    PARASYNC_CUDNN_RETURN(cudnnPoolingForward(c_.cudnn, desc_, &one, x_.get(), x, &zero, y_.get(), y));
    return Status::Ok();
  }

  Status Backward(const float* const* /*params*/, const float* x, const float* y,
                  const float* dy, float* dx, float* const* /*grads*/,
                  const GpuPass& /*pass*/) override {
    if (dx == nullptr) return Status::Ok();
    const float one = 1.0f, zero = 0.0f;
    PARASYNC_CUDNN_RETURN(cudnnPoolingBackward(c_.cudnn, desc_, &one, y_.get(), y, y_.get(), dy,
                                               x_.get(), x, &zero, x_.get(), dx));
    return Status::Ok();
  }

 private:
  const LayerOp op_;
  const GpuContext& c_;
  cudnnPoolingDescriptor_t desc_ = nullptr;
  TensorDesc x_;
  TensorDesc y_;
};

}  // namespace

Result<std::unique_ptr<GpuLayer>> MakeGpuPoolLayer(const LayerOp& op, const GpuContext& context) {
  if (op.pad_begin != op.pad_end) {
    return Status::NotSupported("the CUDA backend cannot run layer '" + op.spec.name +
                                "': its `same` padding is uneven and cuDNN pads evenly");
  }
  auto layer = std::make_unique<PoolLayer>(op, context);
  PARASYNC_RETURN_IF_ERROR(layer->Init());
  return std::unique_ptr<GpuLayer>(std::move(layer));
}

}  // namespace parasync::cuda
