// A model's forward pass and loss in double precision, written with plain loops straight
// from each layer's definition and independent of every backend *and of Model*: it reads only
// the description (ModelSpec: kernels, strides, padding modes, units), the input shape and
// the data's id columns, and derives every shape, padding split, variable size, op index
// and dropout mask itself from the rules docs/models.md states. A mistake in Model's
// geometry (a `same` padding split the wrong way) or in the backends' masks therefore shows
// up as a disagreement with the backend instead of being shared by both sides. The
// reference the CPU backend's gradients are checked against (by central finite
// differences) and a check of its forward pass. Slow by design; for small shapes in tests.
//
// Plain values; thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/model/model.h"

namespace parasync::testing {

// A window of `k` at stride `s` over `n` elements: its output length and its padding before
// (top/left) and after (bottom/right), by TensorFlow's rule as docs/models.md states it:
// `valid` floor((n - k) / s) + 1 outputs, no padding; `same` ceil(n / s) outputs, padding
// total = max((out - 1) * s + k - n, 0), before = total / 2, after = the rest (the odd one
// after).
struct ReferenceWindow {
  int64_t out = 0;
  int64_t pad_before = 0;
  int64_t pad_after = 0;
};
ReferenceWindow ReferenceSlide(int64_t n, int64_t k, int64_t s, Padding padding);

// Whether element `index` of the batch's output of op `op` is kept by dropout at `rate`
// under the step seed `seed`, by the documented rule (a hash of seed, layer and element):
// SplitMix64(seed ^ op << 40 ^ index * 0x9e3779b97f4a7c15)'s top 24 bits as a fraction in
// [0, 1) are >= rate. Written here from the rule, not taken from worker/compute.
bool ReferenceDropoutKeeps(uint64_t seed, uint32_t op, uint64_t index, float rate);

// One op as the reference runs it. A dense or conv2d layer with an activation is two ops,
// the layer then the activation (as docs/models.md says backends run them), so op indices
// (which dropout masks hash) are the backends'.
struct ReferenceOp {
  LayerSpec spec;  // the layer's; for the activation op of a fused layer, kind kActivation
  std::vector<int64_t> in;   // per-example input shape
  std::vector<int64_t> out;  // per-example output shape
  int64_t pad_before = 0;    // conv2d and pools, both axes (square windows)
  int64_t pad_after = 0;
  int64_t id_columns = 0;  // embedding: leading inputs that are ids
  int64_t fields = 0;      // embedding: bags the ids split into
  int64_t table_rows = 0;  // embedding: vocab, or a sparse table's compact rows
  size_t first_param = 0;  // index of its first variable among the model's
  std::vector<std::string> param_names;  // "<layer>/kernel", ...
  std::vector<int64_t> param_sizes;      // elements of each
  int64_t in_size() const;
  int64_t out_size() const;
};

class ReferenceModel {
 public:
  // The description `spec` on examples of shape `input` ([C, H, W] or [D]) whose first
  // `inputs.id_columns` elements are ids (a sparse table has `inputs.sparse_rows` compact
  // rows). Meant for descriptions Model::Build accepts; one it cannot run (a window larger
  // than its input, an image layer on a flat input) is the test's own mistake: it says why
  // and aborts.
  ReferenceModel(const ModelSpec& spec, const std::vector<int64_t>& input,
                 const ModelInputs& inputs = {});

  const std::vector<ReferenceOp>& ops() const { return ops_; }
  // For tests that break the reference on purpose (e.g. swap a padding split) to show that
  // the comparison notices.
  std::vector<ReferenceOp>& mutable_ops() { return ops_; }
  int64_t input_size() const;

  // The mean loss over `batch` examples with parameters `params` (one array per variable, in
  // the order of ops()' params) on inputs x [batch, input_size] and labels y. `training`
  // applies dropout with ReferenceDropoutKeeps(seed, ...) masks.
  double Loss(const std::vector<std::vector<double>>& params, const std::vector<double>& x,
              const std::vector<uint8_t>& y, int batch, bool training, uint64_t seed) const;

 private:
  std::vector<double> Apply(const ReferenceOp& op, uint32_t op_index,
                            const std::vector<std::vector<double>>& params,
                            const std::vector<double>& in, bool training, uint64_t seed,
                            uint64_t index_base) const;

  std::vector<int64_t> input_;
  LossKind loss_;
  std::vector<ReferenceOp> ops_;
};

}  // namespace parasync::testing
