// Dropout on the CPU, hand-written: oneDNN has no dropout primitive (2.6). The mask is
// compute::DropoutKeeps(seed, op, element), a hash, so Backward recomputes it instead of
// storing it and the GPU backend draws the same one. In place; inference passes x through.
#include <algorithm>

#include "worker/compute/checks.h"
#include "worker/compute/cpu/cpu_layer.h"

namespace parasync::cpu {

namespace {

class DropoutLayer final : public CpuLayer {
 public:
  DropoutLayer(const LayerOp& op, uint32_t op_index)
      : size_(op.out_size()), rate_(op.spec.rate), op_index_(op_index) {}

  compute::OpMemory buffer_use() const override { return {Aliasing::kInPlace, false}; }

  Status Forward(const float* const* /*params*/, const float* x, float* y,
                 const Pass& pass) override {
    Apply(x, y, pass);
    return Status::Ok();
  }

  Status Backward(const float* const* /*params*/, const float* /*x*/, const float* /*y*/,
                  const float* dy, float* dx, float* const* /*grads*/, const Pass& pass) override {
    if (dx != nullptr) Apply(dy, dx, pass);  // the same mask and scale
    return Status::Ok();
  }

 private:
  void Apply(const float* in, float* out, const Pass& pass) const {
    const size_t n = static_cast<size_t>(pass.rows) * static_cast<size_t>(size_);
    if (!pass.training || rate_ == 0.0f) {
      if (in != out) std::copy(in, in + n, out);
      return;
    }
    const float scale = 1.0f / (1.0f - rate_);
    for (size_t k = 0; k < n; ++k) {
      out[k] = compute::DropoutKeeps(pass.seed, op_index_, k, rate_) ? in[k] * scale : 0.0f;
    }
  }

  const int64_t size_;
  const float rate_;
  const uint32_t op_index_;
};

}  // namespace

std::unique_ptr<CpuLayer> MakeDropoutLayer(const LayerOp& op, uint32_t op_index) {
  return std::make_unique<DropoutLayer>(op, op_index);
}

}  // namespace parasync::cpu
