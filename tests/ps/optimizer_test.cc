#include "ps/optimizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace parasync {
namespace {

// The formulas of ps/optimizer.h, written out again in double precision.
struct Reference {
  OptimizerSpec spec;
  std::vector<double> w, m, v;
  int64_t t = 0;

  void Step(const std::vector<float>& g) {
    ++t;
    const double lr = spec.learning_rate;
    for (size_t i = 0; i < w.size(); ++i) {
      const double gi = g[i];
      switch (spec.kind) {
        case OptimizerKind::kSgd:
          w[i] -= lr * gi;
          break;
        case OptimizerKind::kMomentum:
          m[i] = double{spec.momentum} * m[i] + gi;
          w[i] -= lr * m[i];
          break;
        case OptimizerKind::kAdam: {
          const double b1 = spec.beta1;
          const double b2 = spec.beta2;
          m[i] = b1 * m[i] + (1 - b1) * gi;
          v[i] = b2 * v[i] + (1 - b2) * gi * gi;
          const double td = static_cast<double>(t);
          const double lr_t = lr * std::sqrt(1 - std::pow(b2, td)) / (1 - std::pow(b1, td));
          w[i] -= lr_t * m[i] / (std::sqrt(v[i]) + double{spec.epsilon});
          break;
        }
        case OptimizerKind::kAdagrad:  // TensorFlow's form: the accumulator starts at a0
          if (t == 1) m[i] = spec.initial_accumulator;
          m[i] += gi * gi;
          w[i] -= lr * gi / (std::sqrt(m[i]) + double{spec.epsilon});
          break;
        case OptimizerKind::kAggregate:
          w[i] = gi;
          break;
        case OptimizerKind::kDelta:
          w[i] += gi;
          break;
      }
    }
  }
};

// What a shard keeps for one slice: values and zero-initialized slots.
struct SliceUnderTest {
  OptimizerSpec spec;
  std::vector<float> w;
  std::vector<std::vector<float>> slots;
  int64_t step = 0;

  SliceUnderTest(const OptimizerSpec& s, std::vector<float> w0)
      : spec(s),
        w(std::move(w0)),
        slots(static_cast<size_t>(NumOptimizerSlots(s.kind)), std::vector<float>(w.size(), 0.0f)) {}

  void Step(const std::vector<float>& g) {
    ++step;
    std::vector<float*> ptrs;
    for (auto& slot : slots) ptrs.push_back(slot.data());
    ApplyUpdate(spec, step, w.data(), w.data(), g.data(), ptrs, static_cast<int64_t>(w.size()));
  }
};

// Relative tolerance 1e-6 (absolute near zero).
void ExpectClose(const std::vector<float>& actual, const std::vector<double>& expected,
                 const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], 1e-6 * std::max(1.0, std::abs(expected[i])))
        << what << ", element " << i;
  }
}

const std::vector<float> kW0 = {1.0f, -2.0f, 0.5f, 0.0f, 3.25f};
const std::vector<std::vector<float>> kGrads = {
    {0.1f, -0.2f, 0.3f, 0.0f, 4.0f},
    {-0.5f, 0.25f, 0.3f, 1e-3f, -4.0f},
    {0.05f, 0.0f, -0.7f, 2.0f, 0.5f},
};

void ExpectMatchesReference(const OptimizerSpec& spec) {
  SliceUnderTest slice(spec, kW0);
  Reference ref{spec, {kW0.begin(), kW0.end()}, std::vector<double>(kW0.size(), 0.0),
                std::vector<double>(kW0.size(), 0.0)};
  for (size_t s = 0; s < kGrads.size(); ++s) {
    slice.Step(kGrads[s]);
    ref.Step(kGrads[s]);
    ExpectClose(slice.w, ref.w, std::string(OptimizerKindName(spec.kind)) + " after step " +
                                    std::to_string(s + 1));
  }
}

TEST(OptimizerTest, NumSlotsPerKind) {
  EXPECT_EQ(NumOptimizerSlots(OptimizerKind::kSgd), 0);
  EXPECT_EQ(NumOptimizerSlots(OptimizerKind::kMomentum), 1);
  EXPECT_EQ(NumOptimizerSlots(OptimizerKind::kAdam), 2);
  EXPECT_EQ(NumOptimizerSlots(OptimizerKind::kAdagrad), 1);
}

TEST(OptimizerTest, AdagradMatchesFormulaOverThreeSteps) {
  OptimizerSpec spec;
  spec.kind = OptimizerKind::kAdagrad;
  spec.learning_rate = 0.1f;
  spec.initial_accumulator = 0.1f;
  ExpectMatchesReference(spec);
}

