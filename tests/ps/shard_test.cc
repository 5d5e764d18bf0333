// ps/shard.h: registering, pushing and reading slices.
// (Refused pushes: shard_reject_test.cc; sync steps and schedules: shard_sync_test.cc; loans
// and parallel or streaming applies: shard_apply_test.cc.)
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

TEST(ShardTest, RegisterCreatesOnlyThisShardsSlices) {
  Shard shard(1, 2);
  EXPECT_FALSE(shard.registered());
  EXPECT_EQ(shard.slice_map(), nullptr);
  EXPECT_EQ(shard.num_elements(), 0);
  MustRegister(shard, SmallModel(2));
  ASSERT_TRUE(shard.registered());
  const SliceMap& map = MapOf(shard);
  EXPECT_EQ(shard.num_slices(), static_cast<int>(map.SlicesOfShard(1).size()));
  EXPECT_EQ(shard.num_elements(), map.ShardLoad(1));
  for (const SliceInfo& s : map.slices()) {
    EXPECT_EQ(shard.SliceValues(s.id).size(), s.shard == 1 ? static_cast<size_t>(s.length) : 0u)
        << "slice " << s.id;
  }
  EXPECT_TRUE(shard.SliceValues(1000).empty());
  EXPECT_EQ(shard.version(), 0);
  EXPECT_EQ(shard.examples(), 0);
}

TEST(ShardTest, RegisterInitializesFromSeedIndependentlyOfSharding) {
  const ModelRegistration reg = SmallModel(2);
  Shard s0(0, 2);
  Shard s1(1, 2);
  MustRegister(s0, reg);
  MustRegister(s1, reg);
  ModelRegistration one = reg;
  one.num_shards = 1;
  one.max_slice_elements = 1000;  // the whole kernel in one slice
  Shard whole(0, 1);
  MustRegister(whole, one);
  for (uint32_t v = 0; v < reg.variables.size(); ++v) {
    const std::vector<float> split = AssembleVariable({&s0, &s1}, v);
    std::vector<float> expected(static_cast<size_t>(reg.variables[v].num_elements()));
    InitializeElements(reg.variables[v].init, reg.seed, v, 0, expected.data(),
                       static_cast<int64_t>(expected.size()));
    EXPECT_EQ(split, expected) << reg.variables[v].name;
    EXPECT_EQ(AssembleVariable({&whole}, v), expected) << reg.variables[v].name;
  }
}

TEST(ShardTest, RegisterWithSameSeedGivesSameValues) {
  Shard a(0, 2);
  Shard b(0, 2);
  MustRegister(a, SmallModel(2));
  MustRegister(b, SmallModel(2));
  EXPECT_EQ(Take(a), Take(b));
  ModelRegistration other = SmallModel(2);
  other.seed = 4321;
  Shard c(0, 2);
  MustRegister(c, other);
  EXPECT_NE(Take(a).values, Take(c).values);
}

TEST(ShardTest, RegisterDrawsKernelUniformlyWithinLimitAndZeroesBias) {
  Shard shard(0, 1);
  MustRegister(shard, SmallModel(1));
  const std::vector<float> kernel = AssembleVariable({&shard}, 0);
  ASSERT_EQ(kernel.size(), 30u);
  bool any_nonzero = false;
  for (float x : kernel) {
    EXPECT_GE(x, -kLimit);
    EXPECT_LT(x, kLimit);
    any_nonzero |= x != 0.0f;
  }
  EXPECT_TRUE(any_nonzero);
  for (float x : AssembleVariable({&shard}, 1)) EXPECT_EQ(x, 0.0f);
}

TEST(ShardTest, ReRegisterIdenticalIsOkAndKeepsTrainedValues) {
  Shard shard(0, 1);
  MustRegister(shard, SmallModel(1));
  RejectReason reason = RejectReason::kNone;
  ASSERT_TRUE(DoPush(shard, {{{0, 0, 8}}, {Ramp(8)}}, &reason).ok());
  const Snapshot trained = Take(shard);
  MustRegister(shard, SmallModel(1));
  EXPECT_EQ(Take(shard), trained);
}

