// The CPU compute backend: the MLP's forward and backward passes with OpenBLAS sgemm for
// the matrix products and plain loops (which the compiler vectorises) for bias, ReLU and
// softmax. It is the reference the GPU backend is tested against.
//
// Layout is row-major throughout: activations [batch, width], kernels [in, out], so a layer
// computes Z = A * W + b. OpenBLAS runs its products on its own thread pool; this file never
// sets its size (parasync-worker does, from --compute-threads).
//
// Not thread-safe: one training thread uses an instance (see worker/compute/backend.h).
// Scratch buffers grow to the largest batch seen and are then reused, so a warmed-up
// instance allocates nothing per call.

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "worker/compute/backend.h"
#include "worker/compute/checks.h"

namespace parasync {

namespace {

// Rows per forward pass in Evaluate: bounds scratch memory for large evaluation sets.
constexpr int kEvalChunkRows = 1024;

class CpuBackend final : public ComputeBackend {
 public:
  explicit CpuBackend(MlpSpec spec) : spec_(std::move(spec)), acts_(spec_.widths.size()) {
    for (size_t l = 1; l < spec_.widths.size(); ++l) {
      max_width_ = std::max(max_width_, spec_.widths[l]);
    }
  }

  std::string name() const override { return "cpu"; }

  Result<float> ForwardBackward(std::span<const float* const> params, const float* x,
                                const uint8_t* labels, int batch,
                                std::span<float* const> grads) override {
    PARASYNC_RETURN_IF_ERROR(compute::CheckForwardBackward(spec_, params, x, labels, batch, grads));

    Reserve(batch);
    Forward(params, x, batch);

    // Softmax cross-entropy. delta_ receives dLoss_mean/dLogits = (softmax - onehot) / batch.
    const int layers = spec_.num_layers();
    const int64_t classes = spec_.widths.back();
    const float* logits = acts_[layers].data();
    float* delta = delta_.data();
    const float inv_batch = 1.0f / static_cast<float>(batch);
    double loss_sum = 0.0;
    for (int i = 0; i < batch; ++i) {
      const float* z = logits + static_cast<size_t>(i) * classes;
      float* d = delta + static_cast<size_t>(i) * classes;
      const float m = *std::max_element(z, z + classes);
      float sum = 0.0f;
      for (int64_t c = 0; c < classes; ++c) {
        d[c] = std::exp(z[c] - m);
        sum += d[c];
      }
      const float scale = inv_batch / sum;
      for (int64_t c = 0; c < classes; ++c) d[c] *= scale;
      d[labels[i]] -= inv_batch;
      loss_sum += static_cast<double>(m) + std::log(static_cast<double>(sum)) -
                  static_cast<double>(z[labels[i]]);
    }

    // Backward, last layer first. On entry to layer l, delta holds dLoss/dZ_l [batch, out].
    for (int l = layers - 1; l >= 0; --l) {
      const int in = static_cast<int>(spec_.widths[l]);
      const int out = static_cast<int>(spec_.widths[l + 1]);
      const float* a_in = l == 0 ? x : acts_[l].data();
      float* dw = grads[2 * l];
      float* db = grads[2 * l + 1];
      // dW = A_in^T * dZ: [in, batch] x [batch, out].
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, in, out, batch, 1.0f, a_in, in,
                  delta, out, 0.0f, dw, out);
      // db = column sums of dZ.
      std::fill(db, db + out, 0.0f);
      for (int i = 0; i < batch; ++i) {
        const float* d = delta + static_cast<size_t>(i) * out;
        for (int o = 0; o < out; ++o) db[o] += d[o];
      }
      if (l == 0) break;
      // dA_in = dZ * W^T: [batch, out] x [out, in], then through the ReLU that made A_in.
      float* delta_in = delta_prev_.data();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, in, out, 1.0f, delta, out,
                  params[2 * l], out, 0.0f, delta_in, in);
      const size_t count = static_cast<size_t>(batch) * in;
      for (size_t k = 0; k < count; ++k) {
        delta_in[k] = a_in[k] > 0.0f ? delta_in[k] : 0.0f;
      }
      std::swap(delta_, delta_prev_);
      delta = delta_.data();
    }
    return static_cast<float>(loss_sum / batch);
  }

