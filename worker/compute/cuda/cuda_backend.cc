// The CUDA backend (cuda_backend.h).
//
// Today it runs the models that are a chain of dense layers with ReLU between them and
// softmax cross-entropy at the end (the built-in mlp, MLP widths, and files of that shape,
// flatten layers allowed); any other layer is NotSupported at creation, so --device auto
// falls back to the CPU saying why. The cuDNN layers (convolution, pooling, the other
// activations, dropout, embedding) are the next step (docs/models.md).
//
// Layout and arithmetic follow the CPU backend (worker/compute/cpu/cpu_backend.cc), which is
// the reference it is tested against: row-major activations [batch, width], kernels
// [in, out], Z = A * W + b, ReLU on hidden layers, softmax cross-entropy on the last. cuBLAS
// is column-major, and a row-major [r, c] matrix is a column-major [c, r] one, so each
// product below is written for the transposes (comments give the row-major meaning).
//
// One step (ForwardBackward) runs on three streams:
//   h2d_:     the batch, then each layer's kernel and bias, one event per layer;
//   compute_: layer l's forward product starts as soon as layer l's parameters have
//             arrived, while the later layers' are still on the wire; then the loss and the
//             backward pass, last layer first;
//   d2h_:     each layer's gradients go back to the host as soon as they exist, while the
//             layers below are still being differentiated.
// The copies are asynchronous when the host arrays are page-locked (AllocateHost, which the
// trainer uses for its parameter, gradient and batch buffers); any other memory works too,
// the runtime then copies through its own staging and the overlap is lost.
//
// Every CUDA and cuBLAS call is checked; a failure becomes a Status naming the call. Errors
// during execution (a fault in a kernel) leave a CUDA context unusable, so after one the
// backend refuses further work with the same error.
//
// Not thread-safe: one training thread uses an instance (worker/compute/backend.h).

#include "worker/compute/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "worker/compute/checks.h"
#include "worker/compute/cuda/device_query.h"
#include "worker/compute/cuda/kernels.h"