TEST(OptimizerTest, AdagradFirstStepDividesByTheRootOfInitialPlusSquare) {
  OptimizerSpec spec;
  spec.kind = OptimizerKind::kAdagrad;
  spec.learning_rate = 0.5f;
  spec.initial_accumulator = 0.0f;
  spec.epsilon = 1e-7f;
  SliceUnderTest slice(spec, {1.0f, 1.0f});
  slice.Step({2.0f, -0.5f});  // a zero start: each moves by lr * sign(g)
  ExpectClose(slice.w, {0.5, 1.5}, "step 1");
  ExpectClose(slice.slots[0], {4.0, 0.25}, "accumulator after step 1");
}

TEST(OptimizerTest, SgdSubtractsLearningRateTimesGradient) {
  OptimizerSpec spec;
  spec.kind = OptimizerKind::kSgd;
  spec.learning_rate = 0.1f;
  SliceUnderTest slice(spec, {1.0f, -2.0f});
  slice.Step({0.5f, -1.0f});
  ExpectClose(slice.w, {0.95, -1.9}, "step 1");
  slice.Step({-1.0f, 2.0f});
  ExpectClose(slice.w, {1.05, -2.1}, "step 2");
}

TEST(OptimizerTest, SgdMatchesFormulaOverThreeSteps) {
  OptimizerSpec spec;
  spec.kind = OptimizerKind::kSgd;
  spec.learning_rate = 0.05f;
  ExpectMatchesReference(spec);
}

TEST(OptimizerTest, MomentumAccumulatesVelocity) {
  OptimizerSpec spec;
  spec.kind = OptimizerKind::kMomentum;
  spec.learning_rate = 0.1f;
  spec.momentum = 0.9f;
  SliceUnderTest slice(spec, {1.0f});
  // v: 1, 0.9*1+1 = 1.9, 0.9*1.9+1 = 2.71;  w: 1-0.1, 0.9-0.19, 0.71-0.271.
  const double want_v[] = {1.0, 1.9, 2.71};
  const double want_w[] = {0.9, 0.71, 0.439};
  for (int s = 0; s < 3; ++s) {
    slice.Step({1.0f});
    ExpectClose(slice.slots[0], {want_v[s]}, "velocity after step " + std::to_string(s + 1));
    ExpectClose(slice.w, {want_w[s]}, "weight after step " + std::to_string(s + 1));
  }
}

TEST(OptimizerTest, MomentumMatchesFormulaOverThreeSteps) {
  OptimizerSpec spec;
  spec.kind = OptimizerKind::kMomentum;
  spec.learning_rate = 0.05f;
  spec.momentum = 0.8f;
  ExpectMatchesReference(spec);
}

TEST(OptimizerTest, AdamBiasCorrectionMakesFirstTwoStepsMoveByLearningRate) {
  // With a constant gradient g the bias-corrected moments are exactly g and g^2, so each
  // step moves w by lr * |g| / (|g| + eps / sqrt-correction) ~ lr. Without the correction the
  // first step would move by lr * (1 - b1) / sqrt(1 - b2) ~ 3.16 lr.
  OptimizerSpec spec;
  spec.kind = OptimizerKind::kAdam;
  spec.learning_rate = 0.01f;
  spec.beta1 = 0.9f;
  spec.beta2 = 0.999f;
  spec.epsilon = 1e-7f;
  SliceUnderTest slice(spec, {1.0f, 1.0f});
  const std::vector<float> g = {0.5f, -0.5f};

  slice.Step(g);  // t = 1
  // m = 0.1 g = +-0.05; v = 0.001 g^2 = 0.00025.
  ExpectClose(slice.slots[0], {0.05, -0.05}, "m at t=1");
  ExpectClose(slice.slots[1], {0.00025, 0.00025}, "v at t=1");
  // lr_1 = 0.01 * sqrt(0.001) / 0.1; w -= lr_1 * 0.05 / (sqrt(0.00025) + 1e-7).
  const double lr1 = 0.01 * std::sqrt(1 - double{0.999f}) / (1 - double{0.9f});
  const double step1 = lr1 * (1 - double{0.9f}) * 0.5 /
                       (std::sqrt((1 - double{0.999f}) * 0.25) + double{1e-7f});
  ExpectClose(slice.w, {1.0 - step1, 1.0 + step1}, "w at t=1");
  EXPECT_NEAR(step1, 0.01, 1e-5);

  slice.Step(g);  // t = 2
  // m = 0.9*0.05 + 0.05 = 0.095; v = 0.999*0.00025 + 0.00025 = 0.00049975.
  ExpectClose(slice.slots[0], {0.095, -0.095}, "m at t=2");
  ExpectClose(slice.slots[1], {0.00049975, 0.00049975}, "v at t=2");
  const double b1 = double{0.9f};
  const double b2 = double{0.999f};
  const double m2 = (b1 * (1 - b1) + (1 - b1)) * 0.5;
  const double v2 = (b2 * (1 - b2) + (1 - b2)) * 0.25;
  const double lr2 = 0.01 * std::sqrt(1 - b2 * b2) / (1 - b1 * b1);
  const double step2 = lr2 * m2 / (std::sqrt(v2) + double{1e-7f});
  ExpectClose(slice.w, {1.0 - step1 - step2, 1.0 + step1 + step2}, "w at t=2");
  EXPECT_NEAR(step2, 0.01, 1e-5);
}