TEST(ShardTest, ReRegisterWithDifferentShapeIsFailedPreconditionNamingBothShapes) {
  Shard shard(0, 1);
  MustRegister(shard, SmallModel(1));
  const Snapshot before = Take(shard);
  ModelRegistration changed = SmallModel(1);
  changed.variables[0].shape = {7, 5};
  RejectReason reason = RejectReason::kNone;
  Status s = shard.Register(changed, &reason);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(reason, RejectReason::kRegisterMismatch);
  EXPECT_TRUE(Contains(s.message(), "dense/kernel")) << s.message();
  EXPECT_TRUE(Contains(s.message(), "[7,5]")) << s.message();
  EXPECT_TRUE(Contains(s.message(), "[6,5]")) << s.message();
  EXPECT_EQ(Take(shard), before);
}

TEST(ShardTest, ReRegisterWithDifferentOptimizerIsRegisterMismatch) {
  Shard shard(0, 1);
  MustRegister(shard, SmallModel(1));
  RejectReason reason = RejectReason::kNone;
  Status s = shard.Register(SmallModel(1, OptimizerKind::kAdam), &reason);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(reason, RejectReason::kRegisterMismatch);
}

TEST(ShardTest, RegisterWithOtherShardCountIsRejected) {
  Shard shard(0, 2);
  RejectReason reason = RejectReason::kNone;
  Status s = shard.Register(SmallModel(3), &reason);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(reason, RejectReason::kBadRegistration);
  EXPECT_TRUE(Contains(s.message(), "expects 3 parameter servers")) << s.message();
  EXPECT_TRUE(Contains(s.message(), "this cluster has 2")) << s.message();
  EXPECT_FALSE(shard.registered());
}

TEST(ShardTest, RegisterOfInvalidModelIsBadRegistration) {
  ModelRegistration empty = SmallModel(1);
  empty.variables.clear();
  ModelRegistration no_lr = SmallModel(1);
  no_lr.optimizer.learning_rate = 0.0f;
  ModelRegistration zero_slice = SmallModel(1);
  zero_slice.max_slice_elements = 0;
  for (const ModelRegistration& reg : {empty, no_lr, zero_slice}) {
    Shard shard(0, 1);
    RejectReason reason = RejectReason::kNone;
    Status s = shard.Register(reg, &reason);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(reason, RejectReason::kBadRegistration);
    EXPECT_FALSE(shard.registered());
  }
}

TEST(ShardTest, PullBeforeRegisterIsNotRegistered) {
  Shard shard(0, 1);
  const std::vector<SliceRange> ranges = {{0, 0, 1}};
  RejectReason reason = RejectReason::kNone;
  Status s = shard.ValidateRanges(ranges, DType::kFloat32, std::nullopt, &reason);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(reason, RejectReason::kNotRegistered);
}

TEST(ShardTest, PushBeforeRegisterIsNotRegistered) {
  Shard shard(0, 1);
  const std::vector<SliceRange> ranges = {{0, 0, 1}};
  const std::vector<size_t> bytes = {4};
  RejectReason reason = RejectReason::kNone;
  Status s = shard.ValidateRanges(ranges, DType::kFloat32, std::span<const size_t>(bytes), &reason);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(reason, RejectReason::kNotRegistered);
}

TEST(ShardTest, ReadCopiesRequestedRanges) {
  Shard shard(0, 1);
  MustRegister(shard, SmallModel(1));
  const std::vector<SliceRange> ranges = {{0, 2, 3}, {1, 0, 8}};
  RejectReason reason = RejectReason::kNone;
  ASSERT_TRUE(shard.ValidateRanges(ranges, DType::kFloat32, std::nullopt, &reason).ok());
  std::vector<float> a(3), b(8);
  float* out[] = {a.data(), b.data()};
  shard.Read(ranges, out);
  const auto s0 = shard.SliceValues(0);
  const auto s1 = shard.SliceValues(1);
  EXPECT_EQ(a, std::vector<float>(s0.begin() + 2, s0.begin() + 5));
  EXPECT_EQ(b, std::vector<float>(s1.begin(), s1.end()));
}

