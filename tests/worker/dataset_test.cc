#include "worker/data/dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "tests/support/data_files.h"

namespace parasync {
namespace {

using ::parasync::testing::IdxBytes;
using ::parasync::testing::LeBytes;
using ::parasync::testing::NpyBytes;
using ::parasync::testing::TempDir;
using ::parasync::testing::WriteFile;

// Pixel (e, h, w, c) of the channels-last test images: distinct for 2 images of 2x3x3.
uint8_t HwcPixel(int e, int h, int w, int c) {
  return static_cast<uint8_t>(e * 100 + (h * 3 + w) * 10 + c);
}

// The bytes of 2 images of 2 rows, 3 columns and 3 channels, channels last.
std::vector<uint8_t> HwcImages() {
  std::vector<uint8_t> v;
  for (int e = 0; e < 2; ++e)
    for (int h = 0; h < 2; ++h)
      for (int w = 0; w < 3; ++w)
        for (int c = 0; c < 3; ++c) v.push_back(HwcPixel(e, h, w, c));
  return v;
}

// Expects `d` to hold HwcImages() in CHW order, scaled by 1/255.
void ExpectChwImages(const Dataset& d) {
  EXPECT_EQ(d.n, 2);
  EXPECT_EQ(d.dim, 18);
  EXPECT_EQ(d.shape, (std::vector<int64_t>{3, 2, 3}));
  ASSERT_EQ(d.x.size(), 36u);
  for (int e = 0; e < 2; ++e)
    for (int c = 0; c < 3; ++c)
      for (int h = 0; h < 2; ++h)
        for (int w = 0; w < 3; ++w) {
          EXPECT_EQ(d.x[e * 18 + c * 6 + h * 3 + w],
                    static_cast<float>(HwcPixel(e, h, w, c)) * (1.0f / 255.0f))
              << e << " " << c << " " << h << " " << w;
        }
}

TEST(DatasetTest, LoadIdxDatasetScalesPixelsAndKeepsLabels) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  // Images compressed, labels plain: each file is found in either form.
  const std::vector<uint8_t> pixels = {0, 255, 51, 102, 10, 20, 30, 40};
  ASSERT_TRUE(WriteFile(dir.File("train-images-idx3-ubyte.gz"), IdxBytes({2, 2, 2}, pixels),
                        true));
  ASSERT_TRUE(WriteFile(dir.File("train-labels-idx1-ubyte"), IdxBytes({2}, {7, 3}), false));
  Result<Dataset> d = LoadIdxDataset(dir.path(), "train");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->n, 2);
  EXPECT_EQ(d->dim, 4);
  EXPECT_EQ(d->shape, (std::vector<int64_t>{1, 2, 2}));
  ASSERT_EQ(d->x.size(), 8u);
  for (size_t i = 0; i < pixels.size(); ++i) {
    EXPECT_FLOAT_EQ(d->x[i], static_cast<float>(pixels[i]) / 255.0f) << i;
  }
  EXPECT_EQ(d->y, (std::vector<uint8_t>{7, 3}));
}

TEST(DatasetTest, LoadIdxDatasetPrefersGzipWhenBothExist) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  ASSERT_TRUE(WriteFile(dir.File("t10k-images-idx3-ubyte.gz"), IdxBytes({1, 1, 1}, {1}), true));
  ASSERT_TRUE(WriteFile(dir.File("t10k-images-idx3-ubyte"), IdxBytes({1, 1, 1}, {2}), false));
  ASSERT_TRUE(WriteFile(dir.File("t10k-labels-idx1-ubyte"), IdxBytes({1}, {0}), false));
  Result<Dataset> d = LoadIdxDataset(dir.path(), "t10k");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_FLOAT_EQ(d->x[0], 1.0f / 255.0f);
}

TEST(DatasetTest, LoadIdxDatasetWithCountMismatchIsCorruption) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  ASSERT_TRUE(WriteFile(dir.File("train-images-idx3-ubyte"),
                        IdxBytes({3, 1, 2}, {1, 2, 3, 4, 5, 6}), false));
  ASSERT_TRUE(WriteFile(dir.File("train-labels-idx1-ubyte"), IdxBytes({2}, {0, 1}), false));
  Result<Dataset> d = LoadIdxDataset(dir.path(), "train");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kCorruption);
  EXPECT_NE(d.status().message().find("3 images but 2 labels"), std::string::npos)
      << d.status().message();
}

