// Embedding on the GPU: a gather kernel forward and an atomic scatter-add backward (cuDNN
// and cuBLAS have no embedding bag); the dense features after the ids are copied through
// with one strided cudaMemcpy2DAsync. The ids were checked on the host before upload. The
// table buffer has op.table_rows rows (a sparse table's compact rows).
#include "worker/compute/cuda/gpu_layer.h"
#include "worker/compute/cuda/kernels.h"

namespace parasync::cuda {

namespace {

class EmbeddingLayer final : public GpuLayer {
 public:
  EmbeddingLayer(const LayerOp& op, const GpuContext& context)
      : ids_(static_cast<int>(op.id_columns)),
        dense_(static_cast<size_t>(op.in_size() - op.id_columns)),
        table_rows_(op.table_rows),
        c_(context) {
    g_.in_width = static_cast<int>(op.in_size());
    g_.fields = static_cast<int>(op.spec.fields);
    g_.bag = static_cast<int>(op.id_columns / op.spec.fields);
    g_.dim = static_cast<int>(op.spec.units);
    g_.out_width = static_cast<int>(op.out_size());
    g_.scale = op.spec.combiner == Combiner::kMean ? 1.0f / static_cast<float>(g_.bag) : 1.0f;
  }

  Status Forward(const float* const* params, const float* x, float* y,
                 const GpuPass& pass) override {
    EmbeddingGeometry g = g_;
    g.rows = pass.rows;
    PARASYNC_CUDA_RETURN(LaunchEmbeddingForward(x, params[0], y, g, c_.stream));
    if (dense_ > 0) {
      const size_t in_pitch = static_cast<size_t>(g_.in_width) * sizeof(float);
      const size_t out_pitch = static_cast<size_t>(g_.out_width) * sizeof(float);
      PARASYNC_CUDA_RETURN(cudaMemcpy2DAsync(
          y + static_cast<size_t>(g_.fields) * g_.dim, out_pitch, x + ids_, in_pitch,
          dense_ * sizeof(float), static_cast<size_t>(pass.rows), cudaMemcpyDeviceToDevice,
          c_.stream));
    }
    return Status::Ok();
  }

  Status Backward(const float* const* /*params*/, const float* x, const float* /*y*/,
                  const float* dy, float* /*dx*/, float* const* grads,
                  const GpuPass& pass) override {
    PARASYNC_CUDA_RETURN(cudaMemsetAsync(
        grads[0], 0, static_cast<size_t>(table_rows_) * g_.dim * sizeof(float), c_.stream));
    EmbeddingGeometry g = g_;
    g.rows = pass.rows;
    PARASYNC_CUDA_RETURN(LaunchEmbeddingBackward(x, dy, grads[0], g, c_.stream));
    return Status::Ok();
  }

 private:
  const int ids_;       // K id columns
  const size_t dense_;  // D features passed through
  const int64_t table_rows_;
  EmbeddingGeometry g_;  // rows set per pass
  const GpuContext& c_;
};

}  // namespace

std::unique_ptr<GpuLayer> MakeGpuEmbeddingLayer(const LayerOp& op, const GpuContext& context) {
  return std::make_unique<EmbeddingLayer>(op, context);
}

}  // namespace parasync::cuda
