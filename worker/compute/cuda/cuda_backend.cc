// The CUDA backend (cuda_backend.h): runs a Model as a chain of GpuLayers (gpu_layer.h; cuDNN
// for convolution, pooling and activations, cuBLAS for dense layers, kernels.cu for the
// rest), then the loss, on one GPU. The CPU backend (worker/compute/cpu) is the reference it
// is tested against: same layouts, same buffer plan (compute::BufferPlan), same dropout masks.
//
// One step (ForwardBackward) runs on three streams:
//   h2d_:     the batch, then each layer's variables, one event per layer that has some;
//   compute_: layer i's forward pass starts as soon as its variables have arrived, while
//             the later layers' are still on the wire; then the loss and the backward pass,
//             last layer first;
//   d2h_:     each layer's gradients go back to the host as soon as they exist, while the
//             layers below are still being differentiated.
// The copies are asynchronous when the host arrays are page-locked (AllocateHost, which the
// trainer uses for its parameter, gradient and batch buffers); any other memory works too,
// the runtime then copies through its own staging and the overlap is lost.
//
// Every CUDA, cuBLAS and cuDNN call is checked; a failure becomes a Status naming the call.
// Errors during execution (a fault in a kernel) leave a CUDA context unusable, so after one
// the backend refuses further work with the same error.
//
// Not thread-safe: one training thread uses an instance (worker/compute/backend.h).

#include "worker/compute/cuda/cuda_backend.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "worker/compute/buffer_plan.h"
#include "worker/compute/checks.h"
#include "worker/compute/cuda/device_query.h"
#include "worker/compute/cuda/gpu_layer.h"
#include "worker/compute/cuda/kernels.h"

namespace parasync::cuda {

namespace {

// Evaluate runs chunks of at most this many rows and this many bytes of activations.
constexpr int64_t kEvalChunkRows = 8192;
constexpr int64_t kEvalChunkBytes = int64_t{256} << 20;

// What the loss kernels accumulate, on the device and (pinned) on the host.
struct Totals {
  double loss_sum;
  unsigned long long correct;
};

// Records the first failure of `expr` in failed_ and returns it.
#define PARASYNC_GPU_CHECK(expr)                  \
  do {                                            \
    ::parasync::Status parasync_s_ = (expr);      \
    if (!parasync_s_.ok()) return Fail(parasync_s_); \
  } while (0)

Status Call(cudaError_t rc, const char* what) {
  return rc == cudaSuccess ? Status::Ok() : CudaError(rc, what);
}
#define PARASYNC_CUDA_CHECK(expr) PARASYNC_GPU_CHECK(Call((expr), #expr))

class CudaBackend final : public ComputeBackend {
 public:
  CudaBackend(Model model, int device) : model_(std::move(model)), device_(device) {}

  ~CudaBackend() override {
    // Best effort: nothing to report to from a destructor.
    cudaSetDevice(device_);
    for (cudaStream_t s : {compute_, h2d_, d2h_}) {
      if (s != nullptr) cudaStreamSynchronize(s);
    }
    layers_.clear();  // their descriptors and workspaces, before the handles
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    if (cudnn_ != nullptr) cudnnDestroy(cudnn_);
    if (cublas_ != nullptr) cublasDestroy(cublas_);
    for (cudaStream_t s : {compute_, h2d_, d2h_}) {
      if (s != nullptr) cudaStreamDestroy(s);
    }
    if (host_totals_ != nullptr) cudaFreeHost(host_totals_);
  }

