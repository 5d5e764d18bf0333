#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/denormals.h"
#include "tests/support/reference_model.h"
#include "tests/support/test_models.h"
#include "worker/compute/backend.h"
#include "worker/compute/cpu/cpu_backend.h"
#include "worker/compute/cpu/cpu_layer.h"
#include "worker/model/model.h"

namespace parasync {
namespace {

using ::parasync::testing::MakeModel;
using ::parasync::testing::MakeSpec;
using ::parasync::testing::ReferenceModel;
using ::parasync::testing::ReferenceSlide;
using ::parasync::testing::ReferenceWindow;

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

// How large a problem's parameters are.
enum class Scale {
  kHalf,         // uniform in [-0.5, 0.5]: large enough for small layers' gradients to matter
  kInitializer,  // uniform in ± each kernel's initializer limit (Glorot), biases ± 0.1: what
                 // training starts from; on wide layers ± 0.5 saturates the softmax and
                 // leaves gradients of ~0 to compare
};

// A batch and parameters drawn from `seed`: parameters by `scale`, inputs in [-1, 1] (or, in
// an embedding's id columns, integer ids below its table rows), labels the loss accepts.
struct Problem {
  Problem(const Model& model, int batch_size, uint64_t seed, Scale scale = Scale::kHalf)
      : params(model), batch(batch_size) {
    std::mt19937_64 gen(seed);
    for (size_t i = 0; i < params.data.size(); ++i) {
      const Initializer& init = model.variables()[i].init;
      const float limit = scale == Scale::kHalf                ? 0.5f
                          : init.kind == InitKind::kUniform ? init.value
                                                            : 0.1f;
      for (float& v : params.data[i]) v = Uniform(gen, -limit, limit);
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

// A model under test and its double-precision reference, both from the same description;
// the reference derives its own shapes, padding and op indices from it (reference_model.h).
struct Subject {
  Subject(const std::string& description, const std::vector<int64_t>& input,
          const ModelInputs& inputs = {})
      : model(MakeModel(description, input, inputs)),
        reference(MakeSpec(description), input, inputs) {}
  Model model;
  ReferenceModel reference;
};

// The Model's geometry (what the backend runs) against the reference's own: op by op the
// same kinds, shapes, padding splits, id columns and variables.
void ExpectSameGeometry(const Model& model, const ReferenceModel& reference) {
  ASSERT_EQ(model.ops().size(), reference.ops().size());
  for (size_t i = 0; i < model.ops().size(); ++i) {
    const LayerOp& m = model.ops()[i];
    const testing::ReferenceOp& r = reference.ops()[i];
    SCOPED_TRACE("op " + std::to_string(i) + " " + m.spec.name);
    EXPECT_EQ(m.spec.kind, r.spec.kind);
    EXPECT_EQ(m.in, r.in);
    EXPECT_EQ(m.out, r.out);
    EXPECT_EQ(m.pad_begin, r.pad_before);
    EXPECT_EQ(m.pad_end, r.pad_after);
    EXPECT_EQ(m.id_columns, r.id_columns);
    EXPECT_EQ(m.table_rows, r.table_rows);
    ASSERT_EQ(static_cast<size_t>(m.num_variables), r.param_sizes.size());
    ASSERT_EQ(static_cast<size_t>(m.first_variable), r.first_param);
    for (size_t v = 0; v < r.param_sizes.size(); ++v) {
      const VariableSpec& var = model.variables()[r.first_param + v];
      EXPECT_EQ(var.name, r.param_names[v]);
      EXPECT_EQ(var.num_elements(), r.param_sizes[v]) << var.name;
    }
  }
}

// A variable's checked gradient elements must reach this (in absolute value, the largest of
// them), 50 times the comparison's absolute tolerance: otherwise its comparison would be
// zeros against zeros and could not fail.
constexpr double kMeaningfulGradient = 1e-3;

// What comparing a backend's gradients with the reference's finite differences found.
struct GradientCheck {
  std::vector<std::string> mismatches;  // one line per element that disagrees
  std::vector<std::string> vanishing;   // one line per variable whose checked gradient is ~0
  int checked = 0;                      // elements compared
};

// The elements of a variable of `n` the check compares: all up to `max`, else one drawn at
// random from each of `max` equal blocks (spread out, and not all of one residue: a fixed
// stride can meet only the even columns of a kernel).
std::vector<size_t> CheckedElements(size_t n, size_t max, uint64_t seed) {
  std::vector<size_t> picked;
  if (n <= max) {
    for (size_t k = 0; k < n; ++k) picked.push_back(k);
    return picked;
  }
  std::mt19937_64 gen(seed);
  for (size_t j = 0; j < max; ++j) {
    const size_t first = j * n / max, last = (j + 1) * n / max;
    picked.push_back(first + static_cast<size_t>(gen() % (last - first)));
  }
  return picked;
}

// Compares `grads` with central finite differences of the reference loss (step 1e-6), for
// every element of variables up to `max_per_variable` elements and a spread-out sample of
// larger ones (CheckedElements).
GradientCheck CheckGradients(const ReferenceModel& reference, const Problem& p,
                             const Arrays& grads, uint64_t seed, size_t max_per_variable) {
  std::vector<std::vector<double>> params = p.params.AsDouble();
  const std::vector<double> x(p.x.begin(), p.x.end());
  std::vector<std::string> names;
  for (const testing::ReferenceOp& op : reference.ops()) {
    names.insert(names.end(), op.param_names.begin(), op.param_names.end());
  }
  GradientCheck check;
  constexpr double kStep = 1e-6;
  for (size_t v = 0; v < params.size(); ++v) {
    const size_t n = params[v].size();
    double largest = 0;
    for (size_t k : CheckedElements(n, max_per_variable, v)) {
      const double original = params[v][k];
      params[v][k] = original + kStep;
      const double up = reference.Loss(params, x, p.y, p.batch, true, seed);
      params[v][k] = original - kStep;
      const double down = reference.Loss(params, x, p.y, p.batch, true, seed);
      params[v][k] = original;
      const double numeric = (up - down) / (2 * kStep);
      const double analytic = grads.data[v][k];
      largest = std::max(largest, std::fabs(numeric));
      if (std::fabs(analytic - numeric) > 2e-5 + 2e-3 * std::fabs(numeric)) {
        check.mismatches.push_back(names[v] + "[" + std::to_string(k) + "]: backend " +
                                   std::to_string(analytic) + ", finite differences " +
                                   std::to_string(numeric));
      }
      ++check.checked;
    }
    if (largest < kMeaningfulGradient) {
      check.vanishing.push_back(names[v] + ": largest checked gradient " +
                                std::to_string(largest) + " (of " + std::to_string(n) +
                                " elements)");
    }
  }
  return check;
}

// Runs the backend on a random problem and checks its geometry and loss against the
// reference, each gradient against finite differences, and that no variable's gradient
// vanishes.
void ExpectGradientsMatch(const std::string& description, const std::vector<int64_t>& input,
                          int batch, size_t max_per_variable = 64,
                          const ModelInputs& inputs = {}, Scale scale = Scale::kHalf) {
  SCOPED_TRACE(description + " on " + ShapeString(input) + ", batch " + std::to_string(batch));
  const Subject s(description, input, inputs);
  ExpectSameGeometry(s.model, s.reference);
  std::unique_ptr<ComputeBackend> backend = MakeBackend(s.model);
  ASSERT_NE(backend, nullptr);
  const Problem p(s.model, batch, /*seed=*/7, scale);
  constexpr uint64_t kDropoutSeed = 99;
  Arrays grads(s.model);
  Result<float> loss =
      backend->ForwardBackward(p.params.in(), p.x.data(), p.y.data(), batch, kDropoutSeed, grads.out());
  ASSERT_TRUE(loss.ok()) << loss.status().ToString();
  const double reference = s.reference.Loss(p.params.AsDouble(),
                                            std::vector<double>(p.x.begin(), p.x.end()), p.y,
                                            batch, true, kDropoutSeed);
  EXPECT_NEAR(*loss, reference, 1e-5 * (1 + std::fabs(reference)));
  const GradientCheck check = CheckGradients(s.reference, p, grads, kDropoutSeed, max_per_variable);
  for (const std::string& line : check.mismatches) ADD_FAILURE() << line;
  for (const std::string& line : check.vanishing) ADD_FAILURE() << "vanishing: " << line;
  EXPECT_GT(check.checked, 0);
}

// ---- The reference's geometry, on its own and against Model's ---------------------------

TEST(GradientReferenceTest, PaddingSplitsAreTheDocumentedOnesInModelAndReference) {
  // docs/models.md: `valid` only whole windows; `same` ceil(n / stride) outputs, an odd
  // padding's extra row after. Written out by hand, not computed.
  struct Row {
    int64_t n;
    int k, s;
    const char* padding;
    int64_t out, before, after;
  };
  const Row rows[] = {
      {7, 4, 2, "same", 4, 1, 2},   // the documented uneven case: 1 before, 2 after
      {5, 4, 1, "same", 5, 1, 2},   // total 3 at stride 1
      {5, 2, 1, "same", 5, 0, 1},   // an even window: its one row after
      {6, 3, 2, "same", 3, 0, 1},   // an odd remainder at stride 2
      {7, 3, 2, "same", 4, 1, 1},
      {5, 3, 2, "same", 3, 1, 1},
      {28, 5, 1, "same", 28, 2, 2},  // lenet5's first convolution
      {8, 2, 3, "same", 3, 0, 0},   // windows that fit: no padding
      {6, 3, 2, "valid", 2, 0, 0},  // the last row left out
      {5, 2, 2, "valid", 2, 0, 0},
  };
  for (const Row& r : rows) {
    for (const char* type : {"conv2d", "avg_pool2d", "max_pool2d"}) {
      const std::string window = std::string(type) == "conv2d"
                                     ? R"("filters": 1, "kernel": )" + std::to_string(r.k)
                                     : R"("pool": )" + std::to_string(r.k);
      const std::string description = R"({"layers": [{"type": ")" + std::string(type) + R"(", )" +
                                      window + R"(, "stride": )" + std::to_string(r.s) +
                                      R"(, "padding": ")" + r.padding +
                                      R"("}, {"type": "dense", "units": 2}]})";
      SCOPED_TRACE(description + " on " + std::to_string(r.n) + "x" + std::to_string(r.n));
      const Subject s(description, {1, r.n, r.n});
      const LayerOp& m = s.model.ops()[0];
      EXPECT_EQ(m.out[1], r.out);
      EXPECT_EQ(m.out[2], r.out);
      EXPECT_EQ(m.pad_begin, r.before);
      EXPECT_EQ(m.pad_end, r.after);
      const testing::ReferenceOp& ref = s.reference.ops()[0];
      EXPECT_EQ(ref.out[1], r.out);
      EXPECT_EQ(ref.out[2], r.out);
      EXPECT_EQ(ref.pad_before, r.before);
      EXPECT_EQ(ref.pad_after, r.after);
    }
    const ReferenceWindow w = ReferenceSlide(
        r.n, r.k, r.s, std::string(r.padding) == "same" ? Padding::kSame : Padding::kValid);
    EXPECT_EQ(w.out, r.out);
    EXPECT_EQ(w.pad_before, r.before);
    EXPECT_EQ(w.pad_after, r.after);
  }
}

