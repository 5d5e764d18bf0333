// Conv2d layer on the CPU: oneDNN's convolution forward, backward-data and backward-weights
// primitives (direct algorithm; oneDNN picks the implementation), on plain NCHW activations
// and OIHW weights, the layouts the parameter servers and the GPU backend share.
#include "worker/compute/cpu/weighted_layer.h"

namespace parasync::cpu {

std::unique_ptr<CpuLayer> MakeConv2dLayer(const LayerOp& op, OneDnn& dnn) {
  using Layer = WeightedLayer<dnnl::convolution_forward, dnnl::convolution_backward_data,
                              dnnl::convolution_backward_weights>;
  return std::make_unique<Layer>(op, dnn, "convolution", [op, &dnn](int rows,
                                                                    Layer::Primitives& p) {
    using dnnl::memory;
    const memory::dim k = op.spec.kernel, s = op.spec.stride;
    const memory::desc src = BatchDesc(rows, op.in);
    const memory::desc dst = BatchDesc(rows, op.out);
    const memory::desc weights({op.out[0], op.in[0], k, k}, memory::data_type::f32,
                               memory::format_tag::oihw);
    const memory::desc bias({op.out[0]}, memory::data_type::f32, memory::format_tag::x);
    const memory::dims strides{s, s}, pad_l{op.pad_begin, op.pad_begin},
        pad_r{op.pad_end, op.pad_end};
    const auto direct = dnnl::algorithm::convolution_direct;
    const dnnl::convolution_forward::primitive_desc fwd(
        {dnnl::prop_kind::forward_training, direct, src, weights, bias, dst, strides, pad_l,
         pad_r},
        dnn.engine);
    p.forward = dnnl::convolution_forward(fwd);
    p.backward_data = dnnl::convolution_backward_data(
        dnnl::convolution_backward_data::primitive_desc(
            {direct, src, weights, dst, strides, pad_l, pad_r}, dnn.engine, fwd));
    p.backward_weights = dnnl::convolution_backward_weights(
        dnnl::convolution_backward_weights::primitive_desc(
            {direct, src, weights, bias, dst, strides, pad_l, pad_r}, dnn.engine, fwd));
    p.src = memory(src, dnn.engine, DNNL_MEMORY_NONE);
    p.weights = memory(weights, dnn.engine, DNNL_MEMORY_NONE);
    p.bias = memory(bias, dnn.engine, DNNL_MEMORY_NONE);
    p.dst = memory(dst, dnn.engine, DNNL_MEMORY_NONE);
  });
}

}  // namespace parasync::cpu
