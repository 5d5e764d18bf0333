// PeerQueues (ps/peer_queues.h): per-peer queues of requests and their fair order.
#include "ps/peer_queues.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace parasync {
namespace {

using Seconds = std::chrono::duration<double>;

constexpr Seconds kCredit{5e-3};

// A request from `peer` as the server reads it.
Inbound Request(const std::string& peer, uint64_t request_id, MsgType type = MsgType::kPush) {
  Inbound in;
  in.identity = zmq::message_t(peer);
  Header h;
  h.type = type;
  h.request_id = request_id;
  if (type == MsgType::kPull) h.slices = {SliceRange{0, 0, 256}};
  in.header = h;
  return in;
}

PeerQueues::Outcome Enqueue(PeerQueues& q, const std::string& peer, uint64_t request_id,
                            MsgType type = MsgType::kPush) {
  Inbound in = Request(peer, request_id, type);
  return q.Take(in).outcome;
}

std::string PeerOf(const Inbound& in) {
  return std::string(static_cast<const char*>(in.identity.data()), in.identity.size());
}

// Serves the next request, charging it `cost` seconds; returns its peer ("" when none).
std::string Serve(PeerQueues& q, double cost) {
  std::optional<Inbound> in = q.Next();
  if (!in) return "";
  q.Charge(Seconds(cost));
  return PeerOf(*in);
}

TEST(PeerQueuesTest, APeersRequestsAreServedInTheOrderTheyCame) {
  PeerQueues q(3, kCredit);
  for (uint64_t id = 1; id <= 3; ++id) EXPECT_EQ(Enqueue(q, "a", id), PeerQueues::Outcome::kQueued);
  for (uint64_t id = 1; id <= 3; ++id) {
    std::optional<Inbound> in = q.Next();
    ASSERT_TRUE(in.has_value());
    EXPECT_EQ(in->header->request_id, id);
    q.Charge(Seconds(1e-3));
  }
  EXPECT_FALSE(q.Next().has_value());
  EXPECT_TRUE(q.empty());
}

TEST(PeerQueuesTest, AQueueHoldsAtMostItsBoundAndAResendIsNotQueuedTwice) {
  PeerQueues q(2, kCredit);
  EXPECT_EQ(Enqueue(q, "a", 1), PeerQueues::Outcome::kQueued);
  EXPECT_EQ(Enqueue(q, "a", 1), PeerQueues::Outcome::kDuplicate);
  // The same id for another type, or from another peer, is another request.
  EXPECT_EQ(Enqueue(q, "a", 1, MsgType::kPull), PeerQueues::Outcome::kQueued);
  EXPECT_EQ(Enqueue(q, "b", 1), PeerQueues::Outcome::kQueued);
  EXPECT_EQ(Enqueue(q, "a", 2), PeerQueues::Outcome::kFull);
  EXPECT_EQ(q.queued(), 3u);
  // Once served, the same id is a new request again (a resend after its reply went out).
  while (q.Next()) q.Charge(Seconds(1e-3));
  EXPECT_EQ(Enqueue(q, "a", 1), PeerQueues::Outcome::kQueued);
}

// Header-only requests (a one-slice pull each) past the count, while they weigh the
// allowance at most together: a client may pipeline many small requests.
TEST(PeerQueuesTest, SmallRequestsAreQueuedPastTheCountWithinTheirWeight) {
  constexpr size_t kAllowance = 16 << 10;
  PeerQueues q(3, kCredit, kAllowance);
  const size_t weight = q.Weight(Request("a", 1, MsgType::kPull));
  ASSERT_GT(weight, sizeof(Inbound));
  const size_t fits = kAllowance / weight;
  ASSERT_GT(fits, 3u);
  for (uint64_t id = 1; id <= fits; ++id) {
    ASSERT_EQ(Enqueue(q, "a", id, MsgType::kPull), PeerQueues::Outcome::kQueued) << id;
  }
  EXPECT_EQ(Enqueue(q, "a", fits + 1, MsgType::kPull), PeerQueues::Outcome::kFull);
  // Another peer has its own allowance.
  EXPECT_EQ(Enqueue(q, "b", 1, MsgType::kPull), PeerQueues::Outcome::kQueued);
  // One of a's served (b's may go first) makes room for one more.
  std::string served = Serve(q, 1e-5);
  if (served != "a") served = Serve(q, 1e-5);
  ASSERT_EQ(served, "a");
  EXPECT_EQ(Enqueue(q, "a", fits + 1, MsgType::kPull), PeerQueues::Outcome::kQueued);
  EXPECT_EQ(Enqueue(q, "a", fits + 2, MsgType::kPull), PeerQueues::Outcome::kFull);
}

// A request that carries more than the allowance is taken only under the count, and while
// one is queued no small one rides past the count: a peer holds the count's requests or the
// allowance, never both. A Register (its model description is not weighed) counts as large.
TEST(PeerQueuesTest, ALargeRequestIsQueuedOnlyUnderTheCount) {
  constexpr size_t kAllowance = 16 << 10;
  PeerQueues q(3, kCredit, kAllowance);
  auto large = [](uint64_t id) {
    Inbound in = Request("a", id);
    in.frames.emplace_back(size_t{64} << 10);
    return in;
  };
  Inbound reg = Request("a", 9, MsgType::kRegister);
  reg.header->registration = ModelRegistration{};
  EXPECT_GT(q.Weight(reg), kAllowance);
  EXPECT_GT(q.Weight(large(1)), kAllowance);

  EXPECT_EQ(Enqueue(q, "a", 1, MsgType::kPull), PeerQueues::Outcome::kQueued);
  for (uint64_t id = 2; id <= 3; ++id) {
    Inbound in = large(id);
    EXPECT_EQ(q.Take(in).outcome, PeerQueues::Outcome::kQueued) << id;
  }
  Inbound one_more = large(4);
  EXPECT_EQ(q.Take(one_more).outcome, PeerQueues::Outcome::kFull);
  EXPECT_EQ(Enqueue(q, "a", 5, MsgType::kPull), PeerQueues::Outcome::kFull);
  EXPECT_EQ(q.Take(reg).outcome, PeerQueues::Outcome::kFull);
  // Served down to two, a Register fits under the count again.
  ASSERT_TRUE(q.Next().has_value());
  q.Charge(Seconds(1e-5));
  EXPECT_EQ(q.Take(reg).outcome, PeerQueues::Outcome::kQueued);
}

TEST(PeerQueuesTest, AMessageWhoseHeaderDidNotDecodeIsQueuedLikeAnyOther) {
  PeerQueues q(2, kCredit);
  Inbound bad;
  bad.identity = zmq::message_t(std::string("a"));
  bad.header = Status::Corruption("not a header");
  EXPECT_EQ(q.Take(bad).outcome, PeerQueues::Outcome::kQueued);
  Inbound again;
  again.identity = zmq::message_t(std::string("a"));
  again.header = Status::Corruption("not a header");
  EXPECT_EQ(q.Take(again).outcome, PeerQueues::Outcome::kQueued);
  std::optional<Inbound> in = q.Next();
  ASSERT_TRUE(in.has_value());
  EXPECT_FALSE(in->header.ok());
}

TEST(PeerQueuesTest, APeerSeenTwiceInOnePassOfReadsIsARepeat) {
  PeerQueues q(3, kCredit);
  q.BeginRead();
  Inbound a1 = Request("a", 1), b1 = Request("b", 1), a2 = Request("a", 2);
  EXPECT_FALSE(q.Take(a1).repeat);
  EXPECT_FALSE(q.Take(b1).repeat);
  EXPECT_TRUE(q.Take(a2).repeat);
  q.BeginRead();
  Inbound a3 = Request("a", 3);
  EXPECT_FALSE(q.Take(a3).repeat);
}

TEST(PeerQueuesTest, BackloggedPeersShareTheLoopsTimeByWhatTheirRequestsCost) {
  PeerQueues q(3, kCredit);
  std::map<std::string, double> time;
  uint64_t id = 0;
  for (int served = 0; served < 400; ++served) {
    // Both always have work; a's requests cost three times b's.
    for (const char* peer : {"a", "b"}) (void)Enqueue(q, peer, ++id);
    std::optional<Inbound> in = q.Next();
    ASSERT_TRUE(in.has_value());
    const double cost = PeerOf(*in) == "a" ? 3e-3 : 1e-3;
    q.Charge(Seconds(cost));
    time[PeerOf(*in)] += cost;
  }
  EXPECT_NEAR(time["a"] / (time["a"] + time["b"]), 0.5, 0.02);
}

// An honest worker (push, then pull, one request in flight: its next request comes one
// request after its reply) beside four peers that always have pushes queued. In arrival
// turn it would get one push for every two of each flooder's (1/9 of the pushes); fairly,
// about its 1/5 of the loop's time.
TEST(PeerQueuesTest, APeerWithOneRequestInFlightKeepsItsShareBesideBackloggedPeers) {
  PeerQueues q(3, kCredit);
  constexpr double kPush = 1e-3, kPull = 5e-5;
  std::map<std::string, int> pushes;
  std::map<std::string, double> time;
  uint64_t id = 0;
  bool honest_pulls_next = false;
  int honest_back_in = 0;  // requests served before its next request is read
  for (int served = 0; served < 5000; ++served) {
    for (const char* f : {"f1", "f2", "f3", "f4"}) (void)Enqueue(q, f, ++id);
    if (honest_back_in-- == 0) {
      (void)Enqueue(q, "honest", ++id, honest_pulls_next ? MsgType::kPull : MsgType::kPush);
    }
    std::optional<Inbound> in = q.Next();
    ASSERT_TRUE(in.has_value());
    const std::string peer = PeerOf(*in);
    const bool pull = in->header->type == MsgType::kPull;
    const double cost = pull ? kPull : kPush;
    q.Charge(Seconds(cost));
    time[peer] += cost;
    if (!pull) ++pushes[peer];
    if (peer == "honest") {
      honest_pulls_next = !pull;
      honest_back_in = 1;
    }
  }
  double total_time = 0;
  int total_pushes = 0;
  for (const auto& [peer, t] : time) total_time += t;
  for (const auto& [peer, n] : pushes) total_pushes += n;
  EXPECT_GE(time["honest"] / total_time, 0.9 / 5) << pushes["honest"] << " pushes";
  EXPECT_GE(static_cast<double>(pushes["honest"]) / total_pushes, 0.8 / 5);
}

TEST(PeerQueuesTest, IdleTimeEarnsNoMoreThanTheCredit) {
  PeerQueues q(3, kCredit);
  uint64_t id = 0;
  // a alone for 100 ms of loop time.
  for (int i = 0; i < 100; ++i) {
    (void)Enqueue(q, "a", ++id);
    (void)Enqueue(q, "a", ++id);
    EXPECT_EQ(Serve(q, 1e-3), "a");
  }
  // b comes with a backlog: it does not get the 100 turns it missed, only the credit's 5
  // (and its own first), then it takes turns with a.
  std::string order;
  for (int i = 0; i < 20; ++i) {
    (void)Enqueue(q, "a", ++id);
    (void)Enqueue(q, "b", ++id);
    order += Serve(q, 1e-3);
  }
  EXPECT_EQ(order, "bbbbbbababababababab");
}

TEST(PeerQueuesTest, PeersWithNothingQueuedOrOwedAreForgotten) {
  PeerQueues q(3, kCredit);
  for (int p = 0; p < 50; ++p) (void)Enqueue(q, "peer" + std::to_string(p), 1);
  while (!q.empty()) (void)Serve(q, 1e-3);
  // The last served may still owe its time; every other one is gone at the next Next.
  (void)q.Next();
  EXPECT_LE(q.peers(), 1u);
}

}  // namespace
}  // namespace parasync