  // Everything that does not depend on the batch size.
  Status Init() {
    char description[256] = "";
    if (!DescribeDevice(device_, description, sizeof(description))) {
      return Status::Unavailable("cuda:" + std::to_string(device_) + ": " + description);
    }
    name_ = "cuda:" + std::to_string(device_) + " (" + description + ")";
    PARASYNC_CUDA_RETURN(cudaSetDevice(device_));
    // A GPU this build has no code for would fail only at the first step; say so now, so
    // --device auto falls back to the CPU.
    if (const cudaError_t rc = CheckKernelImage(); rc != cudaSuccess) {
      cudaGetLastError();
      return Status::Unavailable(name_ + ": this build's CUDA kernels do not run on it (" +
                                 cudaGetErrorName(rc) + "); rebuild with "
                                 "-DCMAKE_CUDA_ARCHITECTURES=<its sm number>");
    }
    for (cudaStream_t* s : {&compute_, &h2d_, &d2h_}) {
      PARASYNC_CUDA_RETURN(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
    }
    PARASYNC_CUBLAS_RETURN(cublasCreate(&cublas_));
    PARASYNC_CUBLAS_RETURN(cublasSetStream(cublas_, compute_));
    // Full FP32 products (no TF32), so the results match the CPU backend's.
    PARASYNC_CUBLAS_RETURN(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
    PARASYNC_CUDNN_RETURN(cudnnCreate(&cudnn_));
    PARASYNC_CUDNN_RETURN(cudnnSetStream(cudnn_, compute_));
    context_.stream = compute_;
    context_.cublas = cublas_;
    context_.cudnn = cudnn_;

    const std::vector<LayerOp>& ops = model_.ops();
    std::vector<compute::OpMemory> memory;
    for (size_t i = 0; i < ops.size(); ++i) {
      PARASYNC_ASSIGN_OR_RETURN(auto layer,
                                MakeGpuLayer(ops[i], static_cast<uint32_t>(i), context_));
      memory.push_back(layer->buffer_use());
      layers_.push_back(std::move(layer));
    }
    plan_ = compute::BufferPlan::For(model_, memory);
    // Convolutions sum their bias gradients over output positions with the ones too.
    for (const LayerOp& op : ops) {
      if (op.spec.kind == LayerKind::kConv2d) {
        ones_beyond_rows_ = std::max(ones_beyond_rows_, static_cast<size_t>(op.out[1] * op.out[2]));
      }
    }
    // Per op: its variables arrived, its gradients computed; then the loss computed.
    events_.resize(2 * ops.size() + 1);
    for (cudaEvent_t& e : events_) {
      PARASYNC_CUDA_RETURN(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }

    size_t total = 0;
    for (const VariableSpec& v : model_.variables()) {
      var_offset_.push_back(total);
      var_elements_.push_back(static_cast<size_t>(v.num_elements()));
      total += static_cast<size_t>(v.num_elements());
    }
    PARASYNC_CUDA_RETURN(params_.Allocate(total * sizeof(float)));
    PARASYNC_CUDA_RETURN(grads_.Allocate(total * sizeof(float)));
    PARASYNC_CUDA_RETURN(totals_.Allocate(sizeof(Totals)));
    void* host_totals = nullptr;
    PARASYNC_CUDA_RETURN(cudaMallocHost(&host_totals, sizeof(Totals)));
    host_totals_ = static_cast<Totals*>(host_totals);
    for (int v = 0; v < static_cast<int>(var_offset_.size()); ++v) {
      param_ptrs_.push_back(Param(v));
      grad_ptrs_.push_back(Grad(v));
    }
    return Status::Ok();
  }

  std::string name() const override { return name_; }

  std::shared_ptr<void> AllocateHost(size_t bytes) override {
    void* p = nullptr;
    if (cudaSetDevice(device_) != cudaSuccess ||
        cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocPortable) != cudaSuccess) {
      // Page-locked memory is limited; plain memory still works, only without overlap.
      cudaGetLastError();
      return ComputeBackend::AllocateHost(bytes);
    }
    std::fill_n(static_cast<unsigned char*>(p), bytes, 0);
    return std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); });
  }