TEST(DatasetTest, LoadIdxDatasetWithWrongRankIsCorruption) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  // Labels stored as images and vice versa.
  ASSERT_TRUE(WriteFile(dir.File("train-images-idx3-ubyte"), IdxBytes({2}, {0, 1}), false));
  ASSERT_TRUE(WriteFile(dir.File("train-labels-idx1-ubyte"), IdxBytes({2, 1, 1}, {0, 1}), false));
  Result<Dataset> d = LoadIdxDataset(dir.path(), "train");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kCorruption);
}

TEST(DatasetTest, LoadIdxDatasetWithMissingFilesIsNotFound) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  Result<Dataset> d = LoadIdxDataset(dir.path(), "train");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kNotFound);
  EXPECT_NE(d.status().message().find("train-images-idx3-ubyte"), std::string::npos)
      << d.status().message();

  ASSERT_TRUE(WriteFile(dir.File("train-images-idx3-ubyte"), IdxBytes({1, 1, 1}, {1}), false));
  d = LoadIdxDataset(dir.path(), "train");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kNotFound);
  EXPECT_NE(d.status().message().find("train-labels-idx1-ubyte"), std::string::npos)
      << d.status().message();
}

TEST(DatasetTest, LoadIdxDatasetTransposesChannelsLastImagesToChw) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  ASSERT_TRUE(WriteFile(dir.File("train-images-idx4-ubyte"), IdxBytes({2, 2, 3, 3}, HwcImages()),
                        false));
  ASSERT_TRUE(WriteFile(dir.File("train-labels-idx1-ubyte.gz"), IdxBytes({2}, {4, 9}), true));
  Result<Dataset> d = LoadIdxDataset(dir.path(), "train");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ExpectChwImages(*d);
  EXPECT_EQ(d->y, (std::vector<uint8_t>{4, 9}));
}

TEST(DatasetTest, LoadNpyDatasetKeepsFloat32FeaturesExactly) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::vector<float> x = {0.1f, -2.5f, 1e-30f, 3e38f, 0.0f, 255.0f};
  ASSERT_TRUE(WriteFile(dir.File("x.npy"), NpyBytes("<f4", {3, 2}, LeBytes(x)), false));
  ASSERT_TRUE(WriteFile(dir.File("y.npy"),
                        NpyBytes("<i8", {3}, LeBytes(std::vector<int64_t>{0, 255, 7})), false));
  Result<Dataset> d = LoadNpyDataset(dir.File("x.npy"), dir.File("y.npy"));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->n, 3);
  EXPECT_EQ(d->dim, 2);
  EXPECT_EQ(d->shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(d->x, x);
  EXPECT_EQ(d->y, (std::vector<uint8_t>{0, 255, 7}));
}

TEST(DatasetTest, LoadNpyDatasetTransposesUint8ChannelsLastToChwAndScales) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  ASSERT_TRUE(WriteFile(dir.File("x.npy"), NpyBytes("|u1", {2, 2, 3, 3}, HwcImages()), false));
  ASSERT_TRUE(WriteFile(dir.File("y.npy"), NpyBytes("|u1", {2, 1}, {4, 9}), false));
  Result<Dataset> d = LoadNpyDataset(dir.File("x.npy"), dir.File("y.npy"));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ExpectChwImages(*d);
  EXPECT_EQ(d->y, (std::vector<uint8_t>{4, 9}));
}

TEST(DatasetTest, LoadNpyDatasetTakesIntegerFeaturesAsTheyAreUpTo2To24) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::vector<int64_t> ids = {0, 16777216, -16777216, 5};
  ASSERT_TRUE(WriteFile(dir.File("x.npy"), NpyBytes("<i8", {2, 2}, LeBytes(ids)), false));
  ASSERT_TRUE(WriteFile(dir.File("y.npy"), NpyBytes("|u1", {2}, {1, 0}), false));
  Result<Dataset> d = LoadNpyDataset(dir.File("x.npy"), dir.File("y.npy"));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(d->x, (std::vector<float>{0.0f, 16777216.0f, -16777216.0f, 5.0f}));

  const std::vector<int64_t> too_big = {0, 1, 16777217, 2};
  ASSERT_TRUE(WriteFile(dir.File("x.npy"), NpyBytes("<i8", {2, 2}, LeBytes(too_big)), false));
  d = LoadNpyDataset(dir.File("x.npy"), dir.File("y.npy"));
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("element 2 (example 1) is 16777217"), std::string::npos)
      << d.status().message();
}

