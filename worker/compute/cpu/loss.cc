// The losses on the CPU, hand-written: oneDNN has softmax but no cross-entropy, and the
// fused form (log-sum-exp once per row, the gradient from the same exponentials) is one
// pass over the logits, which are [rows, classes] with few classes.
#include <algorithm>
#include <cmath>

#include "worker/compute/cpu/loss.h"

namespace parasync::cpu {

double LossAndGradient(LossKind loss, const float* z, const uint8_t* labels, int rows,
                       int64_t outputs, float grad_scale, float* dz, int64_t* correct) {
  double loss_sum = 0.0;
  if (loss == LossKind::kSigmoidCrossEntropy) {
    // outputs == 1: loss = max(z, 0) - z y + log(1 + exp(-|z|)), dLoss/dz = sigmoid(z) - y.
    for (int i = 0; i < rows; ++i) {
      const double v = z[i];
      const double y = labels[i];
      loss_sum += std::max(v, 0.0) - v * y + std::log1p(std::exp(-std::fabs(v)));
      if (dz != nullptr) {
        dz[i] = static_cast<float>((1.0 / (1.0 + std::exp(-v)) - y)) * grad_scale;
      }
      if (correct != nullptr && (v > 0.0) == (labels[i] == 1)) ++*correct;
    }
    return loss_sum;
  }
  for (int i = 0; i < rows; ++i) {
    const float* row = z + static_cast<size_t>(i) * outputs;
    const float* top = std::max_element(row, row + outputs);  // first maximum wins ties
    const float m = *top;
    float sum = 0.0f;
    if (dz != nullptr) {
      float* d = dz + static_cast<size_t>(i) * outputs;
      for (int64_t c = 0; c < outputs; ++c) {
        d[c] = std::exp(row[c] - m);
        sum += d[c];
      }
      const float scale = grad_scale / sum;
      for (int64_t c = 0; c < outputs; ++c) d[c] *= scale;
      d[labels[i]] -= grad_scale;
    } else {
      for (int64_t c = 0; c < outputs; ++c) sum += std::exp(row[c] - m);
    }
    loss_sum += static_cast<double>(m) + std::log(static_cast<double>(sum)) -
                static_cast<double>(row[labels[i]]);
    if (correct != nullptr && top - row == labels[i]) ++*correct;
  }
  return loss_sum;
}

}  // namespace parasync::cpu
