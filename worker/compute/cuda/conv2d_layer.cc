// Conv2d on the GPU: cuDNN's convolution forward, backward data, backward filter and
// backward bias, NCHW activations and OIHW filters (the CPU backend's layouts). FP32 math
// only (CUDNN_FMA_MATH: no TF32), so results match the CPU backend's within rounding. The
// algorithms are cuDNN's heuristic first choices for each row count among the direct and
// GEMM-based ones (FFT and Winograd transforms round differently: on an H100 they put
// lenet5's first kernel gradient 4.9e-4 from the CPU's), the backward ones also
// deterministic, with one workspace for all three.
//
// cuDNN pads symmetrically: a `same` padding with an extra row after (an even window, or an
// odd remainder at stride > 1) is NotSupported here, and --device auto then trains on the CPU.
#include <algorithm>
#include <array>

#include "worker/compute/cuda/gpu_layer.h"

namespace parasync::cuda {

namespace {

// Workspace the algorithm choice may ask for.
constexpr size_t kMaxWorkspace = size_t{256} << 20;

// The algorithms that compute the convolution's sums as written (no FFT or Winograd).
bool Exact(cudnnConvolutionFwdAlgo_t a) {
  return a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_GEMM || a == CUDNN_CONVOLUTION_FWD_ALGO_DIRECT;
}
bool Exact(cudnnConvolutionBwdDataAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
}
bool Exact(cudnnConvolutionBwdFilterAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 ||
         a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3;
}

// The first usable choice: it ran in the heuristic's estimate, fits the workspace, computes
// exactly and, for the backward passes, is deterministic.
template <typename Perf>
const Perf* Pick(const Perf* begin, const Perf* end, bool deterministic) {
  return std::find_if(begin, end, [&](const Perf& p) {
    return p.status == CUDNN_STATUS_SUCCESS && p.memory <= kMaxWorkspace && Exact(p.algo) &&
           (!deterministic || p.determinism == CUDNN_DETERMINISTIC);
  });
}

class Conv2dLayer final : public GpuLayer {
 public:
  Conv2dLayer(const LayerOp& op, const GpuContext& context) : op_(op), c_(context) {}
  ~Conv2dLayer() override {
    if (filter_ != nullptr) cudnnDestroyFilterDescriptor(filter_);
    if (conv_ != nullptr) cudnnDestroyConvolutionDescriptor(conv_);
    if (workspace_ != nullptr) cudaFree(workspace_);
  }

  Status Init() {
    const int k = op_.spec.kernel, s = op_.spec.stride, pad = op_.pad_begin;
    PARASYNC_CUDNN_RETURN(cudnnCreateFilterDescriptor(&filter_));
    PARASYNC_CUDNN_RETURN(cudnnSetFilter4dDescriptor(filter_, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
                                                     static_cast<int>(op_.out[0]),
                                                     static_cast<int>(op_.in[0]), k, k));
    PARASYNC_CUDNN_RETURN(cudnnCreateConvolutionDescriptor(&conv_));
    PARASYNC_CUDNN_RETURN(cudnnSetConvolution2dDescriptor(conv_, pad, pad, s, s, 1, 1,
                                                          CUDNN_CROSS_CORRELATION,
                                                          CUDNN_DATA_FLOAT));
    PARASYNC_CUDNN_RETURN(cudnnSetConvolutionMathType(conv_, CUDNN_FMA_MATH));
    PARASYNC_RETURN_IF_ERROR(bias_.Set(1, static_cast<int>(op_.out[0]), 1, 1));
    return Status::Ok();
  }

