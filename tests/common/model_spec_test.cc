#include "common/model_spec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

namespace parasync {
namespace {

bool Includes(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

ModelRegistration SmallModel() {
  ModelRegistration reg;
  reg.variables = {{"dense/kernel", {4, 3}, DType::kFloat32, {InitKind::kUniform, 0.1f}},
                   {"dense/bias", {3}, DType::kFloat32, {}}};
  reg.seed = 5;
  reg.num_shards = 2;
  return reg;
}

TEST(ParseOptimizerKindTest, ParsesTheThreeNames) {
  EXPECT_EQ(*ParseOptimizerKind("sgd"), OptimizerKind::kSgd);
  EXPECT_EQ(*ParseOptimizerKind("momentum"), OptimizerKind::kMomentum);
  EXPECT_EQ(*ParseOptimizerKind("adam"), OptimizerKind::kAdam);
  for (OptimizerKind k : {OptimizerKind::kSgd, OptimizerKind::kMomentum, OptimizerKind::kAdam}) {
    EXPECT_EQ(*ParseOptimizerKind(std::string(OptimizerKindName(k))), k);
  }
}

TEST(ParseOptimizerKindTest, RejectsUnknownNameAndNamesIt) {
  Result<OptimizerKind> k = ParseOptimizerKind("rmsprop");
  ASSERT_FALSE(k.ok());
  EXPECT_EQ(k.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Includes(k.status().message(), "rmsprop"));
}

TEST(LrScheduleTest, ParsesBothNamesAndRefusesOthersByName) {
  EXPECT_EQ(*ParseLrSchedule("constant"), LrSchedule::kConstant);
  EXPECT_EQ(*ParseLrSchedule("cosine"), LrSchedule::kCosine);
  for (LrSchedule s : {LrSchedule::kConstant, LrSchedule::kCosine}) {
    EXPECT_EQ(*ParseLrSchedule(std::string(LrScheduleName(s))), s);
  }
  Result<LrSchedule> bad = ParseLrSchedule("exponential");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(Includes(bad.status().message(), "exponential"));
}

TEST(LrScheduleTest, ConstantIsOneWhateverTheExamples) {
  OptimizerSpec s;
  for (int64_t e : {int64_t{0}, int64_t{1000}, int64_t{1} << 40}) {
    EXPECT_EQ(LrScheduleFactor(s, e), 1.0f) << e;
  }
}

TEST(LrScheduleTest, CosineFallsFromOneToTheFinalFractionAndStaysThere) {
  OptimizerSpec s;
  s.schedule = LrSchedule::kCosine;
  s.decay_examples = 1000;
  EXPECT_EQ(LrScheduleFactor(s, 0), 1.0f);
  EXPECT_FLOAT_EQ(LrScheduleFactor(s, 250), static_cast<float>((1 + std::sqrt(0.5)) / 2));
  EXPECT_FLOAT_EQ(LrScheduleFactor(s, 500), 0.5f);
  EXPECT_EQ(LrScheduleFactor(s, 1000), 0.0f);
  EXPECT_EQ(LrScheduleFactor(s, 5000), 0.0f);
  s.final_lr_fraction = 0.1f;
  EXPECT_FLOAT_EQ(LrScheduleFactor(s, 500), 0.55f);
  EXPECT_FLOAT_EQ(LrScheduleFactor(s, 1000), 0.1f);
  EXPECT_FLOAT_EQ(LrScheduleFactor(s, 1 << 30), 0.1f);
  // Monotone on the way down.
  float previous = 2.0f;
  for (int64_t e = 0; e <= 1000; e += 10) {
    const float f = LrScheduleFactor(s, e);
    EXPECT_LE(f, previous) << e;
    previous = f;
  }
}

TEST(ValidateOptimizerTest, RejectsACosineScheduleWithoutAHorizonOrWithABadFraction) {
  OptimizerSpec s;
  s.schedule = LrSchedule::kCosine;
  s.decay_examples = 0;
  EXPECT_EQ(ValidateOptimizer(s).code(), StatusCode::kInvalidArgument);
  s.decay_examples = 10;
  EXPECT_TRUE(ValidateOptimizer(s).ok());
  for (float f : {-0.1f, 1.5f, std::numeric_limits<float>::quiet_NaN()}) {
    s.final_lr_fraction = f;
    EXPECT_EQ(ValidateOptimizer(s).code(), StatusCode::kInvalidArgument) << f;
  }
  s.final_lr_fraction = 1.0f;
  EXPECT_TRUE(ValidateOptimizer(s).ok());
  s.schedule = static_cast<LrSchedule>(7);
  EXPECT_EQ(ValidateOptimizer(s).code(), StatusCode::kInvalidArgument);
}

TEST(ValidateOptimizerTest, AcceptsDefaults) {
  for (OptimizerKind k : {OptimizerKind::kSgd, OptimizerKind::kMomentum, OptimizerKind::kAdam}) {
    OptimizerSpec s;
    s.kind = k;
    EXPECT_TRUE(ValidateOptimizer(s).ok()) << OptimizerKindName(k);
  }
}

TEST(ValidateOptimizerTest, RejectsNonPositiveOrNonFiniteLearningRate) {
  for (float lr : {0.0f, -0.1f, std::numeric_limits<float>::infinity(),
                   std::numeric_limits<float>::quiet_NaN()}) {
    OptimizerSpec s;
    s.learning_rate = lr;
    EXPECT_EQ(ValidateOptimizer(s).code(), StatusCode::kInvalidArgument) << lr;
  }
}

TEST(ValidateOptimizerTest, RejectsMomentumOutsideUnitInterval) {
  OptimizerSpec s;
  s.kind = OptimizerKind::kMomentum;
  s.momentum = 1.0f;
  EXPECT_EQ(ValidateOptimizer(s).code(), StatusCode::kInvalidArgument);
  s.momentum = -0.1f;
  EXPECT_EQ(ValidateOptimizer(s).code(), StatusCode::kInvalidArgument);
}

TEST(ValidateOptimizerTest, RejectsBadAdamSettings) {
  OptimizerSpec s;
  s.kind = OptimizerKind::kAdam;
  s.beta1 = 1.0f;
  EXPECT_FALSE(ValidateOptimizer(s).ok());
  s = OptimizerSpec{};
  s.kind = OptimizerKind::kAdam;
  s.beta2 = 1.5f;
  EXPECT_FALSE(ValidateOptimizer(s).ok());
  s = OptimizerSpec{};
  s.kind = OptimizerKind::kAdam;
  s.epsilon = 0.0f;
  EXPECT_FALSE(ValidateOptimizer(s).ok());
}

TEST(ValidateOptimizerTest, RejectsUnknownKind) {
  OptimizerSpec s;
  s.kind = static_cast<OptimizerKind>(9);
  EXPECT_EQ(ValidateOptimizer(s).code(), StatusCode::kInvalidArgument);
}

TEST(ValidateRegistrationTest, AcceptsSmallModel) { EXPECT_TRUE(ValidateRegistration(SmallModel()).ok()); }

TEST(ValidateRegistrationTest, RejectsZeroSlicingOrShards) {
  ModelRegistration reg = SmallModel();
  reg.max_slice_elements = 0;
  EXPECT_EQ(ValidateRegistration(reg).code(), StatusCode::kInvalidArgument);
  reg = SmallModel();
  reg.num_shards = 0;
  EXPECT_EQ(ValidateRegistration(reg).code(), StatusCode::kInvalidArgument);
}

TEST(DescribeRegistrationMismatchTest, EmptyForEqualRegistrations) {
  EXPECT_EQ(DescribeRegistrationMismatch(SmallModel(), SmallModel()), "");
}

TEST(DescribeRegistrationMismatchTest, NamesVariableAndBothShapes) {
  ModelRegistration got = SmallModel();
  got.variables[0].shape = {5, 3};
  const std::string d = DescribeRegistrationMismatch(SmallModel(), got);
  EXPECT_TRUE(Includes(d, "dense/kernel")) << d;
  EXPECT_TRUE(Includes(d, "[5,3]")) << d;
  EXPECT_TRUE(Includes(d, "[4,3]")) << d;
}

TEST(DescribeRegistrationMismatchTest, ReportsEveryKindOfDifference) {
  const ModelRegistration have = SmallModel();
  ModelRegistration got = have;
  got.num_shards = 3;
  EXPECT_TRUE(Includes(DescribeRegistrationMismatch(have, got), "num_shards"));
  got = have;
  got.variables.pop_back();
  EXPECT_NE(DescribeRegistrationMismatch(have, got), "");
  got = have;
  got.variables[1].name = "other";
  EXPECT_TRUE(Includes(DescribeRegistrationMismatch(have, got), "other"));
  got = have;
  got.variables[0].init.value = 0.2f;
  EXPECT_TRUE(Includes(DescribeRegistrationMismatch(have, got), "initializer"));
  got = have;
  got.optimizer.learning_rate = 0.5f;
  EXPECT_TRUE(Includes(DescribeRegistrationMismatch(have, got), "optimizer"));
  got = have;
  got.seed = 6;
  EXPECT_TRUE(Includes(DescribeRegistrationMismatch(have, got), "seed"));
  got = have;
  got.max_slice_elements = 7;
  EXPECT_TRUE(Includes(DescribeRegistrationMismatch(have, got), "max_slice_elements"));
}

}  // namespace
}  // namespace parasync
