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

namespace parasync {
namespace {

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

constexpr float kLimit = 0.5f;

// A 30-element kernel cut into 8-element slices (8, 8, 7, 7) and a 5-element bias.
ModelRegistration SmallModel(int num_shards, OptimizerKind kind = OptimizerKind::kSgd) {
  ModelRegistration reg;
  reg.variables = {{"dense/kernel", {6, 5}, DType::kFloat32, {InitKind::kUniform, kLimit}},
                   {"dense/bias", {5}, DType::kFloat32, {InitKind::kZeros, 0.0f}}};
  reg.optimizer.kind = kind;
  reg.optimizer.learning_rate = 0.5f;
  reg.seed = 1234;
  reg.max_slice_elements = 8;
  reg.num_shards = num_shards;
  return reg;
}

void MustRegister(Shard& shard, const ModelRegistration& reg) {
  RejectReason reason = RejectReason::kNone;
  Status s = shard.Register(reg, &reason);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(reason, RejectReason::kNone);
}

// A push as the server hands it to the shard: ranges, one gradient frame per range (frame
// sizes from the gradients unless overridden), validated and then applied.
struct Push {
  Push(std::vector<SliceRange> r, std::vector<std::vector<float>> g)
      : ranges(std::move(r)), grads(std::move(g)) {}

