#include "worker/compute/cuda/kernels.h"

#include "worker/compute/dropout_mask.h"

#include <climits>
#include <cmath>

namespace parasync::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;
constexpr int kRowsPerBlock = kThreads / kWarp;  // softmax: one warp per row
constexpr unsigned kFullMask = 0xffffffffu;

// Blocks for a grid-stride loop over n elements: enough to fill the GPU, never more than
// the elements need.
unsigned BlocksFor(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 4096 ? (blocks == 0 ? 1 : blocks) : 4096);
}

__global__ void BiasAddKernel(float* z, const float* b, size_t n, int width) {
  for (size_t k = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<size_t>(gridDim.x) * blockDim.x) {
    z[k] += b[k % width];
  }
}

__global__ void FillKernel(float* out, float value, size_t n) {
  for (size_t k = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[k] = value;
  }
}

// One warp per row: the lanes stride over the classes, then reduce with shuffles. The
// arithmetic follows the CPU backend: max-shifted exponentials summed in float, the loss
// m + log(sum) - z[label] in double.
__global__ void SoftmaxCrossEntropyKernel(const float* z, const uint8_t* labels,
                                          int rows, int classes, float grad_scale, float* delta,
                                          double* loss_sum, unsigned long long* correct) {
  __shared__ double block_loss[kRowsPerBlock];
  __shared__ unsigned block_correct[kRowsPerBlock];
  const int warp = static_cast<int>(threadIdx.x) / kWarp;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int row = static_cast<int>(blockIdx.x) * kRowsPerBlock + warp;
  double row_loss = 0.0;
  unsigned row_correct = 0;
  // `row` is the same for the whole warp, so every lane of a working warp takes part in
  // the shuffles below.
  if (row < rows) {
    const float* zr = z + static_cast<size_t>(row) * classes;
    float m = -INFINITY;
    int arg = INT_MAX;
    for (int c = lane; c < classes; c += kWarp) {
      const float v = zr[c];
      if (v > m) {  // strict: within a lane c grows, so the first maximum stays
        m = v;
        arg = c;
      }
    }
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      const float other_m = __shfl_xor_sync(kFullMask, m, offset);
      const int other_arg = __shfl_xor_sync(kFullMask, arg, offset);
      if (other_m > m || (other_m == m && other_arg < arg)) {
        m = other_m;
        arg = other_arg;
      }
    }
    float sum = 0.0f;
    for (int c = lane; c < classes; c += kWarp) {
      sum += expf(zr[c] - m);
    }
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      sum += __shfl_xor_sync(kFullMask, sum, offset);
    }
    const int label = labels[row];
    if (lane == 0) {
      row_loss = static_cast<double>(m) + log(static_cast<double>(sum)) -
                 static_cast<double>(zr[label]);
      row_correct = arg == label ? 1u : 0u;
    }
    if (delta != nullptr) {
      const float scale = grad_scale / sum;
      float* dr = delta + static_cast<size_t>(row) * classes;
      for (int c = lane; c < classes; c += kWarp) {
        float d = expf(zr[c] - m) * scale;
        if (c == label) d -= grad_scale;
        dr[c] = d;
      }
    }
  }
  if (lane == 0) {
    block_loss[warp] = row_loss;
    block_correct[warp] = row_correct;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double loss = 0.0;
    unsigned right = 0;
    for (int w = 0; w < kRowsPerBlock; ++w) {
      loss += block_loss[w];
      right += block_correct[w];
    }
    atomicAdd(loss_sum, loss);
    if (correct != nullptr) atomicAdd(correct, static_cast<unsigned long long>(right));
  }
}

// One thread per row: loss = max(z, 0) - z y + log(1 + exp(-|z|)), dLoss/dz = sigmoid(z) - y,
// as the CPU backend (loss.cc) computes them, in double.
__global__ void SigmoidCrossEntropyKernel(const float* z, const uint8_t* labels, int rows,
                                          float grad_scale, float* delta, double* loss_sum,
                                          unsigned long long* correct) {
  __shared__ double block_loss[kThreads];
  __shared__ unsigned block_correct[kThreads];
  const int row = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  double loss = 0.0;
  unsigned right = 0;
  if (row < rows) {
    const double v = z[row];
    const double y = labels[row];
    loss = fmax(v, 0.0) - v * y + log1p(exp(-fabs(v)));
    if (delta != nullptr) delta[row] = static_cast<float>(1.0 / (1.0 + exp(-v)) - y) * grad_scale;
    right = (v > 0.0) == (labels[row] == 1) ? 1u : 0u;
  }
  block_loss[threadIdx.x] = loss;
  block_correct[threadIdx.x] = right;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    unsigned count = 0;
    for (int t = 0; t < kThreads; ++t) {
      total += block_loss[t];
      count += block_correct[t];
    }
    atomicAdd(loss_sum, total);
    if (correct != nullptr) atomicAdd(correct, static_cast<unsigned long long>(count));
  }
}

__global__ void DropoutKernel(const float* in, float* out, size_t n, uint64_t seed, uint32_t op,
                              float rate) {
  const float scale = 1.0f / (1.0f - rate);
  for (size_t k = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[k] = compute::DropoutKeeps(seed, op, k, rate) ? in[k] * scale : 0.0f;
  }
}