namespace parasync::cuda {

namespace {

// Rows per forward pass in Evaluate: bounds device memory for large evaluation sets.
constexpr int kEvalChunkRows = 8192;

Status CudaError(cudaError_t rc, const char* call) {
  return Status::Internal(std::string(call) + " failed: " + cudaGetErrorString(rc) + " (" +
                          cudaGetErrorName(rc) + ")");
}

Status CublasError(cublasStatus_t rc, const char* call) {
  return Status::Internal(std::string(call) + " failed: " + cublasGetStatusString(rc) +
                          " (cuBLAS status " + std::to_string(static_cast<int>(rc)) + ")");
}

#define PARASYNC_CUDA_CHECK(expr)                                          \
  do {                                                                     \
    const cudaError_t parasync_cuda_rc_ = (expr);                          \
    if (parasync_cuda_rc_ != cudaSuccess) return Fail(CudaError(parasync_cuda_rc_, #expr)); \
  } while (0)

#define PARASYNC_CUBLAS_CHECK(expr)                                               \
  do {                                                                            \
    const cublasStatus_t parasync_cublas_rc_ = (expr);                            \
    if (parasync_cublas_rc_ != CUBLAS_STATUS_SUCCESS) {                           \
      return Fail(CublasError(parasync_cublas_rc_, #expr));                       \
    }                                                                             \
  } while (0)

// A device allocation, freed with the owner.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept : ptr_(std::exchange(other.ptr_, nullptr)) {}
  DeviceBuffer& operator=(DeviceBuffer&&) = delete;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Reset(); }

  cudaError_t Allocate(size_t bytes) {
    Reset();
    return cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes);
  }
  void Reset() {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
};

// What the loss kernel accumulates, on the device and (pinned) on the host.
struct Totals {
  double loss_sum;
  unsigned long long correct;
};

// A model as this backend runs it: widths = {inputs, units of each dense layer}; ReLU after
// every dense layer but the last. Dense layer l's kernel is variable 2l, its bias 2l+1.
struct MlpSpec {
  std::vector<int64_t> widths;
  int num_layers() const { return static_cast<int>(widths.size()) - 1; }
};

// The dense chain `model` is, or NotSupported naming the first op this backend lacks.
Result<MlpSpec> DenseChain(const Model& model) {
  MlpSpec spec;
  spec.widths.push_back(model.input_size());
  const std::vector<LayerOp>& ops = model.ops();
  auto unsupported = [](const LayerOp& op, const std::string& why) {
    return Status::NotSupported("the CUDA backend cannot run layer '" + op.spec.name + "' (" +
                                std::string(LayerKindName(op.spec.kind)) + "): " + why);
  };
  if (model.loss() != LossKind::kSoftmaxCrossEntropy) {
    return Status::NotSupported("the CUDA backend has softmax_cross_entropy only, not " +
                                std::string(LossKindName(model.loss())));
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    const LayerOp& op = ops[i];
    if (op.spec.kind == LayerKind::kFlatten) continue;
    if (op.spec.kind != LayerKind::kDense) {
      return unsupported(op, "it runs dense layers with ReLU between them only");
    }
    spec.widths.push_back(op.out_size());
    size_t next = i + 1;
    while (next < ops.size() && ops[next].spec.kind == LayerKind::kFlatten) ++next;
    const bool last_dense = std::none_of(ops.begin() + static_cast<std::ptrdiff_t>(next), ops.end(),
                                         [](const LayerOp& o) { return o.spec.kind == LayerKind::kDense; });
    const bool relu_next = next < ops.size() && ops[next].spec.kind == LayerKind::kActivation &&
                           ops[next].spec.activation == Activation::kRelu;
    if (last_dense && next < ops.size()) {
      return unsupported(ops[next], "the last dense layer must give the logits");
    }
    if (!last_dense && !relu_next) {
      return unsupported(op, "every dense layer but the last must be followed by a ReLU");
    }
    if (relu_next) i = next;
  }
  if (spec.widths.size() < 2) return Status::NotSupported("the CUDA backend needs a dense layer");
  if (spec.widths.back() > 256) {
    return Status::InvalidArgument("the model has " + std::to_string(spec.widths.back()) +
                                   " classes; labels are uint8, so at most 256");
  }
  return spec;
}

class CudaBackend final : public ComputeBackend {
 public:
  CudaBackend(Model model, MlpSpec spec, int device)
      : model_(std::move(model)), spec_(std::move(spec)), device_(device) {}

  ~CudaBackend() override {
    // Best effort: nothing to report to from a destructor.
    cudaSetDevice(device_);
    if (compute_ != nullptr) cudaStreamSynchronize(compute_);
    if (d2h_ != nullptr) cudaStreamSynchronize(d2h_);
    if (h2d_ != nullptr) cudaStreamSynchronize(h2d_);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
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
    PARASYNC_CUDA_CHECK(cudaSetDevice(device_));
    // A GPU this build has no code for would fail only at the first step; say so now, so
    // --device auto falls back to the CPU.
    if (const cudaError_t rc = CheckKernelImage(); rc != cudaSuccess) {
      cudaGetLastError();
      return Status::Unavailable(name_ + ": this build's CUDA kernels do not run on it (" +
                                 cudaGetErrorName(rc) + "); rebuild with "
                                 "-DCMAKE_CUDA_ARCHITECTURES=<its sm number>");
    }
    for (cudaStream_t* s : {&compute_, &h2d_, &d2h_}) {
      PARASYNC_CUDA_CHECK(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
    }
    const int layers = spec_.num_layers();
    // Per layer: its parameters arrived, its gradients computed; then the loss computed.
    events_.resize(2 * static_cast<size_t>(layers) + 1);
    for (cudaEvent_t& e : events_) {
      PARASYNC_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    PARASYNC_CUBLAS_CHECK(cublasCreate(&cublas_));
    PARASYNC_CUBLAS_CHECK(cublasSetStream(cublas_, compute_));
    // Full FP32 products (no TF32), so the results match the CPU backend's.
    PARASYNC_CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));

    const std::vector<VariableSpec>& vars = model_.variables();
    size_t total = 0;
    for (const VariableSpec& v : vars) {
      var_offset_.push_back(total);
      var_elements_.push_back(static_cast<size_t>(v.num_elements()));
      total += static_cast<size_t>(v.num_elements());
    }
    PARASYNC_CUDA_CHECK(params_.Allocate(total * sizeof(float)));
    PARASYNC_CUDA_CHECK(grads_.Allocate(total * sizeof(float)));
    PARASYNC_CUDA_CHECK(totals_.Allocate(sizeof(Totals)));
    void* host_totals = nullptr;
    PARASYNC_CUDA_CHECK(cudaMallocHost(&host_totals, sizeof(Totals)));
    host_totals_ = static_cast<Totals*>(host_totals);
    for (size_t l = 1; l < spec_.widths.size(); ++l) {
      max_width_ = std::max(max_width_, spec_.widths[l]);
    }
    acts_.resize(spec_.widths.size());
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
                                const uint8_t* labels, int batch, uint64_t /*seed: no dropout*/,
                                std::span<float* const> grads) override {
    PARASYNC_RETURN_IF_ERROR(failed_);
    PARASYNC_RETURN_IF_ERROR(compute::CheckForwardBackward(model_, params, x, labels, batch, grads));
    PARASYNC_CUDA_CHECK(cudaSetDevice(device_));
    PARASYNC_RETURN_IF_ERROR(Reserve(batch));
    const int layers = spec_.num_layers();
    const int inputs = static_cast<int>(spec_.widths.front());
    const int classes = static_cast<int>(spec_.widths.back());
    cudaEvent_t* layer_ready = events_.data();
    cudaEvent_t* grads_ready = events_.data() + layers;
    cudaEvent_t loss_ready = events_[2 * static_cast<size_t>(layers)];

    // Host to device: the batch, then the parameters layer by layer.
    PARASYNC_CUDA_CHECK(cudaMemcpyAsync(x_.as<float>(), x,
                                        static_cast<size_t>(batch) * inputs * sizeof(float),
                                        cudaMemcpyHostToDevice, h2d_));
    PARASYNC_CUDA_CHECK(cudaMemcpyAsync(labels_.as<uint8_t>(), labels,
                                        static_cast<size_t>(batch), cudaMemcpyHostToDevice, h2d_));
    for (int l = 0; l < layers; ++l) {
      for (int v = 2 * l; v <= 2 * l + 1; ++v) {
        PARASYNC_CUDA_CHECK(cudaMemcpyAsync(Param(v), params[v], Bytes(v),
                                            cudaMemcpyHostToDevice, h2d_));
      }
      PARASYNC_CUDA_CHECK(cudaEventRecord(layer_ready[l], h2d_));
    }

    // Forward.
    PARASYNC_CUDA_CHECK(cudaMemsetAsync(totals_.as<Totals>(), 0, sizeof(Totals), compute_));
    for (int l = 0; l < layers; ++l) {
      PARASYNC_CUDA_CHECK(cudaStreamWaitEvent(compute_, layer_ready[l], 0));
      PARASYNC_RETURN_IF_ERROR(LayerForward(l, batch, /*bias=*/l + 1 < layers));
    }
    // The last layer's bias is added inside the loss kernel.
    float* delta = delta_.as<float>();
    float* delta_below = delta_below_.as<float>();
    PARASYNC_CUDA_CHECK(LaunchSoftmaxCrossEntropy(
        acts_[layers].as<float>(), Param(2 * layers - 1), labels_.as<uint8_t>(), batch, classes,
        1.0f / static_cast<float>(batch), delta, &totals_.as<Totals>()->loss_sum, nullptr,
        compute_));
    PARASYNC_CUDA_CHECK(cudaEventRecord(loss_ready, compute_));

    // Backward, last layer first. On entry to layer l, delta holds dLoss/dZ_l [batch, out].
    const float one = 1.0f, zero = 0.0f;
    for (int l = layers - 1; l >= 0; --l) {
      const int in = static_cast<int>(spec_.widths[l]);
      const int out = static_cast<int>(spec_.widths[l + 1]);
      const float* a_in = l == 0 ? x_.as<float>() : acts_[l].as<float>();
      // dW [in, out] = A_in^T [in, batch] * dZ [batch, out].
      PARASYNC_CUBLAS_CHECK(cublasSgemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_T, out, in, batch, &one,
                                        delta, out, a_in, in, &zero, Grad(2 * l), out));
      // db [out] = column sums of dZ: the column-major [out, batch] dZ times ones.
      PARASYNC_CUBLAS_CHECK(cublasSgemv(cublas_, CUBLAS_OP_N, out, batch, &one, delta, out,
                                        ones_.as<float>(), 1, &zero, Grad(2 * l + 1), 1));
      PARASYNC_CUDA_CHECK(cudaEventRecord(grads_ready[l], compute_));
      PARASYNC_CUDA_CHECK(cudaStreamWaitEvent(d2h_, grads_ready[l], 0));
      for (int v = 2 * l; v <= 2 * l + 1; ++v) {
        PARASYNC_CUDA_CHECK(cudaMemcpyAsync(grads[v], Grad(v), Bytes(v),
                                            cudaMemcpyDeviceToHost, d2h_));
      }
      if (l == layers - 1) {
        PARASYNC_CUDA_CHECK(cudaStreamWaitEvent(d2h_, loss_ready, 0));
        PARASYNC_CUDA_CHECK(cudaMemcpyAsync(host_totals_, totals_.as<Totals>(), sizeof(Totals),
                                            cudaMemcpyDeviceToHost, d2h_));
      }
      if (l == 0) break;
      // dA_in [batch, in] = dZ [batch, out] * W^T [out, in], then through the ReLU that
      // made A_in.
      PARASYNC_CUBLAS_CHECK(cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, in, batch, out, &one,
                                        Param(2 * l), out, delta, out, &zero, delta_below, in));
      PARASYNC_CUDA_CHECK(LaunchReluBackward(delta_below, a_in, static_cast<size_t>(batch) * in,
                                             compute_));
      std::swap(delta, delta_below);
    }
    // The last copy on d2h_ waited for the last product on compute_: one wait covers all.
    PARASYNC_CUDA_CHECK(cudaStreamSynchronize(d2h_));
    return static_cast<float>(host_totals_->loss_sum / batch);
  }

  Result<EvalResult> Evaluate(std::span<const float* const> params, const float* x,
                              const uint8_t* labels, int64_t n) override {
    PARASYNC_RETURN_IF_ERROR(failed_);
    PARASYNC_RETURN_IF_ERROR(compute::CheckEvaluate(model_, params, x, labels, n));
    EvalResult result;
    if (n == 0) return result;
    // All labels before any work is queued: an early return leaves nothing running.
    PARASYNC_RETURN_IF_ERROR(compute::CheckLabels(model_, labels, n, 0));
    PARASYNC_CUDA_CHECK(cudaSetDevice(device_));
    const int layers = spec_.num_layers();
    const int64_t inputs = spec_.widths.front();
    const int classes = static_cast<int>(spec_.widths.back());
    PARASYNC_RETURN_IF_ERROR(Reserve(static_cast<int>(std::min<int64_t>(n, kEvalChunkRows))));
    // Everything on compute_, in order: evaluation runs once per epoch, overlap buys little.
    for (int v = 0; v < 2 * layers; ++v) {
      PARASYNC_CUDA_CHECK(cudaMemcpyAsync(Param(v), params[v], Bytes(v), cudaMemcpyHostToDevice,
                                          compute_));
    }
    PARASYNC_CUDA_CHECK(cudaMemsetAsync(totals_.as<Totals>(), 0, sizeof(Totals), compute_));
    for (int64_t start = 0; start < n; start += kEvalChunkRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kEvalChunkRows, n - start));
      PARASYNC_CUDA_CHECK(cudaMemcpyAsync(x_.as<float>(), x + start * inputs,
                                          static_cast<size_t>(rows) * inputs * sizeof(float),
                                          cudaMemcpyHostToDevice, compute_));
      PARASYNC_CUDA_CHECK(cudaMemcpyAsync(labels_.as<uint8_t>(), labels + start,
                                          static_cast<size_t>(rows), cudaMemcpyHostToDevice,
                                          compute_));
      for (int l = 0; l < layers; ++l) {
        PARASYNC_RETURN_IF_ERROR(LayerForward(l, rows, /*bias=*/l + 1 < layers));
      }
      Totals* totals = totals_.as<Totals>();
      PARASYNC_CUDA_CHECK(LaunchSoftmaxCrossEntropy(
          acts_[layers].as<float>(), Param(2 * layers - 1), labels_.as<uint8_t>(), rows, classes,
          0.0f, nullptr, &totals->loss_sum, &totals->correct, compute_));
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
  // Records the first CUDA/cuBLAS failure: after it the backend answers only with it.
  Status Fail(Status s) {
    if (failed_.ok()) failed_ = s;
    return s;
  }

  float* Param(int v) const { return params_.as<float>() + var_offset_[v]; }
  float* Grad(int v) const { return grads_.as<float>() + var_offset_[v]; }
  size_t Bytes(int v) const { return var_elements_[v] * sizeof(float); }

  // acts_[l+1] = A_l * W_l on compute_ (A_0 is the batch), plus the bias and ReLU unless
  // `bias` is false (the last layer, whose bias the loss kernel adds).
  Status LayerForward(int l, int rows, bool bias) {
    const int in = static_cast<int>(spec_.widths[l]);
    const int out = static_cast<int>(spec_.widths[l + 1]);
    const float* a_in = l == 0 ? x_.as<float>() : acts_[l].as<float>();
    float* z = acts_[l + 1].as<float>();
    const float one = 1.0f, zero = 0.0f;
    // Z [rows, out] = A [rows, in] * W [in, out].
    PARASYNC_CUBLAS_CHECK(cublasSgemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, out, rows, in, &one,
                                      Param(2 * l), out, a_in, in, &zero, z, out));
    if (bias) {
      PARASYNC_CUDA_CHECK(LaunchBiasActivation(z, Param(2 * l + 1), rows, out, /*relu=*/true,
                                               compute_));
    }
    return Status::Ok();
  }