  std::vector<SliceRange> ranges;
  std::vector<std::vector<float>> grads;
  DType dtype = DType::kFloat32;
  std::optional<std::vector<size_t>> frame_bytes;
  int64_t batch_examples = 8;
};

Status DoPush(Shard& shard, const Push& push, RejectReason* reason) {
  std::vector<size_t> sizes;
  if (push.frame_bytes) {
    sizes = *push.frame_bytes;
  } else {
    for (const auto& g : push.grads) sizes.push_back(g.size() * sizeof(float));
  }
  PARASYNC_RETURN_IF_ERROR(
      shard.ValidateRanges(push.ranges, push.dtype, std::span<const size_t>(sizes), reason));
  std::vector<const float*> ptrs;
  for (const auto& g : push.grads) ptrs.push_back(g.data());
  return shard.Apply(push.ranges, ptrs, push.batch_examples, reason);
}

// Gradient of `count` floats: 0.01, 0.02, ... scaled by `scale`.
std::vector<float> Ramp(int64_t count, float scale = 1.0f) {
  std::vector<float> g(static_cast<size_t>(count));
  for (size_t i = 0; i < g.size(); ++i) g[i] = scale * 0.01f * static_cast<float>(i + 1);
  return g;
}

// The map of a registered shard.
const SliceMap& MapOf(const Shard& shard) {
  if (const SliceMap* map = shard.slice_map()) return *map;
  ADD_FAILURE() << "shard " << shard.shard_index() << " is not registered";
  static const SliceMap kNoSlices;
  return kNoSlices;
}

// Everything a rejected request must leave alone.
struct Snapshot {
  std::vector<std::vector<float>> values;  // by slice id; empty if not held
  int64_t version = 0;
  int64_t examples = 0;
  bool operator==(const Snapshot&) const = default;
};

Snapshot Take(const Shard& shard) {
  Snapshot s;
  for (uint32_t id = 0; id < MapOf(shard).slices().size(); ++id) {
    std::span<const float> v = shard.SliceValues(id);
    s.values.emplace_back(v.begin(), v.end());
  }
  s.version = shard.version();
  s.examples = shard.examples();
  return s;
}

// Values of variable `var` assembled from the shards that hold its slices.
std::vector<float> AssembleVariable(const std::vector<const Shard*>& shards, uint32_t var) {
  const SliceMap& map = MapOf(*shards[0]);
  std::vector<float> out;
  for (uint32_t id : map.SlicesOfVariable(var)) {
    std::span<const float> v =
        shards[static_cast<size_t>(map.slices()[id].shard)]->SliceValues(id);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

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

// Rejected pushes: a shard and its twin are registered alike (Adam, so hidden slot and step
// state matters) and both take one good push. The bad push goes to `shard_` only; afterwards
// values, version and examples must be as before, and the next good push must give exactly
// what it gives on the twin, which never saw the bad push.
// Under Adam (check, then update in place) and SGD (whole slices: checked and updated in one
// pass, out of place) alike, a refused push changes nothing.
class ShardRejectTest : public ::testing::TestWithParam<OptimizerKind> {
 protected:
  void SetUp() override {
    MustRegister(shard_, SmallModel(2, GetParam()));
    MustRegister(twin_, SmallModel(2, GetParam()));
    ASSERT_TRUE(shard_.registered());
    const SliceMap& map = MapOf(shard_);
    ASSERT_GE(map.SlicesOfShard(0).size(), 2u);
    ASSERT_FALSE(map.SlicesOfShard(1).empty());
    mine_ = map.SlicesOfShard(0)[0];
    mine2_ = map.SlicesOfShard(0)[1];
    other_ = map.SlicesOfShard(1)[0];
    len_ = map.slices()[mine_].length;
    len2_ = map.slices()[mine2_].length;
    Good();
  }

  Push GoodPush() const {
    Push p{{{mine_, 0, len_}, {mine2_, 0, len2_}}, {Ramp(len_), Ramp(len2_, -1.0f)}};
    p.batch_examples = 10;
    return p;
  }

  void Good() {
    RejectReason reason = RejectReason::kNone;
    ASSERT_TRUE(DoPush(shard_, GoodPush(), &reason).ok());
    ASSERT_TRUE(DoPush(twin_, GoodPush(), &reason).ok());
  }

  void ExpectRejected(const Push& bad, RejectReason want, StatusCode code) {
    const Snapshot before = Take(shard_);
    RejectReason reason = RejectReason::kNone;
    Status s = DoPush(shard_, bad, &reason);
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_EQ(reason, want) << "got reason " << RejectReasonName(reason);
    EXPECT_FALSE(s.message().empty());
    EXPECT_EQ(Take(shard_), before) << "a rejected push changed the shard";
    Good();
    EXPECT_EQ(Take(shard_), Take(twin_)) << "a rejected push changed optimizer state";
  }

  Shard shard_{0, 2};
  Shard twin_{0, 2};
  uint32_t mine_ = 0;   // a slice on shard 0
  uint32_t mine2_ = 0;  // another slice on shard 0
  uint32_t other_ = 0;  // a slice on shard 1
  int64_t len_ = 0;
  int64_t len2_ = 0;
};

TEST_P(ShardRejectTest, UnknownSliceIdIsUnknownSlice) {
  const auto past_end = static_cast<uint32_t>(MapOf(shard_).slices().size());
  ExpectRejected({{{past_end, 0, 1}}, {Ramp(1)}}, RejectReason::kUnknownSlice,
                 StatusCode::kNotFound);
  ExpectRejected({{{0xffffffffu, 0, 1}}, {Ramp(1)}}, RejectReason::kUnknownSlice,
                 StatusCode::kNotFound);
}

TEST_P(ShardRejectTest, SliceOfAnotherShardIsUnknownSlice) {
  ExpectRejected({{{other_, 0, 1}}, {Ramp(1)}}, RejectReason::kUnknownSlice,
                 StatusCode::kNotFound);
}

TEST_P(ShardRejectTest, BeginPastEndIsRange) {
  ExpectRejected({{{mine_, len_ + 1, 0}}, {std::vector<float>{}}}, RejectReason::kRange,
                 StatusCode::kInvalidArgument);
}

TEST_P(ShardRejectTest, CountPastEndIsRange) {
  ExpectRejected({{{mine_, 1, len_}}, {Ramp(len_)}}, RejectReason::kRange,
                 StatusCode::kInvalidArgument);
  ExpectRejected({{{mine_, 0, len_ + 1}}, {Ramp(len_ + 1)}}, RejectReason::kRange,
                 StatusCode::kInvalidArgument);
}

TEST_P(ShardRejectTest, CountThatWouldOverflowIsRange) {
  Push p{{{mine_, 1, std::numeric_limits<int64_t>::max()}}, {Ramp(1)}};
  p.frame_bytes = std::vector<size_t>{4};
  ExpectRejected(p, RejectReason::kRange, StatusCode::kInvalidArgument);
}

TEST_P(ShardRejectTest, NegativeBeginOrCountIsRange) {
  ExpectRejected({{{mine_, -1, 2}}, {Ramp(2)}}, RejectReason::kRange,
                 StatusCode::kInvalidArgument);
  Push p{{{mine_, 2, -1}}, {std::vector<float>{}}};
  ExpectRejected(p, RejectReason::kRange, StatusCode::kInvalidArgument);
}

TEST_P(ShardRejectTest, SliceIdsNotStrictlyIncreasingAreOrder) {
  // Repeating a slice would let a small request ask for unbounded work or memory.
  ExpectRejected({{{mine_, 0, 1}, {mine_, 1, 1}}, {Ramp(1), Ramp(1)}}, RejectReason::kOrder,
                 StatusCode::kInvalidArgument);
  ExpectRejected({{{mine2_, 0, len2_}, {mine_, 0, len_}}, {Ramp(len2_), Ramp(len_)}},
                 RejectReason::kOrder, StatusCode::kInvalidArgument);
}

TEST_P(ShardRejectTest, BadRangeAfterGoodRangesRejectsWholePush) {
  ExpectRejected({{{mine_, 0, len_}, {mine2_, 0, len2_ + 1}}, {Ramp(len_), Ramp(len2_ + 1)}},
                 RejectReason::kRange, StatusCode::kInvalidArgument);
}

TEST_P(ShardRejectTest, ShortOrLongFrameIsByteLength) {
  ExpectRejected({{{mine_, 0, len_}}, {Ramp(len_ - 1)}}, RejectReason::kByteLength,
                 StatusCode::kInvalidArgument);
  ExpectRejected({{{mine_, 0, len_}}, {Ramp(len_ + 1)}}, RejectReason::kByteLength,
                 StatusCode::kInvalidArgument);
  Push ragged{{{mine_, 0, 2}}, {Ramp(2)}};
  ragged.frame_bytes = std::vector<size_t>{9};
  ExpectRejected(ragged, RejectReason::kByteLength, StatusCode::kInvalidArgument);
}

TEST_P(ShardRejectTest, WrongFrameCountIsFrameCount) {
  Push fewer{{{mine_, 0, len_}, {mine2_, 0, len2_}}, {Ramp(len_)}};
  ExpectRejected(fewer, RejectReason::kFrameCount, StatusCode::kInvalidArgument);
  Push more{{{mine_, 0, len_}}, {Ramp(len_), Ramp(len_)}};
  ExpectRejected(more, RejectReason::kFrameCount, StatusCode::kInvalidArgument);
  Push none{{{mine_, 0, len_}}, {}};
  ExpectRejected(none, RejectReason::kFrameCount, StatusCode::kInvalidArgument);
}

TEST_P(ShardRejectTest, UnknownDTypeIsDType) {
  Push p = GoodPush();
  p.dtype = static_cast<DType>(7);
  ExpectRejected(p, RejectReason::kDType, StatusCode::kInvalidArgument);
}

TEST_P(ShardRejectTest, NanGradientIsNonFinite) {
  Push p = GoodPush();
  p.grads[0][2] = std::numeric_limits<float>::quiet_NaN();
  ExpectRejected(p, RejectReason::kNonFinite, StatusCode::kInvalidArgument);
}

TEST_P(ShardRejectTest, InfGradientIsNonFinite) {
  Push p = GoodPush();
  p.grads[0][0] = std::numeric_limits<float>::infinity();
  ExpectRejected(p, RejectReason::kNonFinite, StatusCode::kInvalidArgument);
  p = GoodPush();
  p.grads[1][0] = -std::numeric_limits<float>::infinity();
  ExpectRejected(p, RejectReason::kNonFinite, StatusCode::kInvalidArgument);
}

TEST_P(ShardRejectTest, EveryNanBitPatternIsNonFiniteAndExtremeFiniteValuesAreApplied) {
  // The finite check looks at the exponent bits: a NaN with the sign bit and any payload, and
  // a signalling NaN, are caught; the largest finite magnitudes, denormals and -0 are not.
  for (const uint32_t bits : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xffffffffu, 0x7fbfffffu}) {
    Push p = GoodPush();
    std::memcpy(&p.grads[0][1], &bits, sizeof(bits));
    ExpectRejected(p, RejectReason::kNonFinite, StatusCode::kInvalidArgument);
  }
  Push p = GoodPush();
  p.grads[0][0] = std::numeric_limits<float>::max();
  p.grads[0][1] = -std::numeric_limits<float>::max();
  p.grads[1][0] = std::numeric_limits<float>::denorm_min();
  p.grads[1][1] = -0.0f;
  RejectReason reason = RejectReason::kNone;
  EXPECT_TRUE(DoPush(shard_, p, &reason).ok());
  EXPECT_EQ(reason, RejectReason::kNone);
}

TEST_P(ShardRejectTest, NanOnlyInLastRangeAppliesNothingFromEarlierRanges) {
  Push p = GoodPush();
  p.grads.back().back() = std::numeric_limits<float>::quiet_NaN();
  ExpectRejected(p, RejectReason::kNonFinite, StatusCode::kInvalidArgument);
}

TEST_P(ShardRejectTest, PullOfBadRangesIsRejectedWithTheSameReasons) {
  struct Case {
    SliceRange range;
    DType dtype;
    RejectReason want;
  };
  const Case cases[] = {
      {{other_, 0, 1}, DType::kFloat32, RejectReason::kUnknownSlice},
      {{999, 0, 1}, DType::kFloat32, RejectReason::kUnknownSlice},
      {{mine_, len_ + 1, 0}, DType::kFloat32, RejectReason::kRange},
      {{mine_, 0, len_ + 1}, DType::kFloat32, RejectReason::kRange},
      {{mine_, -1, 1}, DType::kFloat32, RejectReason::kRange},
      {{mine_, 0, 1}, static_cast<DType>(7), RejectReason::kDType},
  };
  for (const Case& c : cases) {
    RejectReason reason = RejectReason::kNone;
    const std::vector<SliceRange> ranges = {c.range};
    Status s = shard_.ValidateRanges(ranges, c.dtype, std::nullopt, &reason);
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(reason, c.want) << "got " << RejectReasonName(reason) << " for slice "
                              << c.range.slice_id;
  }
}

TEST_P(ShardRejectTest, EmptyRangeAtSliceEndIsAccepted) {
  RejectReason reason = RejectReason::kNone;
  const std::vector<SliceRange> ranges = {{mine_, len_, 0}};
  EXPECT_TRUE(shard_.ValidateRanges(ranges, DType::kFloat32, std::nullopt, &reason).ok());
}

INSTANTIATE_TEST_SUITE_P(Optimizers, ShardRejectTest,
                         ::testing::Values(OptimizerKind::kAdam, OptimizerKind::kSgd),
                         [](const ::testing::TestParamInfo<OptimizerKind>& p) {
                           return p.param == OptimizerKind::kSgd ? std::string("sgd")
                                                                 : std::string("adam");
                         });

TEST(RejectReasonTest, EveryReasonHasADistinctName) {
  std::vector<std::string> names;
  for (int r = 0; r < kNumRejectReasons; ++r) {
    const std::string name(RejectReasonName(static_cast<RejectReason>(r)));
    EXPECT_NE(name, "unknown") << r;
    for (const std::string& other : names) EXPECT_NE(name, other);
    names.push_back(name);
  }
  EXPECT_EQ(RejectReasonName(RejectReason::kMalformed), "malformed");
}


// --- sync: Accumulate and ApplyAccumulated; lr_scale ---

// Validates `push` as a push and adds it to the shard's current sync step as `rank`'s.
Status DoAccumulate(Shard& shard, const Push& push, RejectReason* reason, int rank = 0) {
  std::vector<size_t> sizes;
  for (const auto& g : push.grads) sizes.push_back(g.size() * sizeof(float));
  PARASYNC_RETURN_IF_ERROR(
      shard.ValidateRanges(push.ranges, push.dtype, std::span<const size_t>(sizes), reason));
  std::vector<const float*> ptrs;
  for (const auto& g : push.grads) ptrs.push_back(g.data());
  return shard.Accumulate(push.ranges, ptrs, push.batch_examples, reason, rank);
}

// A gradient for every slice of `shard`, whole: Ramp(length, scale) per slice.
Push WholeShardPush(const Shard& shard, float scale) {
  Push p{{}, {}};
  for (uint32_t id : MapOf(shard).SlicesOfShard(shard.shard_index())) {
    const int64_t length = MapOf(shard).slices()[id].length;
    p.ranges.push_back({id, 0, length});
    p.grads.push_back(Ramp(length, scale));
  }
  return p;
}

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

  shard.ApplyAccumulated(3);
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
    shard.ApplyAccumulated(4);
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
  shard.ApplyAccumulated(2);
  EXPECT_EQ(shard.version(), 1);
  EXPECT_EQ(shard.examples(), 32);
  p.batch_examples = 5;
  ASSERT_TRUE(DoAccumulate(shard, p, &reason).ok());
  shard.ApplyAccumulated(1);
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
  shard.ApplyAccumulated(2);
  ASSERT_TRUE(DoAccumulate(shard, WholeShardPush(shard, -1.0f), &reason).ok());
  shard.ApplyAccumulated(1);
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
    shard.ApplyAccumulated(2);
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

// Rejected contributions to a sync step: like ShardRejectTest, the bad gradient goes to
// `shard_` only; afterwards nothing visible may have changed, and a good step (two whole
// gradients, averaged) must give exactly what it gives on the twin — so the step's hidden
// sum was not touched either.
class ShardAccumulateRejectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MustRegister(shard_, SmallModel(2, OptimizerKind::kAdam));
    MustRegister(twin_, SmallModel(2, OptimizerKind::kAdam));
    ASSERT_TRUE(shard_.registered());
    ASSERT_GE(MapOf(shard_).SlicesOfShard(0).size(), 2u);
    GoodStep();
  }