// One thread per (row, field, d): the sum over the field's bag of table[id][d], times scale.
__global__ void EmbeddingForwardKernel(const float* x, const float* table, float* out,
                                       EmbeddingGeometry g) {
  const size_t width = static_cast<size_t>(g.fields) * g.dim;
  const size_t n = static_cast<size_t>(g.rows) * width;
  for (size_t k = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t row = k / width, f = (k % width) / g.dim, d = k % g.dim;
    const float* ids = x + row * g.in_width + f * g.bag;
    float sum = 0.0f;
    for (int j = 0; j < g.bag; ++j) sum += table[static_cast<size_t>(ids[j]) * g.dim + d];
    out[row * g.out_width + f * g.dim + d] = sum * g.scale;
  }
}

// One thread per (row, id column, d): adds scale * dy of the column's field into its id's
// row of dtable.
__global__ void EmbeddingBackwardKernel(const float* x, const float* dy, float* dtable,
                                        EmbeddingGeometry g) {
  const int columns = g.fields * g.bag;
  const size_t n = static_cast<size_t>(g.rows) * columns * g.dim;
  for (size_t k = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t d = k % g.dim, slot = k / g.dim, row = slot / columns, c = slot % columns;
    const float id = x[row * g.in_width + c];
    atomicAdd(&dtable[static_cast<size_t>(id) * g.dim + d],
              g.scale * dy[row * g.out_width + (c / g.bag) * g.dim + d]);
  }
}

__global__ void Im2colKernel(const float* x, PatchGeometry g, size_t n, float* col) {
  const size_t positions = static_cast<size_t>(g.out_height) * g.out_width;
  const size_t taps = static_cast<size_t>(g.channels) * g.kernel * g.kernel;
  for (size_t k = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t p = k % positions;
    const size_t t = (k / positions) % taps;
    const size_t r = k / (positions * taps);
    const int j = static_cast<int>(t % g.kernel);
    const int i = static_cast<int>((t / g.kernel) % g.kernel);
    const int c = static_cast<int>(t / (static_cast<size_t>(g.kernel) * g.kernel));
    const int iy = static_cast<int>(p / g.out_width) * g.stride - g.pad + i;
    const int ix = static_cast<int>(p % g.out_width) * g.stride - g.pad + j;
    float v = 0.0f;
    if (iy >= 0 && iy < g.height && ix >= 0 && ix < g.width) {
      v = x[((r * g.channels + c) * g.height + iy) * g.width + ix];
    }
    col[k] = v;
  }
}

}  // namespace

cudaError_t LaunchSigmoidCrossEntropy(const float* z, const uint8_t* labels, int rows,
                                      float grad_scale, float* delta, double* loss_sum,
                                      unsigned long long* correct, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((rows + kThreads - 1) / kThreads);
  SigmoidCrossEntropyKernel<<<blocks, kThreads, 0, stream>>>(z, labels, rows, grad_scale, delta,
                                                             loss_sum, correct);
  return cudaGetLastError();
}

cudaError_t LaunchDropout(const float* in, float* out, size_t n, uint64_t seed, uint32_t op,
                          float rate, cudaStream_t stream) {
  DropoutKernel<<<BlocksFor(n), kThreads, 0, stream>>>(in, out, n, seed, op, rate);
  return cudaGetLastError();
}

cudaError_t LaunchEmbeddingForward(const float* x, const float* table, float* out,
                                   const EmbeddingGeometry& g, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(g.rows) * g.fields * g.dim;
  EmbeddingForwardKernel<<<BlocksFor(n), kThreads, 0, stream>>>(x, table, out, g);
  return cudaGetLastError();
}

cudaError_t LaunchEmbeddingBackward(const float* x, const float* dy, float* dtable,
                                    const EmbeddingGeometry& g, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(g.rows) * g.fields * g.bag * g.dim;
  EmbeddingBackwardKernel<<<BlocksFor(n), kThreads, 0, stream>>>(x, dy, dtable, g);
  return cudaGetLastError();
}

cudaError_t LaunchBiasAdd(float* z, const float* b, int rows, int width, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(rows) * width;
  BiasAddKernel<<<BlocksFor(n), kThreads, 0, stream>>>(z, b, n, width);
  return cudaGetLastError();
}

cudaError_t LaunchSoftmaxCrossEntropy(const float* z, const uint8_t* labels,
                                      int rows, int classes, float grad_scale, float* delta,
                                      double* loss_sum, unsigned long long* correct,
                                      cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  SoftmaxCrossEntropyKernel<<<blocks, kThreads, 0, stream>>>(z, labels, rows, classes,
                                                             grad_scale, delta, loss_sum, correct);
  return cudaGetLastError();
}

cudaError_t CheckKernelImage() {
  cudaFuncAttributes attributes{};
  return cudaFuncGetAttributes(&attributes, FillKernel);
}

cudaError_t LaunchIm2col(const float* x, int rows, const PatchGeometry& g, float* col,
                         cudaStream_t stream) {
  const size_t n = static_cast<size_t>(rows) * g.channels * g.kernel * g.kernel *
                   g.out_height * g.out_width;
  if (n == 0) return cudaSuccess;
  Im2colKernel<<<BlocksFor(n), kThreads, 0, stream>>>(x, g, n, col);
  return cudaGetLastError();
}

cudaError_t LaunchFill(float* out, float value, size_t n, cudaStream_t stream) {
  FillKernel<<<BlocksFor(n), kThreads, 0, stream>>>(out, value, n);
  return cudaGetLastError();
}

}  // namespace parasync::cuda
