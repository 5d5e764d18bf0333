// One layer of the CUDA backend (cuda_backend.cc runs a Model as a chain of these), the GPU
// twin of worker/compute/cpu/cpu_layer.h: one file per layer family beside this one, cuDNN
// for convolution, pooling and activations, cuBLAS for dense layers, the kernels of
// kernels.cu for what neither has (dropout, embedding, bias, the losses).
//
// Arrays are device float32 in the CPU backend's layouts (NCHW activations, OIHW and
// [in, out] kernels). Every call is queued on the context's one compute stream and returns
// at once; a failed CUDA, cuBLAS or cuDNN call becomes a Status naming it. Not thread-safe:
// the backend's one training thread uses a layer.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "common/status.h"
#include "worker/compute/buffer_plan.h"
#include "worker/model/model.h"

namespace parasync::cuda {

Status CudaError(cudaError_t rc, const char* call);
Status CublasError(cublasStatus_t rc, const char* call);
Status CudnnError(cudnnStatus_t rc, const char* call);

// Evaluate `expr` (a CUDA, cuBLAS or cuDNN call) and return its failure as a Status.
#define PARASYNC_CUDA_RETURN(expr)                                                         \
  do {                                                                                     \
    const cudaError_t parasync_rc_ = (expr);                                               \
    if (parasync_rc_ != cudaSuccess) return ::parasync::cuda::CudaError(parasync_rc_, #expr); \
  } while (0)
#define PARASYNC_CUBLAS_RETURN(expr)                                                           \
  do {                                                                                         \
    const cublasStatus_t parasync_rc_ = (expr);                                                \
    if (parasync_rc_ != CUBLAS_STATUS_SUCCESS) return ::parasync::cuda::CublasError(parasync_rc_, #expr); \
  } while (0)
#define PARASYNC_CUDNN_RETURN(expr)                                                          \
  do {                                                                                       \
    const cudnnStatus_t parasync_rc_ = (expr);                                               \
    if (parasync_rc_ != CUDNN_STATUS_SUCCESS) return ::parasync::cuda::CudnnError(parasync_rc_, #expr); \
  } while (0)

// A device allocation, freed with the owner.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&&) = delete;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Reset(); }

  cudaError_t Allocate(size_t bytes) {
    Reset();
    const cudaError_t rc = cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes);
    if (rc == cudaSuccess) bytes_ = bytes;
    return rc;
  }
  // At least `bytes`, allocated anew (contents lost) only when it holds fewer.
  cudaError_t Grow(size_t bytes) {
    return ptr_ != nullptr && bytes <= bytes_ ? cudaSuccess : Allocate(bytes);
  }
  void Reset() {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// What every layer of one backend shares. `ones` holds at least as many 1.0f as the largest
// row count Reserve() was called with and as any convolution's output positions (dense and
// convolution layers sum bias gradients with it).
struct GpuContext {
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cudnnHandle_t cudnn = nullptr;
  const float* ones = nullptr;
};

struct GpuPass {
  int rows = 0;
  bool training = false;
  uint64_t seed = 0;
};

class GpuLayer {
 public:
  virtual ~GpuLayer() = default;

  // How its output relates to its input buffer, and whether its backward pass reads its
  // output (compute::BufferPlan).
  virtual compute::OpMemory buffer_use() const { return {}; }

  // Readies the layer for passes of `rows` rows (cuDNN descriptors, algorithms, workspace).
  // Called whenever the row count changes, with no work of the layer in flight.
  virtual Status Reserve(int /*rows*/) { return Status::Ok(); }

  // y = layer(x), queued on the stream. params: this layer's variables (device pointers).
  virtual Status Forward(const float* const* params, const float* x, float* y,
                         const GpuPass& pass) = 0;

  // From dy, overwrites grads and, when dx is not null, dx (queued on the stream). x and y
  // are the last Forward's.
  virtual Status Backward(const float* const* params, const float* x, const float* y,
                          const float* dy, float* dx, float* const* grads,
                          const GpuPass& pass) = 0;
};

// The layer for `op` (its place in Model::ops() is `op_index`); NotSupported for a layer
// this backend cannot run, naming it and why.
Result<std::unique_ptr<GpuLayer>> MakeGpuLayer(const LayerOp& op, uint32_t op_index,
                                               const GpuContext& context);

// The families, one per file.
std::unique_ptr<GpuLayer> MakeGpuDenseLayer(const LayerOp& op, const GpuContext& context);
Result<std::unique_ptr<GpuLayer>> MakeGpuConv2dLayer(const LayerOp& op, const GpuContext& context);
Result<std::unique_ptr<GpuLayer>> MakeGpuPoolLayer(const LayerOp& op, const GpuContext& context);
Result<std::unique_ptr<GpuLayer>> MakeGpuActivationLayer(const LayerOp& op,
                                                         const GpuContext& context);
std::unique_ptr<GpuLayer> MakeGpuDropoutLayer(const LayerOp& op, uint32_t op_index,
                                              const GpuContext& context);
std::unique_ptr<GpuLayer> MakeGpuEmbeddingLayer(const LayerOp& op, const GpuContext& context);

// A cuDNN NCHW float tensor descriptor, destroyed with its owner.
class TensorDesc {
 public:
  TensorDesc() = default;
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
  ~TensorDesc() {
    if (desc_ != nullptr) cudnnDestroyTensorDescriptor(desc_);
  }
  // Describes [n, c, h, w].
  Status Set(int n, int c, int h, int w) {
    if (desc_ == nullptr) PARASYNC_CUDNN_RETURN(cudnnCreateTensorDescriptor(&desc_));
    PARASYNC_CUDNN_RETURN(
        cudnnSetTensor4dDescriptor(desc_, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, c, h, w));
    return Status::Ok();
  }
  cudnnTensorDescriptor_t get() const { return desc_; }

 private:
  cudnnTensorDescriptor_t desc_ = nullptr;
};

// A batch of `rows` examples of `shape` as a cuDNN tensor: [C, H, W] as NCHW, [D] as
// [rows, D, 1, 1].
Status DescribeBatch(TensorDesc* desc, int rows, const std::vector<int64_t>& shape);

}  // namespace parasync::cuda