  void GoodStep() {
    RejectReason reason = RejectReason::kNone;
    for (Shard* s : {&shard_, &twin_}) {
      ASSERT_TRUE(DoAccumulate(*s, WholeShardPush(*s, 1.0f), &reason).ok());
      ASSERT_TRUE(DoAccumulate(*s, WholeShardPush(*s, -0.5f), &reason).ok());
      s->ApplyAccumulated(2);
    }
  }

  void ExpectRejected(const Push& bad, RejectReason want) {
    const Snapshot before = Take(shard_);
    RejectReason reason = RejectReason::kNone;
    Status s = DoAccumulate(shard_, bad, &reason);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_EQ(reason, want) << "got reason " << RejectReasonName(reason);
    EXPECT_FALSE(s.message().empty());
    EXPECT_EQ(Take(shard_), before) << "a rejected gradient changed the shard";
    GoodStep();
    EXPECT_EQ(Take(shard_), Take(twin_)) << "a rejected gradient entered the step's sum";
  }

  Shard shard_{0, 2};
  Shard twin_{0, 2};
};

TEST_F(ShardAccumulateRejectTest, PushMissingASliceIsPartial) {
  Push p = WholeShardPush(shard_, 2.0f);
  p.ranges.pop_back();
  p.grads.pop_back();
  ExpectRejected(p, RejectReason::kPartial);
  Push first_missing = WholeShardPush(shard_, 2.0f);
  first_missing.ranges.erase(first_missing.ranges.begin());
  first_missing.grads.erase(first_missing.grads.begin());
  ExpectRejected(first_missing, RejectReason::kPartial);
}

TEST_F(ShardAccumulateRejectTest, PushOfPartOfASliceIsPartial) {
  Push late_begin = WholeShardPush(shard_, 2.0f);
  late_begin.ranges[0].begin = 1;
  late_begin.ranges[0].count -= 1;
  late_begin.grads[0].pop_back();
  ExpectRejected(late_begin, RejectReason::kPartial);
  Push short_count = WholeShardPush(shard_, 2.0f);
  short_count.ranges.back().count -= 1;
  short_count.grads.back().pop_back();
  ExpectRejected(short_count, RejectReason::kPartial);
}

TEST_F(ShardAccumulateRejectTest, EmptyPushIsPartial) {
  ExpectRejected(Push{{}, {}}, RejectReason::kPartial);
}

TEST_F(ShardAccumulateRejectTest, NanInTheLastSliceIsNonFinite) {
  Push p = WholeShardPush(shard_, 2.0f);
  p.grads.back().back() = std::numeric_limits<float>::quiet_NaN();
  ExpectRejected(p, RejectReason::kNonFinite);
}

TEST_F(ShardAccumulateRejectTest, InfIsNonFinite) {
  Push p = WholeShardPush(shard_, 2.0f);
  p.grads[0][0] = -std::numeric_limits<float>::infinity();
  ExpectRejected(p, RejectReason::kNonFinite);
}

// ---- zero-copy reads (Lend) and copy-on-write --------------------------------------------

std::vector<float> Copy(std::span<const float> v) { return {v.begin(), v.end()}; }
std::vector<float> Copy(const Shard::Loan& loan) {
  return {loan.data, loan.data + loan.count};
}

TEST(ShardLendTest, LoanShowsTheValuesAndKeepsThemWhileUpdatesGoElsewhere) {
  Shard shard(0, 1);
  MustRegister(shard, SmallModel(1));
  const std::vector<float> before = Copy(shard.SliceValues(0));
  std::vector<Shard::Loan> loans;
  const std::vector<SliceRange> ranges = {{0, 2, 5}};
  shard.Lend(ranges, loans);
  ASSERT_EQ(loans.size(), 1u);
  ASSERT_EQ(loans[0].count, 5);
  EXPECT_EQ(Copy(loans[0]), std::vector<float>(before.begin() + 2, before.begin() + 7));

  // Two updates while the loan is out (the second finds the first's buffer not lent).
  RejectReason reason = RejectReason::kNone;
  const std::vector<float> g = Ramp(8);
  ASSERT_TRUE(DoPush(shard, {{{0, 0, 8}}, {g}}, &reason).ok());
  ASSERT_TRUE(DoPush(shard, {{{0, 0, 8}}, {g}}, &reason).ok());
  EXPECT_EQ(Copy(loans[0]), std::vector<float>(before.begin() + 2, before.begin() + 7))
      << "a lent range changed under its reader";
  const std::vector<float> after = Copy(shard.SliceValues(0));
  for (size_t k = 0; k < 8; ++k) {
    EXPECT_FLOAT_EQ(after[k], before[k] - 0.5f * g[k] - 0.5f * g[k]) << k;
  }
  Shard::ReturnLoan(loans[0].token);
  ASSERT_TRUE(DoPush(shard, {{{0, 0, 8}}, {g}}, &reason).ok());
  EXPECT_FLOAT_EQ(shard.SliceValues(0)[7], after[7] - 0.5f * g[7]);
}

TEST(ShardLendTest, PartialUpdateOfALentSliceKeepsTheRestOfIt) {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kMomentum, OptimizerKind::kAdam}) {
    SCOPED_TRACE(static_cast<int>(kind));
    Shard lent(0, 1), plain(0, 1);
    MustRegister(lent, SmallModel(1, kind));
    MustRegister(plain, SmallModel(1, kind));
    RejectReason reason = RejectReason::kNone;
    const std::vector<float> g = Ramp(3);
    std::vector<Shard::Loan> loans;
    std::vector<void*> out;  // loans still out, returned at the end
    for (int step = 0; step < 5; ++step) {
      // The same pushes to both; `lent` has its slice lent each time (copy-on-write).
      const std::vector<SliceRange> whole = {{0, 0, 8}};
      lent.Lend(whole, loans);
      const std::vector<float> seen = Copy(loans[0]);
      const Push push({{0, static_cast<int64_t>(step % 3) * 2, 3}}, {g});
      ASSERT_TRUE(DoPush(lent, push, &reason).ok());
      ASSERT_TRUE(DoPush(plain, push, &reason).ok());
      EXPECT_EQ(Copy(lent.SliceValues(0)), Copy(plain.SliceValues(0))) << "step " << step;
      EXPECT_EQ(Copy(loans[0]), seen);
      if (step % 2 == 0) {
        Shard::ReturnLoan(loans[0].token);
      } else {
        out.push_back(loans[0].token);  // stays out across the next update
      }
    }
    for (void* token : out) Shard::ReturnLoan(token);
  }
}

