// A CPU layer with a kernel and a bias whose forward, backward-data and backward-weights
// passes are three oneDNN primitives taking the same arguments: the dense layer (inner
// product, dense_layer.cc) and the convolution (conv2d_layer.cc). Each says only how its
// primitives are made; running them is the same.
#pragma once

#include <functional>
#include <utility>

#include "worker/compute/cpu/cpu_layer.h"

namespace parasync::cpu {

template <typename Forward_, typename BackwardData, typename BackwardWeights>
class WeightedLayer final : public CpuLayer {
 public:
  // The primitives for one row count, and memory objects whose data handles each call sets
  // (the gradients reuse the memory of what they are the gradient of: same layouts).
  struct Primitives {
    Forward_ forward;
    BackwardData backward_data;
    BackwardWeights backward_weights;
    dnnl::memory src, weights, bias, dst;
  };
  // Fills a Primitives for `rows` rows; may throw dnnl::error.
  using Make = std::function<void(int rows, Primitives& p)>;

  // `what` names the primitive in errors ("inner product", "convolution").
  WeightedLayer(const LayerOp& op, OneDnn& dnn, const char* what, Make make)
      : op_(op), dnn_(dnn), what_(what), make_(std::move(make)) {}

  Status Forward(const float* const* params, const float* x, float* y,
                 const Pass& pass) override {
    PARASYNC_ASSIGN_OR_RETURN(Primitives * p, cache_.Get(op_, pass.rows, make_));
    return OneDnnCall(op_, what_, [&] {
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
    PARASYNC_ASSIGN_OR_RETURN(Primitives * p, cache_.Get(op_, pass.rows, make_));
    return OneDnnCall(op_, what_, [&] {
      p->src.set_data_handle(const_cast<float*>(x));
      p->dst.set_data_handle(const_cast<float*>(dy));
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
  const LayerOp op_;
  OneDnn& dnn_;
  const char* const what_;
  const Make make_;
  PerRowCount<Primitives> cache_;
};

}  // namespace parasync::cpu
