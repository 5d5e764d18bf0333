#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/denormals.h"
#include "tests/support/reference_model.h"
#include "tests/support/test_models.h"
#include "worker/compute/backend.h"
#include "worker/compute/cpu/cpu_layer.h"
#include "worker/model/model.h"

namespace parasync {
namespace {

using ::parasync::testing::MakeModel;
using ::parasync::testing::ReferenceLoss;

// Parameters (or gradients) of a model as owned host arrays, plus the pointer views the
// backend interface takes.
struct Arrays {
  explicit Arrays(const Model& model) {
    for (const VariableSpec& v : model.variables()) {
      data.emplace_back(static_cast<size_t>(v.num_elements()), 0.0f);
    }
    for (std::vector<float>& d : data) ptrs.push_back(d.data());
    const_ptrs.assign(ptrs.begin(), ptrs.end());
  }
  std::span<const float* const> in() const { return const_ptrs; }
  std::span<float* const> out() { return ptrs; }
  std::vector<std::vector<double>> AsDouble() const {
    std::vector<std::vector<double>> d;
    for (const std::vector<float>& v : data) d.emplace_back(v.begin(), v.end());
    return d;
  }

  std::vector<std::vector<float>> data;
  std::vector<float*> ptrs;
  std::vector<const float*> const_ptrs;
};

std::unique_ptr<ComputeBackend> MakeBackend(const Model& model) {
  Result<std::unique_ptr<ComputeBackend>> backend = CreateCpuBackend(model);
  EXPECT_TRUE(backend.ok()) << backend.status().ToString();
  return backend.ok() ? std::move(backend).value() : nullptr;
}

float Uniform(std::mt19937_64& gen, float lo, float hi) {
  return lo + (hi - lo) * static_cast<float>(gen() >> 40) * (1.0f / 16777216.0f);
}

// A batch and parameters drawn from `seed`: parameters uniform in [-0.5, 0.5], inputs in
// [-1, 1] (or, in an embedding's id columns, integer ids below its table rows), labels the loss accepts.
struct Problem {
  Problem(const Model& model, int batch_size, uint64_t seed) : params(model), batch(batch_size) {
    std::mt19937_64 gen(seed);
    for (std::vector<float>& p : params.data) {
      for (float& v : p) v = Uniform(gen, -0.5f, 0.5f);
    }
    const LayerOp& first = model.ops().front();
    const int64_t inputs = model.input_size();
    const int64_t ids = first.spec.kind == LayerKind::kEmbedding ? first.id_columns : 0;
    x.resize(static_cast<size_t>(batch * inputs));
    for (size_t k = 0; k < x.size(); ++k) {
      x[k] = static_cast<int64_t>(k) % inputs < ids
                 ? static_cast<float>(gen() % static_cast<uint64_t>(first.table_rows))
                 : Uniform(gen, -1.0f, 1.0f);
    }
    const uint64_t classes =
        model.loss() == LossKind::kSigmoidCrossEntropy ? 2 : static_cast<uint64_t>(model.outputs());
    for (int i = 0; i < batch; ++i) y.push_back(static_cast<uint8_t>(gen() % classes));
  }
  Arrays params;
  int batch;
  std::vector<float> x;
  std::vector<uint8_t> y;
};

// Compares `grads` with central finite differences of the double-precision reference loss
// (step 1e-6), for every element of variables up to `max_per_variable` elements and an
// evenly spread sample of larger ones. Returns one line per element that disagrees.
std::vector<std::string> GradientMismatches(const Model& model, const Problem& p,
                                            const Arrays& grads, uint64_t seed,
                                            size_t max_per_variable, int* checked) {
  std::vector<std::vector<double>> params = p.params.AsDouble();
  const std::vector<double> x(p.x.begin(), p.x.end());
  std::vector<std::string> bad;
  constexpr double kStep = 1e-6;
  for (size_t v = 0; v < params.size(); ++v) {
    const size_t n = params[v].size();
    const size_t stride = std::max<size_t>(1, n / max_per_variable);
    for (size_t k = 0; k < n; k += stride) {
      const double original = params[v][k];
      params[v][k] = original + kStep;
      const double up = ReferenceLoss(model, params, x, p.y, p.batch, true, seed);
      params[v][k] = original - kStep;
      const double down = ReferenceLoss(model, params, x, p.y, p.batch, true, seed);
      params[v][k] = original;
      const double numeric = (up - down) / (2 * kStep);
      const double analytic = grads.data[v][k];
      if (std::fabs(analytic - numeric) > 2e-5 + 2e-3 * std::fabs(numeric)) {
        bad.push_back(model.variables()[v].name + "[" + std::to_string(k) + "]: backend " +
                      std::to_string(analytic) + ", finite differences " + std::to_string(numeric));
      }
      ++*checked;
    }
  }
  return bad;
}

// Runs the backend on a random problem and checks its loss against the reference and each
// gradient against finite differences.
void ExpectGradientsMatch(const std::string& description, const std::vector<int64_t>& input,
                          int batch, size_t max_per_variable = 64,
                          const ModelInputs& inputs = {}) {
  SCOPED_TRACE(description + " on " + ShapeString(input) + ", batch " + std::to_string(batch));
  const Model model = MakeModel(description, input, inputs);
  std::unique_ptr<ComputeBackend> backend = MakeBackend(model);
  ASSERT_NE(backend, nullptr);
  const Problem p(model, batch, /*seed=*/7);
  constexpr uint64_t kDropoutSeed = 99;
  Arrays grads(model);
  Result<float> loss =
      backend->ForwardBackward(p.params.in(), p.x.data(), p.y.data(), batch, kDropoutSeed, grads.out());
  ASSERT_TRUE(loss.ok()) << loss.status().ToString();
  const double reference = ReferenceLoss(model, p.params.AsDouble(),
                                         std::vector<double>(p.x.begin(), p.x.end()), p.y, batch,
                                         true, kDropoutSeed);
  EXPECT_NEAR(*loss, reference, 1e-5 * (1 + std::fabs(reference)));
  int checked = 0;
  const std::vector<std::string> bad =
      GradientMismatches(model, p, grads, kDropoutSeed, max_per_variable, &checked);
  for (const std::string& line : bad) ADD_FAILURE() << line;
  EXPECT_GT(checked, 0);
  double largest = 0;
  for (const std::vector<float>& g : grads.data) {
    for (float v : g) largest = std::max(largest, static_cast<double>(std::fabs(v)));
  }
  EXPECT_GT(largest, 1e-3) << "gradients vanish; the check would be vacuous";
}

// ---- Every layer's backward pass against finite differences ----------------------------

class CpuLayerGradientTest : public ::testing::TestWithParam<testing::LayerCase> {};

TEST_P(CpuLayerGradientTest, MatchesFiniteDifferencesOfTheReference) {
  const testing::LayerCase& c = GetParam();
  ExpectGradientsMatch(c.description, c.input, c.batch, 64, c.inputs);
}

INSTANTIATE_TEST_SUITE_P(Layers, CpuLayerGradientTest, ::testing::ValuesIn(testing::LayerCases()),
                         [](const auto& info) { return info.param.name; });

TEST(CpuModelGradientTest, BuiltinModelsOnFashionMnistShapes) {
  // A sample of each large variable's elements: the reference in double is slow.
  for (const testing::LayerCase& c : testing::BuiltinCases()) {
    ExpectGradientsMatch(c.description, c.input, c.batch, 12);
  }
}

TEST(CpuModelGradientTest, CtrOnIdColumnsAndDenseFeatures) {
  // 3 id columns (local ids into 12 compact rows) and 2 dense features per example.
  ExpectGradientsMatch("ctr", {5}, 4, 16, ModelInputs{3, 12});
}

TEST(CpuGradientCheckTest, TheCheckCatchesABrokenGradient) {
  // The comparison itself must be able to fail: one gradient element off by 1e-3 is found.
  const Model model = MakeModel(R"({"layers": [{"type": "conv2d", "filters": 2, "kernel": 2},
                                               {"type": "dense", "units": 3}]})",
                                {1, 3, 3});
  std::unique_ptr<ComputeBackend> backend = MakeBackend(model);
  ASSERT_NE(backend, nullptr);
  const Problem p(model, 2, 7);
  Arrays grads(model);
  ASSERT_TRUE(backend->ForwardBackward(p.params.in(), p.x.data(), p.y.data(), 2, 1, grads.out()).ok());
  int checked = 0;
  EXPECT_TRUE(GradientMismatches(model, p, grads, 1, 64, &checked).empty());
  grads.data[1][1] += 1e-3f;  // conv2d0/bias
  const std::vector<std::string> bad = GradientMismatches(model, p, grads, 1, 64, &checked);
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_NE(bad[0].find("conv2d0/bias[1]"), std::string::npos) << bad[0];
}