TEST(ShardLendTest, ManyOutstandingLoansEachKeepTheirVersion) {
  // More loans than the shard keeps spares: every loan still reads its own version.
  Shard shard(0, 1);
  MustRegister(shard, SmallModel(1));
  RejectReason reason = RejectReason::kNone;
  const std::vector<float> g = Ramp(8);
  std::vector<std::pair<Shard::Loan, std::vector<float>>> out;
  for (int step = 0; step < 6; ++step) {
    std::vector<Shard::Loan> loans;
    const std::vector<SliceRange> whole = {{0, 0, 8}};
    shard.Lend(whole, loans);
    out.emplace_back(loans[0], Copy(shard.SliceValues(0)));
    ASSERT_TRUE(DoPush(shard, {{{0, 0, 8}}, {g}}, &reason).ok());
  }
  for (auto& [loan, seen] : out) {
    EXPECT_EQ(Copy(loan), seen);
    Shard::ReturnLoan(loan.token);
  }
}

TEST(ShardLendTest, ALoanOutlivesItsShard) {
  std::vector<Shard::Loan> loans;
  std::vector<float> seen;
  {
    Shard shard(0, 1);
    MustRegister(shard, SmallModel(1));
    const std::vector<SliceRange> whole = {{0, 0, 8}};
    shard.Lend(whole, loans);
    seen = Copy(shard.SliceValues(0));
  }
  EXPECT_EQ(Copy(loans[0]), seen);  // under ASan, a use after free if the shard freed it
  Shard::ReturnLoan(loans[0].token);
}

