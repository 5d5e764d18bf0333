// ParkedPulls (ps/parked_pulls.h): the parking rules for pulls that must wait.
#include "ps/parked_pulls.h"

#include <gtest/gtest.h>

#include <string>

namespace parasync {
namespace {

using Clock = std::chrono::steady_clock;

// A pull's header as ParkedPulls sees it: who asks, and which request it is.
Header Pull(int rank, uint64_t request_id) {
  Header h;
  h.rank = rank;
  h.request_id = request_id;
  return h;
}

ParkedPulls::Outcome Park(ParkedPulls& parked, int rank, uint64_t request_id,
                          Clock::time_point now, int waited_for = -1) {
  zmq::message_t identity(std::string("peer") + std::to_string(rank));
  Header h = Pull(rank, request_id);
  return parked.Park(identity, h, now, /*ranked=*/rank >= 0, waited_for);
}

std::vector<uint64_t> RequestIds(ParkedPulls& parked) {
  std::vector<uint64_t> ids;
  parked.RemoveIf([&](ParkedPull& p) {
    ids.push_back(p.request.request_id);
    return false;
  });
  return ids;
}

TEST(ParkedPullsTest, ANewerPullOfARankReplacesItsOlderOne) {
  ParkedPulls parked(4);
  const auto t0 = Clock::now();
  EXPECT_EQ(Park(parked, 0, 1, t0), ParkedPulls::Outcome::kNew);
  EXPECT_EQ(Park(parked, 1, 7, t0), ParkedPulls::Outcome::kNew);
  EXPECT_EQ(Park(parked, 0, 2, t0 + std::chrono::seconds(1)), ParkedPulls::Outcome::kNew);
  EXPECT_EQ(RequestIds(parked), (std::vector<uint64_t>{7, 2}));
  EXPECT_DOUBLE_EQ(parked.OldestSeconds(t0 + std::chrono::seconds(3)), 3.0);
}

TEST(ParkedPullsTest, AResendKeepsItsFirstArrivalTime) {
  ParkedPulls parked(4);
  const auto t0 = Clock::now();
  EXPECT_EQ(Park(parked, 0, 5, t0), ParkedPulls::Outcome::kNew);
  EXPECT_EQ(Park(parked, 0, 5, t0 + std::chrono::seconds(2)), ParkedPulls::Outcome::kResent);
  ASSERT_EQ(parked.size(), 1u);
  EXPECT_DOUBLE_EQ(parked.OldestSeconds(t0 + std::chrono::seconds(10)), 10.0);
}

TEST(ParkedPullsTest, ToolPullsAreBoundedAndDoNotReplaceEachOther) {
  ParkedPulls parked(2);
  const auto t0 = Clock::now();
  EXPECT_EQ(Park(parked, -1, 1, t0), ParkedPulls::Outcome::kNew);
  EXPECT_EQ(Park(parked, -1, 2, t0), ParkedPulls::Outcome::kNew);
  zmq::message_t identity(std::string("tool"));
  Header h = Pull(-1, 3);
  EXPECT_EQ(parked.Park(identity, h, t0, /*ranked=*/false, -1), ParkedPulls::Outcome::kRefused);
  EXPECT_EQ(identity.to_string(), "tool");  // refused: left to the caller for its reply
  EXPECT_EQ(parked.size(), 2u);
  // Worker ranks are not bounded by the tool limit.
  EXPECT_EQ(Park(parked, 0, 4, t0), ParkedPulls::Outcome::kNew);
  EXPECT_EQ(parked.size(), 3u);
}

TEST(ParkedPullsTest, RemoveIfKeepsTheOthersInArrivalOrder) {
  ParkedPulls parked(8);
  const auto t0 = Clock::now();
  for (int rank = 0; rank < 4; ++rank) Park(parked, rank, 10 + rank, t0, rank - 1);
  std::vector<int> served;
  parked.RemoveIf([&](ParkedPull& p) {
    if (p.request.rank % 2 != 0) return false;
    served.push_back(p.waited_for);
    return true;
  });
  EXPECT_EQ(served, (std::vector<int>{-1, 1}));
  EXPECT_EQ(RequestIds(parked), (std::vector<uint64_t>{11, 13}));
  parked.RemoveIf([](ParkedPull&) { return true; });
  EXPECT_TRUE(parked.empty());
  EXPECT_EQ(parked.OldestSeconds(t0), 0.0);
}

}  // namespace
}  // namespace parasync
