#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "worker/compute/backend.h"
#include "worker/model/mlp.h"

namespace parasync {
namespace {

// Parameters (or gradients) of an MLP as owned host arrays, plus the pointer views the
// backend interface takes.
struct Arrays {
  explicit Arrays(const MlpSpec& spec) {
    for (const VariableSpec& v : MlpVariables(spec)) {
      data.emplace_back(static_cast<size_t>(v.num_elements()), 0.0f);
    }
    for (std::vector<float>& d : data) ptrs.push_back(d.data());
  }
  std::span<const float* const> in() const {
    const_ptrs.assign(ptrs.begin(), ptrs.end());
    return const_ptrs;
  }
  std::span<float* const> out() { return ptrs; }

  std::vector<std::vector<float>> data;
  std::vector<float*> ptrs;
  mutable std::vector<const float*> const_ptrs;
};

std::unique_ptr<ComputeBackend> MakeBackend(const MlpSpec& spec) {
  Result<std::unique_ptr<ComputeBackend>> backend = CreateCpuBackend(spec);
  EXPECT_TRUE(backend.ok()) << backend.status().ToString();
  return backend.ok() ? std::move(backend).value() : nullptr;
}

// Mean softmax cross-entropy of the MLP in double precision, written independently of the
// backend. If min_abs_preact is given, stores the smallest |pre-activation| of any hidden
// unit, i.e. how close the batch is to a ReLU kink.
double ReferenceLoss(const MlpSpec& spec, const Arrays& params, const std::vector<float>& x,
                     const std::vector<uint8_t>& y, int batch, double* min_abs_preact) {
  double loss = 0.0;
  double min_abs = INFINITY;
  const int layers = spec.num_layers();
  for (int i = 0; i < batch; ++i) {
    std::vector<double> a(x.begin() + i * spec.widths[0], x.begin() + (i + 1) * spec.widths[0]);
    for (int l = 0; l < layers; ++l) {
      const int64_t in = spec.widths[l];
      const int64_t out = spec.widths[l + 1];
      const std::vector<float>& w = params.data[2 * l];
      const std::vector<float>& b = params.data[2 * l + 1];
      std::vector<double> z(static_cast<size_t>(out));
      for (int64_t o = 0; o < out; ++o) {
        double s = b[o];
        for (int64_t k = 0; k < in; ++k) s += a[k] * w[k * out + o];
        z[o] = s;
      }
      if (l + 1 < layers) {
        for (double& v : z) {
          min_abs = std::min(min_abs, std::fabs(v));
          v = std::max(v, 0.0);
        }
      }
      a = std::move(z);
    }
    const double m = *std::max_element(a.begin(), a.end());
    double sum = 0.0;
    for (double v : a) sum += std::exp(v - m);
    loss += m + std::log(sum) - a[y[i]];
  }
  if (min_abs_preact != nullptr) *min_abs_preact = min_abs;
  return loss / batch;
}

void FillUniform(std::vector<float>* v, float lo, float hi, std::mt19937_64* gen) {
  for (float& f : *v) {
    f = lo + (hi - lo) * static_cast<float>((*gen)() >> 40) * (1.0f / 16777216.0f);
  }
}

TEST(CpuBackendTest, GradientMatchesCentralFiniteDifferencesForEveryParameter) {
  const MlpSpec spec{{7, 5, 4, 3}};
  constexpr int kBatch = 6;
  std::unique_ptr<ComputeBackend> backend = MakeBackend(spec);
  ASSERT_NE(backend, nullptr);

  // Pick the first seed whose batch stays clear of ReLU kinks, so a +-eps step never
  // crosses one (a crossing would make the finite difference meaningless, not the backend
  // wrong).
  Arrays params(spec);
  std::vector<float> x(kBatch * 7);
  std::vector<uint8_t> y(kBatch);
  double margin = 0.0;
  uint64_t seed = 1;
  for (; seed < 200; ++seed) {
    std::mt19937_64 gen(seed);
    for (std::vector<float>& p : params.data) FillUniform(&p, -1.0f, 1.0f, &gen);
    FillUniform(&x, 0.0f, 1.0f, &gen);
    for (int i = 0; i < kBatch; ++i) y[i] = static_cast<uint8_t>(gen() % 3);
    ReferenceLoss(spec, params, x, y, kBatch, &margin);
    if (margin > 0.15) break;
  }
  ASSERT_GT(margin, 0.15) << "no kink-free seed found";

  Arrays grads(spec);
  Result<float> loss = backend->ForwardBackward(params.in(), x.data(), y.data(), kBatch,
                                                grads.out());
  ASSERT_TRUE(loss.ok()) << loss.status().ToString();
  EXPECT_NEAR(*loss, ReferenceLoss(spec, params, x, y, kBatch, nullptr), 1e-5);

  constexpr float kEps = 1e-2f;
  Arrays scratch(spec);  // gradients of the perturbed runs, ignored
  int checked = 0;
  double max_abs_grad = 0.0;
  for (size_t v = 0; v < params.data.size(); ++v) {
    for (size_t k = 0; k < params.data[v].size(); ++k) {
      float& p = params.data[v][k];
      const float original = p;
      const float up = original + kEps;
      const float down = original - kEps;
      p = up;
      Result<float> loss_up =
          backend->ForwardBackward(params.in(), x.data(), y.data(), kBatch, scratch.out());
      p = down;
      Result<float> loss_down =
          backend->ForwardBackward(params.in(), x.data(), y.data(), kBatch, scratch.out());
      p = original;
      ASSERT_TRUE(loss_up.ok() && loss_down.ok());
      const double numeric = (static_cast<double>(*loss_up) - *loss_down) / (up - down);
      const double analytic = grads.data[v][k];
      EXPECT_NEAR(analytic, numeric, 5e-4 + 1e-2 * std::fabs(numeric))
          << "variable " << v << " element " << k;
      max_abs_grad = std::max(max_abs_grad, std::fabs(analytic));
      ++checked;
    }
  }
  EXPECT_EQ(checked, 7 * 5 + 5 + 5 * 4 + 4 + 4 * 3 + 3);
  EXPECT_GT(max_abs_grad, 1e-2) << "gradients vanish; the check would be vacuous";
}

TEST(CpuBackendTest, LossOfZeroParametersIsLogOfClassCount) {
  const MlpSpec spec{{4, 6, 5}};
  std::unique_ptr<ComputeBackend> backend = MakeBackend(spec);
  ASSERT_NE(backend, nullptr);
  Arrays params(spec);
  Arrays grads(spec);
  for (std::vector<float>& g : grads.data) std::fill(g.begin(), g.end(), 7.0f);  // stale
  std::vector<float> x = {0.1f, 0.9f, 0.3f, 0.4f, 0.5f, 0.2f, 0.0f, 1.0f};
  std::vector<uint8_t> y = {4, 4};
  Result<float> loss = backend->ForwardBackward(params.in(), x.data(), y.data(), 2, grads.out());
  ASSERT_TRUE(loss.ok()) << loss.status().ToString();
  EXPECT_NEAR(*loss, std::log(5.0), 1e-6);
  // Uniform softmax: the last bias gradient is 1/5 - [c == 4]; everything else is zero
  // (the hidden layer is dead at zero weights, and stale gradients must be overwritten).
  for (int c = 0; c < 5; ++c) {
    EXPECT_NEAR(grads.data[3][c], c == 4 ? 0.2f - 1.0f : 0.2f, 1e-6f) << c;
  }
  for (int v = 0; v < 3; ++v) {
    for (float g : grads.data[v]) EXPECT_EQ(g, 0.0f) << "variable " << v;
  }
}

TEST(CpuBackendTest, EvaluateCountsCorrectAndSumsLossAcrossChunks) {
  // One identity layer: logits = x, so the prediction and loss of each row are known.
  const MlpSpec spec{{3, 3}};
  std::unique_ptr<ComputeBackend> backend = MakeBackend(spec);
  ASSERT_NE(backend, nullptr);
  Arrays params(spec);
  for (int k = 0; k < 3; ++k) params.data[0][k * 3 + k] = 1.0f;

  constexpr int64_t kN = 2500;  // more than one evaluation chunk
  std::vector<float> x(kN * 3, 0.0f);
  std::vector<uint8_t> y(kN);
  int64_t want_correct = 0;
  double want_loss = 0.0;
  const double lse = std::log(std::exp(2.0) + 2.0);
  for (int64_t i = 0; i < kN; ++i) {
    const int hot = static_cast<int>(i % 3);
    x[i * 3 + hot] = 2.0f;
    const bool right = i % 5 != 0;
    y[i] = static_cast<uint8_t>(right ? hot : (hot + 1) % 3);
    want_correct += right ? 1 : 0;
    want_loss += right ? lse - 2.0 : lse;
  }
  Result<EvalResult> r = backend->Evaluate(params.in(), x.data(), y.data(), kN);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->count, kN);
  EXPECT_EQ(r->correct, want_correct);
  EXPECT_EQ(want_correct, 2000);
  EXPECT_NEAR(r->loss_sum, want_loss, 1e-6 * want_loss);
}

TEST(CpuBackendTest, EvaluateLossAgreesWithForwardBackward) {
  const MlpSpec spec{{10, 8, 4}};
  std::unique_ptr<ComputeBackend> backend = MakeBackend(spec);
  ASSERT_NE(backend, nullptr);
  std::mt19937_64 gen(7);
  Arrays params(spec);
  for (std::vector<float>& p : params.data) FillUniform(&p, -1.0f, 1.0f, &gen);
  constexpr int kBatch = 33;
  std::vector<float> x(kBatch * 10);
  FillUniform(&x, 0.0f, 1.0f, &gen);
  std::vector<uint8_t> y(kBatch);
  for (uint8_t& l : y) l = static_cast<uint8_t>(gen() % 4);
  Arrays grads(spec);
  Result<float> loss = backend->ForwardBackward(params.in(), x.data(), y.data(), kBatch,
                                                grads.out());
  Result<EvalResult> eval = backend->Evaluate(params.in(), x.data(), y.data(), kBatch);
  ASSERT_TRUE(loss.ok() && eval.ok());
  EXPECT_EQ(eval->count, kBatch);
  EXPECT_NEAR(eval->loss_sum / kBatch, *loss, 1e-5);
}

TEST(CpuBackendTest, ScratchReuseAcrossBatchSizesGivesSameResults) {
  const MlpSpec spec{{6, 9, 3}};
  std::unique_ptr<ComputeBackend> backend = MakeBackend(spec);
  ASSERT_NE(backend, nullptr);
  std::mt19937_64 gen(11);
  Arrays params(spec);
  for (std::vector<float>& p : params.data) FillUniform(&p, -1.0f, 1.0f, &gen);
  std::vector<float> x(8 * 6);
  FillUniform(&x, 0.0f, 1.0f, &gen);
  std::vector<uint8_t> y = {0, 1, 2, 0, 1, 2, 2, 1};

  Arrays first(spec), small(spec), again(spec);
  Result<float> l1 = backend->ForwardBackward(params.in(), x.data(), y.data(), 8, first.out());
  Result<float> l2 = backend->ForwardBackward(params.in(), x.data(), y.data(), 3, small.out());
  Result<float> l3 = backend->ForwardBackward(params.in(), x.data(), y.data(), 8, again.out());
  ASSERT_TRUE(l1.ok() && l2.ok() && l3.ok());
  EXPECT_EQ(*l1, *l3);
  EXPECT_NE(*l1, *l2);
  EXPECT_EQ(first.data, again.data);

  // A fresh backend on the small batch agrees with the warmed-up one.
  std::unique_ptr<ComputeBackend> fresh = MakeBackend(spec);
  Arrays fresh_grads(spec);
  Result<float> l4 = fresh->ForwardBackward(params.in(), x.data(), y.data(), 3,
                                            fresh_grads.out());
  ASSERT_TRUE(l4.ok());
  EXPECT_EQ(*l2, *l4);
  EXPECT_EQ(small.data, fresh_grads.data);
}

TEST(CpuBackendTest, GradientDescentStepsReduceLoss) {
  const MlpSpec spec{{4, 16, 2}};
  std::unique_ptr<ComputeBackend> backend = MakeBackend(spec);
  ASSERT_NE(backend, nullptr);
  std::mt19937_64 gen(3);
  Arrays params(spec);
  FillUniform(&params.data[0], -0.5f, 0.5f, &gen);
  FillUniform(&params.data[2], -0.5f, 0.5f, &gen);
  // Class = whether the first feature exceeds the second.
  constexpr int kBatch = 64;
  std::vector<float> x(kBatch * 4);
  FillUniform(&x, 0.0f, 1.0f, &gen);
  std::vector<uint8_t> y(kBatch);
  for (int i = 0; i < kBatch; ++i) y[i] = x[i * 4] > x[i * 4 + 1] ? 1 : 0;

  Arrays grads(spec);
  Result<float> start = backend->ForwardBackward(params.in(), x.data(), y.data(), kBatch,
                                                 grads.out());
  ASSERT_TRUE(start.ok());
  float last = *start;
  for (int step = 0; step < 200; ++step) {
    for (size_t v = 0; v < params.data.size(); ++v) {
      for (size_t k = 0; k < params.data[v].size(); ++k) {
        params.data[v][k] -= 0.5f * grads.data[v][k];
      }
    }
    Result<float> loss = backend->ForwardBackward(params.in(), x.data(), y.data(), kBatch,
                                                  grads.out());
    ASSERT_TRUE(loss.ok());
    last = *loss;
  }
  EXPECT_LT(last, 0.5f * *start) << "start " << *start << " end " << last;
}

TEST(CpuBackendTest, LabelOutsideClassesIsInvalidArgument) {
  const MlpSpec spec{{2, 3}};
  std::unique_ptr<ComputeBackend> backend = MakeBackend(spec);
  ASSERT_NE(backend, nullptr);
  Arrays params(spec), grads(spec);
  std::vector<float> x = {0.5f, 0.5f, 0.1f, 0.2f};
  std::vector<uint8_t> y = {2, 3};
  Result<float> loss = backend->ForwardBackward(params.in(), x.data(), y.data(), 2, grads.out());
  ASSERT_FALSE(loss.ok());
  EXPECT_EQ(loss.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(loss.status().message().find("label 3"), std::string::npos)
      << loss.status().message();

  Result<EvalResult> eval = backend->Evaluate(params.in(), x.data(), y.data(), 2);
  ASSERT_FALSE(eval.ok());
  EXPECT_EQ(eval.status().code(), StatusCode::kInvalidArgument);
}

TEST(CpuBackendTest, BadBatchOrArraysIsInvalidArgument) {
  const MlpSpec spec{{2, 3}};
  std::unique_ptr<ComputeBackend> backend = MakeBackend(spec);
  ASSERT_NE(backend, nullptr);
  Arrays params(spec), grads(spec);
  std::vector<float> x = {0.5f, 0.5f};
  std::vector<uint8_t> y = {1};
  for (int batch : {0, -1}) {
    Result<float> r = backend->ForwardBackward(params.in(), x.data(), y.data(), batch,
                                               grads.out());
    ASSERT_FALSE(r.ok()) << batch;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  }
  std::span<const float* const> too_few = params.in().first(1);
  Result<float> r = backend->ForwardBackward(too_few, x.data(), y.data(), 1, grads.out());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  Result<EvalResult> e = backend->Evaluate(params.in(), x.data(), y.data(), -1);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
}

TEST(CpuBackendTest, CreateRejectsBadSpec) {
  for (const MlpSpec& spec : {MlpSpec{}, MlpSpec{{784}}, MlpSpec{{784, 0, 10}},
                              MlpSpec{{784, 300}}}) {
    Result<std::unique_ptr<ComputeBackend>> b = CreateCpuBackend(spec);
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  }
  Result<std::unique_ptr<ComputeBackend>> ok = CreateCpuBackend(MlpSpec{{784, 256, 10}});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)->name(), "cpu");
}

}  // namespace
}  // namespace parasync