TEST(ShardLendTest, RegistrationCountsTheSpareCopy) {
  // 35 elements, SGD: values + spare = 280 bytes.
  Shard fits(0, 1, 280), too_small(0, 1, 279);
  MustRegister(fits, SmallModel(1));
  RejectReason reason = RejectReason::kNone;
  EXPECT_FALSE(too_small.Register(SmallModel(1), &reason).ok());
  EXPECT_EQ(reason, RejectReason::kBadRegistration);
}

// ---- a large push checked and applied on several threads ---------------------------------

// One variable of 4 slices x 128Ki elements by default: 2 MiB, above
// Shard::kParallelApplyElements.
ModelRegistration LargeModel(OptimizerKind kind, int64_t slice_elements = 131072) {
  ModelRegistration reg;
  reg.variables = {{"w", {4 * slice_elements}, DType::kFloat32, {InitKind::kUniform, kLimit}}};
  reg.optimizer.kind = kind;
  reg.optimizer.learning_rate = 0.01f;
  reg.seed = 99;
  reg.max_slice_elements = slice_elements;
  reg.num_shards = 1;
  return reg;
}

Push LargePush(int step, int64_t slice_elements = 131072) {
  std::vector<SliceRange> ranges;
  std::vector<std::vector<float>> grads;
  for (uint32_t id = 0; id < 4; ++id) {
    ranges.push_back({id, 0, slice_elements});
    std::vector<float> g(static_cast<size_t>(slice_elements));
    for (size_t k = 0; k < g.size(); ++k) {
      g[k] = 0.001f * static_cast<float>((k * 7 + id * 13 + static_cast<size_t>(step) * 5) % 101) - 0.05f;
    }
    grads.push_back(std::move(g));
  }
  return {std::move(ranges), std::move(grads)};
}

