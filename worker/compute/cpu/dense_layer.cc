// Dense layer on the CPU: y = x W + b with OpenBLAS sgemm, x [rows, in] (the input
// flattened), W [in, units]. The bias add and its gradient (a column sum) are plain loops
// the compiler vectorises: they are one pass over y and cost nothing beside the products.
#include <cblas.h>

#include <algorithm>

#include "worker/compute/cpu/cpu_layer.h"

namespace parasync::cpu {

namespace {

class DenseLayer final : public CpuLayer {
 public:
  explicit DenseLayer(const LayerOp& op)
      : in_(static_cast<int>(op.in_size())), out_(static_cast<int>(op.out_size())) {}

  Status Forward(const float* const* params, const float* x, float* y,
                 const Pass& pass) override {
    const float* w = params[0];
    const float* b = params[1];
    for (int i = 0; i < pass.rows; ++i) std::copy(b, b + out_, y + static_cast<size_t>(i) * out_);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, pass.rows, out_, in_, 1.0f, x, in_, w,
                out_, 1.0f, y, out_);
    return Status::Ok();
  }

  Status Backward(const float* const* params, const float* x, const float* /*y*/,
                  const float* dy, float* dx, float* const* grads, const Pass& pass) override {
    const int rows = pass.rows;
    // dW [in, out] = x^T [in, rows] * dy [rows, out].
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, in_, out_, rows, 1.0f, x, in_, dy, out_,
                0.0f, grads[0], out_);
    float* db = grads[1];
    std::fill(db, db + out_, 0.0f);
    for (int i = 0; i < rows; ++i) {
      const float* d = dy + static_cast<size_t>(i) * out_;
      for (int o = 0; o < out_; ++o) db[o] += d[o];
    }
    if (dx != nullptr) {
      // dx [rows, in] = dy [rows, out] * W^T [out, in].
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, in_, out_, 1.0f, dy, out_,
                  params[0], out_, 0.0f, dx, in_);
    }
    return Status::Ok();
  }

 private:
  const int in_;
  const int out_;
};

}  // namespace

std::unique_ptr<CpuLayer> MakeDenseLayer(const LayerOp& op) {
  return std::make_unique<DenseLayer>(op);
}

}  // namespace parasync::cpu