// ---- Forward, evaluation and argument checks -------------------------------------------

TEST(CpuBackendTest, LossOfZeroParametersIsLogOfClassCount) {
  const Model model = MakeModel("cnn", {1, 8, 8});
  std::unique_ptr<ComputeBackend> backend = MakeBackend(model);
  ASSERT_NE(backend, nullptr);
  Arrays params(model), grads(model);
  std::vector<float> x(3 * 64, 0.5f);
  std::vector<uint8_t> y = {0, 4, 9};
  Result<float> loss = backend->ForwardBackward(params.in(), x.data(), y.data(), 3, 0, grads.out());
  ASSERT_TRUE(loss.ok()) << loss.status().ToString();
  EXPECT_NEAR(*loss, std::log(10.0), 1e-6);
}

TEST(CpuBackendTest, EvaluateCountsCorrectAndSumsLossWithoutDropout) {
  // More rows than one evaluation chunk holds, and dropout that must not apply.
  const Model model = MakeModel(R"({"layers": [{"type": "dense", "units": 5, "activation": "relu"},
                                               {"type": "dropout", "rate": 0.5},
                                               {"type": "dense", "units": 3}]})",
                                {4});
  std::unique_ptr<ComputeBackend> backend = MakeBackend(model);
  ASSERT_NE(backend, nullptr);
  constexpr int kRows = 2500;
  const Problem p(model, kRows, 3);
  Result<EvalResult> r = backend->Evaluate(p.params.in(), p.x.data(), p.y.data(), kRows);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->count, kRows);
  const double reference = ReferenceLoss(model, p.params.AsDouble(),
                                         std::vector<double>(p.x.begin(), p.x.end()), p.y, kRows,
                                         false, 0);
  EXPECT_NEAR(r->mean_loss(), reference, 1e-5);
  // Correct predictions counted again in five separate calls of 500 rows.
  int64_t correct = 0;
  for (int i = 0; i < kRows; i += 500) {
    Result<EvalResult> part = backend->Evaluate(p.params.in(), p.x.data() + 4 * i, p.y.data() + i, 500);
    ASSERT_TRUE(part.ok());
    correct += part->correct;
  }
  EXPECT_EQ(r->correct, correct);
  EXPECT_GT(correct, 0);
  EXPECT_LT(correct, kRows);
}