  // Grows the batch-sized device buffers to `rows` rows; never shrinks them.
  Status Reserve(int rows) {
    if (rows <= capacity_) return Status::Ok();
    // Nothing may still be using the old buffers; until all new ones exist, none count.
    PARASYNC_CUDA_CHECK(cudaDeviceSynchronize());
    capacity_ = 0;
    const size_t r = static_cast<size_t>(rows);
    PARASYNC_CUDA_CHECK(x_.Allocate(r * spec_.widths.front() * sizeof(float)));
    PARASYNC_CUDA_CHECK(labels_.Allocate(r));
    for (size_t l = 1; l < acts_.size(); ++l) {
      PARASYNC_CUDA_CHECK(acts_[l].Allocate(r * spec_.widths[l] * sizeof(float)));
    }
    PARASYNC_CUDA_CHECK(delta_.Allocate(r * max_width_ * sizeof(float)));
    PARASYNC_CUDA_CHECK(delta_below_.Allocate(r * max_width_ * sizeof(float)));
    PARASYNC_CUDA_CHECK(ones_.Allocate(r * sizeof(float)));
    PARASYNC_CUDA_CHECK(LaunchFill(ones_.as<float>(), 1.0f, r, compute_));
    PARASYNC_CUDA_CHECK(cudaStreamSynchronize(compute_));
    capacity_ = rows;
    return Status::Ok();
  }

