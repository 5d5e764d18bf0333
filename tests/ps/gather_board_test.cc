// GatherBoard (ps/gather_board.h): the collectives' rounds, resends, dead ranks, the timeout
// and the memory bound.
#include "ps/gather_board.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

namespace parasync {
namespace {

using Clock = std::chrono::steady_clock;

struct Board {
  GatherBoard board;
  std::set<int> dead;
  explicit Board(int workers, int64_t max_bytes = int64_t{1} << 20)
      : board({workers, max_bytes, std::chrono::milliseconds(1000)}) {}
  std::function<bool(int)> Expected() {
    return [this](int r) { return !dead.contains(r); };
  }
  std::vector<GatherBoard::Reply> Offer(int rank, const std::string& key, int64_t round,
                                        const std::string& payload, Clock::time_point now,
                                        uint64_t request_id = 1, bool joining = false) {
    Header h;
    h.rank = rank;
    h.joining = joining;
    h.key = key;
    h.clock = round;
    h.request_id = request_id;
    zmq::message_t identity(std::string("peer") + std::to_string(rank));
    return board.Offer(identity, h, zmq::message_t(payload.data(), payload.size()), now,
                       Expected());
  }
};

std::string Text(const zmq::message_t& m) { return std::string(m.data<char>(), m.size()); }

TEST(GatherBoardTest, AnswersEveryRankWithEveryPayloadInRankOrderOnceAllOffered) {
  Board b(3);
  const auto now = Clock::now();
  EXPECT_TRUE(b.Offer(2, "k", 1, "two", now).empty());
  EXPECT_TRUE(b.Offer(0, "k", 1, "zero", now).empty());
  auto replies = b.Offer(1, "k", 1, "one", now);
  ASSERT_EQ(replies.size(), 3u);
  for (const auto& r : replies) {
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    EXPECT_EQ(r.ranks, (std::vector<int32_t>{0, 1, 2}));
    ASSERT_EQ(r.frames.size(), 3u);
    EXPECT_EQ(Text(r.frames[0]), "zero");
    EXPECT_EQ(Text(r.frames[1]), "one");
    EXPECT_EQ(Text(r.frames[2]), "two");
  }
  std::set<std::string> who;
  for (const auto& r : replies) who.insert(Text(r.identity));
  EXPECT_EQ(who, (std::set<std::string>{"peer0", "peer1", "peer2"}));
  EXPECT_EQ(b.board.open_rounds(), 0u);
}

TEST(GatherBoardTest, AResendKeepsOnePayloadAndALateResendGetsTheResultAgain) {
  Board b(2);
  const auto now = Clock::now();
  EXPECT_TRUE(b.Offer(0, "k", 1, "first", now, 1).empty());
  EXPECT_TRUE(b.Offer(0, "k", 1, "resent", now, 1).empty());  // a resend: no second payload
  auto replies = b.Offer(1, "k", 1, "one", now);
  ASSERT_EQ(replies.size(), 2u);
  EXPECT_EQ(Text(replies[0].frames[0]), "first");
  // Rank 1's reply was lost: its resend of round 1 is answered at once, from the kept result.
  auto again = b.Offer(1, "k", 1, "one", now);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_TRUE(again[0].status.ok());
  EXPECT_EQ(Text(again[0].frames[1]), "one");
}

TEST(GatherBoardTest, RoundsOfAKeyFollowEachOtherAndARankOutOfStepIsRefused) {
  Board b(2);
  const auto now = Clock::now();
  (void)b.Offer(0, "k", 1, "a", now);
  ASSERT_EQ(b.Offer(1, "k", 1, "b", now).size(), 2u);
  EXPECT_TRUE(b.Offer(0, "k", 2, "c", now).empty());  // round 2 opens
  auto ahead = b.Offer(1, "k", 3, "d", now);
  ASSERT_EQ(ahead.size(), 1u);
  EXPECT_EQ(ahead[0].status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(ahead[0].status.message().find("round 3"), std::string::npos);
  auto behind = b.Offer(1, "k", 1, "b", now);  // round 1 is gone once round 2 opened
  ASSERT_EQ(behind.size(), 1u);
  EXPECT_EQ(behind[0].status.code(), StatusCode::kFailedPrecondition);
  auto done = b.Offer(1, "k", 2, "e", now);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(Text(done[0].frames[0]), "c");
  // Keys are independent.
  EXPECT_TRUE(b.Offer(1, "other", 7, "x", now).empty());
}

TEST(GatherBoardTest, ADeadRankIsNotWaitedForAndLearnsWhoTookPartWhenItComesBack) {
  Board b(3);
  const auto now = Clock::now();
  (void)b.Offer(0, "k", 1, "zero", now);
  (void)b.Offer(1, "k", 1, "one", now);
  EXPECT_TRUE(b.board.Tick(now, b.Expected()).empty());  // rank 2 is live: still waiting
  b.dead.insert(2);
  auto replies = b.board.Tick(now, b.Expected());
  ASSERT_EQ(replies.size(), 2u);
  EXPECT_EQ(replies[0].ranks, (std::vector<int32_t>{0, 1}));
  b.dead.clear();
  auto late = b.Offer(2, "k", 1, "two", now);
  ASSERT_EQ(late.size(), 1u);
  EXPECT_EQ(late[0].ranks, (std::vector<int32_t>{0, 1}));  // it took no part
}

TEST(GatherBoardTest, ARoundPastTheTimeoutFailsNamingTheMissingRanks) {
  Board b(3);
  const auto now = Clock::now();
  (void)b.Offer(1, "k", 1, "one", now);
  EXPECT_TRUE(b.board.Tick(now + std::chrono::milliseconds(900), b.Expected()).empty());
  auto failed = b.board.Tick(now + std::chrono::milliseconds(1100), b.Expected());
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].status.code(), StatusCode::kTimedOut);
  EXPECT_NE(failed[0].status.message().find("rank(s) 0, 2"), std::string::npos)
      << failed[0].status.message();
  EXPECT_EQ(b.board.keys(), 0u);
  EXPECT_EQ(b.board.bytes(), 0);
}

TEST(GatherBoardTest, PayloadsStayWithinTheBoundDroppingKeptResultsFirst) {
  Board b(2, 4096);
  const auto now = Clock::now();
  const std::string kilo(1000, 'x');
  (void)b.Offer(0, "a", 1, kilo, now);
  ASSERT_EQ(b.Offer(1, "a", 1, kilo, now).size(), 2u);  // kept: ~3 KiB with overheads
  EXPECT_TRUE(b.Offer(0, "b", 1, kilo, now + std::chrono::seconds(1)).empty());
  EXPECT_LE(b.board.bytes(), 4096);
  EXPECT_EQ(b.board.keys(), 1u);  // "a"'s kept result made room
  auto refused = b.Offer(1, "b", 1, std::string(4000, 'y'), now);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0].status.code(), StatusCode::kUnavailable);
  EXPECT_NE(refused[0].status.message().find("--max-gather-bytes"), std::string::npos);
  EXPECT_LE(b.board.bytes(), 4096);
}

