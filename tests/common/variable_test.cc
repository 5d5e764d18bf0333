#include "common/variable.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace parasync {
namespace {

VariableSpec Var(std::string name, std::vector<int64_t> shape) {
  VariableSpec v;
  v.name = std::move(name);
  v.shape = std::move(shape);
  return v;
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(VariableSpecTest, NumElementsIsProductOfShape) {
  EXPECT_EQ(Var("k", {784, 256}).num_elements(), 784 * 256);
  EXPECT_EQ(Var("c", {3, 3, 64, 128}).num_elements(), 3 * 3 * 64 * 128);
  EXPECT_EQ(Var("b", {10}).num_elements(), 10);
}

TEST(VariableSpecTest, ScalarHasOneElement) { EXPECT_EQ(Var("s", {}).num_elements(), 1); }

TEST(ValidateVariablesTest, AcceptsDistinctPositiveVariables) {
  EXPECT_TRUE(ValidateVariables({Var("w", {2, 3}), Var("b", {3}), Var("step", {})}).ok());
}

TEST(ValidateVariablesTest, RejectsEmptyList) {
  Status s = ValidateVariables({});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

TEST(ValidateVariablesTest, RejectsDuplicateNameAndNamesIt) {
  Status s = ValidateVariables({Var("dense/kernel", {2, 2}), Var("dense/kernel", {2})});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "dense/kernel")) << s.message();
}

TEST(ValidateVariablesTest, RejectsZeroDimensionAndNamesVariable) {
  Status s = ValidateVariables({Var("w", {4, 0})});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "'w'")) << s.message();
}

TEST(ValidateVariablesTest, RejectsNegativeDimension) {
  EXPECT_EQ(ValidateVariables({Var("w", {-1, 4})}).code(), StatusCode::kInvalidArgument);
}

TEST(ValidateVariablesTest, RejectsEmptyName) {
  EXPECT_EQ(ValidateVariables({Var("", {4})}).code(), StatusCode::kInvalidArgument);
}

TEST(ValidateVariablesTest, RejectsVariableOfTwoToTheFortyOneElements) {
  // Each dimension is fine on its own; the product would overflow later arithmetic.
  Status s = ValidateVariables({Var("huge", {int64_t{1} << 21, int64_t{1} << 20})});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "huge")) << s.message();
}

TEST(ValidateVariablesTest, RejectsListWhoseTotalPassesTwoToTheForty) {
  // Each variable is within the limit; together they are not, and the sum must not overflow.
  std::vector<VariableSpec> vars;
  for (int i = 0; i < 3; ++i) vars.push_back(Var("v" + std::to_string(i), {int64_t{1} << 39}));
  Status s = ValidateVariables(vars);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  vars.pop_back();
  EXPECT_TRUE(ValidateVariables(vars).ok());
}

TEST(ValidateVariablesTest, RejectsUnknownDType) {
  VariableSpec v = Var("w", {4});
  v.dtype = static_cast<DType>(7);
  EXPECT_EQ(ValidateVariables({v}).code(), StatusCode::kInvalidArgument);
  // The 16-bit dtypes are for the wire only: a variable is float32.
  for (DType wire : {DType::kBfloat16, DType::kFloat16}) {
    v.dtype = wire;
    Status s = ValidateVariables({v});
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(s.message(), "variables are float32")) << s.message();
  }
}

std::vector<float> Init(const Initializer& init, uint64_t seed, uint32_t var_index,
                        int64_t offset, int64_t count) {
  std::vector<float> out(static_cast<size_t>(count), -12345.0f);
  InitializeElements(init, seed, var_index, offset, out.data(), count);
  return out;
}

TEST(InitializeElementsTest, ZerosFillsZero) {
  for (float v : Init({InitKind::kZeros, 3.0f}, 1, 0, 0, 100)) EXPECT_EQ(v, 0.0f);
}

TEST(InitializeElementsTest, ConstantFillsValue) {
  for (float v : Init({InitKind::kConstant, 0.25f}, 1, 0, 0, 100)) EXPECT_EQ(v, 0.25f);
}

TEST(InitializeElementsTest, UniformIsDeterministicForSameSeed) {
  const Initializer init{InitKind::kUniform, 0.05f};
  const std::vector<float> values = Init(init, 42, 3, 0, 1000);
  EXPECT_EQ(values, Init(init, 42, 3, 0, 1000));
  // ...and every element was written (Init pre-fills -12345), within the range.
  for (float v : values) EXPECT_TRUE(v >= -0.05f && v <= 0.05f) << v;
}

TEST(InitializeElementsTest, UniformStaysWithinLimitAndSpreadsOverIt) {
  const float limit = 0.07f;
  const std::vector<float> v = Init({InitKind::kUniform, limit}, 9, 0, 0, 20000);
  double sum = 0;
  for (float x : v) {
    ASSERT_GE(x, -limit);
    ASSERT_LT(x, limit);
    sum += x;
  }
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  EXPECT_LT(*lo, -0.95f * limit);
  EXPECT_GT(*hi, 0.95f * limit);
  // Mean of 20000 uniforms on [-l, l): standard error l/sqrt(3*20000) ~ 0.004 l.
  EXPECT_LT(std::abs(sum / static_cast<double>(v.size())), 0.03 * limit);
}

TEST(InitializeElementsTest, UniformDiffersBySeedAndByVariable) {
  const Initializer init{InitKind::kUniform, 1.0f};
  const std::vector<float> base = Init(init, 1, 0, 0, 64);
  EXPECT_NE(base, Init(init, 2, 0, 0, 64));
  EXPECT_NE(base, Init(init, 1, 1, 0, 64));
}

TEST(InitializeElementsTest, UniformIsIndependentOfSlicing) {
  const Initializer init{InitKind::kUniform, 0.5f};
  const int64_t n = 1000;
  const std::vector<float> whole = Init(init, 77, 2, 0, n);
  for (int64_t cut : {int64_t{1}, int64_t{333}, int64_t{999}}) {
    std::vector<float> pieces = Init(init, 77, 2, 0, cut);
    const std::vector<float> rest = Init(init, 77, 2, cut, n - cut);
    pieces.insert(pieces.end(), rest.begin(), rest.end());
    EXPECT_EQ(pieces, whole) << "cut at " << cut;
  }
}

TEST(InitializeElementsTest, ZeroCountWritesNothing) {
  float sentinel = 5.0f;
  InitializeElements({InitKind::kUniform, 1.0f}, 1, 0, 10, &sentinel, 0);
  EXPECT_EQ(sentinel, 5.0f);
}

}  // namespace
}  // namespace parasync