TEST(GradientReferenceTest, GeometryOfEveryLayerCaseAndBuiltinModelIsModels) {
  std::vector<testing::LayerCase> cases = testing::LayerCases();
  for (const testing::LayerCase& c : testing::BuiltinCases()) cases.push_back(c);
  cases.push_back({"ctr", "ctr", {5}, 4, ModelInputs{3, 12}});
  for (const testing::LayerCase& c : cases) {
    SCOPED_TRACE(c.name);
    const Subject s(c.description, c.input, c.inputs);
    ExpectSameGeometry(s.model, s.reference);
  }
}

TEST(GradientReferenceTest, DropoutMasksKeepOneMinusTheRateAndDifferByOpAndSeed) {
  // The reference draws its own masks; they must really drop (else a dropout case would
  // compare two identities) and must depend on the op and the seed.
  constexpr int kElements = 20000;
  int kept = 0, differ_by_op = 0, differ_by_seed = 0;
  for (uint64_t e = 0; e < kElements; ++e) {
    const bool keep = testing::ReferenceDropoutKeeps(99, 3, e, 0.3f);
    kept += keep ? 1 : 0;
    differ_by_op += keep != testing::ReferenceDropoutKeeps(99, 4, e, 0.3f) ? 1 : 0;
    differ_by_seed += keep != testing::ReferenceDropoutKeeps(100, 3, e, 0.3f) ? 1 : 0;
  }
  // Binomial(20000, 0.7): standard deviation 65; 5 of them either way.
  EXPECT_NEAR(kept, 14000, 325);
  // Independent masks differ with probability 2 * 0.7 * 0.3 = 0.42.
  EXPECT_NEAR(differ_by_op, 8400, 350);
  EXPECT_NEAR(differ_by_seed, 8400, 350);
  EXPECT_TRUE(testing::ReferenceDropoutKeeps(99, 3, 0, 0.0f));
}

