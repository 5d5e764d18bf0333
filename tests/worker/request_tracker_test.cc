#include "worker/request_tracker.h"

#include <gtest/gtest.h>

namespace parasync {
namespace {

using std::chrono::milliseconds;
using Clock = RequestTracker::Clock;
using Resend = RequestTracker::Resend;

RequestTracker::Limits TestLimits() {
  RequestTracker::Limits limits;
  limits.timeout = milliseconds(10000);
  limits.resend_after = milliseconds(100);
  limits.resend_max = milliseconds(350);
  return limits;
}

// Sends every request at t0 to incarnation `incarnation` with ids 1, 2, ... and starts.
void SendAll(RequestTracker& tracker, Clock::time_point t0, uint64_t incarnation = 0) {
  for (size_t i = 0; i < tracker.size(); ++i) {
    tracker.SetId(i, i + 1);
    tracker.Sent(i, incarnation, t0);
  }
  tracker.Start(t0);
}

// The tracker started at `t0` times out at t0 + `at` ms (not a millisecond before), naming
// requests `silent` and the limit `limit_ms` they missed.
void ExpectTimesOutAt(const RequestTracker& tracker, Clock::time_point t0, int at,
                      const std::vector<size_t>& silent, int limit_ms) {
  EXPECT_FALSE(tracker.CheckOverdue(t0 + milliseconds(at - 1)));
  const auto overdue = tracker.CheckOverdue(t0 + milliseconds(at));
  ASSERT_TRUE(overdue);
  EXPECT_EQ(overdue->silent, silent);
  EXPECT_EQ(overdue->limit, milliseconds(limit_ms));
}

TEST(RequestTrackerTest, UnansweredRequestIsResentWithDoublingBackoffUpToTheMaximum) {
  RequestTracker tracker({0}, TestLimits());
  auto t = Clock::now();
  SendAll(tracker, t);
  EXPECT_EQ(tracker.ResendDue(0, 0, t + milliseconds(99)), Resend::kNotDue);
  // Due after 100 ms, then 200, then 350 (the maximum), then 350 again.
  for (int wait : {100, 200, 350, 350}) {
    EXPECT_EQ(tracker.ResendDue(0, 0, t + milliseconds(wait - 1)), Resend::kNotDue) << wait;
    t += milliseconds(wait);
    EXPECT_EQ(tracker.ResendDue(0, 0, t), Resend::kUnanswered) << wait;
    tracker.Sent(0, 0, t);
  }
}

TEST(RequestTrackerTest, RestartedServerGetsTheRequestAtOnceAndTheBackoffResets) {
  RequestTracker tracker({0, 1}, TestLimits());
  auto t = Clock::now();
  SendAll(tracker, t, /*incarnation=*/7);
  // Shard 0 announces a new incarnation: due at once; shard 1 (same incarnation) is not.
  EXPECT_EQ(tracker.ResendDue(0, 8, t + milliseconds(1)), Resend::kRestarted);
  EXPECT_EQ(tracker.ResendDue(1, 7, t + milliseconds(1)), Resend::kNotDue);
  tracker.Sent(0, 8, t + milliseconds(1));
  EXPECT_EQ(tracker.ResendDue(0, 8, t + milliseconds(100)), Resend::kNotDue);
  EXPECT_EQ(tracker.ResendDue(0, 8, t + milliseconds(101)), Resend::kUnanswered);
}

TEST(RequestTrackerTest, UnknownIncarnationIsNoRestart) {
  RequestTracker tracker({0, 1}, TestLimits());
  const auto t = Clock::now();
  SendAll(tracker, t, /*incarnation=*/0);
  EXPECT_EQ(tracker.ResendDue(0, 5, t + milliseconds(1)), Resend::kNotDue);
  tracker.Sent(1, 5, t);
  EXPECT_EQ(tracker.ResendDue(1, 0, t + milliseconds(1)), Resend::kNotDue);
}

TEST(RequestTrackerTest, AnsweredRequestIsNeverDue) {
  RequestTracker tracker({0}, TestLimits());
  const auto t = Clock::now();
  SendAll(tracker, t, 1);
  tracker.Answer(0, t);
  EXPECT_EQ(tracker.ResendDue(0, 2, t + milliseconds(1000)), Resend::kNotDue);
}

TEST(RequestTrackerTest, ComplainsOncePerRequest) {
  RequestTracker tracker({0, 0}, TestLimits());
  EXPECT_FALSE(tracker.complained(0));
  EXPECT_TRUE(tracker.FirstComplaint(0));
  EXPECT_FALSE(tracker.FirstComplaint(0));
  EXPECT_TRUE(tracker.complained(0));
  EXPECT_TRUE(tracker.FirstComplaint(1));
}

TEST(RequestTrackerTest, RepliesMatchByShardAndIdAndLateRepliesMatchNothing) {
  RequestTracker tracker({0, 1, 0}, TestLimits());  // ids 1, 2, 3
  const auto t = Clock::now();
  SendAll(tracker, t);
  EXPECT_EQ(tracker.Match(0, 3), std::optional<size_t>(2));
  EXPECT_EQ(tracker.Match(1, 2), std::optional<size_t>(1));
  EXPECT_EQ(tracker.Match(1, 3), std::nullopt);   // another shard's id
  EXPECT_EQ(tracker.Match(0, 99), std::nullopt);  // an abandoned request's reply
  tracker.Answer(2, t + milliseconds(5));
  EXPECT_EQ(tracker.Match(0, 3), std::nullopt);  // answered already
  EXPECT_EQ(tracker.pending(), 2u);
  EXPECT_EQ(tracker.answered_at()[2], t + milliseconds(5));
  EXPECT_EQ(tracker.answered_at()[0], Clock::time_point{});
}

TEST(RequestTrackerTest, WaitingShardsListsEachShardWithUnansweredRequestsOnce) {
  RequestTracker tracker({2, 0, 2, 1}, TestLimits());
  const auto t = Clock::now();
  SendAll(tracker, t);
  EXPECT_EQ(tracker.WaitingShards(), (std::vector<int>{2, 0, 1}));
  tracker.Answer(0, t);
  EXPECT_EQ(tracker.WaitingShards(), (std::vector<int>{0, 2, 1}));
  tracker.Answer(2, t);
  tracker.Answer(3, t);
  EXPECT_EQ(tracker.WaitingShards(), (std::vector<int>{0}));
  tracker.Answer(1, t);
  EXPECT_TRUE(tracker.WaitingShards().empty());
  EXPECT_EQ(tracker.pending(), 0u);
}

TEST(RequestTrackerTest, TimesOutNamingTheUnansweredRequests) {
  RequestTracker tracker({0, 1, 2}, TestLimits());
  const auto t = Clock::now();
  SendAll(tracker, t);
  tracker.Answer(1, t);
  ExpectTimesOutAt(tracker, t, 10000, {0, 2}, 10000);
  EXPECT_EQ(tracker.Remaining(t + milliseconds(4000)), milliseconds(6000));
}

TEST(RequestTrackerTest, ShortRequestsTimeOutFirst) {
  RequestTracker::Limits limits = TestLimits();
  limits.short_count = 2;
  limits.short_timeout = milliseconds(500);
  RequestTracker tracker({0, 1, 0, 1}, limits);  // two pushes, then two pulls
  const auto t = Clock::now();
  SendAll(tracker, t);
  tracker.Answer(0, t);
  ExpectTimesOutAt(tracker, t, 500, {1}, 500);  // the pulls may wait on
  // Once the short ones are answered, only the long deadline counts.
  tracker.Answer(1, t);
  ExpectTimesOutAt(tracker, t, 10000, {2, 3}, 10000);
}

}  // namespace
}  // namespace parasync
