#include "ps/straggler.h"

#include <gtest/gtest.h>

namespace parasync {
namespace {

using std::chrono::seconds;

StragglerTracker::TimePoint T0() { return StragglerTracker::TimePoint{} + std::chrono::hours(1); }

TEST(StragglerTrackerTest, NoWaitsMeansNoStraggler) {
  StragglerTracker t({3, 1.0});
  EXPECT_EQ(t.Straggler(T0()), -1);
}

TEST(StragglerTrackerTest, TheRankWithTheMostWaitingIsTheStraggler) {
  StragglerTracker t({3, 1.0});
  const auto now = T0();
  t.Record(0, 0.2, now);
  t.Record(2, 0.5, now);
  t.Record(0, 0.2, now);
  EXPECT_EQ(t.Straggler(now), 2);
  t.Record(0, 0.2, now);  // rank 0 now has 0.6 s
  EXPECT_EQ(t.Straggler(now), 0);
}

TEST(StragglerTrackerTest, OldWaitsDecayWithTheHalfLife) {
  StragglerTracker t({2, 1.0, /*half_life_seconds=*/10.0});
  const auto now = T0();
  t.Record(0, 4.0, now);
  EXPECT_NEAR(t.DecayedSeconds(0, now + seconds(10)), 2.0, 1e-9);
  EXPECT_NEAR(t.DecayedSeconds(0, now + seconds(20)), 1.0, 1e-9);
  // A smaller but recent wait overtakes a big old one.
  t.Record(1, 1.5, now + seconds(20));
  EXPECT_EQ(t.Straggler(now + seconds(20)), 1);
  // Everything fades away eventually.
  EXPECT_EQ(t.Straggler(now + std::chrono::hours(2)), -1);
}

TEST(StragglerTrackerTest, LongWaitsAreLoggedAtMostOncePerIntervalPerRankWithACount) {
  StragglerTracker t({2, 1.0, 60.0, /*log_every_seconds=*/10.0});
  const auto now = T0();
  EXPECT_FALSE(t.Record(1, 0.9, now).log);  // below the threshold
  auto v = t.Record(1, 1.5, now);
  EXPECT_TRUE(v.log);
  EXPECT_EQ(v.suppressed, 0);
  EXPECT_FALSE(t.Record(1, 2.0, now + seconds(3)).log);
  EXPECT_FALSE(t.Record(1, 2.0, now + seconds(6)).log);
  EXPECT_TRUE(t.Record(0, 3.0, now + seconds(6)).log);  // other ranks have their own interval
  v = t.Record(1, 2.0, now + seconds(11));
  EXPECT_TRUE(v.log);
  EXPECT_EQ(v.suppressed, 2);
}

TEST(StragglerTrackerTest, ZeroThresholdNeverLogsButStillCounts) {
  StragglerTracker t({1, 0.0});
  EXPECT_FALSE(t.Record(0, 100.0, T0()).log);
  EXPECT_EQ(t.Straggler(T0()), 0);
}

TEST(StragglerTrackerTest, BadRanksAndNegativeWaitsAreIgnored) {
  StragglerTracker t({2, 1.0});
  EXPECT_FALSE(t.Record(-1, 5.0, T0()).log);
  EXPECT_FALSE(t.Record(2, 5.0, T0()).log);
  EXPECT_FALSE(t.Record(0, -5.0, T0()).log);
  EXPECT_EQ(t.Straggler(T0()), -1);
}

}  // namespace
}  // namespace parasync