TEST(ShardTest, SgdPushSubtractsLearningRateTimesGradient) {
  Shard shard(0, 1);
  const ModelRegistration reg = SmallModel(1);
  MustRegister(shard, reg);
  const Snapshot before = Take(shard);
  const std::vector<float> g0 = Ramp(8, 3.0f);
  const std::vector<float> g1 = Ramp(4, -2.0f);
  RejectReason reason = RejectReason::kNone;
  // All of slice 0, and elements [3, 7) of slice 1.
  ASSERT_TRUE(DoPush(shard, {{{0, 0, 8}, {1, 3, 4}}, {g0, g1}}, &reason).ok());
  const Snapshot after = Take(shard);
  const float lr = reg.optimizer.learning_rate;
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_FLOAT_EQ(after.values[0][i], before.values[0][i] - lr * g0[i]) << i;
  }
  for (size_t i = 0; i < 8; ++i) {
    const bool pushed = i >= 3 && i < 7;
    const float want = pushed ? before.values[1][i] - lr * g1[i - 3] : before.values[1][i];
    EXPECT_FLOAT_EQ(after.values[1][i], want) << i;
  }
  for (size_t id = 2; id < after.values.size(); ++id) {
    EXPECT_EQ(after.values[id], before.values[id]) << "slice " << id;
  }
}

TEST(ShardTest, PushBumpsVersionByOneAndExamplesByBatch) {
  Shard shard(0, 1);
  MustRegister(shard, SmallModel(1));
  RejectReason reason = RejectReason::kNone;
  Push push{{{0, 0, 8}, {4, 0, 5}}, {Ramp(8), Ramp(5)}};
  push.batch_examples = 32;
  ASSERT_TRUE(DoPush(shard, push, &reason).ok());
  EXPECT_EQ(shard.version(), 1);
  EXPECT_EQ(shard.examples(), 32);
  push.batch_examples = 16;
  ASSERT_TRUE(DoPush(shard, push, &reason).ok());
  EXPECT_EQ(shard.version(), 2);
  EXPECT_EQ(shard.examples(), 48);
}

TEST(ShardTest, AdamBiasCorrectionCountsPushesPerSlice) {
  // Two pushes of the first half of a slice, then one of the whole slice. The Adam step
  // count belongs to the slice, so the third push is step 3 for every element, the second
  // half included (its first update). The reference applies the same updates to plain
  // arrays with those step numbers.
  Shard shard(0, 1);
  const ModelRegistration reg = SmallModel(1, OptimizerKind::kAdam);
  MustRegister(shard, reg);
  const std::vector<float> g = Ramp(8);
  std::vector<float> w(shard.SliceValues(0).begin(), shard.SliceValues(0).end());
  std::vector<float> m(8, 0.0f), v(8, 0.0f);
  RejectReason reason = RejectReason::kNone;
  auto reference = [&](int64_t step, size_t begin, size_t count) {
    float* slots[2] = {m.data() + begin, v.data() + begin};
    ApplyUpdate(reg.optimizer, step, w.data() + begin, w.data() + begin, g.data() + begin, slots,
                static_cast<int64_t>(count));
  };
  const std::vector<float> half(g.begin(), g.begin() + 4);
  ASSERT_TRUE(DoPush(shard, {{{0, 0, 4}}, {half}}, &reason).ok());
  reference(1, 0, 4);
  ASSERT_TRUE(DoPush(shard, {{{0, 0, 4}}, {half}}, &reason).ok());
  reference(2, 0, 4);
  ASSERT_TRUE(DoPush(shard, {{{0, 0, 8}}, {g}}, &reason).ok());
  // The slice's count is per slice: the third push is step 3 for every element of it.
  reference(3, 0, 8);
  const auto got = shard.SliceValues(0);
  for (size_t i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(got[i], w[i]) << "element " << i;
}

}  // namespace
}  // namespace parasync
