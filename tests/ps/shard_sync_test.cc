// ps/shard.h: sync steps (Accumulate, ApplyAccumulated, lr_scale) and learning-rate schedules.
#include "ps/shard.h"

#include "ps/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>


#include "tests/ps/shard_test_util.h"

namespace parasync {
namespace {

using namespace shard_test;  // this file's helpers: tests/ps/shard_test_util.h

TEST(ShardSyncTest, ApplyAccumulatedOfThreeGradientsIsSgdWithTheirMean) {
  Shard shard(0, 1);
  const ModelRegistration reg = SmallModel(1);
  MustRegister(shard, reg);
  const Snapshot before = Take(shard);
  const float scales[] = {1.0f, -2.0f, 4.5f};
  std::vector<Push> pushes;
  for (float scale : scales) pushes.push_back(WholeShardPush(shard, scale));
  RejectReason reason = RejectReason::kNone;
  for (const Push& p : pushes) ASSERT_TRUE(DoAccumulate(shard, p, &reason).ok());
  EXPECT_EQ(Take(shard), before) << "Accumulate must not change the values";

  ASSERT_TRUE(shard.ApplyAccumulated(3).ok());
  const Snapshot after = Take(shard);
  const double lr = reg.optimizer.learning_rate;
  const std::vector<SliceRange>& ranges = pushes[0].ranges;
  ASSERT_EQ(ranges.size(), after.values.size());
  for (size_t i = 0; i < ranges.size(); ++i) {
    const uint32_t id = ranges[i].slice_id;
    for (size_t k = 0; k < after.values[id].size(); ++k) {
      double mean = 0.0;
      for (const Push& p : pushes) mean += static_cast<double>(p.grads[i][k]);
      mean /= 3.0;
      const double want = static_cast<double>(before.values[id][k]) - lr * mean;
      EXPECT_NEAR(after.values[id][k], want, 1e-6) << "slice " << id << " element " << k;
    }
  }
}

// Gradients whose float sum depends on the order of addition: a big one and small ones.
std::vector<Push> OrderSensitivePushes(const Shard& shard) {
  std::vector<Push> pushes;
  for (float scale : {1e8f, 3.3f, -1e8f, 0.7f}) pushes.push_back(WholeShardPush(shard, scale));
  return pushes;
}

TEST(ShardSyncTest, StepResultIsTheSameWhateverOrderThePushesArriveIn) {
  const ModelRegistration reg = SmallModel(1);
  std::vector<Snapshot> results;
  // Rank order, reversed, and interleaved.
  for (const std::vector<int>& order :
       {std::vector<int>{0, 1, 2, 3}, std::vector<int>{3, 2, 1, 0}, std::vector<int>{2, 0, 3, 1}}) {
    Shard shard(0, 1);
    MustRegister(shard, reg);
    const std::vector<Push> pushes = OrderSensitivePushes(shard);
    RejectReason reason = RejectReason::kNone;
    for (int rank : order) ASSERT_TRUE(DoAccumulate(shard, pushes[rank], &reason, rank).ok());
    ASSERT_TRUE(shard.ApplyAccumulated(4).ok());
    results.push_back(Take(shard));
  }
  EXPECT_EQ(results[1], results[0]) << "reversed arrival changed the step";
  EXPECT_EQ(results[2], results[0]) << "interleaved arrival changed the step";
  // The test can fail: summing these in arrival order does depend on the order.
  float in_order = 0.0f, reversed = 0.0f;
  for (float v : {1e8f, 3.3f, -1e8f, 0.7f}) in_order += v;
  for (float v : {0.7f, -1e8f, 3.3f, 1e8f}) reversed += v;
  EXPECT_NE(in_order, reversed);
}

TEST(ShardSyncTest, VersionAndExamplesAdvanceOncePerApplyAccumulated) {
  Shard shard(0, 1);
  MustRegister(shard, SmallModel(1));
  RejectReason reason = RejectReason::kNone;
  Push p = WholeShardPush(shard, 1.0f);
  p.batch_examples = 8;
  ASSERT_TRUE(DoAccumulate(shard, p, &reason).ok());
  p.batch_examples = 24;
  ASSERT_TRUE(DoAccumulate(shard, p, &reason).ok());
  EXPECT_EQ(shard.version(), 0);
  EXPECT_EQ(shard.examples(), 0);
  ASSERT_TRUE(shard.ApplyAccumulated(2).ok());
  EXPECT_EQ(shard.version(), 1);
  EXPECT_EQ(shard.examples(), 32);
  p.batch_examples = 5;
  ASSERT_TRUE(DoAccumulate(shard, p, &reason).ok());
  ASSERT_TRUE(shard.ApplyAccumulated(1).ok());
  EXPECT_EQ(shard.version(), 2);
  EXPECT_EQ(shard.examples(), 37);
}

TEST(ShardSyncTest, ApplyAccumulatedClearsTheSumForTheNextStep) {
  // Step 1 averages {g, 3g}; step 2 gets only -g. A sum left over from step 1 would show.
  Shard shard(0, 1);
  Shard twin(0, 1);
  MustRegister(shard, SmallModel(1));
  MustRegister(twin, SmallModel(1));
  RejectReason reason = RejectReason::kNone;
  ASSERT_TRUE(DoAccumulate(shard, WholeShardPush(shard, 1.0f), &reason).ok());
  ASSERT_TRUE(DoAccumulate(shard, WholeShardPush(shard, 3.0f), &reason).ok());
  ASSERT_TRUE(shard.ApplyAccumulated(2).ok());
  ASSERT_TRUE(DoAccumulate(shard, WholeShardPush(shard, -1.0f), &reason).ok());
  ASSERT_TRUE(shard.ApplyAccumulated(1).ok());
  ASSERT_TRUE(DoPush(twin, WholeShardPush(twin, 2.0f), &reason).ok());
  ASSERT_TRUE(DoPush(twin, WholeShardPush(twin, -1.0f), &reason).ok());
  const Snapshot got = Take(shard);
  const Snapshot want = Take(twin);
  for (size_t id = 0; id < got.values.size(); ++id) {
    ASSERT_EQ(got.values[id].size(), want.values[id].size());
    for (size_t k = 0; k < got.values[id].size(); ++k) {
      EXPECT_FLOAT_EQ(got.values[id][k], want.values[id][k]) << "slice " << id << " [" << k << "]";
    }
  }
  EXPECT_EQ(got.version, 2);
}

TEST(ShardSyncTest, ApplyWithLrScaleHalfEqualsSgdWithHalfTheLearningRate) {
  Shard scaled(0, 1);
  Shard halved(0, 1);
  Shard plain(0, 1);
  MustRegister(scaled, SmallModel(1));
  ModelRegistration half = SmallModel(1);
  half.optimizer.learning_rate = SmallModel(1).optimizer.learning_rate / 2;
  MustRegister(halved, half);
  MustRegister(plain, SmallModel(1));
  const Push p = WholeShardPush(scaled, 1.0f);
  std::vector<const float*> ptrs;
  for (const auto& g : p.grads) ptrs.push_back(g.data());
  RejectReason reason = RejectReason::kNone;
  ASSERT_TRUE(scaled.Apply(p.ranges, ptrs, 8, &reason, 0.5f).ok());
  ASSERT_TRUE(halved.Apply(p.ranges, ptrs, 8, &reason).ok());
  ASSERT_TRUE(plain.Apply(p.ranges, ptrs, 8, &reason).ok());
  EXPECT_EQ(Take(scaled), Take(halved));
  EXPECT_NE(Take(scaled).values, Take(plain).values);
}

// A cosine schedule over 16 examples, pushes of 8: the factors are 1, 0.5 and then 0.
ModelRegistration CosineModel(OptimizerKind kind) {
  ModelRegistration reg = SmallModel(1, kind);
  reg.optimizer.schedule = LrSchedule::kCosine;
  reg.optimizer.decay_examples = 16;
  return reg;
}

TEST(ShardScheduleTest, EachPushUsesTheFactorAtTheExamplesAppliedBeforeIt) {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kMomentum,
                             OptimizerKind::kAdam}) {
    SCOPED_TRACE(std::string(OptimizerKindName(kind)));
    Shard scheduled(0, 1);
    Shard scaled(0, 1);  // the same optimizer, constant, scaled by hand
    MustRegister(scheduled, CosineModel(kind));
    MustRegister(scaled, SmallModel(1, kind));
    RejectReason reason = RejectReason::kNone;
    float previous_first = NAN;
    for (float factor : {1.0f, 0.5f, 0.0f, 0.0f}) {
      const Push p = WholeShardPush(scheduled, factor == 0.0f ? 3.0f : 1.0f);
      std::vector<const float*> ptrs;
      for (const auto& g : p.grads) ptrs.push_back(g.data());
      ASSERT_TRUE(scheduled.Apply(p.ranges, ptrs, 8, &reason).ok());
      ASSERT_TRUE(scaled.Apply(p.ranges, ptrs, 8, &reason, factor).ok());
      EXPECT_EQ(Take(scheduled), Take(scaled)) << "factor " << factor;
      const float first = scheduled.SliceValues(0)[0];
      if (factor == 0.0f) {
        EXPECT_EQ(first, previous_first);
      } else {
        EXPECT_NE(first, previous_first);
      }
      previous_first = first;
    }
  }
}