std::vector<GatherBoard::Reply>::const_iterator ReplyTo(
    const std::vector<GatherBoard::Reply>& replies, const std::string& who) {
  return std::find_if(replies.begin(), replies.end(),
                      [&](const GatherBoard::Reply& r) { return Text(r.identity) == who; });
}

TEST(GatherBoardTest, AJoiningRankWaitsUnwaitedForUntilTheKeysNextRoundAdmitsIt) {
  Board b(3);
  const auto now = Clock::now();
  (void)b.Offer(0, "commit", 1, "a", now);
  (void)b.Offer(1, "commit", 1, "b", now);
  ASSERT_EQ(b.Offer(2, "commit", 1, "c", now).size(), 3u);
  // Rank 2 restarted: it is still "expected" (not yet declared dead), but its joining offer
  // makes the next round wait for it no longer, and that round admits it.
  EXPECT_TRUE(b.Offer(2, "commit", 0, "", now, 7, /*joining=*/true).empty());
  EXPECT_TRUE(b.Offer(0, "commit", 2, "a2", now).empty());
  auto replies = b.Offer(1, "commit", 2, "b2", now);
  ASSERT_EQ(replies.size(), 3u);
  for (const auto& r : replies) {
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    EXPECT_EQ(r.admitted, (std::vector<int32_t>{2}));
    EXPECT_EQ(r.ranks, (std::vector<int32_t>{0, 1}));  // the joiner offered no payload
    EXPECT_EQ(r.request.clock, 2);
  }
  const auto joiner = ReplyTo(replies, "peer2");
  ASSERT_NE(joiner, replies.end());
  EXPECT_TRUE(joiner->request.joining);
  EXPECT_EQ(Text(joiner->frames[0]), "a2");
  // Its reply was lost: the resend gets the kept result, admission included.
  auto again = b.Offer(2, "commit", 0, "", now, 8, /*joining=*/true);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].admitted, (std::vector<int32_t>{2}));
  EXPECT_EQ(again[0].request.clock, 2);
  // The next round has it as an ordinary rank, and admits nobody.
  (void)b.Offer(0, "commit", 3, "", now);
  (void)b.Offer(1, "commit", 3, "", now);
  auto third = b.Offer(2, "commit", 3, "", now);
  ASSERT_EQ(third.size(), 3u);
  EXPECT_TRUE(third[0].admitted.empty());
}

TEST(GatherBoardTest, AJoinerOutlivesKeptResultsAndTimeoutsAndTheFirstRoundAdmitsIt) {
  Board b(2);
  const auto now = Clock::now();
  EXPECT_TRUE(b.Offer(1, "commit", 0, "", now, 1, /*joining=*/true).empty());
  EXPECT_TRUE(b.board.Tick(now + GatherBoard::kKeepComplete + std::chrono::seconds(1),
                           b.Expected()).empty());
  EXPECT_EQ(b.board.keys(), 1u);  // still parked
  // A round that times out (rank 0 alone, rank 1 dead... then alive and silent) keeps it.
  const auto later = now + GatherBoard::kKeepComplete + std::chrono::seconds(2);
  b.dead.insert(1);
  auto first = b.Offer(0, "commit", 1, "x", later);
  ASSERT_EQ(first.size(), 2u);  // rank 0's and the joiner's
  for (const auto& r : first) EXPECT_EQ(r.admitted, (std::vector<int32_t>{1}));
  // Another key's round is no admission.
  EXPECT_TRUE(b.Offer(1, "other", 0, "", later, 2, /*joining=*/true).empty());
  b.dead.clear();
  (void)b.Offer(0, "commit", 2, "", later);
  auto timed_out = b.board.Tick(later + std::chrono::seconds(2), b.Expected());
  ASSERT_EQ(timed_out.size(), 1u);  // rank 0's round 2: rank 1 never offered
  EXPECT_EQ(timed_out[0].status.code(), StatusCode::kTimedOut);
  EXPECT_EQ(b.board.keys(), 1u);  // "other" still parks rank 1
}

TEST(GatherBoardTest, RefusesWhatCannotBeARound) {
  Board b(2);
  const auto now = Clock::now();
  EXPECT_EQ(b.Offer(0, "", 1, "p", now)[0].status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b.Offer(0, "k", 0, "p", now)[0].status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b.Offer(5, "k", 1, "p", now)[0].status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b.board.keys(), 0u);
}

}  // namespace
}  // namespace parasync
