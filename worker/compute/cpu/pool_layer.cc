// Max and average pooling on the CPU: oneDNN's pooling forward and backward primitives. Max
// pooling keeps oneDNN's workspace (where each maximum was) from Forward to Backward;
// average pooling excludes padding from the average, as TensorFlow's `same` does.
#include "worker/compute/cpu/cpu_layer.h"

namespace parasync::cpu {

namespace {

using dnnl::memory;

class PoolLayer final : public CpuLayer {
 public:
  PoolLayer(const LayerOp& op, OneDnn& dnn)
      : op_(op),
        dnn_(dnn),
        algorithm_(op.spec.kind == LayerKind::kMaxPool2d
                       ? dnnl::algorithm::pooling_max
                       : dnnl::algorithm::pooling_avg_exclude_padding) {}

  Status Forward(const float* const* /*params*/, const float* x, float* y,
                 const Pass& pass) override {
    PARASYNC_ASSIGN_OR_RETURN(Primitives * p, Get(pass.rows));
    return OneDnnCall(op_, "pooling forward", [&] {
      p->src.set_data_handle(const_cast<float*>(x));
      p->dst.set_data_handle(y);
      std::unordered_map<int, memory> args{{DNNL_ARG_SRC, p->src}, {DNNL_ARG_DST, p->dst}};
      if (p->has_workspace) args.emplace(DNNL_ARG_WORKSPACE, p->workspace);
      p->forward.execute(dnn_.stream, args);
      dnn_.stream.wait();
    });
  }

  Status Backward(const float* const* /*params*/, const float* /*x*/, const float* /*y*/,
                  const float* dy, float* dx, float* const* /*grads*/, const Pass& pass) override {
    if (dx == nullptr) return Status::Ok();  // no variables, nothing below to feed
    PARASYNC_ASSIGN_OR_RETURN(Primitives * p, Get(pass.rows));
    return OneDnnCall(op_, "pooling backward", [&] {
      p->dst.set_data_handle(const_cast<float*>(dy));
      p->src.set_data_handle(dx);
      std::unordered_map<int, memory> args{{DNNL_ARG_DIFF_DST, p->dst},
                                           {DNNL_ARG_DIFF_SRC, p->src}};
      if (p->has_workspace) args.emplace(DNNL_ARG_WORKSPACE, p->workspace);
      p->backward.execute(dnn_.stream, args);
      dnn_.stream.wait();
    });
  }

 private:
  struct Primitives {
    dnnl::pooling_forward forward;
    dnnl::pooling_backward backward;
    memory src, dst, workspace;
    bool has_workspace = false;
  };

  Result<Primitives*> Get(int rows) {
    return cache_.Get(op_, rows, [this](int n, Primitives& p) { Make(n, p); });
  }

  void Make(int rows, Primitives& p) {
    const memory::dim k = op_.spec.kernel, s = op_.spec.stride;
    const memory::desc src = BatchDesc(rows, op_.in);
    const memory::desc dst = BatchDesc(rows, op_.out);
    const memory::dims strides{s, s}, kernel{k, k}, pad_l{op_.pad_begin, op_.pad_begin},
        pad_r{op_.pad_end, op_.pad_end};
    const dnnl::pooling_forward::primitive_desc fwd(
        {dnnl::prop_kind::forward_training, algorithm_, src, dst, strides, kernel, pad_l, pad_r},
        dnn_.engine);
    const dnnl::pooling_backward::primitive_desc bwd(
        {algorithm_, src, dst, strides, kernel, pad_l, pad_r}, dnn_.engine, fwd);
    p.forward = dnnl::pooling_forward(fwd);
    p.backward = dnnl::pooling_backward(bwd);
    p.src = memory(src, dnn_.engine, DNNL_MEMORY_NONE);
    p.dst = memory(dst, dnn_.engine, DNNL_MEMORY_NONE);
    p.has_workspace = fwd.workspace_desc().get_size() > 0;
    if (p.has_workspace) p.workspace = memory(fwd.workspace_desc(), dnn_.engine);
  }

  const LayerOp op_;
  OneDnn& dnn_;
  const dnnl::algorithm algorithm_;
  PerRowCount<Primitives> cache_;
};

}  // namespace

std::unique_ptr<CpuLayer> MakePoolLayer(const LayerOp& op, OneDnn& dnn) {
  return std::make_unique<PoolLayer>(op, dnn);
}

}  // namespace parasync::cpu