TEST(ShardScheduleTest, ASyncStepUsesTheFactorAtTheExamplesOfTheStepsBeforeIt) {
  Shard shard(0, 1);
  const ModelRegistration reg = CosineModel(OptimizerKind::kSgd);
  MustRegister(shard, reg);
  RejectReason reason = RejectReason::kNone;
  const double lr = reg.optimizer.learning_rate;
  // Two contributors of 4 examples a step: steps start at 0, 8 and 16 examples.
  for (double factor : {1.0, 0.5, 0.0}) {
    const Snapshot before = Take(shard);
    const Push a = WholeShardPush(shard, 1.0f);
    Push b = WholeShardPush(shard, -3.0f);
    Push a4 = a;
    a4.batch_examples = 4;
    b.batch_examples = 4;
    ASSERT_TRUE(DoAccumulate(shard, a4, &reason, 0).ok());
    ASSERT_TRUE(DoAccumulate(shard, b, &reason, 1).ok());
    ASSERT_TRUE(shard.ApplyAccumulated(2).ok());
    const Snapshot after = Take(shard);
    for (size_t i = 0; i < a.ranges.size(); ++i) {
      const uint32_t id = a.ranges[i].slice_id;
      for (size_t k = 0; k < after.values[id].size(); ++k) {
        const double mean = (static_cast<double>(a.grads[i][k]) + b.grads[i][k]) / 2;
        EXPECT_NEAR(after.values[id][k], before.values[id][k] - lr * factor * mean, 1e-6)
            << "factor " << factor << " slice " << id << " element " << k;
      }
    }
  }
  EXPECT_EQ(shard.examples(), 24);
}

}  // namespace
}  // namespace parasync