  Status Reserve(int rows) override {
    PARASYNC_RETURN_IF_ERROR(DescribeBatch(&x_, rows, op_.in));
    PARASYNC_RETURN_IF_ERROR(DescribeBatch(&y_, rows, op_.out));
    // The output shape cuDNN computes must be the model's.
    std::array<int, 4> dims{};
    PARASYNC_CUDNN_RETURN(cudnnGetConvolution2dForwardOutputDim(conv_, x_.get(), filter_, &dims[0],
                                                                &dims[1], &dims[2], &dims[3]));
    if (dims[1] != op_.out[0] || dims[2] != op_.out[1] || dims[3] != op_.out[2]) {
      return Status::Internal("layer '" + op_.spec.name + "': cuDNN's output shape differs from " +
                              ShapeString(op_.out));
    }
    constexpr int kChoices = 8;
    int found = 0;
    size_t need = 0;
    {
      std::array<cudnnConvolutionFwdAlgoPerf_t, kChoices> perf{};
      PARASYNC_CUDNN_RETURN(cudnnGetConvolutionForwardAlgorithm_v7(
          c_.cudnn, x_.get(), filter_, conv_, y_.get(), kChoices, &found, perf.data()));
      const auto* pick = Pick(perf.data(), perf.data() + found, /*deterministic=*/false);
      if (pick == perf.data() + found) return NoAlgorithm("forward");
      forward_ = pick->algo;
      need = std::max(need, pick->memory);
    }
    {
      std::array<cudnnConvolutionBwdDataAlgoPerf_t, kChoices> perf{};
      PARASYNC_CUDNN_RETURN(cudnnGetConvolutionBackwardDataAlgorithm_v7(
          c_.cudnn, filter_, y_.get(), conv_, x_.get(), kChoices, &found, perf.data()));
      const auto* pick = Pick(perf.data(), perf.data() + found, /*deterministic=*/true);
      if (pick == perf.data() + found) return NoAlgorithm("backward data");
      backward_data_ = pick->algo;
      need = std::max(need, pick->memory);
    }
    {
      std::array<cudnnConvolutionBwdFilterAlgoPerf_t, kChoices> perf{};
      PARASYNC_CUDNN_RETURN(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
          c_.cudnn, x_.get(), y_.get(), conv_, filter_, kChoices, &found, perf.data()));
      const auto* pick = Pick(perf.data(), perf.data() + found, /*deterministic=*/true);
      if (pick == perf.data() + found) return NoAlgorithm("backward filter");
      backward_filter_ = pick->algo;
      need = std::max(need, pick->memory);
    }
    if (need > workspace_bytes_) {
      if (workspace_ != nullptr) PARASYNC_CUDA_RETURN(cudaFree(workspace_));
      workspace_ = nullptr;
      workspace_bytes_ = 0;
      PARASYNC_CUDA_RETURN(cudaMalloc(&workspace_, need));
      workspace_bytes_ = need;
    }
    return Status::Ok();
  }

  Status Forward(const float* const* params, const float* x, float* y,
                 const GpuPass& /*pass*/) override {
    const float one = 1.0f, zero = 0.0f;
    PARASYNC_CUDNN_RETURN(cudnnConvolutionForward(c_.cudnn, &one, x_.get(), x, filter_, params[0],
                                                  conv_, forward_, workspace_, workspace_bytes_,
                                                  &zero, y_.get(), y));
    PARASYNC_CUDNN_RETURN(cudnnAddTensor(c_.cudnn, &one, bias_.get(), params[1], &one, y_.get(), y));
    return Status::Ok();
  }

  Status Backward(const float* const* params, const float* x, const float* /*y*/,
                  const float* dy, float* dx, float* const* grads,
                  const GpuPass& /*pass*/) override {
    const float one = 1.0f, zero = 0.0f;
    PARASYNC_CUDNN_RETURN(
        cudnnConvolutionBackwardBias(c_.cudnn, &one, y_.get(), dy, &zero, bias_.get(), grads[1]));
    PARASYNC_CUDNN_RETURN(cudnnConvolutionBackwardFilter(
        c_.cudnn, &one, x_.get(), x, y_.get(), dy, conv_, backward_filter_, workspace_,
        workspace_bytes_, &zero, filter_, grads[0]));
    if (dx != nullptr) {
      PARASYNC_CUDNN_RETURN(cudnnConvolutionBackwardData(
          c_.cudnn, &one, filter_, params[0], y_.get(), dy, conv_, backward_data_, workspace_,
          workspace_bytes_, &zero, x_.get(), dx));
    }
    return Status::Ok();
  }

 private:
  Status NoAlgorithm(const char* pass) const {
    return Status::NotSupported("layer '" + op_.spec.name + "': cuDNN offers no " + pass +
                                " algorithm for it within " +
                                std::to_string(kMaxWorkspace >> 20) + " MiB of workspace");
  }

  const LayerOp op_;
  const GpuContext& c_;
  cudnnFilterDescriptor_t filter_ = nullptr;
  cudnnConvolutionDescriptor_t conv_ = nullptr;
  TensorDesc bias_;  // [1, filters, 1, 1]
  TensorDesc x_;
  TensorDesc y_;
  cudnnConvolutionFwdAlgo_t forward_{};
  cudnnConvolutionBwdDataAlgo_t backward_data_{};
  cudnnConvolutionBwdFilterAlgo_t backward_filter_{};
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

}  // namespace

Result<std::unique_ptr<GpuLayer>> MakeGpuConv2dLayer(const LayerOp& op, const GpuContext& context) {
  if (op.pad_begin != op.pad_end) {
    return Status::NotSupported("the CUDA backend cannot run layer '" + op.spec.name +
                                "': its `same` padding is uneven (" + std::to_string(op.pad_begin) +
                                " before, " + std::to_string(op.pad_end) +
                                " after) and cuDNN pads evenly");
  }
  auto layer = std::make_unique<Conv2dLayer>(op, context);
  PARASYNC_RETURN_IF_ERROR(layer->Init());
  return std::unique_ptr<GpuLayer>(std::move(layer));
}

}  // namespace parasync::cuda