  Result<float> ForwardBackward(std::span<const float* const> params, const float* x,
                                const uint8_t* labels, int batch, uint64_t seed,
                                std::span<float* const> grads) override {
    PARASYNC_RETURN_IF_ERROR(failed_);
    PARASYNC_RETURN_IF_ERROR(compute::CheckForwardBackward(model_, params, x, labels, batch, grads));
    PARASYNC_RETURN_IF_ERROR(CheckIds(x, batch, 0));
    PARASYNC_CUDA_CHECK(cudaSetDevice(device_));
    PARASYNC_GPU_CHECK(Reserve(batch));
    const std::vector<LayerOp>& ops = model_.ops();
    const size_t n = ops.size();
    cudaEvent_t* vars_ready = events_.data();
    cudaEvent_t* grads_ready = events_.data() + n;
    cudaEvent_t loss_ready = events_[2 * n];

    // Host to device: the batch, then the variables op by op.
    PARASYNC_CUDA_CHECK(cudaMemcpyAsync(x_.as<float>(), x, InputBytes(batch),
                                        cudaMemcpyHostToDevice, h2d_));
    PARASYNC_CUDA_CHECK(cudaMemcpyAsync(labels_.as<uint8_t>(), labels, static_cast<size_t>(batch),
                                        cudaMemcpyHostToDevice, h2d_));
    for (size_t i = 0; i < n; ++i) {
      for (int v = ops[i].first_variable; v < ops[i].first_variable + ops[i].num_variables; ++v) {
        PARASYNC_CUDA_CHECK(cudaMemcpyAsync(Param(v), params[static_cast<size_t>(v)], Bytes(v),
                                            cudaMemcpyHostToDevice, h2d_));
      }
      PARASYNC_CUDA_CHECK(cudaEventRecord(vars_ready[i], h2d_));
    }

    GpuPass pass;
    pass.rows = batch;
    pass.training = true;
    pass.seed = seed;
    PARASYNC_CUDA_CHECK(cudaMemsetAsync(totals_.as<Totals>(), 0, sizeof(Totals), compute_));
    for (size_t i = 0; i < n; ++i) {
      PARASYNC_CUDA_CHECK(cudaStreamWaitEvent(compute_, vars_ready[i], 0));
      PARASYNC_GPU_CHECK(layers_[i]->Forward(param_ptrs_.data() + ops[i].first_variable, Act(i),
                                             Act(i + 1), pass));
    }
    PARASYNC_GPU_CHECK(Loss(batch, 1.0f / static_cast<float>(batch), DeltaBuffer(n), false));
    PARASYNC_CUDA_CHECK(cudaEventRecord(loss_ready, compute_));
    PARASYNC_CUDA_CHECK(cudaStreamWaitEvent(d2h_, loss_ready, 0));
    PARASYNC_CUDA_CHECK(cudaMemcpyAsync(host_totals_, totals_.as<Totals>(), sizeof(Totals),
                                        cudaMemcpyDeviceToHost, d2h_));

    // Backward, last op first; each op's gradients leave as soon as they exist.
    for (size_t i = n; i-- > 0;) {
      const LayerOp& op = ops[i];
      if (!plan_.needs_dx[i] && op.num_variables == 0) continue;
      float* dx = plan_.needs_dx[i] ? DeltaBuffer(i) : nullptr;
      PARASYNC_GPU_CHECK(layers_[i]->Backward(param_ptrs_.data() + op.first_variable, Act(i),
                                              Act(i + 1), DeltaBuffer(i + 1), dx,
                                              grad_ptrs_.data() + op.first_variable, pass));
      if (op.num_variables == 0) continue;
      PARASYNC_CUDA_CHECK(cudaEventRecord(grads_ready[i], compute_));
      PARASYNC_CUDA_CHECK(cudaStreamWaitEvent(d2h_, grads_ready[i], 0));
      for (int v = op.first_variable; v < op.first_variable + op.num_variables; ++v) {
        PARASYNC_CUDA_CHECK(cudaMemcpyAsync(grads[static_cast<size_t>(v)], Grad(v), Bytes(v),
                                            cudaMemcpyDeviceToHost, d2h_));
      }
    }
    PARASYNC_CUDA_CHECK(cudaStreamSynchronize(d2h_));
    PARASYNC_CUDA_CHECK(cudaStreamSynchronize(compute_));
    return static_cast<float>(host_totals_->loss_sum / batch);
  }