// ---- Every layer's backward pass against finite differences ----------------------------

class CpuLayerGradientTest : public ::testing::TestWithParam<testing::LayerCase> {};

TEST_P(CpuLayerGradientTest, MatchesFiniteDifferencesOfTheReference) {
  const testing::LayerCase& c = GetParam();
  ExpectGradientsMatch(c.description, c.input, c.batch, 64, c.inputs);
}

INSTANTIATE_TEST_SUITE_P(Layers, CpuLayerGradientTest, ::testing::ValuesIn(testing::LayerCases()),
                         [](const auto& layer) { return layer.param.name; });

TEST(CpuModelGradientTest, BuiltinModelsOnFashionMnistShapes) {
  // A sample of each large variable's elements: the reference in double is slow.
  for (const testing::LayerCase& c : testing::BuiltinCases()) {
    ExpectGradientsMatch(c.description, c.input, c.batch, 12, {}, Scale::kInitializer);
  }
}

TEST(CpuModelGradientTest, CtrOnIdColumnsAndDenseFeatures) {
  // 3 id columns (local ids into 12 compact rows) and 2 dense features per example.
  ExpectGradientsMatch("ctr", {5}, 4, 16, ModelInputs{3, 12});
}

// ---- The check must be able to fail ----------------------------------------------------

