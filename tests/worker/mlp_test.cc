#include "worker/model/mlp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace parasync {
namespace {

TEST(MlpTest, ParseMlpWidthsAcceptsDashSeparatedWidths) {
  Result<MlpSpec> spec = ParseMlpWidths("784-256-128-10");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->widths, (std::vector<int64_t>{784, 256, 128, 10}));
  EXPECT_EQ(spec->num_layers(), 3);

  Result<MlpSpec> smallest = ParseMlpWidths("1-1");
  ASSERT_TRUE(smallest.ok()) << smallest.status().ToString();
  EXPECT_EQ(smallest->widths, (std::vector<int64_t>{1, 1}));

  Result<MlpSpec> largest = ParseMlpWidths("1048576-2");
  ASSERT_TRUE(largest.ok()) << largest.status().ToString();
  EXPECT_EQ(largest->widths[0], int64_t{1} << 20);
}

TEST(MlpTest, ParseMlpWidthsRejectsMalformedTextWithInvalidArgument) {
  for (const std::string text :
       {"", "784", "784-", "-10", "784--10", "784-x-10", "784-1.5-10", "784- 10", "+784-10",
        "0-10", "784-0", "1048577-10", "99999999999999999999999-10", "784-10 "}) {
    Result<MlpSpec> spec = ParseMlpWidths(text);
    ASSERT_FALSE(spec.ok()) << "accepted '" << text << "'";
    EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument) << text;
    EXPECT_NE(spec.status().message().find("'" + text + "'"), std::string::npos)
        << "message does not quote the input: " << spec.status().message();
  }
}

TEST(MlpTest, MlpVariablesDeclaresKernelThenBiasPerLayer) {
  MlpSpec spec{{784, 256, 10}};
  std::vector<VariableSpec> vars = MlpVariables(spec);
  ASSERT_EQ(vars.size(), 4u);

  EXPECT_EQ(vars[0].name, "dense0/kernel");
  EXPECT_EQ(vars[0].shape, (std::vector<int64_t>{784, 256}));
  EXPECT_EQ(vars[0].init.kind, InitKind::kUniform);
  EXPECT_FLOAT_EQ(vars[0].init.value, static_cast<float>(std::sqrt(6.0 / (784 + 256))));

  EXPECT_EQ(vars[1].name, "dense0/bias");
  EXPECT_EQ(vars[1].shape, (std::vector<int64_t>{256}));
  EXPECT_EQ(vars[1].init.kind, InitKind::kZeros);

  EXPECT_EQ(vars[2].name, "dense1/kernel");
  EXPECT_EQ(vars[2].shape, (std::vector<int64_t>{256, 10}));
  EXPECT_EQ(vars[2].init.kind, InitKind::kUniform);
  EXPECT_FLOAT_EQ(vars[2].init.value, static_cast<float>(std::sqrt(6.0 / (256 + 10))));

  EXPECT_EQ(vars[3].name, "dense1/bias");
  EXPECT_EQ(vars[3].shape, (std::vector<int64_t>{10}));
  EXPECT_EQ(vars[3].init.kind, InitKind::kZeros);

  for (const VariableSpec& v : vars) EXPECT_EQ(v.dtype, DType::kFloat32) << v.name;
  EXPECT_TRUE(ValidateVariables(vars).ok());
}

TEST(MlpTest, MlpVariablesOfParsedSpecPassValidation) {
  Result<MlpSpec> spec = ParseMlpWidths("784-256-128-10");
  ASSERT_TRUE(spec.ok());
  std::vector<VariableSpec> vars = MlpVariables(*spec);
  ASSERT_EQ(vars.size(), 6u);
  EXPECT_EQ(vars[4].name, "dense2/kernel");
  EXPECT_EQ(vars[5].name, "dense2/bias");
  Status s = ValidateVariables(vars);
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST(MlpTest, MlpVariablesOfSpecWithoutLayersIsEmpty) {
  EXPECT_TRUE(MlpVariables(MlpSpec{{784}}).empty());
  EXPECT_TRUE(MlpVariables(MlpSpec{}).empty());
}

}  // namespace
}  // namespace parasync
