// One layer of the CPU backend (worker/compute/cpu/cpu_backend.cc runs a Model as a chain
// of these). One file per layer family beside this one; each calls oneDNN or BLAS where
// they have the primitive and says why where a loop is hand-written.
//
// Arrays are host float32, example after example: x [rows, op.in_size()], y [rows,
// op.out_size()], images [C, H, W] within an example (NCHW for the batch). A layer may keep
// state from Forward to the Backward of the same rows (a max pool's workspace) and caches
// its primitives per row count. Not thread-safe: the backend's one training thread uses it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>

#include <oneapi/dnnl/dnnl.hpp>

#include "common/status.h"
#include "worker/compute/buffer_plan.h"
#include "worker/model/model.h"

namespace parasync::cpu {

// What one pass needs to know besides its arrays.
struct Pass {
  int rows = 0;
  bool training = false;       // dropout drops only then
  uint64_t seed = 0;           // dropout masks (compute::DropoutKeeps)
  int64_t first_example = 0;   // for messages naming an example
};

using compute::Aliasing;

class CpuLayer {
 public:
  virtual ~CpuLayer() = default;

  // How its output relates to its input buffer, and whether its backward pass reads its
  // output (compute::BufferPlan).
  virtual compute::OpMemory buffer_use() const { return {}; }

  // y = layer(x). params: this layer's variables in Model::variables() order (not owned).
  // InvalidArgument for bad input values (an embedding id out of range), Internal when the
  // library fails.
  virtual Status Forward(const float* const* params, const float* x, float* y,
                         const Pass& pass) = 0;

  // From dy = dLoss/dy, overwrites grads (one array per variable) with dLoss/dparams and,
  // when dx is not null, dx with dLoss/dx. x and y are the last Forward's with these rows.
  virtual Status Backward(const float* const* params, const float* x, const float* y,
                          const float* dy, float* dx, float* const* grads,
                          const Pass& pass) = 0;
};

// The oneDNN engine and stream every layer of one backend shares (CPU, OpenMP threads).
struct OneDnn {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
};

// The layer for `op`; `op_index` is its place in Model::ops() (dropout masks use it).
// Internal when oneDNN cannot make its primitives.
Result<std::unique_ptr<CpuLayer>> MakeCpuLayer(const LayerOp& op, uint32_t op_index,
                                               OneDnn& dnn);

// The families, one per file.
std::unique_ptr<CpuLayer> MakeDenseLayer(const LayerOp& op, OneDnn& dnn);
std::unique_ptr<CpuLayer> MakeConv2dLayer(const LayerOp& op, OneDnn& dnn);
std::unique_ptr<CpuLayer> MakePoolLayer(const LayerOp& op, OneDnn& dnn);
std::unique_ptr<CpuLayer> MakeActivationLayer(const LayerOp& op, OneDnn& dnn);
std::unique_ptr<CpuLayer> MakeDropoutLayer(const LayerOp& op, uint32_t op_index);
std::unique_ptr<CpuLayer> MakeEmbeddingLayer(const LayerOp& op);

// Runs `body`, turning a dnnl::error into Internal naming `what` and the layer.
template <typename F>
Status OneDnnCall(const LayerOp& op, const char* what, F&& body) {
  try {
    body();
    return Status::Ok();
  } catch (const dnnl::error& e) {
    return Status::Internal("layer '" + op.spec.name + "': oneDNN " + what + " failed: " +
                            e.what() + " (status " + std::to_string(static_cast<int>(e.status)) +
                            ")");
  }
}

// Primitives made once per row count and kept (the batch, an epoch's shorter last batch,
// evaluation chunks). Get returns the entry for `rows`, made by make(rows, entry) the first
// time; a dnnl::error from make becomes Internal naming the layer.
template <typename P>
class PerRowCount {
 public:
  template <typename Make>
  Result<P*> Get(const LayerOp& op, int rows, Make&& make) {
    if (auto it = entries_.find(rows); it != entries_.end()) return &it->second;
    P entry;
    PARASYNC_RETURN_IF_ERROR(OneDnnCall(op, "set-up", [&] { make(rows, entry); }));
    return &entries_.emplace(rows, std::move(entry)).first->second;
  }

 private:
  std::map<int, P> entries_;
};

// dnnl dims of a batch of `rows` examples of `shape` ([C, H, W] -> nchw, [D] -> nc).
dnnl::memory::desc BatchDesc(int rows, const std::vector<int64_t>& shape);

}  // namespace parasync::cpu