TEST(CpuGradientCheckTest, TheCheckCatchesABrokenGradient) {
  // The comparison itself: one gradient element off by 1e-3 is found.
  const Subject s(R"({"layers": [{"type": "conv2d", "filters": 2, "kernel": 2},
                                 {"type": "dense", "units": 3}]})",
                  {1, 3, 3});
  std::unique_ptr<ComputeBackend> backend = MakeBackend(s.model);
  ASSERT_NE(backend, nullptr);
  const Problem p(s.model, 2, 7);
  Arrays grads(s.model);
  ASSERT_TRUE(backend->ForwardBackward(p.params.in(), p.x.data(), p.y.data(), 2, 1, grads.out()).ok());
  EXPECT_TRUE(CheckGradients(s.reference, p, grads, 1, 64).mismatches.empty());
  grads.data[1][1] += 1e-3f;  // conv2d0/bias
  const std::vector<std::string> bad = CheckGradients(s.reference, p, grads, 1, 64).mismatches;
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_NE(bad[0].find("conv2d0/bias[1]"), std::string::npos) << bad[0];
}

TEST(CpuGradientCheckTest, AVanishingGradientIsReported) {
  // Zero parameters: every gradient but the last layer's bias is exactly zero, on both sides.
  const Subject s(R"({"layers": [{"type": "dense", "units": 4, "activation": "tanh"},
                                 {"type": "dense", "units": 3}]})",
                  {5});
  std::unique_ptr<ComputeBackend> backend = MakeBackend(s.model);
  ASSERT_NE(backend, nullptr);
  Problem p(s.model, 3, 7);
  for (std::vector<float>& v : p.params.data) std::fill(v.begin(), v.end(), 0.0f);
  Arrays grads(s.model);
  ASSERT_TRUE(
      backend->ForwardBackward(p.params.in(), p.x.data(), p.y.data(), 3, 1, grads.out()).ok());
  const GradientCheck check = CheckGradients(s.reference, p, grads, 1, 64);
  EXPECT_TRUE(check.mismatches.empty());
  ASSERT_EQ(check.vanishing.size(), 3u);
  EXPECT_EQ(check.vanishing[0].rfind("dense0/kernel:", 0), 0u) << check.vanishing[0];
  EXPECT_EQ(check.vanishing[1].rfind("dense0/bias:", 0), 0u) << check.vanishing[1];
  EXPECT_EQ(check.vanishing[2].rfind("dense1/kernel:", 0), 0u) << check.vanishing[2];
}

// Whether every one of `out` windows of `k` at stride `s` over `n` elements covers the same
// elements with `a` padding before as with `b` (a 3-window over 2 elements covers both
// whether the padding is before or after).
bool SameWindows(int64_t n, int64_t k, int64_t s, int64_t out, int64_t a, int64_t b) {
  for (int64_t o = 0; o < out; ++o) {
    const auto covered = [&](int64_t before) {
      const int64_t first = o * s - before;
      return std::pair(std::max<int64_t>(first, 0), std::min(first + k, n));
    };
    if (covered(a) != covered(b)) return false;
  }
  return true;
}

