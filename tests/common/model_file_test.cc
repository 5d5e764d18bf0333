#include "common/model_file.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/support/temp_dir.h"

namespace parasync {
namespace {

class ModelFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tmp_.path();
    path_ = tmp_.File("m.psm");
  }

  static ModelFile Sample() {
    ModelFile m;
    m.variables = {{"dense0/kernel", {3, 2}, DType::kFloat32, {}},
                   {"dense0/bias", {2}, DType::kFloat32, {}}};
    m.values = {{1.5f, -2.0f, 3.25f, 0.0f, 1e-7f, -1e7f}, {0.5f, -0.5f}};
    m.metadata_json = R"({"version":12,"mode":"sync"})";
    return m;
  }

  std::string ReadAll() {
    std::ifstream f(path_, std::ios::binary | std::ios::ate);
    std::string bytes(static_cast<size_t>(f.tellg()), '\0');
    f.seekg(0);
    f.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return bytes;
  }
  void WriteAll(const std::string& bytes) {
    std::ofstream f(path_, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }

  testing::TempDir tmp_;
  std::string dir_;
  std::string path_;
};

TEST_F(ModelFileTest, RoundTripKeepsNamesShapesValuesAndMetadata) {
  ASSERT_TRUE(WriteModelFile(path_, Sample()).ok());
  Result<ModelFile> m = ReadModelFile(path_);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->variables.size(), 2u);
  EXPECT_EQ(m->variables[0].name, "dense0/kernel");
  EXPECT_EQ(m->variables[0].shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(m->values, Sample().values);
  EXPECT_NE(m->metadata_json.find("\"version\":12"), std::string::npos) << m->metadata_json;
  EXPECT_FALSE(std::filesystem::exists(path_ + ".tmp"));
}

TEST_F(ModelFileTest, AnyFlippedByteIsCorruption) {
  ASSERT_TRUE(WriteModelFile(path_, Sample()).ok());
  const std::string good = ReadAll();
  for (size_t at : {size_t{3}, size_t{20}, good.size() - 30, good.size() - 2}) {
    std::string bad = good;
    bad[at] = static_cast<char>(bad[at] ^ 0x10);
    WriteAll(bad);
    Result<ModelFile> m = ReadModelFile(path_);
    EXPECT_EQ(m.status().code(), StatusCode::kCorruption) << "flip at " << at;
    EXPECT_NE(m.status().message().find(path_), std::string::npos);
  }
}

TEST_F(ModelFileTest, TruncatedFileIsCorruption) {
  ASSERT_TRUE(WriteModelFile(path_, Sample()).ok());
  const std::string good = ReadAll();
  for (size_t keep : {size_t{0}, size_t{10}, good.size() / 2, good.size() - 1}) {
    WriteAll(good.substr(0, keep));
    EXPECT_EQ(ReadModelFile(path_).status().code(), StatusCode::kCorruption) << keep << " bytes";
  }
}

TEST_F(ModelFileTest, MissingFileIsNotFound) {
  EXPECT_EQ(ReadModelFile(dir_ + "/none.psm").status().code(), StatusCode::kNotFound);
}

TEST_F(ModelFileTest, ValuesNotMatchingTheirVariableAreRefusedAndNothingIsWritten) {
  ModelFile m = Sample();
  m.values[1].push_back(1.0f);
  EXPECT_EQ(WriteModelFile(path_, m).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(path_));
}

}  // namespace
}  // namespace parasync