TEST(DatasetTest, LoadNpyDatasetMapsFeatureShapesToExampleShapes) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  ASSERT_TRUE(WriteFile(dir.File("y.npy"),
                        NpyBytes("<i4", {2}, LeBytes(std::vector<int32_t>{1, 2})), false));
  struct Case {
    std::vector<int64_t> file_shape;
    std::vector<int64_t> example_shape;  // empty: refused
  };
  for (const Case& c : {Case{{2}, {1}}, Case{{2, 3, 4}, {1, 3, 4}}, Case{{2, 1, 1, 1, 1}, {}}}) {
    int64_t count = 1;
    for (int64_t dim : c.file_shape) count *= dim;
    const std::vector<double> x(static_cast<size_t>(count), 0.25);
    ASSERT_TRUE(WriteFile(dir.File("x.npy"), NpyBytes("<f8", c.file_shape, LeBytes(x)), false));
    Result<Dataset> d = LoadNpyDataset(dir.File("x.npy"), dir.File("y.npy"));
    if (c.example_shape.empty()) {
      ASSERT_FALSE(d.ok());
      EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument) << d.status().ToString();
      continue;
    }
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(d->shape, c.example_shape);
    EXPECT_EQ(d->dim, count / 2);
    EXPECT_EQ(d->x, std::vector<float>(static_cast<size_t>(count), 0.25f));
  }
}

TEST(DatasetTest, LoadNpyDatasetLabelOutsideUint8IsInvalidArgumentNamingExample) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string x = dir.File("x.npy");
  const std::string y = dir.File("y.npy");
  ASSERT_TRUE(WriteFile(x, NpyBytes("|u1", {3, 1}, {1, 2, 3}), false));
  ASSERT_TRUE(WriteFile(y, NpyBytes("<i2", {3}, LeBytes(std::vector<int16_t>{3, 300, 1})),
                        false));
  Result<Dataset> d = LoadNpyDataset(x, y);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find(y + ": example 1 has label 300"), std::string::npos)
      << d.status().message();

  ASSERT_TRUE(WriteFile(y, NpyBytes("<i8", {3, 1}, LeBytes(std::vector<int64_t>{0, 1, -1})),
                        false));
  d = LoadNpyDataset(x, y);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("example 2 has label -1"), std::string::npos)
      << d.status().message();

  ASSERT_TRUE(WriteFile(y, NpyBytes("<f4", {3}, LeBytes(std::vector<float>{0, 1, 2})), false));
  d = LoadNpyDataset(x, y);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("must be integers"), std::string::npos)
      << d.status().message();
}

TEST(DatasetTest, LoadNpyDatasetCountMismatchIsCorruptionNamingBothFiles) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string x = dir.File("x.npy");
  const std::string y = dir.File("y.npy");
  ASSERT_TRUE(WriteFile(x, NpyBytes("|u1", {3, 2}, {1, 2, 3, 4, 5, 6}), false));
  ASSERT_TRUE(WriteFile(y, NpyBytes("|u1", {2}, {0, 1}), false));
  Result<Dataset> d = LoadNpyDataset(x, y);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kCorruption);
  EXPECT_NE(d.status().message().find(x + " have 3 examples but labels " + y + " have 2"),
            std::string::npos)
      << d.status().message();
}

TEST(DatasetTest, LoadDatasetPrefersIdxAndFallsBackToNpy) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  // train: both formats, IDX wins. test: NumPy only (IDX "t10k" files absent).
  ASSERT_TRUE(WriteFile(dir.File("train-images-idx3-ubyte"), IdxBytes({1, 1, 2}, {0, 255}),
                        false));
  ASSERT_TRUE(WriteFile(dir.File("train-labels-idx1-ubyte"), IdxBytes({1}, {6}), false));
  ASSERT_TRUE(WriteFile(dir.File("train_x.npy"), NpyBytes("|u1", {2, 5}, std::vector<uint8_t>(10)),
                        false));
  ASSERT_TRUE(WriteFile(dir.File("train_y.npy"), NpyBytes("|u1", {2}, {0, 0}), false));
  ASSERT_TRUE(WriteFile(dir.File("test_x.npy"),
                        NpyBytes("<f4", {1, 3}, LeBytes(std::vector<float>{1, 2, 3})), false));
  ASSERT_TRUE(WriteFile(dir.File("test_y.npy"), NpyBytes("|u1", {1}, {8}), false));

  Result<Dataset> train = LoadDataset(dir.path(), "train");
  ASSERT_TRUE(train.ok()) << train.status().ToString();
  EXPECT_EQ(train->shape, (std::vector<int64_t>{1, 1, 2}));
  EXPECT_EQ(train->x, (std::vector<float>{0.0f, 1.0f}));
  EXPECT_EQ(train->y, (std::vector<uint8_t>{6}));

  Result<Dataset> test = LoadDataset(dir.path(), "test");
  ASSERT_TRUE(test.ok()) << test.status().ToString();
  EXPECT_EQ(test->shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(test->x, (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(test->y, (std::vector<uint8_t>{8}));
  EXPECT_TRUE(CheckDataFilesExist(dir.path()).ok());

  Result<Dataset> other = LoadDataset(dir.path(), "t10k");
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), StatusCode::kInvalidArgument);
}

