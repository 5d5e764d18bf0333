#include "worker/compute/cpu/cpu_layer.h"

namespace parasync::cpu {

namespace {

// Flatten: the NCHW batch already is the flat [rows, C*H*W] one.
class FlattenLayer final : public CpuLayer {
 public:
  compute::OpMemory buffer_use() const override { return {Aliasing::kView, false}; }
  Status Forward(const float* const*, const float*, float*, const Pass&) override {
    return Status::Ok();
  }
  Status Backward(const float* const*, const float*, const float*, const float*, float*,
                  float* const*, const Pass&) override {
    return Status::Ok();
  }
};

}  // namespace

dnnl::memory::desc BatchDesc(int rows, const std::vector<int64_t>& shape) {
  using dnnl::memory;
  if (shape.size() == 3) {
    return memory::desc({rows, shape[0], shape[1], shape[2]}, memory::data_type::f32,
                        memory::format_tag::nchw);
  }
  return memory::desc({rows, shape[0]}, memory::data_type::f32, memory::format_tag::nc);
}

Result<std::unique_ptr<CpuLayer>> MakeCpuLayer(const LayerOp& op, uint32_t op_index,
                                               OneDnn& dnn) {
  switch (op.spec.kind) {
    case LayerKind::kDense: return MakeDenseLayer(op, dnn);
    case LayerKind::kConv2d: return MakeConv2dLayer(op, dnn);
    case LayerKind::kMaxPool2d:
    case LayerKind::kAvgPool2d: return MakePoolLayer(op, dnn);
    case LayerKind::kFlatten: return std::unique_ptr<CpuLayer>(std::make_unique<FlattenLayer>());
    case LayerKind::kActivation: return MakeActivationLayer(op, dnn);
    case LayerKind::kDropout: return MakeDropoutLayer(op, op_index);
    case LayerKind::kEmbedding: return MakeEmbeddingLayer(op);
  }
  return Status::Internal("layer '" + op.spec.name + "': no CPU implementation");
}

}  // namespace parasync::cpu
