// The CUDA backend's own kernels (everything that is not a cuBLAS product). Compiled by nvcc
// as C++17; the callers (cuda_backend.cc) are C++20, so this header holds plain types only.
//
// Every Launch* queues its kernel on `stream` and returns the launch's cudaError_t (a bad
// configuration; faults during execution surface at the next synchronisation). Matrices are
// row-major, [rows, width], as in the CPU backend.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace parasync::cuda {

// z[r][o] += b[o]: a dense layer's bias, z [rows, width].
cudaError_t LaunchBiasAdd(float* z, const float* b, int rows, int width, cudaStream_t stream);

// Softmax cross-entropy of the logits z [rows, classes] (left as they are).
// Adds the rows' summed loss to *loss_sum. When `correct` is not null, adds the number of
// rows whose first arg-max logit equals the label. When `delta` is not null, writes
// dLoss/dLogits = (softmax - onehot) * grad_scale into delta [rows, classes].
// Labels must be below `classes` (the host checks them before upload).
cudaError_t LaunchSoftmaxCrossEntropy(const float* z, const uint8_t* labels,
                                      int rows, int classes, float grad_scale, float* delta,
                                      double* loss_sum, unsigned long long* correct,
                                      cudaStream_t stream);

// Sigmoid cross-entropy of one logit per row against 0/1 labels: adds the rows' summed loss
// to *loss_sum and, when `correct` is not null, the rows whose logit is > 0 exactly when the
// label is 1; when `delta` is not null, writes dLoss/dz * grad_scale into it.
cudaError_t LaunchSigmoidCrossEntropy(const float* z, const uint8_t* labels, int rows,
                                      float grad_scale, float* delta, double* loss_sum,
                                      unsigned long long* correct, cudaStream_t stream);

// out[k] = in[k] / (1 - rate) where compute::DropoutKeeps(seed, op, k, rate), else 0, for
// k < n (in may be out). The same masks as the CPU backend's.
cudaError_t LaunchDropout(const float* in, float* out, size_t n, uint64_t seed, uint32_t op,
                          float rate, cudaStream_t stream);

// An embedding's batch: each of `rows` examples is in_width floats, `fields` bags of `bag`
// ids (floats holding integers the host checked) then in_width - fields * bag dense
// features; its output is out_width floats, the fields' rows then those features.
struct EmbeddingGeometry {
  int rows = 0;
  int in_width = 0;
  int fields = 0;
  int bag = 0;
  int dim = 0;
  int out_width = 0;
  float scale = 1.0f;  // 1 for sum, 1 / bag for mean
};

// out[r][f * dim + d] = scale * sum over j < bag of table[ids[r][f * bag + j]][d]; the dense
// features are not copied here (the layer copies them).
cudaError_t LaunchEmbeddingForward(const float* x, const float* table, float* out,
                                   const EmbeddingGeometry& g, cudaStream_t stream);

// dtable[ids[r][k]][d] += scale * dy[r][(k / bag) * dim + d] (atomically); dtable must be
// zeroed first.
cudaError_t LaunchEmbeddingBackward(const float* x, const float* dy, float* dtable,
                                    const EmbeddingGeometry& g, cudaStream_t stream);

// cudaSuccess when this module's kernels can run on the current device, else the reason
// (cudaErrorNoKernelImageForDevice: built for other GPU architectures).
cudaError_t CheckKernelImage();

// A convolution's input patches, one matrix per example: for `rows` NCHW examples
// x [rows, channels, height, width], col[r][(c * kernel + i) * kernel + j][p] is the input
// under filter tap (c, i, j) at output position p = oy * out_width + ox (0 where the tap falls
// in the padding). col is [rows, channels * kernel * kernel, out_height * out_width].
struct PatchGeometry {
  int channels = 0;
  int height = 0;
  int width = 0;
  int kernel = 0;
  int stride = 1;
  int pad = 0;
  int out_height = 0;
  int out_width = 0;
};
cudaError_t LaunchIm2col(const float* x, int rows, const PatchGeometry& g, float* col,
                         cudaStream_t stream);

// out[k] = value for k < n.
cudaError_t LaunchFill(float* out, float value, size_t n, cudaStream_t stream);

}  // namespace parasync::cuda
