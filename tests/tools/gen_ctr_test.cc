// parasync-gen-ctr run as a real process on a tiny configuration: its files load with the
// worker's own .npy readers, and the seed alone decides their bytes.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tests/support/process_util.h"
#include "tests/support/temp_dir.h"
#include "tools/zipf_sampler.h"
#include "worker/data/dataset.h"
#include "worker/data/npy_reader.h"

namespace parasync {
namespace {

using ::parasync::testing::BinDir;
using ::parasync::testing::Finished;
using ::parasync::testing::ReadFile;
using ::parasync::testing::RunToExit;
using ::parasync::testing::TempDir;

constexpr int64_t kTrain = 2000;
constexpr int64_t kTest = 500;
constexpr int64_t kFields = 3;
constexpr int64_t kVocab = 1000;
const char* const kFiles[] = {"train_ids.npy", "train_x.npy", "train_y.npy",
                              "test_ids.npy",  "test_x.npy",  "test_y.npy"};

class GenCtrTest : public ::testing::Test {
 protected:
  // Runs the generator on the tiny configuration into dir_/`out` with `extra` flags.
  Finished Generate(const std::string& out, const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {BinDir() + "/parasync-gen-ctr", "--out", dir_.File(out),
                                     "--train", std::to_string(kTrain), "--test",
                                     std::to_string(kTest), "--fields", std::to_string(kFields),
                                     "--vocab", std::to_string(kVocab)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return RunToExit(argv, dir_.path(), std::chrono::seconds(60));
  }
  std::vector<uint64_t> Ids(const NpyArray& a) {
    std::vector<uint64_t> ids(static_cast<size_t>(a.NumElements()));
    std::memcpy(ids.data(), a.data.data(), a.data.size());
    return ids;
  }
  TempDir dir_;
};

TEST_F(GenCtrTest, WritesSplitsTheWorkerReadersLoad) {
  Finished run = Generate("a", {"--check-learnable"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("planted model on test: log-loss"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("reference learner"), std::string::npos) << run.out;
  for (const auto& [split, n] : {std::pair{"train", kTrain}, std::pair{"test", kTest}}) {
    const std::string base = dir_.File("a/") + split;
    Result<NpyArray> ids = ReadNpyFile(base + "_ids.npy");
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    EXPECT_EQ(ids->dtype, NpyDtype::kInt64);
    EXPECT_EQ(ids->shape, (std::vector<int64_t>{n, kFields}));
    const std::vector<uint64_t> values = Ids(*ids);
    for (size_t k = 0; k < values.size(); ++k) {
      // Field f's ids lie in [f * V, (f + 1) * V).
      const auto field = static_cast<uint64_t>(k % kFields);
      ASSERT_GE(values[k], field * kVocab) << k;
      ASSERT_LT(values[k], (field + 1) * kVocab) << k;
    }
    Result<Dataset> data = LoadNpyDataset(base + "_x.npy", base + "_y.npy");
    ASSERT_TRUE(data.ok()) << data.status().ToString();
    EXPECT_EQ(data->n, n);
    EXPECT_EQ(data->dim, 4);
    int positives = 0;
    for (uint8_t y : data->y) {
      ASSERT_LE(y, 1);
      positives += y;
    }
    EXPECT_GT(positives, 0);
    EXPECT_LT(positives, n);
  }
}

TEST_F(GenCtrTest, SameSeedSameBytesAndAnotherSeedOthers) {
  ASSERT_EQ(Generate("a", {"--seed", "5"}).exit_code, 0);
  ASSERT_EQ(Generate("b", {"--seed", "5"}).exit_code, 0);
  ASSERT_EQ(Generate("c", {"--seed", "6"}).exit_code, 0);
  for (const char* file : kFiles) {
    const std::string a = ReadFile(dir_.File("a/") + file);
    ASSERT_FALSE(a.empty()) << file;
    // Data starts at a multiple of 64 bytes, as np.save aligns it.
    const size_t header = 10 + (static_cast<uint8_t>(a[8]) | (static_cast<uint8_t>(a[9]) << 8));
    EXPECT_EQ(header % 64, 0u) << file;
    EXPECT_EQ(a, ReadFile(dir_.File("b/") + file)) << file;
    EXPECT_NE(a, ReadFile(dir_.File("c/") + file)) << file;
  }
}

TEST_F(GenCtrTest, HashIdsAreUint64SpreadOverAllBits) {
  ASSERT_EQ(Generate("h", {"--id-kind", "hash"}).exit_code, 0);
  Result<NpyArray> ids = ReadNpyFile(dir_.File("h/train_ids.npy"));
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  EXPECT_EQ(ids->dtype, NpyDtype::kUint64);
  int high = 0;
  for (uint64_t id : Ids(*ids)) high += (id >> 63) != 0 ? 1 : 0;
  // About half the ids have the top bit set; far from none and from all.
  EXPECT_GT(high, kTrain * kFields / 4);
  EXPECT_LT(high, kTrain * kFields * 3 / 4);
}

TEST_F(GenCtrTest, BadFlagsAreOneLineAndStatus2) {
  for (const std::vector<std::string>& bad : std::vector<std::vector<std::string>>{
           {"--zipf", "0"}, {"--vocab", "0"}, {"--id-kind", "modulo"}, {"--train", "-3"}}) {
    Finished run = Generate("bad", bad);
    EXPECT_EQ(run.exit_code, 2) << bad[0];
    ASSERT_EQ(run.ErrLines().size(), 1u) << run.err;
    EXPECT_NE(run.err.find(bad[0]), std::string::npos) << run.err;
  }
}

// The sampler draws rank k with probability k^-s / H(n, s), also at and below s = 1 (the
// flat long tails --zipf allows since tiered tables): 400,000 draws over 8 ranks land within
// 0.4 percentage points of each rank's share.
TEST(ZipfSamplerTest, DrawsEachRankAsOftenAsItsShareAtAnyExponent) {
  struct Lcg {
    uint64_t x = 88172645463325252ULL;
    double Uniform() {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      return static_cast<double>(x >> 11) * 0x1.0p-53;
    }
  };
  constexpr int64_t kRanks = 8;
  constexpr int kDraws = 400000;
  for (double s : {0.3, 0.8, 1.0, 1.6}) {
    ZipfSampler zipf(kRanks, s);
    Lcg stream;
    std::vector<int> count(kRanks + 1, 0);
    for (int i = 0; i < kDraws; ++i) {
      const int64_t k = zipf.Sample(stream);
      ASSERT_GE(k, 1);
      ASSERT_LE(k, kRanks);
      ++count[static_cast<size_t>(k)];
    }
    double h = 0;
    for (int64_t k = 1; k <= kRanks; ++k) h += std::pow(static_cast<double>(k), -s);
    for (int64_t k = 1; k <= kRanks; ++k) {
      const double want = std::pow(static_cast<double>(k), -s) / h;
      EXPECT_NEAR(count[static_cast<size_t>(k)] / static_cast<double>(kDraws), want, 0.004)
          << "s " << s << ", rank " << k;
    }
  }
}

}  // namespace
}  // namespace parasync
