#include "worker/data/idx_reader.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/support/data_files.h"

namespace parasync {
namespace {

using ::parasync::testing::IdxBytes;
using ::parasync::testing::TempDir;
using ::parasync::testing::WriteFile;

std::vector<uint8_t> Ramp(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7 + 3);
  return v;
}

class IdxReaderTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { ASSERT_FALSE(dir_.path().empty()) << "mkdtemp failed"; }
  bool gzip() const { return GetParam(); }
  std::string Write(const std::string& name, const std::vector<uint8_t>& bytes) {
    const std::string path = dir_.File(name + (gzip() ? ".gz" : ""));
    EXPECT_TRUE(WriteFile(path, bytes, gzip())) << path;
    return path;
  }
  TempDir dir_;
};

TEST_P(IdxReaderTest, ReadsImagesBackUnchanged) {
  const std::vector<uint8_t> data = Ramp(3 * 4 * 5);
  const std::string path = Write("images", IdxBytes({3, 4, 5}, data));
  Result<IdxTensor> t = ReadIdxFile(path);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->dims, (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(t->data, data);
}

TEST_P(IdxReaderTest, ReadsLabelsBackUnchanged) {
  const std::vector<uint8_t> data = {9, 0, 3, 255, 1};
  const std::string path = Write("labels", IdxBytes({5}, data));
  Result<IdxTensor> t = ReadIdxFile(path);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->dims, (std::vector<int64_t>{5}));
  EXPECT_EQ(t->data, data);
}

TEST_P(IdxReaderTest, ReadsFileLargerThanOneReadChunk) {
  // 17 MiB: more than the reader's 16 MiB chunk, with a first dimension above 2^16.
  const std::vector<uint8_t> data = Ramp(size_t{17} << 20);
  const std::string path = Write("big", IdxBytes({(17u << 20) / 64, 8, 8}, data));
  Result<IdxTensor> t = ReadIdxFile(path);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->dims, (std::vector<int64_t>{(int64_t{17} << 20) / 64, 8, 8}));
  EXPECT_TRUE(t->data == data);
}

TEST_P(IdxReaderTest, TruncatedDataIsCorruptionNamingExpectedAndActualBytes) {
  const std::string path = Write("short", IdxBytes({3, 2, 2}, Ramp(7)));
  Result<IdxTensor> t = ReadIdxFile(path);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kCorruption);
  const std::string m = t.status().message();
  EXPECT_NE(m.find(path), std::string::npos) << m;
  EXPECT_NE(m.find("promises 12 data bytes, the file has 7"), std::string::npos) << m;
}

TEST_P(IdxReaderTest, TruncatedHeaderIsCorruption) {
  std::vector<uint8_t> bytes = IdxBytes({60000, 28, 28}, {});
  bytes.resize(9);  // magic and one and a quarter dimensions
  const std::string path = Write("header", bytes);
  Result<IdxTensor> t = ReadIdxFile(path);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kCorruption);
  EXPECT_NE(t.status().message().find("header needs 16 bytes, the file has 9"),
            std::string::npos)
      << t.status().message();
}

TEST_P(IdxReaderTest, BytesAfterDataAreCorruption) {
  const std::string path = Write("long", IdxBytes({2, 2}, Ramp(5)));
  Result<IdxTensor> t = ReadIdxFile(path);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kCorruption);
}

TEST_P(IdxReaderTest, BadMagicIsCorruption) {
  std::vector<uint8_t> bytes = IdxBytes({4}, Ramp(4));
  bytes[0] = 0x1f;  // e.g. a doubly-gzipped file
  const std::string path = Write("magic", bytes);
  Result<IdxTensor> t = ReadIdxFile(path);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kCorruption);
  EXPECT_NE(t.status().message().find("bad magic 0x1f000801"), std::string::npos)
      << t.status().message();
}

TEST_P(IdxReaderTest, NonByteElementTypeIsCorruption) {
  std::vector<uint8_t> bytes = IdxBytes({4}, Ramp(16));
  bytes[2] = 0x0D;  // float32
  const std::string path = Write("float", bytes);
  Result<IdxTensor> t = ReadIdxFile(path);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kCorruption);
  EXPECT_NE(t.status().message().find("type code 13"), std::string::npos)
      << t.status().message();
}

TEST_P(IdxReaderTest, ZeroDimensionsIsCorruption) {
  const std::string path = Write("scalar", IdxBytes({}, Ramp(1)));
  Result<IdxTensor> t = ReadIdxFile(path);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kCorruption);
}

INSTANTIATE_TEST_SUITE_P(PlainAndGzip, IdxReaderTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& param) {
                           return param.param ? std::string("Gzip") : std::string("Plain");
                         });

TEST(IdxReaderMissingTest, MissingFileIsNotFoundNamingPath) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string path = dir.File("no-such-file-idx1-ubyte.gz");
  Result<IdxTensor> t = ReadIdxFile(path);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  EXPECT_NE(t.status().message().find(path), std::string::npos) << t.status().message();
}

TEST(IdxReaderMissingTest, DamagedGzipStreamIsCorruption) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string path = dir.File("damaged.gz");
  ASSERT_TRUE(WriteFile(path, IdxBytes({1000}, Ramp(1000)), true));
  // Flip bytes in the middle of the deflate stream (past the 10-byte gzip header).
  std::vector<uint8_t> raw;
  {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    ASSERT_NE(f, nullptr);
    uint8_t buf[4096];
    const size_t n = std::fread(buf, 1, sizeof(buf), f);
    std::fclose(f);
    raw.assign(buf, buf + n);
  }
  ASSERT_GT(raw.size(), 30u);
  for (size_t i = 12; i < raw.size() - 8; ++i) raw[i] = static_cast<uint8_t>(raw[i] ^ 0x5a);
  ASSERT_TRUE(WriteFile(path, raw, false));
  Result<IdxTensor> t = ReadIdxFile(path);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kCorruption) << t.status().ToString();
  EXPECT_NE(t.status().message().find(path), std::string::npos) << t.status().message();
}

}  // namespace
}  // namespace parasync