TEST(CpuBackendTest, SigmoidAccuracyComparesTheLogitWithZero) {
  const Model model = MakeModel(R"({"layers": [{"type": "dense", "units": 1}],
                                   "loss": "sigmoid_cross_entropy"})",
                                {1});
  std::unique_ptr<ComputeBackend> backend = MakeBackend(model);
  ASSERT_NE(backend, nullptr);
  Arrays params(model);
  params.data[0][0] = 1.0f;  // logit = x
  const std::vector<float> x = {2.0f, -1.0f, 3.0f, -0.5f};
  const std::vector<uint8_t> y = {1, 0, 0, 1};
  Result<EvalResult> r = backend->Evaluate(params.in(), x.data(), y.data(), 4);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->correct, 2);
}

TEST(CpuBackendTest, ScratchReuseAcrossBatchSizesGivesSameResults) {
  const Model model = MakeModel("lenet5", {1, 28, 28});
  const Problem p(model, 5, 11);
  std::unique_ptr<ComputeBackend> fresh = MakeBackend(model);
  std::unique_ptr<ComputeBackend> reused = MakeBackend(model);
  ASSERT_TRUE(fresh != nullptr && reused != nullptr);
  Arrays g1(model), g2(model);
  ASSERT_TRUE(reused->ForwardBackward(p.params.in(), p.x.data(), p.y.data(), 5, 1, g2.out()).ok());
  Result<float> a = fresh->ForwardBackward(p.params.in(), p.x.data(), p.y.data(), 3, 1, g1.out());
  Result<float> b = reused->ForwardBackward(p.params.in(), p.x.data(), p.y.data(), 3, 1, g2.out());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(g1.data, g2.data);
}