TEST(DatasetTest, MissingDataFilesAreNotFoundInOneLineNamingBothPairs) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  // Half of each pair is no pair.
  ASSERT_TRUE(WriteFile(dir.File("train-images-idx3-ubyte"), IdxBytes({1, 1, 1}, {1}), false));
  ASSERT_TRUE(WriteFile(dir.File("train_y.npy"), NpyBytes("|u1", {1}, {0}), false));
  Result<Dataset> d = LoadDataset(dir.path(), "train");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(d.status().message(),
            "--dataset " + dir.path() +
                " lacks train-images-idx3-ubyte[.gz] + train-labels-idx1-ubyte[.gz] and "
                "train_x.npy (or train_ids.npy) + train_y.npy (either pair will do)");

  ASSERT_TRUE(WriteFile(dir.File("train-labels-idx1-ubyte"), IdxBytes({1}, {0}), false));
  const Status check = CheckDataFilesExist(dir.path());
  EXPECT_EQ(check.code(), StatusCode::kNotFound);
  EXPECT_EQ(check.message(), "--dataset " + dir.path() +
                                 " lacks t10k-images-idx3-ubyte[.gz] + "
                                 "t10k-labels-idx1-ubyte[.gz] and test_x.npy (or test_ids.npy) + test_y.npy "
                                 "(either pair will do)");
}

TEST(DatasetTest, MaxLabelIsTheLargestLabelOrMinusOne) {
  Dataset d;
  EXPECT_EQ(MaxLabel(d), -1);
  d.y = {3, 255, 0};
  EXPECT_EQ(MaxLabel(d), 255);
}

// The real data set, where the machine has it (PARASYNC_DATA_DIR overrides the location).
TEST(DatasetTest, LoadsFashionMnistTrainAndTestSplits) {
  const char* env = std::getenv("PARASYNC_DATA_DIR");
  const std::string dir = env != nullptr ? env : "/usr/share/datasets/fashion-mnist";
  if (!std::filesystem::exists(dir + "/train-labels-idx1-ubyte.gz") &&
      !std::filesystem::exists(dir + "/train-labels-idx1-ubyte")) {
    GTEST_SKIP() << "Fashion-MNIST not found in " << dir << " (set PARASYNC_DATA_DIR)";
  }
  struct Split {
    const char* name;
    int64_t n;
  };
  for (const Split split : {Split{"train", 60000}, Split{"t10k", 10000}}) {
    Result<Dataset> d = LoadIdxDataset(dir, split.name);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(d->n, split.n) << split.name;
    EXPECT_EQ(d->dim, 784) << split.name;
    EXPECT_EQ(d->shape, (std::vector<int64_t>{1, 28, 28})) << split.name;
    ASSERT_EQ(d->x.size(), static_cast<size_t>(split.n * 784));
    ASSERT_EQ(d->y.size(), static_cast<size_t>(split.n));
    const auto [lo, hi] = std::minmax_element(d->x.begin(), d->x.end());
    EXPECT_EQ(*lo, 0.0f);
    EXPECT_EQ(*hi, 1.0f);
    // Fashion-MNIST is balanced: every one of the 10 classes has n / 10 examples.
    std::vector<int64_t> per_class(256, 0);
    for (uint8_t label : d->y) ++per_class[label];
    for (int c = 0; c < 10; ++c) EXPECT_EQ(per_class[c], split.n / 10) << split.name << " " << c;
    EXPECT_EQ(std::accumulate(per_class.begin() + 10, per_class.end(), int64_t{0}), 0);
  }
}

