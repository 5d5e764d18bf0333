// ps/shard.h: a refused push or sync contribution changes nothing.
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
      ASSERT_TRUE(s->ApplyAccumulated(2).ok());
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

}  // namespace
}  // namespace parasync