TEST(CpuBackendTest, GradientDescentStepsReduceTheLoss) {
  const Model model = MakeModel("cnn", {1, 10, 10});
  std::unique_ptr<ComputeBackend> backend = MakeBackend(model);
  ASSERT_NE(backend, nullptr);
  Problem p(model, 16, 5);
  for (std::vector<float>& v : p.params.data) {
    for (float& w : v) w *= 0.1f;
  }
  Arrays grads(model);
  float first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    Result<float> loss = backend->ForwardBackward(p.params.in(), p.x.data(), p.y.data(), 16, 0, grads.out());
    ASSERT_TRUE(loss.ok()) << loss.status().ToString();
    if (step == 0) first = *loss;
    last = *loss;
    for (size_t v = 0; v < grads.data.size(); ++v) {
      for (size_t k = 0; k < grads.data[v].size(); ++k) p.params.data[v][k] -= 0.1f * grads.data[v][k];
    }
  }
  EXPECT_LT(last, 0.5f * first);
}

TEST(CpuBackendTest, BadLabelsIdsBatchesAndArraysAreInvalidArgument) {
  const Model model = MakeModel("4-3", {4});
  std::unique_ptr<ComputeBackend> backend = MakeBackend(model);
  ASSERT_NE(backend, nullptr);
  Arrays params(model), grads(model);
  std::vector<float> x(8, 0.1f);
  std::vector<uint8_t> y = {1, 3};
  Result<float> r = backend->ForwardBackward(params.in(), x.data(), y.data(), 2, 0, grads.out());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("label 3 of example 1"), std::string::npos);
  y[1] = 0;
  EXPECT_FALSE(backend->ForwardBackward(params.in(), x.data(), y.data(), 0, 0, grads.out()).ok());
  EXPECT_FALSE(backend->ForwardBackward(params.in().first(1), x.data(), y.data(), 2, 0, grads.out()).ok());

  const Model embed = MakeModel(R"({"layers": [{"type": "embedding", "vocab": 5, "dim": 2},
                                               {"type": "dense", "units": 2}]})",
                                {2});
  std::unique_ptr<ComputeBackend> eb = MakeBackend(embed);
  ASSERT_NE(eb, nullptr);
  Arrays ep(embed), eg(embed);
  for (const std::vector<float>& ids : {std::vector<float>{0, 1, 4, 5}, std::vector<float>{0, 1, 2.5f, 1}}) {
    Result<float> bad = eb->ForwardBackward(ep.in(), ids.data(), y.data(), 2, 0, eg.out());
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(bad.status().message().find("of example 1 is not an integer in [0, 5)"), std::string::npos)
        << bad.status().message();
  }
}

// ---- The embedding layer on its own -------------------------------------------------------

// A sparse embedding of dim 2 over 4 id columns in 2 fields, then 2 dense features; 5 compact
// rows, row r = {10r + 1, 10r + 2}.
struct EmbeddingCase {
  explicit EmbeddingCase(const std::string& combiner)
      : model(MakeModel(R"({"layers": [{"type": "embedding", "dim": 2, "sparse": true, "fields": 2,
                                        "combiner": ")" + combiner + R"("},
                                       {"type": "dense", "units": 1}],
                            "loss": "sigmoid_cross_entropy"})",
                        {6}, ModelInputs{4, 5})),
        layer(cpu::MakeEmbeddingLayer(model.ops()[0])) {
    for (int r = 0; r < 5; ++r) table.insert(table.end(), {10.0f * r + 1, 10.0f * r + 2});
  }
  Model model;
  std::unique_ptr<cpu::CpuLayer> layer;
  std::vector<float> table;
  // Example 0 repeats local id 4 in its second field; the dense features are not ids.
  std::vector<float> x = {0, 1, 4, 4, 0.5f, -2.5f,  //
                          3, 0, 1, 3, 7, 8};
};

