// The coordinator as a pure state machine: time is injected, nothing sleeps.
#include "ps/coordinator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <random>
#include <vector>

namespace parasync {
namespace {

using std::chrono::milliseconds;
using Offer = Coordinator::Offer;
using State = Coordinator::Worker::State;

// An arbitrary start; only differences from it matter.
const Coordinator::TimePoint kT0 = Coordinator::TimePoint{} + std::chrono::hours(1);
constexpr milliseconds kTimeout{1000};

Coordinator::Options Options(TrainingMode::Kind kind, int num_workers, int replicas = 0,
                             int64_t staleness = 0) {
  Coordinator::Options o;
  o.mode.kind = kind;
  o.mode.staleness = staleness;
  o.num_workers = num_workers;
  o.replicas_to_aggregate = replicas;
  o.worker_timeout = kTimeout;
  return o;
}

Coordinator Sync(int num_workers, int replicas = 0) {
  return Coordinator(Options(TrainingMode::Kind::kSync, num_workers, replicas), kT0);
}

Coordinator Ssp(int num_workers, int64_t k) {
  return Coordinator(Options(TrainingMode::Kind::kSsp, num_workers, 0, k), kT0);
}

int64_t ClockOf(const Coordinator& c, int rank) {
  return c.workers()[static_cast<size_t>(rank)].clock;
}

State StateOf(const Coordinator& c, int rank) {
  return c.workers()[static_cast<size_t>(rank)].state;
}

// Advances `rank`'s clock by `n` gradients.
void Advance(Coordinator& c, int rank, int64_t n) {
  for (int64_t i = 0; i < n; ++i) (void)c.RecordGradient(rank);
}

// Keeps every live rank but `silent` alive at `at`, then expires at `at` + the timeout + 1 ms, so
// exactly `silent` (last heard at kT0) dies. Returns the time of the expiry.
Coordinator::TimePoint KillOnly(Coordinator& c, int silent, Coordinator::TimePoint at) {
  for (int r = 0; r < c.num_workers(); ++r) {
    if (r != silent && StateOf(c, r) == State::kLive) (void)c.Touch(r, at);
  }
  const Coordinator::TimePoint when = kT0 + kTimeout + milliseconds(1);
  EXPECT_EQ(c.ExpireSilent(when), std::vector<int>{silent});
  return when;
}

// --- sync ---

TEST(CoordinatorTest, SyncStepIsReadyExactlyWhenTheLastOfAllRanksArrivesInAnyOrder) {
  std::array<int, 4> order = {0, 1, 2, 3};
  do {
    Coordinator c = Sync(4);
    EXPECT_EQ(c.needed(), 4);
    for (size_t i = 0; i < order.size(); ++i) {
      EXPECT_FALSE(c.StepReady()) << "before arrival " << i;
      EXPECT_EQ(c.OfferSync(order[i], 0, 0), Offer::kAccept) << "rank " << order[i];
      EXPECT_EQ(c.contributors(), static_cast<int>(i + 1));
    }
    EXPECT_TRUE(c.StepReady());
    EXPECT_TRUE(c.MissingFromStep().empty());
  } while (std::next_permutation(order.begin(), order.end()));
}

TEST(CoordinatorTest, SyncWithBackupWorkersCompletesAtRAndTheLastArrivalIsStale) {
  for (int last = 0; last < 4; ++last) {
    Coordinator c = Sync(4, 3);
    EXPECT_EQ(c.needed(), 3);
    for (int r = 0; r < 4; ++r) {
      if (r == last) continue;
      EXPECT_FALSE(c.StepReady());
      EXPECT_EQ(c.OfferSync(r, 0, 0), Offer::kAccept);
    }
    ASSERT_TRUE(c.StepReady()) << "last = " << last;
    EXPECT_EQ(c.MissingFromStep(), std::vector<int>{last});
    c.CompleteStep();  // the shard is now at version 1
    EXPECT_EQ(c.OfferSync(last, 0, 1), Offer::kStale) << "last = " << last;
    EXPECT_EQ(c.contributors(), 0);
    EXPECT_FALSE(c.StepReady());
  }
}

TEST(CoordinatorTest, SecondGradientFromOneRankInAStepIsDuplicateAndDoesNotCount) {
  Coordinator c = Sync(2);
  EXPECT_EQ(c.OfferSync(0, 0, 0), Offer::kAccept);
  EXPECT_EQ(c.OfferSync(0, 0, 0), Offer::kDuplicate);
  EXPECT_EQ(c.OfferSync(0, 0, 0), Offer::kDuplicate);
  EXPECT_EQ(c.contributors(), 1);
  EXPECT_FALSE(c.StepReady());
  EXPECT_EQ(c.MissingFromStep(), std::vector<int>{1});
  EXPECT_EQ(c.OfferSync(1, 0, 0), Offer::kAccept);
  EXPECT_TRUE(c.StepReady());
}

TEST(CoordinatorTest, GradientFromAnOlderVersionIsStaleAndFromANewerOneIsFuture) {
  Coordinator c = Sync(2);
  EXPECT_EQ(c.OfferSync(0, 4, 5), Offer::kStale);
  EXPECT_EQ(c.OfferSync(0, 0, 5), Offer::kStale);
  EXPECT_EQ(c.OfferSync(0, 6, 5), Offer::kFuture);
  EXPECT_EQ(c.contributors(), 0);
  // Neither marked the rank as a contributor.
  EXPECT_EQ(c.OfferSync(0, 5, 5), Offer::kAccept);
  EXPECT_EQ(c.contributors(), 1);
}

TEST(CoordinatorTest, DelayedSyncTakesGradientsOneVersionOldAndNoOlder) {
  Coordinator::Options o = Options(TrainingMode::Kind::kSync, 2);
  o.mode.delay = 1;
  Coordinator c(o, kT0);
  EXPECT_EQ(c.OfferSync(0, 3, 5), Offer::kStale);
  EXPECT_EQ(c.OfferSync(0, 6, 5), Offer::kFuture);
  EXPECT_EQ(c.contributors(), 0);
  // Read at 4 (the step before) and at 5 (the first step, or a worker that did not overlap):
  // one gradient per rank all the same.
  EXPECT_EQ(c.OfferSync(0, 4, 5), Offer::kAccept);
  EXPECT_EQ(c.OfferSync(0, 5, 5), Offer::kDuplicate);
  EXPECT_EQ(c.OfferSync(1, 5, 5), Offer::kAccept);
  EXPECT_TRUE(c.StepReady());
  // Plain sync drops the one-version-old gradient.
  Coordinator plain = Sync(2);
  EXPECT_EQ(plain.OfferSync(0, 4, 5), Offer::kStale);
}

TEST(CoordinatorTest, StaleIsReportedBeforeDuplicate) {
  // A rank that contributed to step 5 and resends an older gradient is told it is stale
  // (dropped, not an error).
  Coordinator c = Sync(2);
  ASSERT_EQ(c.OfferSync(0, 5, 5), Offer::kAccept);
  EXPECT_EQ(c.OfferSync(0, 4, 5), Offer::kStale);
}

TEST(CoordinatorTest, ClassifySyncChangesNothingAndContributeMarksTheRank) {
  Coordinator c = Sync(3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(c.ClassifySync(1, 0, 0), Offer::kAccept);
    EXPECT_EQ(c.ClassifySync(1, 0, 1), Offer::kStale);
    EXPECT_EQ(c.ClassifySync(1, 2, 1), Offer::kFuture);
  }
  EXPECT_EQ(c.contributors(), 0);
  EXPECT_EQ(c.MissingFromStep(), (std::vector<int>{0, 1, 2}));
  EXPECT_FALSE(c.workers()[1].contributed);

  c.Contribute(1);
  EXPECT_EQ(c.contributors(), 1);
  EXPECT_TRUE(c.workers()[1].contributed);
  EXPECT_EQ(c.ClassifySync(1, 0, 0), Offer::kDuplicate);
  EXPECT_EQ(c.ClassifySync(2, 0, 0), Offer::kAccept);
  EXPECT_EQ(c.contributors(), 1);
  EXPECT_EQ(c.MissingFromStep(), (std::vector<int>{0, 2}));
}

TEST(CoordinatorTest, CompleteStepStartsAnEmptyStepThatEveryRankMayJoinAgain) {
  Coordinator c = Sync(2);
  ASSERT_EQ(c.OfferSync(0, 0, 0), Offer::kAccept);
  ASSERT_EQ(c.OfferSync(1, 0, 0), Offer::kAccept);
  ASSERT_TRUE(c.StepReady());
  c.CompleteStep();
  EXPECT_EQ(c.contributors(), 0);
  EXPECT_FALSE(c.StepReady());
  EXPECT_EQ(c.MissingFromStep(), (std::vector<int>{0, 1}));
  for (const Coordinator::Worker& w : c.workers()) EXPECT_FALSE(w.contributed);
  EXPECT_EQ(c.OfferSync(1, 1, 1), Offer::kAccept);
  EXPECT_EQ(c.OfferSync(0, 1, 1), Offer::kAccept);
  EXPECT_TRUE(c.StepReady());
}

TEST(CoordinatorTest, MissingFromStepNamesOnlyLiveNonContributors) {
  Coordinator c = Sync(5);
  ASSERT_EQ(c.OfferSync(1, 0, 0), Offer::kAccept);
  c.Leave(3);
  (void)KillOnly(c, 4, kT0 + milliseconds(500));
  EXPECT_EQ(c.MissingFromStep(), (std::vector<int>{0, 2}));
}

// --- liveness ---

TEST(CoordinatorTest, ARankDeclaredDeadAtOnceNoLongerHoldsTheStepAndComesBackWhenHeard) {
  Coordinator c = Sync(2);
  c.Contribute(0);
  EXPECT_FALSE(c.StepReady());  // waits for rank 1
  EXPECT_TRUE(c.DeclareDead(1));  // its restart asked to join: the old process is gone
  EXPECT_EQ(StateOf(c, 1), State::kDead);
  EXPECT_EQ(c.declared_dead(), 1);
  EXPECT_TRUE(c.StepReady());
  EXPECT_FALSE(c.DeclareDead(1));  // once
  EXPECT_EQ(c.declared_dead(), 1);
  EXPECT_TRUE(c.Touch(1, kT0 + milliseconds(10)));  // admitted back: live again
  EXPECT_EQ(c.live_count(), 2);
}

TEST(CoordinatorTest, SilentRankIsDeclaredDeadOnceAfterTheWorkerTimeout) {
  Coordinator c = Sync(3);
  (void)c.Touch(0, kT0 + milliseconds(600));
  (void)c.Touch(2, kT0 + milliseconds(600));
  // Silent for exactly the timeout is not yet longer than it.
  EXPECT_TRUE(c.ExpireSilent(kT0 + kTimeout).empty());
  EXPECT_EQ(c.live_count(), 3);
  EXPECT_EQ(c.ExpireSilent(kT0 + kTimeout + milliseconds(1)), std::vector<int>{1});
  EXPECT_EQ(StateOf(c, 1), State::kDead);
  EXPECT_EQ(c.live_count(), 2);
  EXPECT_EQ(c.declared_dead(), 1);
  // Not reported, nor counted, a second time.
  EXPECT_TRUE(c.ExpireSilent(kT0 + milliseconds(1500)).empty());
  EXPECT_EQ(c.declared_dead(), 1);
  EXPECT_EQ(c.ExpireSilent(kT0 + milliseconds(1601)), (std::vector<int>{0, 2}));
  EXPECT_EQ(c.live_count(), 0);
  EXPECT_EQ(c.declared_dead(), 3);
  EXPECT_TRUE(c.ExpireSilent(kT0 + milliseconds(5000)).empty());
}

TEST(CoordinatorTest, DeathOfANonContributorLowersNeededAndReadiesTheStep) {
  Coordinator c = Sync(3);
  ASSERT_EQ(c.OfferSync(0, 0, 0), Offer::kAccept);
  ASSERT_EQ(c.OfferSync(1, 0, 0), Offer::kAccept);
  EXPECT_EQ(c.needed(), 3);
  EXPECT_FALSE(c.StepReady());
  (void)KillOnly(c, 2, kT0 + milliseconds(500));
  EXPECT_EQ(c.live_count(), 2);
  EXPECT_EQ(c.needed(), 2);
  EXPECT_TRUE(c.StepReady());
}

TEST(CoordinatorTest, GradientOfARankThatDiedAfterContributingStillCountsButLiveRanksAreAwaited) {
  Coordinator c = Sync(3);
  ASSERT_EQ(c.OfferSync(0, 0, 0), Offer::kAccept);
  (void)KillOnly(c, 0, kT0 + milliseconds(500));
  EXPECT_EQ(c.contributors(), 1);
  EXPECT_EQ(c.needed(), 3);  // the dead rank's gradient and both live ranks'
  EXPECT_FALSE(c.StepReady());
  EXPECT_EQ(c.MissingFromStep(), (std::vector<int>{1, 2}));
  ASSERT_EQ(c.OfferSync(1, 0, 0), Offer::kAccept);
  EXPECT_FALSE(c.StepReady()) << "the step completed without live rank 2";
  ASSERT_EQ(c.OfferSync(2, 0, 0), Offer::kAccept);
  EXPECT_TRUE(c.StepReady());
}

TEST(CoordinatorTest, StepDoesNotCompleteWithoutTheOnlyLiveRankWhenTheContributorDied) {
  Coordinator c = Sync(2);
  ASSERT_EQ(c.OfferSync(0, 0, 0), Offer::kAccept);
  (void)KillOnly(c, 0, kT0 + milliseconds(500));
  EXPECT_FALSE(c.StepReady()) << "rank 1 is live and has not given its gradient";
  ASSERT_EQ(c.OfferSync(1, 0, 0), Offer::kAccept);
  EXPECT_TRUE(c.StepReady());
  EXPECT_EQ(c.contributors(), 2);
}

TEST(CoordinatorTest, ContributorThatLeavesStillCounts) {
  Coordinator c = Sync(3);
  ASSERT_EQ(c.OfferSync(0, 0, 0), Offer::kAccept);
  c.Leave(0);
  ASSERT_EQ(c.OfferSync(1, 0, 0), Offer::kAccept);
  EXPECT_FALSE(c.StepReady());
  c.Leave(2);
  EXPECT_TRUE(c.StepReady());
  EXPECT_EQ(c.contributors(), 2);
}

TEST(CoordinatorTest, BackupQuorumShrinksToTheLiveCountWhenFewerRemain) {
  Coordinator c = Sync(4, 3);
  ASSERT_EQ(c.OfferSync(0, 0, 0), Offer::kAccept);
  ASSERT_EQ(c.OfferSync(1, 0, 0), Offer::kAccept);
  c.Leave(2);
  EXPECT_EQ(c.needed(), 3);  // three live ranks still make R = 3
  EXPECT_FALSE(c.StepReady());
  c.Leave(3);
  EXPECT_EQ(c.needed(), 2);
  EXPECT_TRUE(c.StepReady());
}

TEST(CoordinatorTest, LeaveRemovesTheRankFromTheLiveSetWithoutCountingItDead) {
  Coordinator c = Sync(2);
  ASSERT_EQ(c.OfferSync(0, 0, 0), Offer::kAccept);
  c.Leave(1);
  EXPECT_EQ(StateOf(c, 1), State::kLeft);
  EXPECT_EQ(c.live_count(), 1);
  EXPECT_EQ(c.needed(), 1);
  EXPECT_TRUE(c.StepReady());
  EXPECT_TRUE(c.MissingFromStep().empty());
  // A departed rank is not declared dead later.
  (void)c.Touch(0, kT0 + milliseconds(900));
  EXPECT_TRUE(c.ExpireSilent(kT0 + milliseconds(1500)).empty());
  EXPECT_EQ(c.declared_dead(), 0);
}

TEST(CoordinatorTest, NeededIsAtLeastOneWhenNoRankIsLive) {
  Coordinator c = Sync(2);
  c.Leave(0);
  c.Leave(1);
  EXPECT_EQ(c.live_count(), 0);
  EXPECT_EQ(c.needed(), 1);
  EXPECT_FALSE(c.StepReady());  // nothing to apply
}

TEST(CoordinatorTest, TouchOfALiveRankOnlyRefreshesIt) {
  Coordinator c = Sync(2);
  EXPECT_FALSE(c.Touch(1, kT0 + milliseconds(900)));
  EXPECT_EQ(c.workers()[1].last_seen, kT0 + milliseconds(900));
  EXPECT_EQ(c.ExpireSilent(kT0 + milliseconds(1500)), std::vector<int>{0});
}

TEST(CoordinatorTest, DeadRankRejoinsOnceAtTheSlowestLiveClock) {
  Coordinator c = Ssp(3, 2);
  Advance(c, 0, 5);
  Advance(c, 1, 3);
  const Coordinator::TimePoint died = KillOnly(c, 2, kT0 + milliseconds(500));
  EXPECT_EQ(c.MinLiveClock(), 3);
  EXPECT_TRUE(c.Touch(2, died));
  EXPECT_EQ(StateOf(c, 2), State::kLive);
  EXPECT_EQ(ClockOf(c, 2), 3);
  // Its last read is from before its death: a gradient computed then is 3 clocks stale,
  // more than K, and the server drops it instead of applying it.
  EXPECT_EQ(c.workers()[2].read_min_clock, 0);
  EXPECT_EQ(c.ClockStaleness(2), 3);
  c.RecordRead(2);
  EXPECT_EQ(c.ClockStaleness(2), 0);
  EXPECT_EQ(c.live_count(), 3);
  EXPECT_FALSE(c.Touch(2, died));
  EXPECT_EQ(c.declared_dead(), 1);
  // Rejoining refreshed it: it is not expired by the same clock again.
  EXPECT_TRUE(c.ExpireSilent(died).empty());
  // Back at clock 3 rather than 0, it blocks nobody: rank 0 (clock 5) may read under ssp:2.
  EXPECT_TRUE(c.PullAllowed(0));
  EXPECT_TRUE(c.SspBlockers(0).empty());
}

TEST(CoordinatorTest, RejoiningRankAheadOfTheSlowestKeepsItsClock) {
  Coordinator c = Ssp(3, 1);
  Advance(c, 0, 5);
  Advance(c, 1, 2);
  Advance(c, 2, 2);
  const Coordinator::TimePoint died = KillOnly(c, 0, kT0 + milliseconds(500));
  EXPECT_TRUE(c.Touch(0, died));
  EXPECT_EQ(ClockOf(c, 0), 5);
}

TEST(CoordinatorTest, DepartedRankRejoinsWhenItSpeaksAgain) {
  Coordinator c = Sync(2);
  Advance(c, 0, 4);
  c.Leave(1);
  EXPECT_EQ(c.live_count(), 1);
  EXPECT_TRUE(c.Touch(1, kT0 + milliseconds(10)));
  EXPECT_EQ(StateOf(c, 1), State::kLive);
  EXPECT_EQ(ClockOf(c, 1), 4);
  EXPECT_EQ(c.live_count(), 2);
  EXPECT_EQ(c.needed(), 2);
  EXPECT_EQ(c.declared_dead(), 0);
  EXPECT_FALSE(c.Touch(1, kT0 + milliseconds(20)));
}

// --- ssp ---

TEST(CoordinatorTest, SspPullIsRefusedExactlyWhenTheRankIsMoreThanKAheadOfTheSlowest) {
  for (int64_t k = 0; k <= 2; ++k) {
    for (int64_t c0 = 0; c0 < 5; ++c0) {
      for (int64_t c1 = 0; c1 < 5; ++c1) {
        for (int64_t c2 = 0; c2 < 5; ++c2) {
          Coordinator c = Ssp(3, k);
          const std::array<int64_t, 3> clocks = {c0, c1, c2};
          for (int r = 0; r < 3; ++r) Advance(c, r, clocks[static_cast<size_t>(r)]);
          const int64_t slowest = std::min({c0, c1, c2});
          ASSERT_EQ(c.MinLiveClock(), slowest);
          for (int r = 0; r < 3; ++r) {
            const int64_t mine = clocks[static_cast<size_t>(r)];
            std::vector<int> behind;
            for (int o = 0; o < 3; ++o) {
              if (clocks[static_cast<size_t>(o)] < mine - k) behind.push_back(o);
            }
            EXPECT_EQ(c.PullAllowed(r), !(mine - k > slowest))
                << "K=" << k << " clocks " << c0 << "," << c1 << "," << c2 << " rank " << r;
            EXPECT_EQ(c.SspBlockers(r), behind)
                << "K=" << k << " clocks " << c0 << "," << c1 << "," << c2 << " rank " << r;
          }
        }
      }
    }
  }
}

TEST(CoordinatorTest, DeadAndDepartedRanksDoNotBlockSspReads) {
  Coordinator c = Ssp(3, 1);
  Advance(c, 0, 4);
  Advance(c, 2, 4);
  EXPECT_FALSE(c.PullAllowed(0));
  EXPECT_EQ(c.SspBlockers(0), std::vector<int>{1});
  (void)KillOnly(c, 1, kT0 + milliseconds(500));
  EXPECT_TRUE(c.PullAllowed(0));
  EXPECT_TRUE(c.SspBlockers(0).empty());
  EXPECT_EQ(c.MinLiveClock(), 4);

  Coordinator d = Ssp(3, 1);
  Advance(d, 0, 4);
  Advance(d, 2, 4);
  d.Leave(1);
  EXPECT_TRUE(d.PullAllowed(0));
  EXPECT_TRUE(d.SspBlockers(0).empty());
}

TEST(CoordinatorTest, MinLiveClockIsTheLargestClockWhenNoRankIsLive) {
  Coordinator c = Ssp(2, 0);
  Advance(c, 0, 2);
  Advance(c, 1, 7);
  c.Leave(0);
  c.Leave(1);
  EXPECT_EQ(c.MinLiveClock(), 7);
  EXPECT_TRUE(c.PullAllowed(0));
  EXPECT_TRUE(c.PullAllowed(1));
}

TEST(CoordinatorTest, RecordGradientAdvancesTheClockAndReturnsItsDistanceFromTheLastRead) {
  Coordinator c = Ssp(2, 5);
  EXPECT_EQ(c.RecordGradient(0), 0);
  EXPECT_EQ(c.RecordGradient(0), 1);
  EXPECT_EQ(c.RecordGradient(0), 2);
  EXPECT_EQ(ClockOf(c, 0), 3);
  EXPECT_EQ(c.workers()[0].gradients, 3);
  Advance(c, 1, 2);
  c.RecordRead(0);  // sees the slowest live clock, 2
  EXPECT_EQ(c.workers()[0].read_min_clock, 2);
  EXPECT_EQ(c.RecordGradient(0), 1);
  c.RecordDropped(1);
  EXPECT_EQ(c.workers()[1].dropped, 1);
  EXPECT_EQ(ClockOf(c, 1), 2);
}

// Three workers, each alternating read and push, scheduled at random; a read happens only
// when PullAllowed. The clock staleness of every gradient must stay within K, and the bound
// must have been needed (some reads refused) and reached.
TEST(CoordinatorTest, SspReadsOnlyWhenAllowedKeepClockStalenessWithinK) {
  for (int64_t k = 0; k <= 2; ++k) {
    Coordinator c = Ssp(3, k);
    std::mt19937 rng(static_cast<uint32_t>(20240 + k));
    std::uniform_int_distribution<int> pick(0, 2);
    // Rank 2 is picked a third as often as the others, so it falls behind.
    std::discrete_distribution<int> skewed({3.0, 3.0, 1.0});
    std::array<bool, 3> wants_read = {true, true, true};
    int64_t max_staleness = 0;
    int refused = 0;
    int reads = 0;
    for (int turn = 0; turn < 3000; ++turn) {
      const int r = turn % 2 == 0 ? pick(rng) : skewed(rng);
      const auto i = static_cast<size_t>(r);
      if (wants_read[i]) {
        if (!c.PullAllowed(r)) {
          ++refused;
          continue;
        }
        c.RecordRead(r);
        ++reads;
        wants_read[i] = false;
      } else {
        max_staleness = std::max(max_staleness, c.RecordGradient(r));
        wants_read[i] = true;
      }
    }
    EXPECT_LE(max_staleness, k) << "K=" << k;
    EXPECT_EQ(max_staleness, k) << "K=" << k << ": the schedule never reached the bound";
    EXPECT_GT(refused, 0) << "K=" << k;
    EXPECT_GT(reads, 300) << "K=" << k;
    for (int r = 0; r < 3; ++r) EXPECT_GT(ClockOf(c, r), 100) << "K=" << k << " rank " << r;
  }
}

TEST(CoordinatorTest, AsyncAndSyncNeverRefuseAPull) {
  for (TrainingMode::Kind kind : {TrainingMode::Kind::kAsync, TrainingMode::Kind::kSync}) {
    Coordinator c(Options(kind, 3), kT0);
    Advance(c, 0, 100);
    EXPECT_TRUE(c.PullAllowed(0));
    EXPECT_TRUE(c.PullAllowed(1));
  }
}

TEST(CoordinatorTest, ValidRankIsZeroToNumWorkersMinusOne) {
  Coordinator c = Sync(3);
  EXPECT_EQ(c.num_workers(), 3);
  EXPECT_FALSE(c.ValidRank(-1));
  EXPECT_TRUE(c.ValidRank(0));
  EXPECT_TRUE(c.ValidRank(2));
  EXPECT_FALSE(c.ValidRank(3));
  EXPECT_FALSE(c.ValidRank(7));
}

TEST(CoordinatorTest, EveryRankStartsLiveAtClockZero) {
  Coordinator c = Sync(3);
  EXPECT_EQ(c.live_count(), 3);
  EXPECT_EQ(c.declared_dead(), 0);
  for (const Coordinator::Worker& w : c.workers()) {
    EXPECT_EQ(w.state, State::kLive);
    EXPECT_EQ(w.clock, 0);
    EXPECT_EQ(w.last_seen, kT0);
  }
}

}  // namespace
}  // namespace parasync

