// Dropout on the GPU: a kernel (cuDNN's dropout draws its own masks; this one draws
// compute::DropoutKeeps's, the CPU backend's, so both backends train alike and are tested
// against each other). In place; the backward pass applies the same mask to the gradient.
#include "worker/compute/cuda/gpu_layer.h"
#include "worker/compute/cuda/kernels.h"

namespace parasync::cuda {

namespace {

class DropoutLayer final : public GpuLayer {
 public:
  DropoutLayer(const LayerOp& op, uint32_t op_index, const GpuContext& context)
      : size_(op.out_size()), rate_(op.spec.rate), op_index_(op_index), c_(context) {}

  compute::OpMemory buffer_use() const override { return {compute::Aliasing::kInPlace, false}; }

  Status Forward(const float* const* /*params*/, const float* x, float* y,
                 const GpuPass& pass) override {
    return Apply(x, y, pass);
  }

  Status Backward(const float* const* /*params*/, const float* /*x*/, const float* /*y*/,
                  const float* dy, float* dx, float* const* /*grads*/,
                  const GpuPass& pass) override {
    return dx == nullptr ? Status::Ok() : Apply(dy, dx, pass);
  }

 private:
  Status Apply(const float* in, float* out, const GpuPass& pass) {
    const size_t n = static_cast<size_t>(pass.rows) * static_cast<size_t>(size_);
    if (!pass.training || rate_ == 0.0f) {
      if (in != out) {
        PARASYNC_CUDA_RETURN(cudaMemcpyAsync(out, in, n * sizeof(float), cudaMemcpyDeviceToDevice,
                                             c_.stream));
      }
      return Status::Ok();
    }
    PARASYNC_CUDA_RETURN(LaunchDropout(in, out, n, pass.seed, op_index_, rate_, c_.stream));
    return Status::Ok();
  }

  const int64_t size_;
  const float rate_;
  const uint32_t op_index_;
  const GpuContext& c_;
};

}  // namespace

std::unique_ptr<GpuLayer> MakeGpuDropoutLayer(const LayerOp& op, uint32_t op_index,
                                              const GpuContext& context) {
  return std::make_unique<DropoutLayer>(op, op_index, context);
}

}  // namespace parasync::cuda