  Result<EvalResult> Evaluate(std::span<const float* const> params, const float* x,
                              const uint8_t* labels, int64_t n, float* logits) override {
    PARASYNC_RETURN_IF_ERROR(failed_);
    PARASYNC_RETURN_IF_ERROR(compute::CheckEvaluate(model_, params, x, labels, n));
    EvalResult result;
    if (n == 0) return result;
    // All labels and ids before any work is queued: an early return leaves nothing running.
    PARASYNC_RETURN_IF_ERROR(compute::CheckLabels(model_, labels, n, 0));
    PARASYNC_RETURN_IF_ERROR(CheckIds(x, n, 0));
    PARASYNC_CUDA_CHECK(cudaSetDevice(device_));
    const int64_t by_bytes =
        std::max<int64_t>(1, kEvalChunkBytes / (4 * std::max<int64_t>(plan_.per_example, 1)));
    const int64_t chunk = std::min({n, kEvalChunkRows, by_bytes});
    // Everything on compute_, in order: evaluation runs once per epoch, overlap buys little.
    for (size_t v = 0; v < var_offset_.size(); ++v) {
      PARASYNC_CUDA_CHECK(cudaMemcpyAsync(Param(static_cast<int>(v)), params[v],
                                          Bytes(static_cast<int>(v)), cudaMemcpyHostToDevice,
                                          compute_));
    }
    PARASYNC_CUDA_CHECK(cudaMemsetAsync(totals_.as<Totals>(), 0, sizeof(Totals), compute_));
    const int64_t inputs = model_.input_size();
    for (int64_t start = 0; start < n; start += chunk) {
      const int rows = static_cast<int>(std::min(chunk, n - start));
      PARASYNC_GPU_CHECK(Reserve(rows));
      PARASYNC_CUDA_CHECK(cudaMemcpyAsync(x_.as<float>(), x + start * inputs, InputBytes(rows),
                                          cudaMemcpyHostToDevice, compute_));
      PARASYNC_CUDA_CHECK(cudaMemcpyAsync(labels_.as<uint8_t>(), labels + start,
                                          static_cast<size_t>(rows), cudaMemcpyHostToDevice,
                                          compute_));
      GpuPass pass;
      pass.rows = rows;
      for (size_t i = 0; i < layers_.size(); ++i) {
        PARASYNC_GPU_CHECK(layers_[i]->Forward(
            param_ptrs_.data() + model_.ops()[i].first_variable, Act(i), Act(i + 1), pass));
      }
      PARASYNC_GPU_CHECK(Loss(rows, 0.0f, nullptr, true));
      if (logits != nullptr) {
        // Pageable memory: the copy returns once the logits are on the host.
        PARASYNC_CUDA_CHECK(cudaMemcpyAsync(
            logits + start * model_.outputs(), Act(layers_.size()),
            static_cast<size_t>(rows * model_.outputs()) * sizeof(float), cudaMemcpyDeviceToHost,
            compute_));
      }
      result.count += rows;
    }
    PARASYNC_CUDA_CHECK(cudaMemcpyAsync(host_totals_, totals_.as<Totals>(), sizeof(Totals),
                                        cudaMemcpyDeviceToHost, compute_));
    PARASYNC_CUDA_CHECK(cudaStreamSynchronize(compute_));
    result.loss_sum = host_totals_->loss_sum;
    result.correct = static_cast<int64_t>(host_totals_->correct);
    return result;
  }

 private:
  // Records the first CUDA/cuBLAS/cuDNN failure: after it the backend answers only with it.
  Status Fail(Status s) {
    if (failed_.ok()) failed_ = s;
    return s;
  }

  // An embedding's ids are checked on the host, before they reach a kernel.
  Status CheckIds(const float* x, int64_t rows, int64_t first_example) const {
    const LayerOp& first = model_.ops().front();
    if (first.spec.kind != LayerKind::kEmbedding) return Status::Ok();
    return compute::CheckIds(first, x, rows, first_example);
  }

  // The loss of `rows` logits into totals_ (and, when delta is not null, its gradient).
  Status Loss(int rows, float grad_scale, float* delta, bool count_correct) {
    Totals* totals = totals_.as<Totals>();
    unsigned long long* correct = count_correct ? &totals->correct : nullptr;
    const float* logits = Act(layers_.size());
    if (model_.loss() == LossKind::kSigmoidCrossEntropy) {
      PARASYNC_CUDA_RETURN(LaunchSigmoidCrossEntropy(logits, labels_.as<uint8_t>(), rows,
                                                     grad_scale, delta, &totals->loss_sum,
                                                     correct, compute_));
    } else {
      PARASYNC_CUDA_RETURN(LaunchSoftmaxCrossEntropy(
          logits, labels_.as<uint8_t>(), rows, static_cast<int>(model_.outputs()),
          grad_scale, delta, &totals->loss_sum, correct, compute_));
    }
    return Status::Ok();
  }

