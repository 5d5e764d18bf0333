// Conv2d on the GPU: NCHW activations and OIHW filters (the CPU backend's layouts), FP32
// math only (no TF32), so results match the CPU backend's within rounding.
//   - forward and backward data: cuDNN, the heuristic's first choice for each row count
//     among the direct and GEMM-based algorithms (FFT and Winograd transforms round
//     differently: on an H100 they put lenet5's first kernel gradient 4.9e-4 from the
//     CPU's), backward data also deterministic;
//   - the filter gradient: measured. On the first backward pass of each row count both ways
//     run twice on the real batch and the faster one (second runs, CUDA events) is kept:
//       patches: each example's input patches (im2col), one strided-batched cuBLAS product
//         per chunk of examples giving each example's [filters, taps] gradient, and their
//         sum over the batch (gemv against ones): deterministic;
//       cudnn: cuDNN's heuristic first choice among its exact algorithms, deterministic or
//         not (ALGO_0 and ALGO_3 add with atomics), as PyTorch and TensorFlow do by default.
//     PARASYNC_CUDA_DETERMINISTIC=1 computes by patches always (the same gradients bit for
//     bit, run after run); PARASYNC_CUDA_CONV_WGRAD=patches|cudnn|cudnn-deterministic
//     forces one way (benchmarks). On an H100 (docs/performance.md, GPU) the cnn's filter
//     gradient at batch 1024 took 0.94 ms with ALGO_1, the only exact deterministic cuDNN
//     algorithm and this backend's choice until then, against 0.18 ms with PyTorch's ALGO_0;
//     patches won on the cnn, cuDNN's ALGO_0 on lenet5;
//   - the bias gradient: the sum of dy over positions then over examples (two gemv), where
//     cuDNN's cudnnConvolutionBackwardBias took 0.89 ms against PyTorch's 0.05 ms.
//
// cuDNN pads symmetrically: a `same` padding with an extra row after (an even window, or an
// odd remainder at stride > 1) is NotSupported here, and --device auto then trains on the CPU.
#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <map>

#include "worker/compute/cuda/gpu_layer.h"
#include "worker/compute/cuda/kernels.h"

namespace parasync::cuda {

namespace {

// Workspace the algorithm choice may ask for.
constexpr size_t kMaxWorkspace = size_t{256} << 20;
// At most this much of input patches at once: the filter gradient runs in chunks of examples
// (PARASYNC_CUDA_PATCH_BYTES sets another bound, for tests of the chunking).
constexpr size_t kMaxPatchBytes = size_t{256} << 20;

size_t PatchBytesFromEnvironment() {
  const char* v = std::getenv("PARASYNC_CUDA_PATCH_BYTES");
  if (v == nullptr || *v == '\0') return kMaxPatchBytes;
  const unsigned long long bytes = std::strtoull(v, nullptr, 10);
  return bytes == 0 ? kMaxPatchBytes : static_cast<size_t>(bytes);
}

// How the filter gradient is computed (the header comment). kMeasured: the faster of
// kPatches and kCudnn, chosen on the first backward pass of each row count.
enum class FilterGradient { kMeasured, kPatches, kCudnn };

struct FilterGradientChoice {
  FilterGradient way = FilterGradient::kMeasured;
  bool deterministic = false;  // cuDNN's deterministic algorithms only
};

Result<FilterGradientChoice> FilterGradientFromEnvironment() {
  FilterGradientChoice choice;
  const char* d = std::getenv("PARASYNC_CUDA_DETERMINISTIC");
  choice.deterministic = d != nullptr && std::strcmp(d, "1") == 0;
  const char* v = std::getenv("PARASYNC_CUDA_CONV_WGRAD");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "auto") == 0) {
    // A measured choice could differ from run to run, and with it the rounding.
    if (choice.deterministic) choice.way = FilterGradient::kPatches;
    return choice;
  }
  if (std::strcmp(v, "patches") == 0) {
    choice.way = FilterGradient::kPatches;
  } else if (std::strcmp(v, "cudnn") == 0) {
    choice.way = FilterGradient::kCudnn;
  } else if (std::strcmp(v, "cudnn-deterministic") == 0) {
    choice.way = FilterGradient::kCudnn;
    choice.deterministic = true;
  } else {
    return Status::InvalidArgument(std::string("PARASYNC_CUDA_CONV_WGRAD=") + v +
                                   ": expected auto, patches, cudnn or cudnn-deterministic");
  }
  return choice;
}

// Two timing events on a stream, destroyed with their owner.
class EventPair {
 public:
  EventPair() = default;
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
  ~EventPair() {
    for (cudaEvent_t e : events_) {
      if (e != nullptr) cudaEventDestroy(e);
    }
  }
  Status Create() {
    for (cudaEvent_t& e : events_) PARASYNC_CUDA_RETURN(cudaEventCreate(&e));
    return Status::Ok();
  }
  cudaEvent_t start() const { return events_[0]; }
  cudaEvent_t stop() const { return events_[1]; }

