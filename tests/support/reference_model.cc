#include "tests/support/reference_model.h"

#include <algorithm>
#include <cmath>

#include "worker/compute/checks.h"

namespace parasync::testing {

namespace {

using Vec = std::vector<double>;

// An embedding on one example: fields of id_columns / fields ids each, one after another,
// each the sum (or mean) of its ids' rows, then the dense inputs as they are.
Vec Embed(const LayerOp& op, const Vec& table, const Vec& in) {
  const LayerSpec& l = op.spec;
  const int64_t bag = op.id_columns / l.fields;
  Vec out;
  for (int64_t f = 0; f < l.fields; ++f) {
    Vec field(static_cast<size_t>(l.units), 0.0);
    for (int64_t k = 0; k < bag; ++k) {
      const int64_t id = static_cast<int64_t>(in[f * bag + k]);
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

// One op on one example. `index_base` is the example's first element index in the batch
// (dropout masks are drawn per element of the whole batch).
Vec Apply(const LayerOp& op, uint32_t op_index, const std::vector<std::vector<double>>& params,
          const Vec& in, bool training, uint64_t seed, uint64_t index_base) {
  const LayerSpec& l = op.spec;
  switch (l.kind) {
    case LayerKind::kDense: {
      const Vec& w = params[static_cast<size_t>(op.first_variable)];
      const Vec& b = params[static_cast<size_t>(op.first_variable) + 1];
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
      const int64_t k = l.kernel, s = l.stride, p = op.pad_begin;
      Vec out(static_cast<size_t>(F * OH * OW));
      for (int64_t f = 0; f < F; ++f) {
        for (int64_t oh = 0; oh < OH; ++oh) {
          for (int64_t ow = 0; ow < OW; ++ow) {
            double acc = 0, best = -INFINITY;
            int64_t count = 0;
            if (l.kind == LayerKind::kConv2d) {
              acc = params[static_cast<size_t>(op.first_variable) + 1][f];
            }
            for (int64_t i = 0; i < k; ++i) {
              for (int64_t j = 0; j < k; ++j) {
                const int64_t h = oh * s + i - p, w = ow * s + j - p;
                if (h < 0 || h >= H || w < 0 || w >= W) continue;  // padding
                if (l.kind == LayerKind::kConv2d) {
                  const Vec& K = params[static_cast<size_t>(op.first_variable)];
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
            else y = acc / static_cast<double>(count);
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
        out[e] = compute::DropoutKeeps(seed, op_index, index_base + e, l.rate)
                     ? out[e] / (1.0 - static_cast<double>(l.rate))
                     : 0.0;
      }
      return out;
    }
    case LayerKind::kEmbedding:
      return Embed(op, params[static_cast<size_t>(op.first_variable)], in);
  }
  return in;
}

}  // namespace

double ReferenceLoss(const Model& model, const std::vector<std::vector<double>>& params,
                     const std::vector<double>& x, const std::vector<uint8_t>& y, int batch,
                     bool training, uint64_t seed) {
  const int64_t inputs = model.input_size();
  double loss = 0;
  for (int i = 0; i < batch; ++i) {
    Vec a(x.begin() + i * inputs, x.begin() + (i + 1) * inputs);
    for (size_t o = 0; o < model.ops().size(); ++o) {
      const LayerOp& op = model.ops()[o];
      a = Apply(op, static_cast<uint32_t>(o), params, a, training, seed,
                static_cast<uint64_t>(i) * static_cast<uint64_t>(op.out_size()));
    }
    if (model.loss() == LossKind::kSigmoidCrossEntropy) {
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