std::vector<float> AllValues(const Shard& shard) {
  std::vector<float> out;
  for (uint32_t id = 0; id < 4; ++id) {
    const std::span<const float> v = shard.SliceValues(id);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

TEST(ShardParallelApplyTest, SameResultAsOneThreadBitForBit) {
  static_assert(4 * 131072 >= Shard::kParallelApplyElements);
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kMomentum, OptimizerKind::kAdam}) {
    SCOPED_TRACE(static_cast<int>(kind));
    Shard one(0, 1, 0, 1), three(0, 1, 0, 3);
    MustRegister(one, LargeModel(kind));
    MustRegister(three, LargeModel(kind));
    RejectReason reason = RejectReason::kNone;
    std::vector<Shard::Loan> loans;
    for (int step = 0; step < 4; ++step) {
      if (step == 2) {  // copy-on-write on the helper threads too
        const std::vector<SliceRange> all = {{0, 0, 131072}, {1, 0, 131072}, {2, 0, 131072},
                                             {3, 0, 131072}};
        three.Lend(all, loans);
      }
      const Push push = LargePush(step);
      ASSERT_TRUE(DoPush(one, push, &reason).ok());
      ASSERT_TRUE(DoPush(three, push, &reason).ok());
    }
    EXPECT_EQ(AllValues(three), AllValues(one));
    EXPECT_EQ(three.version(), 4);
    for (const Shard::Loan& loan : loans) Shard::ReturnLoan(loan.token);
  }
}

