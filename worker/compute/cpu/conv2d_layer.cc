// Conv2d layer on the CPU: oneDNN's convolution forward, backward-data and backward-weights
// primitives (direct algorithm; oneDNN picks the implementation), on plain NCHW activations
// and OIHW weights, the layouts the parameter servers and the GPU backend share.
#include "worker/compute/cpu/cpu_layer.h"

namespace parasync::cpu {

namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using DType = memory::data_type;

class Conv2dLayer final : public CpuLayer {
 public:
  Conv2dLayer(const LayerOp& op, OneDnn& dnn) : op_(op), dnn_(dnn) {}

  Status Forward(const float* const* params, const float* x, float* y,
                 const Pass& pass) override {
    PARASYNC_ASSIGN_OR_RETURN(Primitives * p, Get(pass.rows));
    return OneDnnCall(op_, "convolution forward", [&] {
      p->src.set_data_handle(const_cast<float*>(x));
      p->weights.set_data_handle(const_cast<float*>(params[0]));
      p->bias.set_data_handle(const_cast<float*>(params[1]));
      p->dst.set_data_handle(y);
      p->forward.execute(dnn_.stream, {{DNNL_ARG_SRC, p->src},
                                       {DNNL_ARG_WEIGHTS, p->weights},
                                       {DNNL_ARG_BIAS, p->bias},
                                       {DNNL_ARG_DST, p->dst}});
      dnn_.stream.wait();
    });
  }

  Status Backward(const float* const* params, const float* x, const float* /*y*/,
                  const float* dy, float* dx, float* const* grads, const Pass& pass) override {
    PARASYNC_ASSIGN_OR_RETURN(Primitives * p, Get(pass.rows));
    return OneDnnCall(op_, "convolution backward", [&] {
      p->src.set_data_handle(const_cast<float*>(x));
      p->dst.set_data_handle(const_cast<float*>(dy));  // diff_dst has dst's layout
      p->weights.set_data_handle(grads[0]);
      p->bias.set_data_handle(grads[1]);
      p->backward_weights.execute(dnn_.stream, {{DNNL_ARG_SRC, p->src},
                                                {DNNL_ARG_DIFF_DST, p->dst},
                                                {DNNL_ARG_DIFF_WEIGHTS, p->weights},
                                                {DNNL_ARG_DIFF_BIAS, p->bias}});
      if (dx != nullptr) {
        p->weights.set_data_handle(const_cast<float*>(params[0]));
        p->src.set_data_handle(dx);
        p->backward_data.execute(dnn_.stream, {{DNNL_ARG_DIFF_DST, p->dst},
                                               {DNNL_ARG_WEIGHTS, p->weights},
                                               {DNNL_ARG_DIFF_SRC, p->src}});
      }
      dnn_.stream.wait();
    });
  }

 private:
  // The primitives for one row count and memory objects whose data handles each call sets.
  struct Primitives {
    dnnl::convolution_forward forward;
    dnnl::convolution_backward_data backward_data;
    dnnl::convolution_backward_weights backward_weights;
    memory src, weights, bias, dst;
  };

  Result<Primitives*> Get(int rows) {
    return cache_.Get(op_, rows, [this](int n, Primitives& p) { Make(n, p); });
  }

  void Make(int rows, Primitives& p) {
    const memory::dim k = op_.spec.kernel, s = op_.spec.stride;
    const memory::desc src = BatchDesc(rows, op_.in);
    const memory::desc dst = BatchDesc(rows, op_.out);
    const memory::desc weights({op_.out[0], op_.in[0], k, k}, DType::f32, Tag::oihw);
    const memory::desc bias({op_.out[0]}, DType::f32, Tag::x);
    const memory::dims strides{s, s}, pad_l{op_.pad_begin, op_.pad_begin},
        pad_r{op_.pad_end, op_.pad_end};
    const dnnl::convolution_forward::primitive_desc fwd(
        {dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, src, weights,
         bias, dst, strides, pad_l, pad_r},
        dnn_.engine);
    const dnnl::convolution_backward_data::primitive_desc bwd_data(
        {dnnl::algorithm::convolution_direct, src, weights, dst, strides, pad_l, pad_r},
        dnn_.engine, fwd);
    const dnnl::convolution_backward_weights::primitive_desc bwd_weights(
        {dnnl::algorithm::convolution_direct, src, weights, bias, dst, strides, pad_l, pad_r},
        dnn_.engine, fwd);
    p.forward = dnnl::convolution_forward(fwd);
    p.backward_data = dnnl::convolution_backward_data(bwd_data);
    p.backward_weights = dnnl::convolution_backward_weights(bwd_weights);
    p.src = memory(src, dnn_.engine, DNNL_MEMORY_NONE);
    p.weights = memory(weights, dnn_.engine, DNNL_MEMORY_NONE);
    p.bias = memory(bias, dnn_.engine, DNNL_MEMORY_NONE);
    p.dst = memory(dst, dnn_.engine, DNNL_MEMORY_NONE);
  }

  const LayerOp op_;
  OneDnn& dnn_;
  PerRowCount<Primitives> cache_;
};

}  // namespace

std::unique_ptr<CpuLayer> MakeConv2dLayer(const LayerOp& op, OneDnn& dnn) {
  return std::make_unique<Conv2dLayer>(op, dnn);
}

}  // namespace parasync::cpu