  float* Param(int v) const { return params_.as<float>() + var_offset_[static_cast<size_t>(v)]; }
  float* Grad(int v) const { return grads_.as<float>() + var_offset_[static_cast<size_t>(v)]; }
  size_t Bytes(int v) const { return var_elements_[static_cast<size_t>(v)] * sizeof(float); }
  size_t InputBytes(int64_t rows) const {
    return static_cast<size_t>(rows) * static_cast<size_t>(model_.input_size()) * sizeof(float);
  }
  // The input of op j (the output of op j-1): the uploaded batch, or a buffer.
  float* Act(size_t j) const {
    const int b = plan_.act[j];
    return b < 0 ? x_.as<float>() : acts_[static_cast<size_t>(b)].as<float>();
  }
  float* DeltaBuffer(size_t j) const { return deltas_[plan_.delta[j]].as<float>(); }

  // Readies the buffers (grown to `rows`, never shrunk) and every layer for passes of `rows`.
  Status Reserve(int rows) {
    if (rows > capacity_) {
      // Nothing may still be using the old buffers; until all new ones exist, none count.
      PARASYNC_CUDA_RETURN(cudaDeviceSynchronize());
      capacity_ = 0;
      const size_t r = static_cast<size_t>(rows);
      PARASYNC_CUDA_RETURN(x_.Allocate(InputBytes(rows)));
      PARASYNC_CUDA_RETURN(labels_.Allocate(r));
      acts_.clear();
      for (int64_t elements : plan_.act_elements) {
        acts_.emplace_back();
        PARASYNC_CUDA_RETURN(acts_.back().Allocate(r * static_cast<size_t>(elements) * sizeof(float)));
      }
      for (DeviceBuffer& d : deltas_) {
        PARASYNC_CUDA_RETURN(d.Allocate(r * static_cast<size_t>(plan_.delta_elements) * sizeof(float)));
      }
      const size_t ones = std::max(r, ones_beyond_rows_);
      PARASYNC_CUDA_RETURN(ones_.Allocate(ones * sizeof(float)));
      PARASYNC_CUDA_RETURN(LaunchFill(ones_.as<float>(), 1.0f, ones, compute_));
      PARASYNC_CUDA_RETURN(cudaStreamSynchronize(compute_));
      context_.ones = ones_.as<float>();
      capacity_ = rows;
    }
    if (rows != described_rows_) {
      described_rows_ = 0;
      for (auto& layer : layers_) PARASYNC_RETURN_IF_ERROR(layer->Reserve(rows));
      described_rows_ = rows;
    }
    return Status::Ok();
  }

  const Model model_;
  const int device_;
  std::string name_;
  Status failed_;
  cudaStream_t compute_ = nullptr;
  cudaStream_t h2d_ = nullptr;
  cudaStream_t d2h_ = nullptr;
  std::vector<cudaEvent_t> events_;
  cublasHandle_t cublas_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  GpuContext context_;  // the layers hold a reference to it
  std::vector<std::unique_ptr<GpuLayer>> layers_;
  compute::BufferPlan plan_;

  // All variables in one block each, at var_offset_ in Model::variables() order.
  std::vector<size_t> var_offset_;
  std::vector<size_t> var_elements_;
  DeviceBuffer params_;
  DeviceBuffer grads_;
  std::vector<const float*> param_ptrs_;
  std::vector<float*> grad_ptrs_;
  DeviceBuffer totals_;
  Totals* host_totals_ = nullptr;  // page-locked

  int capacity_ = 0;        // rows the batch-sized buffers hold
  int described_rows_ = 0;  // rows the layers are ready for
  DeviceBuffer x_;
  DeviceBuffer labels_;
  std::vector<DeviceBuffer> acts_;
  DeviceBuffer deltas_[2];
  DeviceBuffer ones_;
  size_t ones_beyond_rows_ = 0;  // ones_ holds at least this many as well as capacity_
};

}  // namespace

Result<std::unique_ptr<ComputeBackend>> CreateCudaBackend(const Model& model, int device) {
  auto backend = std::make_unique<CudaBackend>(model, device);
  PARASYNC_RETURN_IF_ERROR(backend->Init());
  return std::unique_ptr<ComputeBackend>(std::move(backend));
}

}  // namespace parasync::cuda
