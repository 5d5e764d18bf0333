// Server-side optimizers: the update a parameter server applies to a slice for one pushed
// gradient. Pure functions over caller-owned arrays; thread-safe for disjoint arrays.
//
//   sgd       w -= lr * g
//   momentum  v = momentum * v + g;  w -= lr * v                     (TensorFlow's Momentum)
//   adam      m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//             lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t);  w -= lr_t * m / (sqrt(v) + eps)
//                                                                    (TensorFlow's Adam)
//   adagrad   a += g^2;  w -= lr * g / (sqrt(a0 + a) + eps)           (TensorFlow's Adagrad,
//             a0 = initial_accumulator; the slot a starts at zero)
//   aggregate w = g           (sync: the step's averaged gradient, for the workers'
//                              own optimizer to apply)
//   delta     w += g          (async, ssp: g is the change a worker's optimizer made)
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "common/model_spec.h"

namespace parasync {

// One optimizer's update (see ApplyUpdate), in place or out of place. The table of them is in
// ps/optimizer.cc: one row per row of kOptimizerKinds (common/model_spec.h, which names each
// optimizer, counts its slots — at most kMaxOptimizerSlots — and checks its hyperparameters),
// in the same order, or it does not compile.
struct OptimizerDef {
  using UpdateFn = void (*)(const OptimizerSpec& spec, int64_t step, const float* w_in,
                            float* w_out, const float* g, std::span<float* const> slots,
                            int64_t n);
  OptimizerKind kind;
  UpdateFn update_in_place;      // w_in unused: the weights are read from and written to w_out
  UpdateFn update_out_of_place;  // w_in only read
};

// The row of `kind`; null for a kind outside the table (never for a validated spec).
const OptimizerDef* FindOptimizer(OptimizerKind kind);

// Slot arrays (same length as the variable) each optimizer keeps (kOptimizerKinds' slots:
// sgd 0, momentum 1 (v), adam 2 (m, v)); 0 for a kind outside the table. Slots start at zero.
int NumOptimizerSlots(OptimizerKind kind);

// Applies one update to the weights w_in[0..n) from g[0..n), writing the new weights to
// w_out[0..n): in place when w_out == w_in, otherwise w_in is only read (copy-on-write of a
// slice whose values are lent to a pull reply); partial overlap is not allowed. `slots`
// holds NumOptimizerSlots(spec.kind) arrays of n floats, updated in place. `step` is the
// 1-based count of updates this slice has received including this one (Adam's bias
// correction).
void ApplyUpdate(const OptimizerSpec& spec, int64_t step, const float* w_in, float* w_out,
                 const float* g, std::span<float* const> slots, int64_t n);

// True if no g[i] (i < n) is NaN or +-Inf: the check every push passes before any update.
bool IsAllFinite(const float* g, int64_t n);

// SGD out of place with the finite check folded in: w_out = w_in - lr * g (bit for bit what
// ApplyUpdate computes), and false if any g[i] is NaN or +-Inf (w_out then holds garbage;
// w_in is never written). One pass over the gradient where a check and an update take two.
// The arrays must not overlap.
bool ApplySgdIfFinite(float lr, const float* w_in, float* w_out, const float* g, int64_t n);
// The same, bit for bit, with streaming stores into w_out (x86-64; elsewhere the same as
// ApplySgdIfFinite): for a push too large for w_out to still be cached when the pull reply
// reads it, the update then moves three bytes per byte instead of four (an ordinary store
// reads the line in first). Ends with a store fence (see CopyFloatsStreaming).
bool ApplySgdIfFiniteStreaming(float lr, const float* w_in, float* w_out, const float* g,
                               int64_t n);

}  // namespace parasync
