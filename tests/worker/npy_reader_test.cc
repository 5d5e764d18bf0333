#include "worker/data/npy_reader.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/support/data_files.h"

namespace parasync {
namespace {

using ::parasync::testing::LeBytes;
using ::parasync::testing::NpyBytes;
using ::parasync::testing::NpyBytesWithHeader;
using ::parasync::testing::TempDir;
using ::parasync::testing::WriteFile;

class NpyReaderTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(dir_.path().empty()) << "mkdtemp failed"; }
  std::string Write(const std::string& name, const std::vector<uint8_t>& bytes) {
    const std::string path = dir_.File(name);
    EXPECT_TRUE(WriteFile(path, bytes, false)) << path;
    return path;
  }
  TempDir dir_;
};

TEST_F(NpyReaderTest, ReadsFloat32ArrayBackUnchanged) {
  const std::vector<float> values = {0.5f, -1.25f, 3e-8f, 1e30f, 0.0f, 7.0f};
  const std::string path = Write("a.npy", NpyBytes("<f4", {2, 3}, LeBytes(values)));
  Result<NpyArray> a = ReadNpyFile(path);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->dtype, NpyDtype::kFloat32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a->NumElements(), 6);
  EXPECT_EQ(a->data, LeBytes(values));
}

TEST_F(NpyReaderTest, ReadsFormatVersions2And3AndPython2Headers) {
  const std::vector<int64_t> values = {-3, 0, 1LL << 40};
  for (int major : {2, 3}) {
    const std::string path = Write("v" + std::to_string(major) + ".npy",
                                   NpyBytes("<i8", {3}, LeBytes(values), major));
    Result<NpyArray> a = ReadNpyFile(path);
    ASSERT_TRUE(a.ok()) << major << ": " << a.status().ToString();
    EXPECT_EQ(a->dtype, NpyDtype::kInt64);
    EXPECT_EQ(a->shape, (std::vector<int64_t>{3}));
    EXPECT_EQ(a->data, LeBytes(values));
  }
  // Python 2's np.save wrote longs ("3L") and the keys in another order.
  const std::string path = Write(
      "py2.npy", NpyBytesWithHeader("{'shape': (1L, 3L), 'fortran_order': False, 'descr': '|u1'}",
                                    {1, 2, 3}));
  Result<NpyArray> a = ReadNpyFile(path);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->dtype, NpyDtype::kUint8);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{1, 3}));
}

TEST_F(NpyReaderTest, DataShorterOrLongerThanShapeIsCorruptionNamingBothByteCounts) {
  const std::string short_path =
      Write("short.npy", NpyBytes("<f4", {2, 3}, LeBytes(std::vector<float>(5, 1.0f))));
  Result<NpyArray> a = ReadNpyFile(short_path);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kCorruption);
  std::string m = a.status().message();
  EXPECT_NE(m.find(short_path), std::string::npos) << m;
  EXPECT_NE(m.find("promises 24 data bytes (shape (2, 3) of <f4), the file has 20"),
            std::string::npos)
      << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;

  const std::string long_path = Write("long.npy", NpyBytes("|u1", {4}, {1, 2, 3, 4, 5}));
  a = ReadNpyFile(long_path);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kCorruption);
  m = a.status().message();
  EXPECT_NE(m.find("promises 4 data bytes (shape (4,) of |u1), the file has 5"),
            std::string::npos)
      << m;
}

TEST_F(NpyReaderTest, TruncatedHeaderIsCorruption) {
  std::vector<uint8_t> bytes = NpyBytes("<f4", {2}, LeBytes(std::vector<float>{1, 2}));
  bytes.resize(40);  // the header says 118 bytes
  const std::string path = Write("header.npy", bytes);
  Result<NpyArray> a = ReadNpyFile(path);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kCorruption);
  EXPECT_NE(a.status().message().find("the header needs 128 bytes, the file has 40"),
            std::string::npos)
      << a.status().message();
}

TEST_F(NpyReaderTest, BadMagicIsCorruption) {
  std::vector<uint8_t> bytes = NpyBytes("|u1", {1}, {7});
  bytes[1] = 'X';
  const std::string path = Write("magic.npy", bytes);
  Result<NpyArray> a = ReadNpyFile(path);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kCorruption);
  EXPECT_NE(a.status().message().find("bad magic 0x9358554d5059"), std::string::npos)
      << a.status().message();
}

TEST_F(NpyReaderTest, HeaderThatDoesNotParseIsCorruption) {
  for (const std::string& dict : {
           std::string("{'descr': '<f4', 'fortran_order': False, 'shape': (2,"),
           std::string("{'descr': '<f4', 'fortran_order': False}"),
           std::string("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}"),
           std::string("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,)}"),
           std::string("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}"),
           std::string("not a dict"),
       }) {
    const std::string path = Write("bad.npy", NpyBytesWithHeader(dict, std::vector<uint8_t>(8)));
    Result<NpyArray> a = ReadNpyFile(path);
    ASSERT_FALSE(a.ok()) << dict;
    EXPECT_EQ(a.status().code(), StatusCode::kCorruption) << dict << ": " << a.status().ToString();
    EXPECT_NE(a.status().message().find(path), std::string::npos) << a.status().message();
  }
}

TEST_F(NpyReaderTest, FortranOrderBigEndianAndOtherDtypesAreRefused) {
  struct Case {
    std::vector<uint8_t> bytes;
    const char* says;
  };
  const Case cases[] = {
      {NpyBytes("<f4", {2, 2}, std::vector<uint8_t>(16), 1, true), "Fortran order"},
      {NpyBytes(">f4", {2}, std::vector<uint8_t>(8)), "big-endian dtype '>f4'"},
      {NpyBytes("<U3", {2}, std::vector<uint8_t>(24)), "dtype '<U3'"},
  };
  for (const Case& c : cases) {
    const std::string path = Write("refused.npy", c.bytes);
    Result<NpyArray> a = ReadNpyFile(path);
    ASSERT_FALSE(a.ok()) << c.says;
    EXPECT_EQ(a.status().code(), StatusCode::kNotSupported) << a.status().ToString();
    EXPECT_NE(a.status().message().find(c.says), std::string::npos) << a.status().message();
  }
  // A Fortran-order vector has the same bytes as a C-order one.
  Result<NpyArray> a =
      ReadNpyFile(Write("vector.npy", NpyBytes("|u1", {3, 1}, {1, 2, 3}, 1, true)));
  EXPECT_TRUE(a.ok()) << a.status().ToString();
}

TEST_F(NpyReaderTest, MissingFileIsNotFoundNamingPath) {
  const std::string path = dir_.File("absent.npy");
  Result<NpyArray> a = ReadNpyFile(path);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kNotFound);
  EXPECT_NE(a.status().message().find(path), std::string::npos) << a.status().message();
}

}  // namespace
}  // namespace parasync