  const Model model_;
  const MlpSpec spec_;
  const int device_;
  std::string name_;
  Status failed_;
  cudaStream_t compute_ = nullptr;
  cudaStream_t h2d_ = nullptr;
  cudaStream_t d2h_ = nullptr;
  std::vector<cudaEvent_t> events_;
  cublasHandle_t cublas_ = nullptr;

  // All variables in one block each, at var_offset_ in Model::variables() order.
  std::vector<size_t> var_offset_;
  std::vector<size_t> var_elements_;
  DeviceBuffer params_;
  DeviceBuffer grads_;
  DeviceBuffer totals_;
  Totals* host_totals_ = nullptr;  // page-locked

  int64_t max_width_ = 0;
  int capacity_ = 0;  // rows the batch-sized buffers hold
  DeviceBuffer x_;
  DeviceBuffer labels_;
  std::vector<DeviceBuffer> acts_;  // acts_[l], l >= 1: output of layer l-1; acts_[0] unused
  DeviceBuffer delta_;
  DeviceBuffer delta_below_;
  DeviceBuffer ones_;
};

}  // namespace

Result<std::unique_ptr<ComputeBackend>> CreateCudaBackend(const Model& model, int device) {
  PARASYNC_ASSIGN_OR_RETURN(MlpSpec spec, DenseChain(model));
  auto backend = std::make_unique<CudaBackend>(model, std::move(spec), device);
  PARASYNC_RETURN_IF_ERROR(backend->Init());
  return std::unique_ptr<ComputeBackend>(std::move(backend));
}

}  // namespace parasync::cuda
