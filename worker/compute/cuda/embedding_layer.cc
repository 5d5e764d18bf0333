// Embedding on the GPU: a gather kernel forward and an atomic scatter-add backward (cuDNN
// and cuBLAS have no embedding bag). The ids were checked on the host before upload.
#include "worker/compute/cuda/gpu_layer.h"
#include "worker/compute/cuda/kernels.h"

namespace parasync::cuda {

namespace {

class EmbeddingLayer final : public GpuLayer {
 public:
  EmbeddingLayer(const LayerOp& op, const GpuContext& context)
      : bag_(static_cast<int>(op.in_size())),
        dim_(static_cast<int>(op.spec.units)),
        vocab_(op.spec.vocab),
        scale_(op.spec.combiner == Combiner::kMean ? 1.0f / static_cast<float>(bag_) : 1.0f),
        c_(context) {}

  Status Forward(const float* const* params, const float* x, float* y,
                 const GpuPass& pass) override {
    PARASYNC_CUDA_RETURN(
        LaunchEmbeddingForward(x, params[0], y, pass.rows, bag_, dim_, scale_, c_.stream));
    return Status::Ok();
  }

  Status Backward(const float* const* /*params*/, const float* x, const float* /*y*/,
                  const float* dy, float* /*dx*/, float* const* grads,
                  const GpuPass& pass) override {
    PARASYNC_CUDA_RETURN(cudaMemsetAsync(grads[0], 0,
                                         static_cast<size_t>(vocab_) * dim_ * sizeof(float),
                                         c_.stream));
    PARASYNC_CUDA_RETURN(
        LaunchEmbeddingBackward(x, dy, grads[0], pass.rows, bag_, dim_, scale_, c_.stream));
    return Status::Ok();
  }

 private:
  const int bag_;
  const int dim_;
  const int64_t vocab_;
  const float scale_;
  const GpuContext& c_;
};

}  // namespace

std::unique_ptr<GpuLayer> MakeGpuEmbeddingLayer(const LayerOp& op, const GpuContext& context) {
  return std::make_unique<EmbeddingLayer>(op, context);
}

}  // namespace parasync::cuda