  Result<EvalResult> Evaluate(std::span<const float* const> params, const float* x,
                              const uint8_t* labels, int64_t n) override {
    PARASYNC_RETURN_IF_ERROR(compute::CheckEvaluate(spec_, params, x, labels, n));
    EvalResult result;
    if (n == 0) return result;
    const int64_t inputs = spec_.widths.front();
    const int64_t classes = spec_.widths.back();
    Reserve(static_cast<int>(std::min<int64_t>(n, kEvalChunkRows)));
    for (int64_t start = 0; start < n; start += kEvalChunkRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kEvalChunkRows, n - start));
      const uint8_t* y = labels + start;
      PARASYNC_RETURN_IF_ERROR(compute::CheckLabels(spec_, y, rows, start));
      Forward(params, x + start * inputs, rows);
      const float* logits = acts_[spec_.num_layers()].data();
      for (int i = 0; i < rows; ++i) {
        const float* z = logits + static_cast<size_t>(i) * classes;
        // First maximum wins ties, so the count is deterministic.
        const float* top = std::max_element(z, z + classes);
        const float m = *top;
        float sum = 0.0f;
        for (int64_t c = 0; c < classes; ++c) sum += std::exp(z[c] - m);
        result.loss_sum += static_cast<double>(m) + std::log(static_cast<double>(sum)) -
                           static_cast<double>(z[y[i]]);
        if (top - z == y[i]) ++result.correct;
      }
      result.count += rows;
    }
    return result;
  }

 private:
  // Grows the scratch buffers to hold `rows` examples; never shrinks them.
  void Reserve(int rows) {
    if (rows <= capacity_) return;
    capacity_ = rows;
    for (size_t l = 1; l < acts_.size(); ++l) {
      acts_[l].resize(static_cast<size_t>(rows) * spec_.widths[l]);
    }
    const size_t delta_size = static_cast<size_t>(rows) * max_width_;
    delta_.resize(delta_size);
    delta_prev_.resize(delta_size);
  }

  // acts_[l+1] = layer l applied to acts_[l] (x for l = 0): ReLU on hidden layers, raw
  // logits on the last. Precondition: Reserve(rows).
  void Forward(std::span<const float* const> params, const float* x, int rows) {
    const int layers = spec_.num_layers();
    for (int l = 0; l < layers; ++l) {
      const int in = static_cast<int>(spec_.widths[l]);
      const int out = static_cast<int>(spec_.widths[l + 1]);
      const float* a_in = l == 0 ? x : acts_[l].data();
      const float* w = params[2 * l];
      const float* b = params[2 * l + 1];
      float* z = acts_[l + 1].data();
      for (int i = 0; i < rows; ++i) {
        std::copy(b, b + out, z + static_cast<size_t>(i) * out);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, out, in, 1.0f, a_in, in, w,
                  out, 1.0f, z, out);
      if (l + 1 < layers) {
        const size_t count = static_cast<size_t>(rows) * out;
        for (size_t k = 0; k < count; ++k) z[k] = std::max(z[k], 0.0f);
      }
    }
  }

  const MlpSpec spec_;
  int64_t max_width_ = 0;  // widest layer output, for the delta buffers
  int capacity_ = 0;       // rows the scratch buffers hold
  // acts_[l] for l >= 1: output of layer l-1, [capacity_, widths[l]]; acts_[0] unused
  // (the input is read in place).
  std::vector<std::vector<float>> acts_;
  std::vector<float> delta_;       // dLoss/dZ of the current layer
  std::vector<float> delta_prev_;  // dLoss/dZ of the layer below, being computed
};

}  // namespace

Result<std::unique_ptr<ComputeBackend>> CreateCpuBackend(const MlpSpec& spec) {
  PARASYNC_RETURN_IF_ERROR(compute::ValidateSpec(spec));
  return std::unique_ptr<ComputeBackend>(std::make_unique<CpuBackend>(spec));
}

}  // namespace parasync