TEST(ShardParallelApplyTest, NonFiniteInAnySliceRejectsThePushAndChangesNothing) {
  // Momentum checks first and updates in place; SGD checks while it writes out of place. On
  // one and three threads, with the values lent to a pull reply or not.
  for (OptimizerKind kind : {OptimizerKind::kMomentum, OptimizerKind::kSgd}) {
    for (int threads : {1, 3}) {
      for (bool lent : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "optimizer " << static_cast<int>(kind) << ", "
                                          << threads << " thread(s), lent " << lent);
        Shard shard(0, 1, 0, threads);
        MustRegister(shard, LargeModel(kind));
        RejectReason reason = RejectReason::kNone;
        ASSERT_TRUE(DoPush(shard, LargePush(0), &reason).ok());  // a spare exists for SGD
        std::vector<Shard::Loan> loans;
        if (lent) shard.Lend(LargePush(0).ranges, loans);
        const std::vector<float> before = AllValues(shard);
        Push push = LargePush(1);
        push.grads[3][5] = std::numeric_limits<float>::infinity();
        push.grads[2][70000] = std::numeric_limits<float>::quiet_NaN();
        const Status s = DoPush(shard, push, &reason);
        EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
        EXPECT_EQ(reason, RejectReason::kNonFinite);
        EXPECT_TRUE(Contains(s.message(), "slice 2 ")) << s.message();  // the first bad one
        EXPECT_EQ(AllValues(shard), before);
        EXPECT_EQ(shard.version(), 1);
        // The slots are untouched too: good pushes now give the one-thread result, and a
        // loan still shows the values it was made of.
        Shard one(0, 1, 0, 1);
        MustRegister(one, LargeModel(kind));
        for (int step : {0, 1, 2}) {
          ASSERT_TRUE(DoPush(one, LargePush(step), &reason).ok());
          if (step > 0) {
            ASSERT_TRUE(DoPush(shard, LargePush(step), &reason).ok());
          }
        }
        EXPECT_EQ(AllValues(shard), AllValues(one));
        for (size_t i = 0; i < loans.size(); ++i) {
          EXPECT_TRUE(std::equal(loans[i].data, loans[i].data + loans[i].count,
                                 before.begin() + static_cast<std::ptrdiff_t>(i * 131072)));
          Shard::ReturnLoan(loans[i].token);
        }
      }
    }
  }
}

