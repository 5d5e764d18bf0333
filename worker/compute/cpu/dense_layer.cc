// Dense layer on the CPU: oneDNN's inner product forward, backward-data and backward-weights
// primitives (bias and its gradient included), on the flattened input x [rows, in] and the
// kernel W [in, units] (oneDNN's `io` layout of its [units, in] weights).
//
// Why not OpenBLAS sgemm, which this layer used before: side by side on the 2-core VM
// (2026-11-24, a scratch program timing forward + both backward products, one thread),
// oneDNN took 0.48-0.53 of sgemm's time for the MLP's 784x256 and 256x128 layers and the
// CNN's 21632x128 one at batch 64 and 256, and 0.85 for the tiny 128x10; on two threads
// 0.47-0.64, and 1.10 for 128x10 (7.0 vs 7.7 us). docs/performance.md has the figures.
#include "worker/compute/cpu/weighted_layer.h"

namespace parasync::cpu {

std::unique_ptr<CpuLayer> MakeDenseLayer(const LayerOp& op, OneDnn& dnn) {
  using Layer = WeightedLayer<dnnl::inner_product_forward, dnnl::inner_product_backward_data,
                              dnnl::inner_product_backward_weights>;
  return std::make_unique<Layer>(op, dnn, "inner product", [op, &dnn](int rows,
                                                                      Layer::Primitives& p) {
    using dnnl::memory;
    const memory::dim in = op.in_size(), out = op.out_size();
    const memory::desc src({rows, in}, memory::data_type::f32, memory::format_tag::nc);
    const memory::desc dst({rows, out}, memory::data_type::f32, memory::format_tag::nc);
    // W [in, out] row-major is oneDNN's [out, in] weights in `io` order.
    const memory::desc weights({out, in}, memory::data_type::f32, memory::format_tag::io);
    const memory::desc bias({out}, memory::data_type::f32, memory::format_tag::x);
    const dnnl::inner_product_forward::primitive_desc fwd(
        {dnnl::prop_kind::forward_training, src, weights, bias, dst}, dnn.engine);
    p.forward = dnnl::inner_product_forward(fwd);
    p.backward_data = dnnl::inner_product_backward_data(
        dnnl::inner_product_backward_data::primitive_desc({src, weights, dst}, dnn.engine, fwd));
    p.backward_weights = dnnl::inner_product_backward_weights(
        dnnl::inner_product_backward_weights::primitive_desc({src, weights, bias, dst},
                                                             dnn.engine, fwd));
    p.src = memory(src, dnn.engine, DNNL_MEMORY_NONE);
    p.weights = memory(weights, dnn.engine, DNNL_MEMORY_NONE);
    p.bias = memory(bias, dnn.engine, DNNL_MEMORY_NONE);
    p.dst = memory(dst, dnn.engine, DNNL_MEMORY_NONE);
  });
}

}  // namespace parasync::cpu