TEST(CpuGradientCheckTest, ASwappedPaddingSplitIsCaught) {
  // A split of an uneven `same` padding the wrong way round (2 before, 1 after) in what the
  // backend is compared with gives other gradients: the check would catch Model or a
  // backend splitting it so. (Where both splits cover the same elements, they are one.)
  std::set<std::string> swapped;
  for (const testing::LayerCase& c : testing::LayerCases()) {
    const Subject s(c.description, c.input, c.inputs);
    for (size_t i = 0; i < s.reference.ops().size(); ++i) {
      const testing::ReferenceOp& op = s.reference.ops()[i];
      if (SameWindows(op.in.size() == 3 ? op.in[1] : 0, op.spec.kernel, op.spec.stride,
                      op.out.size() == 3 ? op.out[1] : 0, op.pad_before, op.pad_after)) {
        continue;
      }
      SCOPED_TRACE(c.name + ", op " + std::to_string(i) + " " + op.spec.name);
      ReferenceModel wrong = s.reference;
      std::swap(wrong.mutable_ops()[i].pad_before, wrong.mutable_ops()[i].pad_after);
      std::unique_ptr<ComputeBackend> backend = MakeBackend(s.model);
      ASSERT_NE(backend, nullptr);
      const Problem p(s.model, c.batch, 7);
      Arrays grads(s.model);
      ASSERT_TRUE(backend->ForwardBackward(p.params.in(), p.x.data(), p.y.data(), c.batch, 99,
                                           grads.out()).ok());
      EXPECT_TRUE(CheckGradients(s.reference, p, grads, 99, 64).mismatches.empty());
      EXPECT_FALSE(CheckGradients(wrong, p, grads, 99, 64).mismatches.empty());
      swapped.insert(std::string(LayerKindName(op.spec.kind)));
    }
  }
  EXPECT_EQ(swapped, (std::set<std::string>{"conv2d", "avg_pool2d", "max_pool2d"}));
}

// How a test breaks a layer's backward pass.
enum class Break {
  kVariableGradients,  // the gradients of the layer's own variables
  kInputGradient,      // the gradient it passes to the layer below
};

// A CPU layer whose forward pass is the real one's and whose backward pass is the real one's
// with one of its results 1% too large (every element times 1.01). Counts the backward
// passes it broke in *broken.
class BrokenBackward final : public cpu::CpuLayer {
 public:
  BrokenBackward(std::unique_ptr<cpu::CpuLayer> real, const Model& model, const LayerOp& op,
                 Break what, int* broken)
      : real_(std::move(real)), in_size_(op.in_size()), what_(what), broken_(broken) {
    for (int v = 0; v < op.num_variables; ++v) {
      variable_sizes_.push_back(model.variables()[static_cast<size_t>(op.first_variable + v)]
                                    .num_elements());
    }
  }

  compute::OpMemory buffer_use() const override { return real_->buffer_use(); }

  Status Forward(const float* const* params, const float* x, float* y,
                 const cpu::Pass& pass) override {
    return real_->Forward(params, x, y, pass);
  }

  Status Backward(const float* const* params, const float* x, const float* y, const float* dy,
                  float* dx, float* const* grads, const cpu::Pass& pass) override {
    PARASYNC_RETURN_IF_ERROR(real_->Backward(params, x, y, dy, dx, grads, pass));
    if (what_ == Break::kVariableGradients && !variable_sizes_.empty()) {
      for (size_t v = 0; v < variable_sizes_.size(); ++v) Scale(grads[v], variable_sizes_[v]);
      ++*broken_;
    } else if (what_ == Break::kInputGradient && dx != nullptr) {
      Scale(dx, pass.rows * in_size_);
      ++*broken_;
    }
    return Status::Ok();
  }

 private:
  static void Scale(float* a, int64_t n) {
    for (int64_t k = 0; k < n; ++k) a[k] *= 1.01f;
  }

  const std::unique_ptr<cpu::CpuLayer> real_;
  const int64_t in_size_;
  const Break what_;
  int* const broken_;
  std::vector<int64_t> variable_sizes_;
};

