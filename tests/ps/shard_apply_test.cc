// ps/shard.h: zero-copy reads (Lend) with copy-on-write, and large pushes checked and applied
// on several threads or streamed.
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
#include "tests/support/small_model.h"

namespace parasync {
namespace {

using namespace shard_test;  // this file's helpers: tests/ps/shard_test_util.h

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
  return testing::SmallModel(
      {{"w", {4 * slice_elements}, DType::kFloat32, {InitKind::kUniform, kLimit}}}, slice_elements,
      /*num_shards=*/1, /*seed=*/99, /*learning_rate=*/0.01f, kind);
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