TEST(CpuEmbeddingLayerTest, FieldsAndDenseFeaturesMatchAHandWrittenReference) {
  for (const std::string combiner : {"sum", "mean"}) {
    SCOPED_TRACE(combiner);
    EmbeddingCase c(combiner);
    ASSERT_EQ(c.model.ops()[0].out, (std::vector<int64_t>{2 * 2 + 2}));
    const float s = combiner == "mean" ? 0.5f : 1.0f;  // bags of 2
    const float* params[] = {c.table.data()};
    std::vector<float> y(12, -1.0f);
    cpu::Pass pass;
    pass.rows = 2;
    ASSERT_TRUE(c.layer->Forward(params, c.x.data(), y.data(), pass).ok());
    // Rows 0+1 | 4+4, then the features; rows 3+0 | 1+3, then the features.
    const std::vector<float> want = {12 * s, 14 * s, 82 * s, 84 * s, 0.5f, -2.5f,
                                     32 * s, 34 * s, 42 * s, 44 * s, 7,    8};
    EXPECT_EQ(y, want);

    // The dense features' gradients (100) go nowhere; id 4's two uses add up in its row.
    const std::vector<float> dy = {1, 2, 3, 4, 100, 100, 5, 6, 7, 8, 100, 100};
    std::vector<float> dtable(10, 99.0f);
    float* grads[] = {dtable.data()};
    ASSERT_TRUE(c.layer->Backward(params, c.x.data(), y.data(), dy.data(), nullptr, grads, pass).ok());
    const std::vector<float> want_grad = {6 * s, 8 * s,  8 * s, 10 * s, 0, 0,
                                          12 * s, 14 * s, 6 * s, 8 * s};
    EXPECT_EQ(dtable, want_grad);
  }
}

TEST(CpuEmbeddingLayerTest, IdsBeyondTheCompactRowsAreRefusedFeaturesAreNotIds) {
  EmbeddingCase c("sum");
  const float* params[] = {c.table.data()};
  std::vector<float> y(12);
  cpu::Pass pass;
  pass.rows = 2;
  pass.first_example = 10;
  c.x[4] = 1e9f;  // a dense feature: anything goes
  EXPECT_TRUE(c.layer->Forward(params, c.x.data(), y.data(), pass).ok());
  c.x[8] = 5;  // example 1's third id: only rows 0..4 exist
  const Status bad = c.layer->Forward(params, c.x.data(), y.data(), pass);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("id 5.000000 of example 11 is not an integer in [0, 5)"),
            std::string::npos)
      << bad.message();
}

}  // namespace
}  // namespace parasync

namespace parasync {
namespace {

// The compute threads flush denormals (common/denormals.h) whatever the thread that sized
// them had, and a pass whose every product is denormal computes zeros: with IEEE denormals
// each would take x86's slow path.
TEST(CpuComputeThreadsTest, FlushDenormalsWhateverTheCallerHad) {
  std::thread([] {
    KeepDenormalsOnThisThread();
    // This thread's OpenMP pool is made here, while the bits are clear: its threads keep
    // what they were made with until SetCpuComputeThreads sets them.
    EXPECT_FALSE(CpuComputeThreadsFlushDenormals());
    SetCpuComputeThreads(2);
    EXPECT_TRUE(CpuComputeThreadsFlushDenormals());

    const Model model = testing::MakeModel("64-10", {64});
    std::unique_ptr<ComputeBackend> backend = MakeBackend(model);
    ASSERT_NE(backend, nullptr);
    Arrays params(model);
    std::fill(params.data[0].begin(), params.data[0].end(), 1e-20f);  // kernel; bias 0
    constexpr int64_t kExamples = 512;
    std::vector<float> x(static_cast<size_t>(kExamples * 64), 1e-20f);
    std::vector<uint8_t> y(kExamples, 0);
    std::vector<float> logits(static_cast<size_t>(kExamples * 10), -1.0f);
    auto result = backend->Evaluate(params.in(), x.data(), y.data(), kExamples, logits.data());
    ASSERT_TRUE(result.ok()) << result.status().ToString();
    // 64 products of 1e-40 each: IEEE gives 6.4e-39, a denormal; flushed, exactly 0.
    EXPECT_EQ(std::count(logits.begin(), logits.end(), 0.0f), static_cast<long>(logits.size()))
        << "some logit kept a denormal";
    SetCpuComputeThreads(1);
  }).join();
}

}  // namespace
}  // namespace parasync
