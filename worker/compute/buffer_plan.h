// Where a backend keeps a model's activations and gradients: which op writes a buffer of
// its own, which writes over its input (in place) or only reinterprets it (a view), which
// ops need the gradient of their input, and which of two gradient buffers holds each
// gradient in the backward pass. The CPU and CUDA backends run the same plan.
// Header-only (the CUDA module compiles it too); a plain value.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "worker/model/model.h"

namespace parasync::compute {

enum class Aliasing {
  kNone,     // the op's output is a buffer of its own
  kInPlace,  // the output may overwrite the input (and the input's gradient the output's)
  kView,     // the output is the input: nothing to compute either way (flatten)
};

// What an op's implementation allows and needs of its buffers.
struct OpMemory {
  Aliasing aliasing = Aliasing::kNone;
  // Its backward pass reads its own output (an activation computing its gradient from its
  // output, cuDNN's pooling): no later op may write over that output in place.
  bool backward_reads_output = false;
};

struct BufferPlan {
  // act[j] for j in [0, ops]: the buffer holding op j-1's output (the input of op j);
  // -1 is the caller's input, which is never written.
  std::vector<int> act;
  std::vector<int64_t> act_elements;  // per buffer: elements per example
  std::vector<bool> needs_dx;         // per op: an op below it has variables
  std::vector<int> delta;             // per op boundary: gradient buffer 0 or 1
  int64_t delta_elements = 0;         // per example, both gradient buffers
  int64_t per_example = 0;            // activation elements per example, all buffers

  // `memory[i]` is what op i's implementation allows and needs. An op runs in place only
  // on a buffer of the plan's (never the caller's input) whose content no backward pass
  // reads (the op that wrote it last, views looked through, does not read its output).
  static BufferPlan For(const Model& model, const std::vector<OpMemory>& memory) {
    const std::vector<LayerOp>& ops = model.ops();
    const size_t n = ops.size();
    BufferPlan p;
    p.act.assign(n + 1, -1);
    bool content_read = false;  // the content of act[i] is read by its writer's backward pass
    std::vector<Aliasing> aliasing(n);
    for (size_t i = 0; i < n; ++i) {
      aliasing[i] = memory[i].aliasing;
      if (aliasing[i] == Aliasing::kInPlace && (p.act[i] < 0 || content_read)) {
        aliasing[i] = Aliasing::kNone;
      }
      if (aliasing[i] != Aliasing::kView) content_read = memory[i].backward_reads_output;
      if (aliasing[i] != Aliasing::kNone) {
        p.act[i + 1] = p.act[i];
      } else {
        p.act[i + 1] = static_cast<int>(p.act_elements.size());
        p.act_elements.push_back(0);
      }
      if (p.act[i + 1] >= 0) {
        int64_t& e = p.act_elements[static_cast<size_t>(p.act[i + 1])];
        e = std::max(e, ops[i].out_size());
      }
      p.per_example += ops[i].out_size();
    }
    p.needs_dx.assign(n, false);
    bool below = false;
    for (size_t i = 0; i < n; ++i) {
      p.needs_dx[i] = below;
      below = below || ops[i].num_variables > 0;
    }
    p.delta.assign(n + 1, 0);
    for (size_t i = n; i-- > 0;) {
      p.delta[i] = aliasing[i] != Aliasing::kNone ? p.delta[i + 1] : 1 - p.delta[i + 1];
      p.delta_elements = std::max(p.delta_elements, ops[i].out_size());
    }
    return p;
  }
};

}  // namespace parasync::compute