TEST(OptimizerTest, AdamMatchesFormulaOverThreeSteps) {
  OptimizerSpec spec;
  spec.kind = OptimizerKind::kAdam;
  spec.learning_rate = 0.02f;
  spec.beta1 = 0.85f;
  spec.beta2 = 0.99f;
  spec.epsilon = 1e-4f;
  ExpectMatchesReference(spec);
}

TEST(OptimizerTest, AdamUsesTheGivenStepForBiasCorrection) {
  // The same moments applied as step 1 and as step 5 must differ: the step is not ignored.
  OptimizerSpec spec;
  spec.kind = OptimizerKind::kAdam;
  SliceUnderTest first(spec, {1.0f});
  SliceUnderTest fifth(spec, {1.0f});
  fifth.step = 4;
  first.Step({1.0f});
  fifth.Step({1.0f});
  EXPECT_NE(first.w[0], fifth.w[0]);
}

TEST(OptimizerTest, ZeroLengthUpdateTouchesNothing) {
  OptimizerSpec spec;
  spec.kind = OptimizerKind::kAdam;
  float w = 2.0f;
  float m = 0.0f;
  float v = 0.0f;
  float* slots[] = {&m, &v};
  const float g = 1.0f;
  ApplyUpdate(spec, 1, &w, &w, &g, slots, 0);
  EXPECT_EQ(w, 2.0f);
  EXPECT_EQ(m, 0.0f);
}

// The fused SGD with its finite check: bit for bit ApplyUpdate's SGD, and false for a NaN or
// Inf wherever it is (the vector body and the scalar tail of the loop), never writing w_in.
TEST(OptimizerTest, ApplySgdIfFiniteIsSgdBitForBitAndCatchesEveryNonFinitePosition) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  OptimizerSpec spec;
  spec.kind = OptimizerKind::kSgd;
  spec.learning_rate = 0.0123f;
  for (int64_t n : {0, 1, 7, 16, 33, 1000}) {
    std::vector<float> w(static_cast<size_t>(n)), g(static_cast<size_t>(n));
    for (float& x : w) x = normal(rng);
    for (float& x : g) x = normal(rng);
    if (n > 0) g[0] = std::numeric_limits<float>::max();  // finite, extreme
    const std::vector<float> w0 = w;
    std::vector<float> fused(static_cast<size_t>(n), -1.0f), plain(static_cast<size_t>(n));
    ASSERT_TRUE(ApplySgdIfFinite(spec.learning_rate, w.data(), fused.data(), g.data(), n));
    ApplyUpdate(spec, 1, w.data(), plain.data(), g.data(), {}, n);
    if (n > 0) {
      ASSERT_EQ(std::memcmp(fused.data(), plain.data(), fused.size() * sizeof(float)), 0) << n;
    }
    ASSERT_EQ(w, w0);
    for (int64_t bad = 0; bad < n; ++bad) {
      for (float poison : {std::numeric_limits<float>::quiet_NaN(),
                           -std::numeric_limits<float>::infinity()}) {
        std::vector<float> g2 = g;
        g2[static_cast<size_t>(bad)] = poison;
        ASSERT_FALSE(ApplySgdIfFinite(spec.learning_rate, w.data(), fused.data(), g2.data(), n))
            << "n " << n << ", position " << bad;
        ASSERT_EQ(w, w0);
      }
    }
  }
}