namespace parasync {
namespace {

TEST(CoordinatorLeaveTest, HeartbeatAfterLeaveDoesNotBringTheRankBack) {
  // The heartbeat thread's last beat may overtake the Leave on the wire.
  Coordinator c = Sync(2);
  c.Leave(1);
  EXPECT_FALSE(c.Touch(1, kT0 + milliseconds(10), /*heartbeat=*/true));
  EXPECT_EQ(c.live_count(), 1);
  // A pull, push or register does: it is training again.
  EXPECT_TRUE(c.Touch(1, kT0 + milliseconds(20)));
  EXPECT_EQ(c.live_count(), 2);
}

TEST(CoordinatorLeaveTest, HeartbeatOfADeadRankBringsItBack) {
  // A stopped and resumed process first speaks through its heartbeat thread.
  Coordinator c = Sync(2);
  (void)KillOnly(c, 1, kT0 + milliseconds(500));
  ASSERT_EQ(c.live_count(), 1);
  EXPECT_TRUE(c.Touch(1, kT0 + milliseconds(3000), /*heartbeat=*/true));
  EXPECT_EQ(c.live_count(), 2);
}

TEST(CoordinatorLeaveTest, SilenceCountsFromRestartSilenceClocks) {
  // Time before the model is registered is start-up, not silence.
  Coordinator c = Sync(2);
  c.RestartSilenceClocks(kT0 + 5 * kTimeout);
  EXPECT_TRUE(c.ExpireSilent(kT0 + 5 * kTimeout + kTimeout / 2).empty());
  EXPECT_EQ(c.ExpireSilent(kT0 + 7 * kTimeout).size(), 2u);
}

}  // namespace
}  // namespace parasync
