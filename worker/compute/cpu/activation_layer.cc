// ReLU, tanh and sigmoid on the CPU: oneDNN's eltwise primitives in their use-dst-for-backward
// forms, so the backward pass needs only the output and the layer runs in place (the
// activation overwrites its input, the input's gradient its output's).
#include "worker/compute/cpu/cpu_layer.h"

namespace parasync::cpu {

namespace {

using dnnl::memory;

dnnl::algorithm AlgorithmFor(Activation a) {
  switch (a) {
    case Activation::kTanh: return dnnl::algorithm::eltwise_tanh_use_dst_for_bwd;
    case Activation::kSigmoid: return dnnl::algorithm::eltwise_logistic_use_dst_for_bwd;
    case Activation::kRelu:
    case Activation::kNone: break;
  }
  return dnnl::algorithm::eltwise_relu_use_dst_for_bwd;
}

class ActivationLayer final : public CpuLayer {
 public:
  ActivationLayer(const LayerOp& op, OneDnn& dnn)
      : op_(op), dnn_(dnn), algorithm_(AlgorithmFor(op.spec.activation)) {}

  // In place; the backward pass reads the output (use-dst-for-backward).
  compute::OpMemory buffer_use() const override { return {Aliasing::kInPlace, true}; }

  Status Forward(const float* const* /*params*/, const float* x, float* y,
                 const Pass& pass) override {
    PARASYNC_ASSIGN_OR_RETURN(Primitives * p, Get(pass.rows));
    return OneDnnCall(op_, "eltwise forward", [&] {
      p->a.set_data_handle(const_cast<float*>(x));
      p->b.set_data_handle(y);
      p->forward.execute(dnn_.stream, {{DNNL_ARG_SRC, p->a}, {DNNL_ARG_DST, p->b}});
      dnn_.stream.wait();
    });
  }

  Status Backward(const float* const* /*params*/, const float* /*x*/, const float* y,
                  const float* dy, float* dx, float* const* /*grads*/, const Pass& pass) override {
    if (dx == nullptr) return Status::Ok();
    PARASYNC_ASSIGN_OR_RETURN(Primitives * p, Get(pass.rows));
    return OneDnnCall(op_, "eltwise backward", [&] {
      p->a.set_data_handle(const_cast<float*>(y));
      p->b.set_data_handle(const_cast<float*>(dy));
      p->c.set_data_handle(dx);
      p->backward.execute(dnn_.stream,
                          {{DNNL_ARG_DST, p->a}, {DNNL_ARG_DIFF_DST, p->b}, {DNNL_ARG_DIFF_SRC, p->c}});
      dnn_.stream.wait();
    });
  }

 private:
  struct Primitives {
    dnnl::eltwise_forward forward;
    dnnl::eltwise_backward backward;
    memory a, b, c;  // every array here has the one flat layout
  };

  Result<Primitives*> Get(int rows) {
    return cache_.Get(op_, rows, [this](int n, Primitives& p) { Make(n, p); });
  }

  void Make(int rows, Primitives& p) {
    const memory::desc md({static_cast<memory::dim>(rows) * op_.out_size()},
                          memory::data_type::f32, memory::format_tag::a);
    const dnnl::eltwise_forward::primitive_desc fwd(
        {dnnl::prop_kind::forward_training, algorithm_, md, 0.0f, 0.0f}, dnn_.engine);
    const dnnl::eltwise_backward::primitive_desc bwd({algorithm_, md, md, 0.0f, 0.0f},
                                                     dnn_.engine, fwd);
    p.forward = dnnl::eltwise_forward(fwd);
    p.backward = dnnl::eltwise_backward(bwd);
    p.a = memory(md, dnn_.engine, DNNL_MEMORY_NONE);
    p.b = memory(md, dnn_.engine, DNNL_MEMORY_NONE);
    p.c = memory(md, dnn_.engine, DNNL_MEMORY_NONE);
  }

  const LayerOp op_;
  OneDnn& dnn_;
  const dnnl::algorithm algorithm_;
  PerRowCount<Primitives> cache_;
};

}  // namespace

std::unique_ptr<CpuLayer> MakeActivationLayer(const LayerOp& op, OneDnn& dnn) {
  return std::make_unique<ActivationLayer>(op, dnn);
}

}  // namespace parasync::cpu