// The streaming-store SGD against the plain one, with w_out at every offset from a 16-byte
// boundary (so the scalar head, the vector body and the scalar tail all run): the same bits,
// and a NaN or Inf caught at every position, whichever of the three parts holds it.
TEST(OptimizerTest, ApplySgdIfFiniteStreamingIsTheSameBitsAndCatchesEveryNonFinite) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float lr = 0.0123f;
  for (int64_t n : {0, 1, 3, 4, 9, 40, 1001}) {
    std::vector<float> w(static_cast<size_t>(n)), g(static_cast<size_t>(n));
    for (float& x : w) x = normal(rng);
    for (float& x : g) x = normal(rng);
    if (n > 1) g[1] = -std::numeric_limits<float>::max();  // finite, extreme
    const std::vector<float> w0 = w;
    std::vector<float> plain(static_cast<size_t>(n));
    ASSERT_TRUE(ApplySgdIfFinite(lr, w.data(), plain.data(), g.data(), n));
    for (size_t offset = 0; offset < 4; ++offset) {
      SCOPED_TRACE(::testing::Message() << "n " << n << ", w_out offset " << offset);
      // A 16-byte aligned buffer (vector's allocation), entered `offset` floats in.
      std::vector<float> buffer(static_cast<size_t>(n) + 8, -1.0f);
      float* out = buffer.data() + offset;
      ASSERT_TRUE(ApplySgdIfFiniteStreaming(lr, w.data(), out, g.data(), n));
      ASSERT_EQ(w, w0);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(std::memcmp(out + i, &plain[static_cast<size_t>(i)], sizeof(float)), 0)
            << "element " << i;
      }
      EXPECT_EQ(buffer[offset + static_cast<size_t>(n)], -1.0f) << "wrote past the end";
      for (int64_t bad = 0; bad < n; ++bad) {
        for (float poison : {std::numeric_limits<float>::quiet_NaN(),
                             std::numeric_limits<float>::infinity()}) {
          std::vector<float> g2 = g;
          g2[static_cast<size_t>(bad)] = poison;
          ASSERT_FALSE(ApplySgdIfFiniteStreaming(lr, w.data(), out, g2.data(), n))
              << "position " << bad;
          ASSERT_EQ(w, w0);
        }
      }
    }
  }
}

}  // namespace
}  // namespace parasync

namespace parasync {
namespace {

// The workers' optimizer (parasync.horovod): the server keeps the averaged gradient
// (aggregate) or adds the pushed change (delta), bit for bit, in place and out of place.
TEST(OptimizerTest, AggregateKeepsTheGradientAndDeltaAddsIt) {
  for (OptimizerKind kind : {OptimizerKind::kAggregate, OptimizerKind::kDelta}) {
    OptimizerSpec spec;
    spec.kind = kind;
    spec.learning_rate = 1.0f;
    EXPECT_EQ(NumOptimizerSlots(kind), 0);
    EXPECT_TRUE(ValidateOptimizer(spec).ok());
    SliceUnderTest slice(spec, {1.0f, -2.0f});
    slice.Step({0.25f, 3.0f});
    const bool aggregate = kind == OptimizerKind::kAggregate;
    ExpectClose(slice.w, aggregate ? std::vector<double>{0.25, 3.0}
                                   : std::vector<double>{1.25, 1.0}, "step 1");
    std::vector<float> in{1.0f, 2.0f}, out(2);
    const std::vector<float> g{0.5f, -0.5f};
    ApplyUpdate(spec, 1, in.data(), out.data(), g.data(), {}, 2);
    const std::vector<float> want = aggregate ? g : std::vector<float>{1.5f, 1.5f};
    EXPECT_EQ(out, want);
    EXPECT_EQ(in, (std::vector<float>{1.0f, 2.0f}));  // out of place: the input unchanged
  }
}

TEST(OptimizerTest, WorkerSideOptimizersTakeNoServerLearningRateScheduleOrStaleness) {
  OptimizerSpec spec;
  spec.kind = OptimizerKind::kAggregate;
  spec.learning_rate = 0.1f;
  EXPECT_NE(ValidateOptimizer(spec).message().find("learning rate"), std::string::npos);
  spec.learning_rate = 1.0f;
  spec.schedule = LrSchedule::kCosine;
  spec.decay_examples = 10;
  EXPECT_NE(ValidateOptimizer(spec).message().find("lr_scheduler"), std::string::npos);
  spec.schedule = LrSchedule::kConstant;
  spec.kind = OptimizerKind::kDelta;
  spec.staleness_aware = true;
  EXPECT_FALSE(ValidateOptimizer(spec).ok());
}

TEST(OptimizerTest, AggregateIsForSyncModesAndDeltaForAsyncAndSsp) {
  ModelRegistration reg;
  reg.variables = {{"w", {2}, DType::kFloat32, {InitKind::kZeros, 0.0f}}};
  reg.optimizer.kind = OptimizerKind::kAggregate;
  reg.optimizer.learning_rate = 1.0f;
  reg.mode = "sync";
  EXPECT_TRUE(ValidateRegistration(reg).ok());
  reg.mode = "async";
  EXPECT_NE(ValidateRegistration(reg).message().find("delta"), std::string::npos);
  reg.optimizer.kind = OptimizerKind::kDelta;
  EXPECT_TRUE(ValidateRegistration(reg).ok());
  reg.mode = "ssp:2";
  EXPECT_TRUE(ValidateRegistration(reg).ok());
  reg.mode = "sync";
  EXPECT_NE(ValidateRegistration(reg).message().find("aggregate"), std::string::npos);
  EXPECT_EQ(ParseOptimizerKind("aggregate").value(), OptimizerKind::kAggregate);
  EXPECT_EQ(ParseOptimizerKind("delta").value(), OptimizerKind::kDelta);
}

}  // namespace
}  // namespace parasync
