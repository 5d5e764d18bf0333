// Embedding on the CPU, hand-written: oneDNN 2.6 has no embedding-bag primitive, and the
// work is a gather (forward) and a scatter-add (backward) of rows, which are memory copies.
// Each example's input is K ids (floats holding integers) then D dense features; the ids
// form `fields` bags of K/fields ids, and the output is each bag's sum or mean of rows, one
// field after another, then the dense features as they are. The table is a whole buffer of
// op.table_rows rows here (a sparse table's compact rows): its gradient is zero except in
// the rows the batch touched, and ids repeated in a batch add up in their row.
#include <algorithm>

#include "worker/compute/checks.h"
#include "worker/compute/cpu/cpu_layer.h"

namespace parasync::cpu {

namespace {

class EmbeddingLayer final : public CpuLayer {
 public:
  explicit EmbeddingLayer(const LayerOp& op)
      : op_(op),
        in_width_(op.in_size()),
        out_width_(op.out_size()),
        ids_(op.id_columns),
        fields_(op.spec.fields),
        bag_(op.id_columns / op.spec.fields),
        dim_(op.spec.units),
        dense_(op.in_size() - op.id_columns) {}

  Status Forward(const float* const* params, const float* x, float* y,
                 const Pass& pass) override {
    PARASYNC_RETURN_IF_ERROR(compute::CheckIds(op_, x, pass.rows, pass.first_example));
    const float* table = params[0];
    const float scale = Scale();
    for (int i = 0; i < pass.rows; ++i) {
      const float* in = x + static_cast<size_t>(i) * in_width_;
      float* out = y + static_cast<size_t>(i) * out_width_;
      for (int64_t f = 0; f < fields_; ++f) {
        float* field = out + f * dim_;
        std::fill(field, field + dim_, 0.0f);
        for (int64_t k = 0; k < bag_; ++k) {
          const float* row = table + static_cast<int64_t>(in[f * bag_ + k]) * dim_;
          for (int64_t d = 0; d < dim_; ++d) field[d] += row[d];
        }
        if (scale != 1.0f) {
          for (int64_t d = 0; d < dim_; ++d) field[d] *= scale;
        }
      }
      std::copy_n(in + ids_, dense_, out + fields_ * dim_);
    }
    return Status::Ok();
  }

  Status Backward(const float* const* /*params*/, const float* x, const float* /*y*/,
                  const float* dy, float* /*dx*/, float* const* grads, const Pass& pass) override {
    // Ids and the dense features passed through need no gradient: dx stays untouched (the
    // embedding is always the first layer).
    float* dtable = grads[0];
    std::fill(dtable, dtable + op_.table_rows * dim_, 0.0f);
    const float scale = Scale();
    for (int i = 0; i < pass.rows; ++i) {
      const float* in = x + static_cast<size_t>(i) * in_width_;
      const float* d_out = dy + static_cast<size_t>(i) * out_width_;
      for (int64_t k = 0; k < ids_; ++k) {
        const float* d = d_out + (k / bag_) * dim_;
        float* row = dtable + static_cast<int64_t>(in[k]) * dim_;
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
  const int64_t in_width_;
  const int64_t out_width_;
  const int64_t ids_;     // K id columns
  const int64_t fields_;  // bags, K / bag_ of them
  const int64_t bag_;
  const int64_t dim_;
  const int64_t dense_;   // D features passed through
};

}  // namespace

std::unique_ptr<CpuLayer> MakeEmbeddingLayer(const LayerOp& op) {
  return std::make_unique<EmbeddingLayer>(op);
}

}  // namespace parasync::cpu