TEST(DatasetTest, ShardIndicesAreDisjointCoverAllAndBalanced) {
  for (int64_t n : {0, 1, 5, 10, 1001}) {
    for (int world = 1; world <= 5; ++world) {
      std::vector<int> owner(static_cast<size_t>(n), -1);
      size_t min_size = SIZE_MAX, max_size = 0;
      for (int rank = 0; rank < world; ++rank) {
        std::vector<int64_t> shard = ShardIndices(n, rank, world);
        EXPECT_TRUE(std::is_sorted(shard.begin(), shard.end()));
        min_size = std::min(min_size, shard.size());
        max_size = std::max(max_size, shard.size());
        for (int64_t i : shard) {
          ASSERT_GE(i, 0);
          ASSERT_LT(i, n);
          EXPECT_EQ(owner[i], -1) << "index " << i << " in two shards";
          owner[i] = rank;
          EXPECT_EQ(i % world, rank);
        }
      }
      EXPECT_LE(max_size - min_size, 1u) << "n=" << n << " world=" << world;
      EXPECT_EQ(std::count(owner.begin(), owner.end(), -1), 0) << "n=" << n << " world=" << world;
    }
  }
}

TEST(DatasetTest, ShardIndicesOfBadArgumentsIsEmpty) {
  EXPECT_TRUE(ShardIndices(10, 0, 0).empty());
  EXPECT_TRUE(ShardIndices(10, -1, 2).empty());
  EXPECT_TRUE(ShardIndices(10, 2, 2).empty());
  EXPECT_TRUE(ShardIndices(-1, 0, 1).empty());
}

std::vector<int64_t> Iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

std::vector<int64_t> Shuffled(int64_t n, uint64_t seed, int rank, int epoch) {
  std::vector<int64_t> v = Iota(n);
  ShuffleForEpoch(&v, seed, rank, epoch);
  return v;
}

TEST(DatasetTest, ShuffleForEpochIsADeterministicPermutation) {
  const std::vector<int64_t> a = Shuffled(1000, 42, 1, 3);
  EXPECT_EQ(a, Shuffled(1000, 42, 1, 3));
  EXPECT_NE(a, Iota(1000));
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, Iota(1000));
}

TEST(DatasetTest, ShuffleForEpochDiffersAcrossEpochsRanksAndSeeds) {
  const std::vector<int64_t> base = Shuffled(1000, 42, 0, 0);
  EXPECT_NE(base, Shuffled(1000, 42, 0, 1));
  EXPECT_NE(base, Shuffled(1000, 42, 1, 0));
  EXPECT_NE(base, Shuffled(1000, 43, 0, 0));
  EXPECT_NE(Shuffled(1000, 42, 0, 1), Shuffled(1000, 42, 1, 0));
}

TEST(DatasetTest, ShuffleForEpochOrderIsPinned) {
  // The order must not change between builds or standard libraries: workers and restarts
  // rely on it. mt19937_64 is fully specified and the draw is our own, so this holds.
  EXPECT_EQ(Shuffled(10, 42, 0, 0), (std::vector<int64_t>{9, 2, 4, 8, 5, 7, 1, 0, 6, 3}));
}

TEST(DatasetTest, ShuffleForEpochHandlesTinyInputs) {
  std::vector<int64_t> empty;
  ShuffleForEpoch(&empty, 1, 0, 0);
  EXPECT_TRUE(empty.empty());
  std::vector<int64_t> one = {5};
  ShuffleForEpoch(&one, 1, 0, 0);
  EXPECT_EQ(one, (std::vector<int64_t>{5}));
}

TEST(DatasetTest, GatherBatchCopiesRowsInIndexOrder) {
  Dataset d;
  d.n = 4;
  d.dim = 3;
  d.x = {0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32};
  d.y = {5, 6, 7, 8};
  const std::vector<int64_t> idx = {2, 0, 2};
  std::vector<float> x(9, -1.0f);
  std::vector<uint8_t> y(3, 0);
  GatherBatch(d, idx, x.data(), y.data());
  EXPECT_EQ(x, (std::vector<float>{20, 21, 22, 0, 1, 2, 20, 21, 22}));
  EXPECT_EQ(y, (std::vector<uint8_t>{7, 5, 7}));
}

// ---- Ids beside the NumPy features -----------------------------------------------------------

// Writes <split>_y.npy with `n` labels 0, 1, 0, ... into `dir`.
bool WriteLabels(const TempDir& dir, const std::string& split, int64_t n) {
  std::vector<uint8_t> y;
  for (int64_t i = 0; i < n; ++i) y.push_back(static_cast<uint8_t>(i % 2));
  return WriteFile(dir.File(split + "_y.npy"), NpyBytes("|u1", {n}, y), false);
}

