// Dense layer on the GPU: cuBLAS sgemm for the products (cuBLAS is column-major, and a
// row-major [r, c] matrix is a column-major [c, r] one, so each call is written for the
// transposes; comments give the row-major meaning), the bias added by a kernel and its
// gradient summed by sgemv against a vector of ones.
#include "worker/compute/cuda/gpu_layer.h"
#include "worker/compute/cuda/kernels.h"

namespace parasync::cuda {

namespace {

class DenseLayer final : public GpuLayer {
 public:
  DenseLayer(const LayerOp& op, const GpuContext& context)
      : in_(static_cast<int>(op.in_size())), out_(static_cast<int>(op.out_size())), c_(context) {}

  Status Forward(const float* const* params, const float* x, float* y,
                 const GpuPass& pass) override {
    const float one = 1.0f, zero = 0.0f;
    // y [rows, out] = x [rows, in] * W [in, out], then + b.
    PARASYNC_CUBLAS_RETURN(cublasSgemm(c_.cublas, CUBLAS_OP_N, CUBLAS_OP_N, out_, pass.rows, in_,
                                       &one, params[0], out_, x, in_, &zero, y, out_));
    PARASYNC_CUDA_RETURN(LaunchBiasAdd(y, params[1], pass.rows, out_, c_.stream));
    return Status::Ok();
  }

  Status Backward(const float* const* params, const float* x, const float* /*y*/,
                  const float* dy, float* dx, float* const* grads, const GpuPass& pass) override {
    const float one = 1.0f, zero = 0.0f;
    // dW [in, out] = x^T [in, rows] * dy [rows, out].
    PARASYNC_CUBLAS_RETURN(cublasSgemm(c_.cublas, CUBLAS_OP_N, CUBLAS_OP_T, out_, in_, pass.rows,
                                       &one, dy, out_, x, in_, &zero, grads[0], out_));
    // db [out] = column sums of dy: the column-major [out, rows] dy times ones.
    PARASYNC_CUBLAS_RETURN(cublasSgemv(c_.cublas, CUBLAS_OP_N, out_, pass.rows, &one, dy, out_,
                                       c_.ones, 1, &zero, grads[1], 1));
    if (dx != nullptr) {
      // dx [rows, in] = dy [rows, out] * W^T [out, in].
      PARASYNC_CUBLAS_RETURN(cublasSgemm(c_.cublas, CUBLAS_OP_T, CUBLAS_OP_N, in_, pass.rows, out_,
                                         &one, params[0], out_, dy, out_, &zero, dx, in_));
    }
    return Status::Ok();
  }

 private:
  const int in_;
  const int out_;
  const GpuContext& c_;
};

}  // namespace

std::unique_ptr<GpuLayer> MakeGpuDenseLayer(const LayerOp& op, const GpuContext& context) {
  return std::make_unique<DenseLayer>(op, context);
}

}  // namespace parasync::cuda