// An SGD push of Shard::kStreamingApplyElements or more is written with streaming stores: on
// one and two threads the values are w - lr * g bit for bit, and a NaN in the very last
// element (checked in the last vector step) still refuses the whole push.
TEST(ShardStreamingApplyTest, LargeSgdPushIsWMinusLrGBitForBitAndANanStillChangesNothing) {
  constexpr int64_t kSliceElements = 524288;  // 4 slices: 8 MiB
  static_assert(4 * kSliceElements >= Shard::kStreamingApplyElements);
  for (int threads : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << threads << " thread(s)");
    Shard shard(0, 1, 0, threads);
    MustRegister(shard, LargeModel(OptimizerKind::kSgd, kSliceElements));
    RejectReason reason = RejectReason::kNone;
    for (int step = 0; step < 2; ++step) {  // the second writes into the spares
      const std::vector<float> before = AllValues(shard);
      const Push push = LargePush(step, kSliceElements);
      ASSERT_TRUE(DoPush(shard, push, &reason).ok());
      const std::vector<float> after = AllValues(shard);
      ASSERT_EQ(after.size(), before.size());
      for (size_t i = 0; i < after.size(); ++i) {
        const float g = push.grads[i / kSliceElements][i % kSliceElements];
        const float want = before[i] - 0.01f * g;
        ASSERT_EQ(std::memcmp(&after[i], &want, sizeof(float)), 0) << "element " << i;
      }
    }
    const std::vector<float> before = AllValues(shard);
    Push bad = LargePush(2, kSliceElements);
    bad.grads[3][kSliceElements - 1] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_EQ(DoPush(shard, bad, &reason).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(reason, RejectReason::kNonFinite);
    EXPECT_EQ(AllValues(shard), before);
    EXPECT_EQ(shard.version(), 2);
  }
}

}  // namespace
}  // namespace parasync