// What a mutation test calls an op: its kind, and the variant a kind has.
std::string Variant(const LayerSpec& l) {
  std::string name(LayerKindName(l.kind));
  if (l.kind == LayerKind::kActivation) name += " " + std::string(ActivationName(l.activation));
  if (l.kind == LayerKind::kEmbedding) {
    name += std::string(l.sparse ? " sparse" : "") +
            (l.combiner == Combiner::kMean ? " mean" : " sum");
  }
  return name;
}

// Every variant of every layer kind the model format has (a kind added later is missing
// here until some layer case has it).
std::set<std::string> EveryVariant() {
  std::set<std::string> all;
  for (int k = 0; LayerKindName(static_cast<LayerKind>(k)) != "?"; ++k) {
    LayerSpec l;
    l.kind = static_cast<LayerKind>(k);
    if (l.kind == LayerKind::kActivation) {
      for (int a = 1; ActivationName(static_cast<Activation>(a)) != "?"; ++a) {
        l.activation = static_cast<Activation>(a);
        all.insert(Variant(l));
      }
    } else if (l.kind == LayerKind::kEmbedding) {
      for (bool sparse : {false, true}) {
        for (Combiner c : {Combiner::kSum, Combiner::kMean}) {
          l.sparse = sparse;
          l.combiner = c;
          all.insert(Variant(l));
        }
      }
    } else {
      all.insert(Variant(l));
    }
  }
  return all;
}

TEST(CpuGradientCheckTest, BreakingAnyLayersBackwardPassFailsTheCheck) {
  // Each op of each layer case in turn: its variables' gradients, then the gradient it
  // passes down, 1% off. The check must report a mismatch every time. An op whose backward
  // pass computes neither (the first op of a model, without variables) is never run
  // backward: nothing to break. Flatten has no code of its own (its gradient is a view of
  // the one above); breaking it scales that view.
  std::map<std::string, int> caught;
  int mutations = 0;
  for (const testing::LayerCase& c : testing::LayerCases()) {
    const Subject s(c.description, c.input, c.inputs);
    const Problem p(s.model, c.batch, 7);
    bool variables_below = false;
    for (size_t i = 0; i < s.model.ops().size(); ++i) {
      const LayerOp& op = s.model.ops()[i];
      for (Break what : {Break::kVariableGradients, Break::kInputGradient}) {
        if (what == Break::kVariableGradients ? op.num_variables == 0 : !variables_below) continue;
        const std::string name = c.name + ", op " + std::to_string(i) + " " + op.spec.name +
                                 " (" + Variant(op.spec) + "), " +
                                 (what == Break::kVariableGradients ? "variable gradients"
                                                                    : "input gradient");
        SCOPED_TRACE(name);
        int broken = 0;
        Result<std::unique_ptr<ComputeBackend>> backend = cpu::CreateCpuBackendWrappingLayers(
            s.model, [&](const LayerOp& o, uint32_t index, std::unique_ptr<cpu::CpuLayer> layer)
                         -> std::unique_ptr<cpu::CpuLayer> {
              if (index != i) return layer;
              return std::make_unique<BrokenBackward>(std::move(layer), s.model, o, what, &broken);
            });
        ASSERT_TRUE(backend.ok()) << backend.status().ToString();
        Arrays grads(s.model);
        ASSERT_TRUE((*backend)->ForwardBackward(p.params.in(), p.x.data(), p.y.data(), c.batch,
                                                99, grads.out()).ok());
        ASSERT_EQ(broken, 1) << "the broken backward pass did not run";
        const GradientCheck check = CheckGradients(s.reference, p, grads, 99, 64);
        ++mutations;
        if (check.mismatches.empty()) {
          ADD_FAILURE() << "breaking " << name << " went unnoticed";
          continue;
        }
        ++caught[Variant(op.spec)];
        std::cout << "[ broken   ] " << name << ": " << check.mismatches.size() << " of "
                  << check.checked << " mismatch, first " << check.mismatches.front() << "\n";
      }
      variables_below = variables_below || op.num_variables > 0;
    }
  }
  for (const std::string& variant : EveryVariant()) {
    EXPECT_GT(caught[variant], 0) << "no broken backward pass of " << variant << " was caught";
    std::cout << "[ broken   ] " << variant << ": " << caught[variant] << " caught\n";
  }
  EXPECT_GT(mutations, 40);
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
  const ReferenceModel ref(model.spec(), model.input_shape());
  const double reference = ref.Loss(p.params.AsDouble(),
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
    for (float r = 0; r < 5; ++r) table.insert(table.end(), {10.0f * r + 1, 10.0f * r + 2});
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
