#include "tests/support/reference_model.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>

#include "common/variable.h"

namespace parasync::testing {

namespace {

using Vec = std::vector<double>;

int64_t Product(const std::vector<int64_t>& shape) {
  int64_t p = 1;
  for (int64_t d : shape) p *= d;
  return p;
}

[[noreturn]] void Refuse(const LayerSpec& l, const std::string& why) {
  std::cerr << "reference model: layer '" << l.name << "': " << why << "\n";
  std::abort();
}

// An embedding on one example: `fields` bags of id_columns / fields ids each, one after
// another, each the sum (or mean) of its ids' rows, then the dense inputs as they are.
Vec Embed(const ReferenceOp& op, const Vec& table, const Vec& in) {
  const LayerSpec& l = op.spec;
  const int64_t bag = op.id_columns / op.fields;
  Vec out;
  for (int64_t f = 0; f < op.fields; ++f) {
    Vec field(static_cast<size_t>(l.units), 0.0);
    for (int64_t k = 0; k < bag; ++k) {
      const int64_t id = static_cast<int64_t>(in[f * bag + k]);
      if (id < 0 || id >= op.table_rows) Refuse(l, "id out of range: " + std::to_string(id));
      for (int64_t d = 0; d < l.units; ++d) field[d] += table[id * l.units + d];
    }
    if (l.combiner == Combiner::kMean) {
      for (double& v : field) v /= static_cast<double>(bag);
    }
    out.insert(out.end(), field.begin(), field.end());
  }
  out.insert(out.end(), in.begin() + op.id_columns, in.end());
  return out;
}

}  // namespace

ReferenceWindow ReferenceSlide(int64_t n, int64_t k, int64_t s, Padding padding) {
  ReferenceWindow w;
  if (padding == Padding::kValid) {
    w.out = n >= k ? (n - k) / s + 1 : 0;
    return w;
  }
  w.out = n / s + (n % s != 0 ? 1 : 0);
  const int64_t total = std::max<int64_t>((w.out - 1) * s + k - n, 0);
  w.pad_before = total / 2;
  w.pad_after = total - w.pad_before;
  return w;
}

bool ReferenceDropoutKeeps(uint64_t seed, uint32_t op, uint64_t index, float rate) {
  const uint64_t h =
      SplitMix64(seed ^ (static_cast<uint64_t>(op) << 40) ^ (index * 0x9e3779b97f4a7c15ULL));
  // 24 bits over 2^24: exact in double, as is the float rate.
  return static_cast<double>(h >> 40) / 16777216.0 >= static_cast<double>(rate);
}

int64_t ReferenceOp::in_size() const { return Product(in); }
int64_t ReferenceOp::out_size() const { return Product(out); }

ReferenceModel::ReferenceModel(const ModelSpec& spec, const std::vector<int64_t>& input,
                               const ModelInputs& inputs)
    : input_(input), loss_(spec.loss) {
  std::vector<int64_t> shape = input;
  size_t params = 0;
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    const LayerSpec& l = spec.layers[i];
    ReferenceOp op;
    op.spec = l;
    op.in = shape;
    op.first_param = params;
    auto add_param = [&op, &l](const char* what, int64_t size) {
      op.param_names.push_back(l.name + "/" + what);
      op.param_sizes.push_back(size);
    };
    switch (l.kind) {
      case LayerKind::kDense:
        op.out = {l.units};
        add_param("kernel", Product(shape) * l.units);
        add_param("bias", l.units);
        break;
      case LayerKind::kConv2d:
      case LayerKind::kMaxPool2d:
      case LayerKind::kAvgPool2d: {
        if (shape.size() != 3) Refuse(l, "a window layer on a flat input");
        const ReferenceWindow h = ReferenceSlide(shape[1], l.kernel, l.stride, l.padding);
        const ReferenceWindow w = ReferenceSlide(shape[2], l.kernel, l.stride, l.padding);
        if (h.out < 1 || w.out < 1) Refuse(l, "a window larger than its input");
        if (h.pad_before != w.pad_before || h.pad_after != w.pad_after) {
          Refuse(l, "padding that differs between height and width");
        }
        op.pad_before = h.pad_before;
        op.pad_after = h.pad_after;
        const bool conv = l.kind == LayerKind::kConv2d;
        op.out = {conv ? l.units : shape[0], h.out, w.out};
        if (conv) {
          add_param("kernel", l.units * shape[0] * l.kernel * l.kernel);
          add_param("bias", l.units);
        }
        break;
      }
      case LayerKind::kFlatten:
        op.out = {Product(shape)};
        break;
      case LayerKind::kActivation:
      case LayerKind::kDropout:
        op.out = shape;
        break;
      case LayerKind::kEmbedding: {
        if (i != 0 || shape.size() != 1) Refuse(l, "an embedding that is not first on flat ids");
        op.id_columns = inputs.id_columns > 0 ? inputs.id_columns : shape[0];
        op.fields = l.fields == 0 ? op.id_columns : l.fields;
        op.table_rows = l.sparse ? inputs.sparse_rows : l.vocab;
        op.out = {op.fields * l.units + (shape[0] - op.id_columns)};
        add_param("table", op.table_rows * l.units);
        break;
      }
    }
    params += op.param_sizes.size();
    shape = op.out;
    ops_.push_back(op);
    const bool fused = l.kind == LayerKind::kDense || l.kind == LayerKind::kConv2d;
    if (fused && l.activation != Activation::kNone) {
      ReferenceOp act;
      act.spec.kind = LayerKind::kActivation;
      act.spec.name = l.name + "/" + std::string(ActivationName(l.activation));
      act.spec.activation = l.activation;
      act.in = shape;
      act.out = shape;
      act.first_param = params;
      ops_.push_back(act);
    }
  }
}

