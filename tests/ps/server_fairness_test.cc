// Fair service (ps/peer_queues.h), counted in the server's own turns: the test thread runs
// the loop (Server::ServeOnce, over real ZeroMQ on loopback). The machine still enters: the
// honest peer's next request must cross ZeroMQ's I/O threads before the next turn, which a
// busy core delays, so this test is its own binary and runs alone (tests/ps/CMakeLists.txt).
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <zmq.hpp>

#include "common/wire.h"
#include "ps/server.h"
#include "tests/support/sanitized.h"
#include "tests/support/small_model.h"

namespace parasync {
namespace {

using namespace std::chrono_literals;

constexpr int64_t kSliceElements = 65536;
constexpr int kSlices = 4;  // a 1 MiB model

zmq::message_t HeaderFrame(const Header& h) {
  auto bytes = EncodeHeader(h);
  return zmq::message_t(bytes.data(), bytes.size());
}

// Sends `h` with a frame per slice of `grad` (borrowed: `grad` must outlive the socket's
// context, whose I/O thread sends it), or none.
bool SendRequest(zmq::socket_t& s, const Header& h, const std::vector<float>* grad) {
  if (!s.send(HeaderFrame(h), grad ? zmq::send_flags::sndmore : zmq::send_flags::none)) {
    return false;
  }
  for (int i = 0; grad != nullptr && i < kSlices; ++i) {
    zmq::message_t frame(const_cast<float*>(grad->data()) + i * kSliceElements,
                         kSliceElements * sizeof(float), [](void*, void*) {}, nullptr);
    (void)s.send(frame, i + 1 < kSlices ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
  return true;
}

// Takes one whole reply within `wait`; its header, or nullopt.
std::optional<Header> TakeReply(zmq::socket_t& s, std::chrono::milliseconds wait) {
  zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, wait) == 0) return std::nullopt;
  std::vector<zmq::message_t> parts;
  do {
    parts.emplace_back();
    if (!s.recv(parts.back())) return std::nullopt;
  } while (parts.back().more());
  auto header = DecodeHeader(parts[0].data(), parts[0].size());
  if (!header.ok()) return std::nullopt;
  return *header;
}

Header Request(MsgType type, uint64_t id, int64_t batch_examples = 0) {
  Header h;
  h.type = type;
  h.request_id = id;
  h.rank = -1;
  h.batch_examples = batch_examples;
  for (uint32_t i = 0; i < kSlices; ++i) h.slices.push_back({i, 0, kSliceElements});
  return h;
}

// Beside 4 sockets that always have pushes queued, a peer that sends its next request (a push,
// then a pull) once its reply is in gets at least its share of the pushes applied: fair is
// 1/5 (it asks for more: a push every four turns at most), 0.7 x that is the margin (under a
// sanitizer, see below). The pushes are the server's work here (Adam over 1 MiB); a pull lends
// the buffers. Served in ZeroMQ's fair-queue turn, one message per peer per turn, each of its
// two requests per step waited for a push of every flooder: 1/9.
TEST(ServerFairnessTest, APeerWithOneRequestInFlightGetsItsShareBesideFourFloodingSockets) {
  // The gradient is sent borrowed (no copy), so it outlives both contexts: their I/O threads
  // may still be sending the last request's frames when the test ends (the server no longer
  // reads). Declared after them, it was freed first: ASan saw a send read it, in a CI run.
  const std::vector<float> grad(static_cast<size_t>(kSlices * kSliceElements), 1e-6f);
  zmq::context_t context;
  PsMetrics metrics(/*shard=*/0, /*num_workers=*/1);
  ServerOptions options;
  options.endpoint = "tcp://127.0.0.1:*";
  options.max_message_bytes = int64_t{4} << 20;
  auto created = Server::Create(context, options, &metrics);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  Server& server = **created;

  zmq::socket_t honest(context, zmq::socket_type::dealer);
  honest.set(zmq::sockopt::linger, 0);
  honest.connect(server.endpoint());
  Header reg = Request(MsgType::kRegister, 1);
  reg.slices.clear();
  reg.registration = testing::SmallModel(
      {{"w", {512, 512}, DType::kFloat32, {InitKind::kUniform, 0.1f}}}, kSliceElements,
      /*num_shards=*/1, /*seed=*/3, /*learning_rate=*/0.01f);
  reg.registration->optimizer.kind = OptimizerKind::kAdam;
  ASSERT_TRUE(SendRequest(honest, reg, nullptr));
  std::optional<Header> registered;
  for (int turn = 0; turn < 50 && !registered; ++turn) {
    ASSERT_TRUE(server.ServeOnce(100ms).ok());
    registered = TakeReply(honest, 10ms);
  }
  ASSERT_TRUE(registered.has_value());
  ASSERT_TRUE(registered->status.ok()) << registered->status.ToString();

  constexpr int kFlooders = 4;
  std::atomic<int64_t> refused{0};
  {
    zmq::context_t flood_context;
    // Declared after their context: on any return, a failed assertion's too, the threads are
    // asked to stop and joined before the context closes under their sockets.
    std::vector<std::jthread> flooders;
    for (int f = 0; f < kFlooders; ++f) {
      flooders.emplace_back([&](std::stop_token asked) {
        zmq::socket_t s(flood_context, zmq::socket_type::dealer);
        s.set(zmq::sockopt::linger, 0);
        s.set(zmq::sockopt::sndtimeo, 100);  // a full queue skips a turn; bounded
        s.connect(server.endpoint());
        for (uint64_t n = 1; n <= 100000 && !asked.stop_requested(); ++n) {
          (void)SendRequest(s, Request(MsgType::kPush, n), &grad);
          while (auto reply = TakeReply(s, 0ms)) {
            if (!reply->status.ok()) refused.fetch_add(1);
          }
        }
      });
    }
    // Every flooder has pushes queued before the count starts (bounded in turns).
    for (int turn = 0; turn < 2000 && server.shard().version() < 8 * kFlooders; ++turn) {
      ASSERT_TRUE(server.ServeOnce(100ms).ok());
    }
    ASSERT_GE(server.shard().version(), 8 * kFlooders) << "the flooders sent nothing";

    // The count: a bounded number of the server's turns.
    constexpr int kTurns = 2000;
    const int64_t version_before = server.shard().version();
    int64_t honest_pushes = 0;
    uint64_t id = 1;
    Header next = Request(MsgType::kPush, ++id, /*batch_examples=*/32);
    ASSERT_TRUE(SendRequest(honest, next, &grad));
    // Whether the turn served the honest peer: only its pushes carry examples (the flooders'
    // carry none), only it pulls.
    auto honest_served = [&, seen = 0.0]() mutable {
      const double now = metrics.examples->Value() +
                         metrics.requests[static_cast<size_t>(MsgType::kPull)]->Value();
      const bool served = now != seen;
      seen = now;
      return served;
    };
    (void)honest_served();
    for (int turn = 0; turn < kTurns; ++turn) {
      ASSERT_TRUE(server.ServeOnce(100ms).ok());
      if (!honest_served()) {
        // A turn for the flood: 2 ms lets its sockets send what the turn took (as in a real
        // flood, the server applies a push more slowly than they send one), so each of them
        // has pushes waiting at every turn.
        ASSERT_FALSE(TakeReply(honest, 2ms).has_value()) << "a reply to a request not served";
        continue;
      }
      // It sends its next request as soon as the reply is in.
      std::optional<Header> reply = TakeReply(honest, 5s);
      ASSERT_TRUE(reply.has_value()) << "no reply within 5 s";
      ASSERT_EQ(reply->request_id, next.request_id);
      ASSERT_TRUE(reply->status.ok()) << reply->status.ToString();
      const bool pushed = next.type == MsgType::kPush;
      if (pushed) ++honest_pushes;
      next = Request(pushed ? MsgType::kPull : MsgType::kPush, ++id, pushed ? 0 : 32);
      ASSERT_TRUE(SendRequest(honest, next, pushed ? nullptr : &grad));
    }
    const int64_t applied = server.shard().version() - version_before;
    flooders.clear();  // asks them to stop, and joins
    const double share = static_cast<double>(honest_pushes) / static_cast<double>(applied);
    std::printf("fairness in %d turns: %lld of %lld pushes applied were the honest peer's: share "
                "%.3f (fair %.3f); %lld flood pushes refused\n",
                kTurns, static_cast<long long>(honest_pushes), static_cast<long long>(applied),
                share, 1.0 / (kFlooders + 1), static_cast<long long>(refused.load()));
    ASSERT_GT(applied, 4 * honest_pushes) << "the flooders were not served";
    // The fairness bound is the main build's: 0.180-0.204 in ten runs of 2000 turns alone
    // (2026-11-28). Under ASan the share runs lower and wider, 0.132-0.168 in ten such runs
    // (0.119 once in 1000 turns), too close to the unfair 1/9 (0.111) for a bound between the
    // two to hold; there the test checks memory, and only that the honest peer was not
    // starved: half the unfair share.
    if (testing::kSanitized) {
      EXPECT_GE(share, 0.5 / (2 * kFlooders + 1));
    } else {
      EXPECT_GE(share, 0.7 / (kFlooders + 1));
    }
  }
}

}  // namespace
}  // namespace parasync
