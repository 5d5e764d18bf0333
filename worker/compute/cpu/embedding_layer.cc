// Embedding on the CPU, hand-written: oneDNN 2.6 has no embedding-bag primitive, and the
// work is a gather (forward) and a scatter-add (backward) of rows, which are memory copies.
// Each example's input is a bag of ids (floats holding integers); its output the sum or
// mean of their rows. The table is a whole, dense variable here: its gradient is zero
// except in the rows the batch touched.
#include <algorithm>

#include "worker/compute/checks.h"
#include "worker/compute/cpu/cpu_layer.h"

namespace parasync::cpu {

namespace {

class EmbeddingLayer final : public CpuLayer {
 public:
  explicit EmbeddingLayer(const LayerOp& op)
      : op_(op), bag_(op.in_size()), dim_(op.spec.units), vocab_(op.spec.vocab) {}

  Status Forward(const float* const* params, const float* x, float* y,
                 const Pass& pass) override {
    PARASYNC_RETURN_IF_ERROR(compute::CheckIds(op_, x, pass.rows * bag_, pass.first_example));
    const float* table = params[0];
    const float scale = Scale();
    for (int i = 0; i < pass.rows; ++i) {
      float* out = y + static_cast<size_t>(i) * dim_;
      std::fill(out, out + dim_, 0.0f);
      for (int64_t k = 0; k < bag_; ++k) {
        const float* row = table + static_cast<int64_t>(x[i * bag_ + k]) * dim_;
        for (int64_t d = 0; d < dim_; ++d) out[d] += row[d];
      }
      if (scale != 1.0f) {
        for (int64_t d = 0; d < dim_; ++d) out[d] *= scale;
      }
    }
    return Status::Ok();
  }

  Status Backward(const float* const* /*params*/, const float* x, const float* /*y*/,
                  const float* dy, float* /*dx*/, float* const* grads, const Pass& pass) override {
    // Ids have no gradient; dx stays untouched (the embedding is always the first layer).
    float* dtable = grads[0];
    std::fill(dtable, dtable + vocab_ * dim_, 0.0f);
    const float scale = Scale();
    for (int i = 0; i < pass.rows; ++i) {
      const float* d = dy + static_cast<size_t>(i) * dim_;
      for (int64_t k = 0; k < bag_; ++k) {
        float* row = dtable + static_cast<int64_t>(x[i * bag_ + k]) * dim_;
        for (int64_t j = 0; j < dim_; ++j) row[j] += scale * d[j];
      }
    }
    return Status::Ok();
  }

 private:
  float Scale() const {
    return op_.spec.combiner == Combiner::kMean ? 1.0f / static_cast<float>(bag_) : 1.0f;
  }

  const LayerOp op_;
  const int64_t bag_;
  const int64_t dim_;
  const int64_t vocab_;
};

}  // namespace

std::unique_ptr<CpuLayer> MakeEmbeddingLayer(const LayerOp& op) {
  return std::make_unique<EmbeddingLayer>(op);
}

}  // namespace parasync::cpu