 private:
  std::array<cudaEvent_t, 2> events_{};
};

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
    PARASYNC_ASSIGN_OR_RETURN(choice_, FilterGradientFromEnvironment());
    patch_bytes_ = PatchBytesFromEnvironment();
    const int k = op_.spec.kernel, s = op_.spec.stride, pad = op_.pad_begin;
    patches_.channels = static_cast<int>(op_.in[0]);
    patches_.height = static_cast<int>(op_.in[1]);
    patches_.width = static_cast<int>(op_.in[2]);
    patches_.kernel = k;
    patches_.stride = s;
    patches_.pad = pad;
    patches_.out_height = static_cast<int>(op_.out[1]);
    patches_.out_width = static_cast<int>(op_.out[2]);
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
    filter_gradient_ = choice_.way;
    if (choice_.way == FilterGradient::kMeasured) {
      // Measured before for this row count (an epoch's last, smaller batch comes back).
      if (auto it = measured_.find(rows); it != measured_.end()) filter_gradient_ = it->second;
    }
    if (choice_.way != FilterGradient::kPatches) {
      std::array<cudnnConvolutionBwdFilterAlgoPerf_t, kChoices> perf{};
      PARASYNC_CUDNN_RETURN(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
          c_.cudnn, x_.get(), y_.get(), conv_, filter_, kChoices, &found, perf.data()));
      const auto* pick = Pick(perf.data(), perf.data() + found, choice_.deterministic);
      if (pick != perf.data() + found) {
        backward_filter_ = pick->algo;
        need = std::max(need, pick->memory);
      } else if (choice_.way == FilterGradient::kCudnn) {
        return NoAlgorithm("backward filter");
      } else {
        filter_gradient_ = FilterGradient::kPatches;  // measured: patches is what is left
      }
    }
    // The gradients' scratch: patches for a chunk of examples, each example's filter
    // gradient and per-filter bias sums (the backend's ones cover rows and positions).
    const size_t r = static_cast<size_t>(rows);
    const size_t patch_floats = Taps() * Positions();
    chunk_rows_ = static_cast<int>(
        std::clamp<size_t>(patch_bytes_ / (patch_floats * sizeof(float)), 1, r));
    if (choice_.way != FilterGradient::kCudnn) {
      PARASYNC_CUDA_RETURN(
          patch_buffer_.Grow(static_cast<size_t>(chunk_rows_) * patch_floats * sizeof(float)));
      PARASYNC_CUDA_RETURN(filter_sums_.Grow(r * Filters() * Taps() * sizeof(float)));
    }
    PARASYNC_CUDA_RETURN(bias_sums_.Grow(r * Filters() * sizeof(float)));
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
                  const GpuPass& pass) override {
    const float one = 1.0f, zero = 0.0f;
    const int rows = pass.rows;
    const int filters = static_cast<int>(Filters());
    const int positions = static_cast<int>(Positions());
    // db [filters]: dy, column-major [positions, rows * filters], summed over positions,
    // then the [filters, rows] sums over examples.
    PARASYNC_CUBLAS_RETURN(cublasSgemv(c_.cublas, CUBLAS_OP_T, positions, rows * filters, &one,
                                       dy, positions, c_.ones, 1, &zero, bias_sums_.as<float>(), 1));
    PARASYNC_CUBLAS_RETURN(cublasSgemv(c_.cublas, CUBLAS_OP_N, filters, rows, &one,
                                       bias_sums_.as<float>(), filters, c_.ones, 1, &zero,
                                       grads[1], 1));
    if (filter_gradient_ == FilterGradient::kMeasured) {
      PARASYNC_RETURN_IF_ERROR(ChooseFilterGradient(x, dy, grads[0], rows));
    }
    PARASYNC_RETURN_IF_ERROR(FilterGradientBy(filter_gradient_, x, dy, grads[0], rows));
    if (dx != nullptr) {
      PARASYNC_CUDNN_RETURN(cudnnConvolutionBackwardData(
          c_.cudnn, &one, filter_, params[0], y_.get(), dy, conv_, backward_data_, workspace_,
          workspace_bytes_, &zero, x_.get(), dx));
    }
    return Status::Ok();
  }

 private:
  // dW into `dw` the given way (kPatches or kCudnn), queued on the stream.
  Status FilterGradientBy(FilterGradient way, const float* x, const float* dy, float* dw,
                          int rows) {
    const float one = 1.0f, zero = 0.0f;
    if (way == FilterGradient::kCudnn) {
      PARASYNC_CUDNN_RETURN(cudnnConvolutionBackwardFilter(
          c_.cudnn, &one, x_.get(), x, y_.get(), dy, conv_, backward_filter_, workspace_,
          workspace_bytes_, &zero, filter_, dw));
      return Status::Ok();
    }
    const int filters = static_cast<int>(Filters()), taps = static_cast<int>(Taps());
    const int positions = static_cast<int>(Positions());
    // Per example n: dW_n [filters, taps] = dy_n [filters, positions] * col_n^T, that is
    // column-major [taps, filters] = col_n^T (col_n column-major [positions, taps]) * dy_n.
    const size_t x_stride = static_cast<size_t>(op_.in[0] * op_.in[1] * op_.in[2]);
    const size_t dy_stride = Filters() * Positions();
    for (int start = 0; start < rows; start += chunk_rows_) {
      const int n = std::min(chunk_rows_, rows - start);
      PARASYNC_CUDA_RETURN(LaunchIm2col(x + static_cast<size_t>(start) * x_stride, n, patches_,
                                        patch_buffer_.as<float>(), c_.stream));
      PARASYNC_CUBLAS_RETURN(cublasSgemmStridedBatched(
          c_.cublas, CUBLAS_OP_T, CUBLAS_OP_N, taps, filters, positions, &one,
          patch_buffer_.as<float>(), positions, static_cast<long long>(Taps() * Positions()),
          dy + static_cast<size_t>(start) * dy_stride, positions,
          static_cast<long long>(dy_stride), &zero,
          filter_sums_.as<float>() + static_cast<size_t>(start) * Filters() * Taps(), taps,
          static_cast<long long>(Filters() * Taps()), n));
    }
    // dW = the sum over examples: [filters * taps, rows] times ones.
    PARASYNC_CUBLAS_RETURN(cublasSgemv(c_.cublas, CUBLAS_OP_N, filters * taps, rows, &one,
                                       filter_sums_.as<float>(), filters * taps, c_.ones, 1,
                                       &zero, dw, 1));
    return Status::Ok();
  }

  // Runs both ways twice on this batch and keeps the faster second run (both leave the same
  // gradient in dw, up to rounding). Waits for the stream: once per row count.
  Status ChooseFilterGradient(const float* x, const float* dy, float* dw, int rows) {
    std::array<float, 2> ms{};
    const std::array<FilterGradient, 2> ways{FilterGradient::kPatches, FilterGradient::kCudnn};
    for (size_t w = 0; w < ways.size(); ++w) {
      EventPair events;
      PARASYNC_RETURN_IF_ERROR(events.Create());
      PARASYNC_RETURN_IF_ERROR(FilterGradientBy(ways[w], x, dy, dw, rows));  // warm-up
      PARASYNC_CUDA_RETURN(cudaEventRecord(events.start(), c_.stream));
      PARASYNC_RETURN_IF_ERROR(FilterGradientBy(ways[w], x, dy, dw, rows));
      PARASYNC_CUDA_RETURN(cudaEventRecord(events.stop(), c_.stream));
      PARASYNC_CUDA_RETURN(cudaEventSynchronize(events.stop()));
      PARASYNC_CUDA_RETURN(cudaEventElapsedTime(&ms[w], events.start(), events.stop()));
    }
    filter_gradient_ = ms[1] < ms[0] ? FilterGradient::kCudnn : FilterGradient::kPatches;
    measured_[rows] = filter_gradient_;
    return Status::Ok();
  }

  Status NoAlgorithm(const char* pass) const {
    return Status::NotSupported("layer '" + op_.spec.name + "': cuDNN offers no " + pass +
                                " algorithm for it within " +
                                std::to_string(kMaxWorkspace >> 20) + " MiB of workspace");
  }

  size_t Filters() const { return static_cast<size_t>(op_.out[0]); }
  size_t Taps() const {
    return static_cast<size_t>(op_.in[0]) * static_cast<size_t>(op_.spec.kernel) *
           static_cast<size_t>(op_.spec.kernel);
  }
  size_t Positions() const { return static_cast<size_t>(op_.out[1] * op_.out[2]); }

  const LayerOp op_;
  const GpuContext& c_;
  FilterGradientChoice choice_;
  FilterGradient filter_gradient_ = FilterGradient::kMeasured;  // for the reserved row count
  std::map<int, FilterGradient> measured_;                      // by row count
  PatchGeometry patches_;
  size_t patch_bytes_ = kMaxPatchBytes;
  int chunk_rows_ = 1;
  DeviceBuffer patch_buffer_;  // [chunk_rows_, taps, positions]
  DeviceBuffer filter_sums_;   // [rows, filters, taps]
  DeviceBuffer bias_sums_;     // [rows, filters]
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