TEST(DatasetTest, LoadDatasetReadsUint64IdColumnsBesideTheFeatures) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::vector<float> x = {1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(WriteFile(dir.File("train_x.npy"), NpyBytes("<f4", {3, 2}, LeBytes(x)), false));
  ASSERT_TRUE(WriteLabels(dir, "train", 3));
  const std::vector<uint64_t> ids = {0, 18446744073709551615ULL, 7, 7, uint64_t{1} << 63, 42};
  ASSERT_TRUE(WriteFile(dir.File("train_ids.npy"), NpyBytes("<u8", {3, 2}, LeBytes(ids)), false));
  Result<Dataset> d = LoadDataset(dir.path(), "train");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->n, 3);
  EXPECT_EQ(d->dim, 2);
  EXPECT_EQ(d->x, x);
  EXPECT_EQ(d->id_columns, 2);
  EXPECT_EQ(d->ids, ids);
  EXPECT_EQ(ModelInputShape(*d), (std::vector<int64_t>{4}));
}

TEST(DatasetTest, IdsAloneNeedNoFeaturesFile) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  for (const std::string split : {"train", "test"}) {
    ASSERT_TRUE(WriteLabels(dir, split, 3));
    ASSERT_TRUE(WriteFile(dir.File(split + "_ids.npy"),
                          NpyBytes("<i8", {3}, LeBytes(std::vector<int64_t>{5, 0, 9})), false));
  }
  EXPECT_TRUE(CheckDataFilesExist(dir.path()).ok());
  Result<Dataset> d = LoadDataset(dir.path(), "test");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->n, 3);
  EXPECT_EQ(d->dim, 0);
  EXPECT_EQ(d->shape, (std::vector<int64_t>{0}));
  EXPECT_TRUE(d->x.empty());
  EXPECT_EQ(d->y, (std::vector<uint8_t>{0, 1, 0}));
  EXPECT_EQ(d->id_columns, 1);
  EXPECT_EQ(d->ids, (std::vector<uint64_t>{5, 0, 9}));
  EXPECT_EQ(ModelInputShape(*d), (std::vector<int64_t>{1}));
  // No features to copy; labels still arrive.
  std::vector<uint8_t> y(2);
  const std::vector<int64_t> idx = {2, 1};
  GatherBatch(*d, idx, nullptr, y.data());
  EXPECT_EQ(y, (std::vector<uint8_t>{0, 1}));
  // Without ids, labels alone are no data set.
  std::filesystem::remove(dir.File("train_ids.npy"));
  EXPECT_EQ(LoadDataset(dir.path(), "train").status().code(), StatusCode::kNotFound);
}

TEST(DatasetTest, NegativeInt64IdIsInvalidArgumentNamingFileExampleAndValue) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  ASSERT_TRUE(WriteLabels(dir, "train", 2));
  ASSERT_TRUE(WriteFile(dir.File("train_ids.npy"),
                        NpyBytes("<i8", {2, 2}, LeBytes(std::vector<int64_t>{1, 2, 3, -4})), false));
  Result<Dataset> d = LoadDataset(dir.path(), "train");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d.status().message(), "ids " + dir.File("train_ids.npy") +
                                      ": example 1 has id -4; int64 ids must be >= 0");
  // Float ids are refused too: they could not be exact.
  ASSERT_TRUE(WriteFile(dir.File("train_ids.npy"),
                        NpyBytes("<f8", {2}, LeBytes(std::vector<double>{1, 2})), false));
  d = LoadDataset(dir.path(), "train");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("ids must be int64 or uint64"), std::string::npos)
      << d.status().message();
}

TEST(DatasetTest, IdsOfAnotherExampleCountAreCorruptionNamingBothFiles) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  ASSERT_TRUE(WriteLabels(dir, "train", 3));
  ASSERT_TRUE(WriteFile(dir.File("train_x.npy"),
                        NpyBytes("<f4", {3}, LeBytes(std::vector<float>{1, 2, 3})), false));
  ASSERT_TRUE(WriteFile(dir.File("train_ids.npy"),
                        NpyBytes("<u8", {2, 1}, LeBytes(std::vector<uint64_t>{1, 2})), false));
  Result<Dataset> d = LoadDataset(dir.path(), "train");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kCorruption);
  EXPECT_EQ(d.status().message(), "ids " + dir.File("train_ids.npy") + " have 2 examples but labels " +
                                      dir.File("train_y.npy") + " have 3");
}

}  // namespace
}  // namespace parasync
