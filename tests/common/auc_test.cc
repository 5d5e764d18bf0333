#include "common/auc.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace parasync {
namespace {

// The definition itself: over all (positive, negative) pairs, 1 when the positive scores
// higher, 1/2 on a tie. O(n^2), the reference RocAuc must agree with.
double PairwiseAuc(const std::vector<float>& scores, const std::vector<uint8_t>& labels) {
  double credit = 0;
  double pairs = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    if (labels[i] == 0) continue;
    for (size_t j = 0; j < scores.size(); ++j) {
      if (labels[j] != 0) continue;
      pairs += 1;
      if (scores[i] > scores[j]) credit += 1;
      if (scores[i] == scores[j]) credit += 0.5;
    }
  }
  return credit / pairs;
}

TEST(RocAucTest, PerfectRankingIsOne) {
  EXPECT_DOUBLE_EQ(RocAuc(std::vector<float>{0.1f, 0.2f, 0.8f, 0.9f},
                          std::vector<uint8_t>{0, 0, 1, 1}),
                   1.0);
}

TEST(RocAucTest, ReversedRankingIsZero) {
  EXPECT_DOUBLE_EQ(RocAuc(std::vector<float>{0.9f, 0.8f, 0.2f, 0.1f},
                          std::vector<uint8_t>{0, 0, 1, 1}),
                   0.0);
}

TEST(RocAucTest, AllTiedScoresGiveOneHalf) {
  EXPECT_DOUBLE_EQ(RocAuc(std::vector<float>(6, 0.3f), std::vector<uint8_t>{1, 0, 0, 1, 0, 1}),
                   0.5);
}

TEST(RocAucTest, TiesAcrossClassesGetHalfCredit) {
  // Positives 0.5, 0.7, 0.7; negatives 0.2, 0.5, 0.7. Pairs (pos, neg), 9 in all:
  // 0.5 beats 0.2, ties 0.5, loses to 0.7 -> 1.5; each 0.7 beats 0.2 and 0.5, ties 0.7 -> 2.5.
  // (1.5 + 2.5 + 2.5) / 9 = 6.5 / 9.
  const std::vector<float> scores = {0.5f, 0.2f, 0.7f, 0.5f, 0.7f, 0.7f};
  const std::vector<uint8_t> labels = {1, 0, 1, 0, 0, 1};
  EXPECT_NEAR(RocAuc(scores, labels), 6.5 / 9.0, 1e-12);
}

TEST(RocAucTest, AgreesWithPairwiseCountOnRandomData) {
  std::mt19937 rng(7);
  // Scores rounded to a coarse grid, so many ties fall across both classes.
  std::uniform_int_distribution<int> grid(0, 20);
  std::bernoulli_distribution coin(0.3);
  for (int trial = 0; trial < 5; ++trial) {
    std::vector<float> scores(400);
    std::vector<uint8_t> labels(400);
    for (size_t i = 0; i < scores.size(); ++i) {
      labels[i] = coin(rng) ? 1 : 0;
      // Positives shifted up a little, so the AUC is not near 1/2 by symmetry alone.
      scores[i] = static_cast<float>(grid(rng) + 3 * labels[i]) / 10.0f;
    }
    EXPECT_NEAR(RocAuc(scores, labels), PairwiseAuc(scores, labels), 1e-12) << trial;
  }
}

TEST(RocAucTest, OneClassOnlyOrMismatchedLengthsIsNaN) {
  EXPECT_TRUE(std::isnan(RocAuc(std::vector<float>{0.1f, 0.2f}, std::vector<uint8_t>{1, 1})));
  EXPECT_TRUE(std::isnan(RocAuc(std::vector<float>{0.1f, 0.2f}, std::vector<uint8_t>{0, 0})));
  EXPECT_TRUE(std::isnan(RocAuc(std::vector<float>{}, std::vector<uint8_t>{})));
  EXPECT_TRUE(std::isnan(RocAuc(std::vector<float>{0.1f, 0.2f}, std::vector<uint8_t>{0})));
}

TEST(LogLossTest, MeanCrossEntropyOfKnownValues) {
  // -(log 0.8 + log(1 - 0.4) + log 0.5) / 3
  const double expected = -(std::log(0.8) + std::log(0.6) + std::log(0.5)) / 3.0;
  EXPECT_NEAR(LogLoss(std::vector<float>{0.8f, 0.4f, 0.5f}, std::vector<uint8_t>{1, 0, 1}),
              expected, 1e-7);
}

TEST(LogLossTest, ConfidentMistakesAreClampedToAFiniteCost) {
  // p = 0 for a positive and p = 1 for a negative both cost -log(1e-7) = 16.118...
  const double cost = -std::log(1e-7);
  EXPECT_NEAR(LogLoss(std::vector<float>{0.0f, 1.0f}, std::vector<uint8_t>{1, 0}), cost, 1e-3);
  EXPECT_NEAR(LogLoss(std::vector<float>{1.0f, 0.0f}, std::vector<uint8_t>{1, 0}), 0.0, 1e-6);
}

TEST(LogLossTest, EmptyOrMismatchedIsNaN) {
  EXPECT_TRUE(std::isnan(LogLoss(std::vector<float>{}, std::vector<uint8_t>{})));
  EXPECT_TRUE(std::isnan(LogLoss(std::vector<float>{0.5f}, std::vector<uint8_t>{1, 0})));
}

}  // namespace
}  // namespace parasync
