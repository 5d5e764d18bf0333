// GatherBoard (ps/gather_board.h): the collectives' rounds, resends, dead ranks, the timeout
// and the memory bound.
#include "ps/gather_board.h"

#include <gtest/gtest.h>

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
                                        uint64_t request_id = 1) {
    Header h;
    h.rank = rank;
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