int64_t ReferenceModel::input_size() const { return Product(input_); }

// One op on one example. `index_base` is the example's first element index in the batch
// (dropout masks are drawn per element of the whole batch).
Vec ReferenceModel::Apply(const ReferenceOp& op, uint32_t op_index,
                          const std::vector<std::vector<double>>& params, const Vec& in,
                          bool training, uint64_t seed, uint64_t index_base) const {
  const LayerSpec& l = op.spec;
  switch (l.kind) {
    case LayerKind::kDense: {  // its activation, if any, is the next op
      const Vec& w = params[op.first_param];
      const Vec& b = params[op.first_param + 1];
      const int64_t n_in = op.in_size(), n_out = op.out_size();
      Vec out(static_cast<size_t>(n_out));
      for (int64_t o = 0; o < n_out; ++o) {
        double s = b[o];
        for (int64_t k = 0; k < n_in; ++k) s += in[k] * w[k * n_out + o];
        out[o] = s;
      }
      return out;
    }
    case LayerKind::kConv2d:
    case LayerKind::kMaxPool2d:
    case LayerKind::kAvgPool2d: {
      const int64_t C = op.in[0], H = op.in[1], W = op.in[2];
      const int64_t F = op.out[0], OH = op.out[1], OW = op.out[2];
      const int64_t k = l.kernel, s = l.stride, p = op.pad_before;
      Vec out(static_cast<size_t>(F * OH * OW));
      for (int64_t f = 0; f < F; ++f) {
        for (int64_t oh = 0; oh < OH; ++oh) {
          for (int64_t ow = 0; ow < OW; ++ow) {
            double acc = 0, best = -INFINITY;
            int64_t count = 0;
            if (l.kind == LayerKind::kConv2d) acc = params[op.first_param + 1][f];
            for (int64_t i = 0; i < k; ++i) {
              for (int64_t j = 0; j < k; ++j) {
                const int64_t h = oh * s + i - p, w = ow * s + j - p;
                if (h < 0 || h >= H || w < 0 || w >= W) continue;  // padding
                if (l.kind == LayerKind::kConv2d) {
                  const Vec& K = params[op.first_param];
                  for (int64_t c = 0; c < C; ++c) {
                    acc += in[(c * H + h) * W + w] * K[((f * C + c) * k + i) * k + j];
                  }
                } else {
                  const double v = in[(f * H + h) * W + w];
                  best = std::max(best, v);
                  acc += v;
                  ++count;
                }
              }
            }
            double& y = out[(f * OH + oh) * OW + ow];
            if (l.kind == LayerKind::kConv2d) y = acc;
            else if (l.kind == LayerKind::kMaxPool2d) y = best;
            else y = acc / static_cast<double>(count);  // padding left out of the mean
          }
        }
      }
      return out;
    }
    case LayerKind::kFlatten:
      return in;
    case LayerKind::kActivation: {
      Vec out = in;
      for (double& v : out) {
        if (l.activation == Activation::kRelu) v = std::max(v, 0.0);
        else if (l.activation == Activation::kTanh) v = std::tanh(v);
        else if (l.activation == Activation::kSigmoid) v = 1.0 / (1.0 + std::exp(-v));
      }
      return out;
    }
    case LayerKind::kDropout: {
      Vec out = in;
      if (!training) return out;
      for (size_t e = 0; e < out.size(); ++e) {
        out[e] = ReferenceDropoutKeeps(seed, op_index, index_base + e, l.rate)
                     ? out[e] / (1.0 - static_cast<double>(l.rate))
                     : 0.0;
      }
      return out;
    }
    case LayerKind::kEmbedding:
      return Embed(op, params[op.first_param], in);
  }
  return in;
}

double ReferenceModel::Loss(const std::vector<std::vector<double>>& params, const Vec& x,
                            const std::vector<uint8_t>& y, int batch, bool training,
                            uint64_t seed) const {
  const int64_t inputs = input_size();
  double loss = 0;
  for (int i = 0; i < batch; ++i) {
    Vec a(x.begin() + i * inputs, x.begin() + (i + 1) * inputs);
    for (size_t o = 0; o < ops_.size(); ++o) {
      const ReferenceOp& op = ops_[o];
      a = Apply(op, static_cast<uint32_t>(o), params, a, training, seed,
                static_cast<uint64_t>(i) * static_cast<uint64_t>(op.out_size()));
    }
    if (loss_ == LossKind::kSigmoidCrossEntropy) {
      const double z = a[0];
      loss += std::max(z, 0.0) - z * y[i] + std::log1p(std::exp(-std::fabs(z)));
    } else {
      const double m = *std::max_element(a.begin(), a.end());
      double sum = 0;
      for (double v : a) sum += std::exp(v - m);
      loss += m + std::log(sum) - a[y[i]];
    }
  }
  return loss / batch;
}

}  // namespace parasync::testing
