// Dense layer on the CPU: oneDNN's inner product forward, backward-data and backward-weights
// primitives (bias and its gradient included), on the flattened input x [rows, in] and the
// kernel W [in, units] (oneDNN's `io` layout of its [units, in] weights).
//
// Why not OpenBLAS sgemm, which this layer used before: side by side on the 2-core VM
// (2026-11-24, a scratch program timing forward + both backward products, one thread),
// oneDNN took 0.48-0.53 of sgemm's time for the MLP's 784x256 and 256x128 layers and the
// CNN's 21632x128 one at batch 64 and 256, and 0.85 for the tiny 128x10; on two threads
// 0.47-0.64, and 1.10 for 128x10 (7.0 vs 7.7 us). docs/performance.md has the figures.
#include "worker/compute/cpu/cpu_layer.h"

namespace parasync::cpu {

namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using DType = memory::data_type;

class DenseLayer final : public CpuLayer {
 public:
  DenseLayer(const LayerOp& op, OneDnn& dnn) : op_(op), dnn_(dnn) {}

  Status Forward(const float* const* params, const float* x, float* y,
                 const Pass& pass) override {
    PARASYNC_ASSIGN_OR_RETURN(Primitives * p, Get(pass.rows));
    return OneDnnCall(op_, "inner product forward", [&] {
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
    return OneDnnCall(op_, "inner product backward", [&] {
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
    dnnl::inner_product_forward forward;
    dnnl::inner_product_backward_data backward_data;
    dnnl::inner_product_backward_weights backward_weights;
    memory src, weights, bias, dst;
  };

  Result<Primitives*> Get(int rows) {
    return cache_.Get(op_, rows, [this](int n, Primitives& p) { Make(n, p); });
  }

  void Make(int rows, Primitives& p) {
    const memory::dim in = op_.in_size(), out = op_.out_size();
    const memory::desc src({rows, in}, DType::f32, Tag::nc);
    const memory::desc dst({rows, out}, DType::f32, Tag::nc);
    const memory::desc weights({out, in}, DType::f32, Tag::io);  // W [in, out], row-major
    const memory::desc bias({out}, DType::f32, Tag::x);
    const dnnl::inner_product_forward::primitive_desc fwd(
        {dnnl::prop_kind::forward_training, src, weights, bias, dst}, dnn_.engine);
    const dnnl::inner_product_backward_data::primitive_desc bwd_data({src, weights, dst},
                                                                     dnn_.engine, fwd);
    const dnnl::inner_product_backward_weights::primitive_desc bwd_weights(
        {src, weights, bias, dst}, dnn_.engine, fwd);
    p.forward = dnnl::inner_product_forward(fwd);
    p.backward_data = dnnl::inner_product_backward_data(bwd_data);
    p.backward_weights = dnnl::inner_product_backward_weights(bwd_weights);
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

std::unique_ptr<CpuLayer> MakeDenseLayer(const LayerOp& op, OneDnn& dnn) {
  return std::make_unique<DenseLayer>(op, dnn);
}

}  // namespace parasync::cpu
