// The parameter server over real ZeroMQ on loopback: hostile raw messages from a DEALER, then
// the real client (worker/ps_client.h) against the same server.
// (Two shards: server_shards_test.cc; the training modes: server_modes_test.cc.)
#include "ps/server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <future>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "common/metrics.h"
#include "common/wire.h"
#include "ps/shard.h"
#include "tests/ps/server_test_util.h"
#include "tests/support/process_util.h"
#include "worker/heartbeater.h"
#include "worker/ps_client.h"

namespace parasync {
namespace {

using namespace server_test;  // this file's helpers: tests/ps/server_test_util.h
using ::testing::HasSubstr;

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<InProcessServer>(context_, 0, 1);
    ASSERT_TRUE(server_->started());
  }

  std::unique_ptr<PsClient> Client(const std::vector<std::string>& endpoints) {
    PsClientOptions options;
    options.ps_addresses = endpoints;
    options.rank = 0;
    options.request_timeout = kWait;
    auto client = PsClient::Connect(context_, options);
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    return client.ok() ? std::move(client).value() : nullptr;
  }

  // Sends `frames` raw and expects an error reply with `code`.
  Status SendRaw(const std::vector<std::vector<uint8_t>>& frames) {
    RawPeer peer(context_, server_->endpoint());
    peer.Send(frames);
    Result<Header> reply = peer.Receive();
    if (!reply.ok()) return reply.status().WithContext("reply");
    return reply->status;
  }

  zmq::context_t context_;  // declared first: outlives every socket
  std::unique_ptr<InProcessServer> server_;
};

TEST_F(ServerTest, GarbageHeaderGetsCorruptionReplyAndCountsMalformed) {
  const std::vector<uint8_t> garbage = RandomBytes(64, 7);
  ASSERT_FALSE(DecodeHeader(garbage.data(), garbage.size()).ok());
  Status s = SendRaw({garbage});
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_EQ(server_->Rejected(RejectReason::kMalformed), 1.0);
}

TEST_F(ServerTest, EmptyFrameGetsCorruptionReply) {
  Status s = SendRaw({{}});
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_EQ(server_->Rejected(RejectReason::kMalformed), 1.0);
}

TEST_F(ServerTest, JunkHeaderWithTensorFramesGetsCorruptionReply) {
  const std::vector<uint8_t> junk = {'j', 'u', 'n', 'k'};
  EXPECT_EQ(SendRaw({junk}).code(), StatusCode::kCorruption);
  EXPECT_EQ(SendRaw({junk, RandomBytes(40, 1), RandomBytes(3, 2)}).code(),
            StatusCode::kCorruption);
  EXPECT_EQ(server_->Rejected(RejectReason::kMalformed), 2.0);
}

TEST_F(ServerTest, UnknownMessageTypeGetsCorruptionReply) {
  Header h;
  h.type = static_cast<MsgType>(9);
  EXPECT_EQ(SendRaw({EncodeHeader(h)}).code(), StatusCode::kCorruption);
  EXPECT_EQ(server_->Rejected(RejectReason::kMalformed), 1.0);
}

TEST_F(ServerTest, OtherProtocolVersionIsFailedPreconditionNamingBothVersions) {
  Header h;
  h.protocol_version = 999;
  h.type = MsgType::kRegister;
  h.registration = SmallModel(1);
  RawPeer peer(context_, server_->endpoint());
  peer.SendHeader(h);
  Result<Header> reply = peer.Receive();
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->status.code(), StatusCode::kFailedPrecondition);
  std::string message = reply->status.message();
  const size_t theirs = message.find("999");
  ASSERT_NE(theirs, std::string::npos) << message;
  message.erase(theirs, 3);
  EXPECT_TRUE(Contains(message, std::to_string(kProtocolVersion))) << reply->status.message();
  EXPECT_EQ(server_->Rejected(RejectReason::kVersionMismatch), 1.0);

  // Nothing was registered.
  h = Header{};
  h.type = MsgType::kStats;
  peer.SendHeader(h);
  Result<Header> stats = peer.Receive();
  ASSERT_TRUE(stats.ok() && stats->stats.has_value());
  EXPECT_FALSE(stats->stats->registered);
}

TEST_F(ServerTest, PullWithTensorFramesIsRejected) {
  Header h;
  h.type = MsgType::kPull;
  h.slices = {{0, 0, 1}};
  RawPeer peer(context_, server_->endpoint());
  peer.SendHeader(h, {FloatBytes({1.0f})});
  Result<Header> reply = peer.Receive();
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(server_->Rejected(RejectReason::kFrameCount), 1.0);
}

TEST_F(ServerTest, PullBeforeRegisterIsFailedPrecondition) {
  Header h;
  h.type = MsgType::kPull;
  h.slices = {{0, 0, 1}};
  RawPeer peer(context_, server_->endpoint());
  peer.SendHeader(h);
  Result<Header> reply = peer.Receive();
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->status.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(server_->Rejected(RejectReason::kNotRegistered), 1.0);
}

TEST_F(ServerTest, ClientRegistersPushesAndPullsAfterHostileMessages) {
  const std::vector<uint8_t> junk = {'j', 'u', 'n', 'k'};
  EXPECT_EQ(SendRaw({RandomBytes(128, 3)}).code(), StatusCode::kCorruption);
  EXPECT_EQ(SendRaw({{}}).code(), StatusCode::kCorruption);
  EXPECT_EQ(SendRaw({junk, junk}).code(), StatusCode::kCorruption);
  Header old_version;
  old_version.protocol_version = 999;
  old_version.type = MsgType::kRegister;
  old_version.registration = SmallModel(1);
  EXPECT_EQ(SendRaw({EncodeHeader(old_version)}).code(), StatusCode::kFailedPrecondition);
  Header pull_with_frames;
  pull_with_frames.type = MsgType::kPull;
  pull_with_frames.slices = {{0, 0, 1}};
  EXPECT_EQ(SendRaw({EncodeHeader(pull_with_frames), FloatBytes({1.0f})}).code(),
            StatusCode::kInvalidArgument);

  const ModelRegistration reg = SmallModel(1);
  std::unique_ptr<PsClient> client = Client({server_->endpoint()});
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Register(reg, kWait).ok());

  std::vector<std::vector<float>> params = {std::vector<float>(200), std::vector<float>(10)};
  ASSERT_TRUE(client->Pull(Pointers<float>(params)).ok());
  const std::vector<std::vector<float>> w0 = InitialValues(reg);
  EXPECT_EQ(params, w0);

  std::vector<std::vector<float>> grads = Gradients(reg);
  ASSERT_TRUE(client->Push(Pointers<const float>(grads), 16).ok());
  ASSERT_TRUE(client->Pull(Pointers<float>(params)).ok());
  EXPECT_EQ(client->last_version(), 1);
  for (size_t v = 0; v < params.size(); ++v) {
    for (size_t i = 0; i < params[v].size(); ++i) {
      EXPECT_FLOAT_EQ(params[v][i], w0[v][i] - kLearningRate * grads[v][i])
          << reg.variables[v].name << "[" << i << "]";
    }
  }
  EXPECT_EQ(server_->Rejected(RejectReason::kMalformed), 3.0);
  EXPECT_EQ(server_->Rejected(RejectReason::kVersionMismatch), 1.0);
  EXPECT_EQ(server_->Rejected(RejectReason::kFrameCount), 1.0);

  Result<std::vector<ShardStats>> stats = client->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  ASSERT_EQ(stats->size(), 1u);
  EXPECT_EQ((*stats)[0].rejected, 5);
}

TEST_F(ServerTest, StatsReportsVersionExamplesAndSize) {
  const ModelRegistration reg = SmallModel(1);
  std::unique_ptr<PsClient> client = Client({server_->endpoint()});
  ASSERT_NE(client, nullptr);
  Result<std::vector<ShardStats>> before = client->Stats();
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  EXPECT_FALSE((*before)[0].registered);
  EXPECT_EQ((*before)[0].version, 0);

  ASSERT_TRUE(client->Register(reg, kWait).ok());
  std::vector<std::vector<float>> grads = Gradients(reg);
  ASSERT_TRUE(client->Push(Pointers<const float>(grads), 10).ok());
  ASSERT_TRUE(client->Push(Pointers<const float>(grads), 22).ok());
  Result<std::vector<ShardStats>> after = client->Stats();
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  ASSERT_EQ(after->size(), 1u);
  const ShardStats& s = (*after)[0];
  EXPECT_EQ(s.shard, 0);
  EXPECT_TRUE(s.registered);
  EXPECT_EQ(s.version, 2);
  EXPECT_EQ(s.examples, 32);
  EXPECT_EQ(s.num_slices, 5);
  EXPECT_EQ(s.num_elements, 210);
  EXPECT_EQ(s.requests, 5);  // stats, register, 2 pushes, this stats
  EXPECT_EQ(s.rejected, 0);
  EXPECT_EQ(server_->metrics().examples->Value(), 32.0);
  EXPECT_EQ(server_->metrics().version->Value(), 2.0);
}

TEST_F(ServerTest, RejectedPushOverTheWireChangesNothing) {
  const ModelRegistration reg = SmallModel(1);
  std::unique_ptr<PsClient> client = Client({server_->endpoint()});
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Register(reg, kWait).ok());

  RawPeer peer(context_, server_->endpoint());
  Header push;
  push.type = MsgType::kPush;
  push.batch_examples = 4;
  push.slices = {{0, 49, 2}};  // runs past the 50-element slice
  peer.SendHeader(push, {FloatBytes({1.0f, 1.0f})});
  Result<Header> reply = peer.Receive();
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->status.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(reply->slices.empty());
  EXPECT_EQ(server_->Rejected(RejectReason::kRange), 1.0);

  std::vector<std::vector<float>> grads = Gradients(reg);
  grads[1][9] = std::numeric_limits<float>::quiet_NaN();
  Status nan_push = client->Push(Pointers<const float>(grads), 4);
  EXPECT_EQ(nan_push.code(), StatusCode::kInvalidArgument) << nan_push.ToString();
  EXPECT_EQ(server_->Rejected(RejectReason::kNonFinite), 1.0);

  std::vector<std::vector<float>> params = {std::vector<float>(200), std::vector<float>(10)};
  ASSERT_TRUE(client->Pull(Pointers<float>(params)).ok());
  EXPECT_EQ(params, InitialValues(reg));
  EXPECT_EQ(client->last_version(), 0);
}

TEST_F(ServerTest, ReRegisterWithOtherShapeIsFailedPreconditionForTheClient) {
  std::unique_ptr<PsClient> client = Client({server_->endpoint()});
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Register(SmallModel(1), kWait).ok());
  ModelRegistration other = SmallModel(1);
  other.variables[0].shape = {21, 10};
  Status s = client->Register(other, kWait);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(s.message(), "dense/kernel")) << s.message();
  EXPECT_EQ(server_->Rejected(RejectReason::kRegisterMismatch), 1.0);
}

TEST_F(ServerTest, ShutdownMessageMakesRunReturnOk) {
  std::unique_ptr<PsClient> client = Client({server_->endpoint()});
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Shutdown(0).ok());
  EXPECT_TRUE(server_->WaitForExit().ok());
}

TEST_F(ServerTest, ShouldStopMakesRunReturnOk) {
  EXPECT_TRUE(server_->StopAndWait().ok());
}

// On the wire: a 16-bit push's frames must be count * 2 bytes (a float32-sized frame is
// refused and changes nothing), and a pull asking for a 16-bit dtype gets count * 2 bytes.
TEST_F(ServerTest, SixteenBitFramesAreCheckedAgainstTheirOwnSize) {
  auto client = Client({server_->endpoint()});
  ASSERT_NE(client, nullptr);
  const ModelRegistration reg = SmallModel(1);
  ASSERT_TRUE(client->Register(reg, kWait).ok());
  RawPeer peer(context_, server_->endpoint());
  Header push;
  push.type = MsgType::kPush;
  push.dtype = DType::kBfloat16;
  push.slices = {{0, 0, 50}};
  peer.SendHeader(push, {std::vector<uint8_t>(50 * 4, 0)});
  Result<Header> reply = peer.Receive();
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->status.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(reply->status.message(), "expected 100")) << reply->status.message();
  EXPECT_EQ(server_->Rejected(RejectReason::kByteLength), 1);
  EXPECT_EQ(reply->version, 0);

  std::vector<float> g(50, 0.5f);
  std::vector<uint8_t> wire(100);
  EncodeFloats(g.data(), g.size(), DType::kBfloat16, wire.data());
  peer.SendHeader(push, {wire});
  reply = peer.Receive();
  ASSERT_TRUE(reply.ok());
  EXPECT_TRUE(reply->status.ok()) << reply->status.ToString();
  EXPECT_EQ(reply->version, 1);

  Header pull;
  pull.type = MsgType::kPull;
  pull.dtype = DType::kFloat16;
  pull.slices = {{0, 0, 50}, {1, 10, 5}};
  peer.SendHeader(pull);
  std::vector<std::vector<uint8_t>> frames;
  reply = peer.Receive(&frames);
  ASSERT_TRUE(reply.ok());
  ASSERT_TRUE(reply->status.ok()) << reply->status.ToString();
  EXPECT_EQ(reply->dtype, DType::kFloat16);
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(frames[0].size(), 100u);
  EXPECT_EQ(frames[1].size(), 10u);
  std::vector<float> values(50);
  DecodeFloats(frames[0].data(), 50, DType::kFloat16, values.data());
  const std::vector<float> w0 = InitialValues(reg)[0];
  for (size_t i = 0; i < 50; ++i) {
    EXPECT_EQ(values[i], HalfToFloat(FloatToHalf(w0[i] - kLearningRate * 0.5f))) << i;
  }
}

// A resent pull whose first reply is still being written out is not served again: on a slow
// link the reply outlasts the client's resend timer, and a second copy would double its
// bytes. Here the reply (26 MB) is held up by a peer that does not read: its receive queue
// (one message) holds the reply to a Stats request sent first, so its ZeroMQ stops taking
// bytes from the connection. The resend gets no second reply; once everything is read, the
// same id is served again.
TEST(ServerPullResendTest, AResendWhileItsReplyIsStillOnItsWayIsNotServedAgain) {
  zmq::context_t context;
  InProcessServer server(context, 0, 1);
  ASSERT_TRUE(server.started());
  const ModelRegistration reg = testing::SmallModel(
      testing::DenseLayer("big", 2560, 2560, 0.1f), /*max_slice_elements=*/int64_t{1} << 23,
      /*num_shards=*/1, /*seed=*/5, kLearningRate);
  auto client = ConnectClient(context, {server.endpoint()}, 1);
  ASSERT_TRUE(client && client->Register(reg, kWait).ok());
  const SliceMap map = SliceMap::Build(reg.variables, reg.max_slice_elements, 1).value();
  Header pull;
  pull.type = MsgType::kPull;
  pull.rank = 0;
  pull.request_id = 7;
  for (const SliceInfo& slice : map.slices()) pull.slices.push_back({slice.id, 0, slice.length});

  zmq::socket_t peer(context, zmq::socket_type::dealer);
  peer.set(zmq::sockopt::linger, 0);
  peer.set(zmq::sockopt::rcvhwm, 1);
  peer.set(zmq::sockopt::rcvbuf, 4096);
  peer.connect(server.endpoint());
  const auto send = [&](const Header& h) {
    const std::vector<uint8_t> bytes = EncodeHeader(h);
    zmq::message_t m(bytes.data(), bytes.size());
    ASSERT_TRUE(peer.send(m, zmq::send_flags::none).has_value());
  };
  const auto resent = [&] { return server.metrics().resent_pulls_in_flight->Value(); };
  Header stats;
  stats.type = MsgType::kStats;
  stats.rank = 0;
  stats.request_id = 6;
  send(stats);
  send(pull);
  // The reply is out once the server counts its bytes unread; then the resend arrives.
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  while (server.metrics().unread_reply_bytes->Value() <= 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_GT(server.metrics().unread_reply_bytes->Value(), 0) << "the reply was written out";
  send(pull);
  while (resent() < 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(resent(), 1);
  // Every reply, read to the end: the Stats one, then one for request 7.
  peer.set(zmq::sockopt::rcvtimeo, 2000);
  int replies = 0;
  for (;;) {
    zmq::message_t head;
    if (!peer.recv(head, zmq::recv_flags::none)) break;
    Result<Header> h = DecodeHeader(head.data(), head.size());
    ASSERT_TRUE(h.ok());
    EXPECT_TRUE(h->status.ok()) << h->status.ToString();
    EXPECT_TRUE(h->request_id == 6 || h->request_id == 7) << h->request_id;
    replies += h->request_id == 7 ? 1 : 0;
    while (peer.get(zmq::sockopt::rcvmore)) {
      zmq::message_t part;
      ASSERT_TRUE(peer.recv(part, zmq::recv_flags::none));
    }
  }
  EXPECT_EQ(replies, 1);
  // Read to the end, the reply is no longer on its way: the same id is served again.
  send(pull);
  zmq::message_t head;
  ASSERT_TRUE(peer.recv(head, zmq::recv_flags::none));
  EXPECT_EQ(DecodeHeader(head.data(), head.size())->request_id, 7u);
  EXPECT_EQ(resent(), 1);
}

TEST(ServerCreateTest, BindToAddressInUseIsUnavailable) {
  zmq::context_t context;
  InProcessServer first(context, 0, 1);
  ASSERT_TRUE(first.started());
  PsMetrics metrics(0, 1);
  ServerOptions options;
  options.endpoint = first.endpoint();
  auto second = Server::Create(context, options, &metrics);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
}

// The server's /healthz (common/metrics.h) is kept fresh by the request loop itself: idle for
// several bounds it still answers 200 (the loop turns every 100 ms), and once the loop stops
// turning — its should_stop callback blocks, as a wedged handler would, while the metrics
// threads go on — /healthz answers 503 within the bound, and 200 again when the loop turns.
TEST(ServerHealthTest, HealthzIs503WithinTheBoundWhileTheRequestLoopIsWedged) {
  using Clock = std::chrono::steady_clock;
  constexpr milliseconds kBound{500};
  zmq::context_t context;
  PsMetrics metrics(/*shard=*/0, /*num_workers=*/1);
  ServerOptions options;
  options.endpoint = "tcp://127.0.0.1:*";
  auto server = Server::Create(context, options, &metrics);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto http = MetricsServer::Start("127.0.0.1", 0, metrics.registry,
                                   {.loop = &metrics.loop, .stale_after = kBound});
  ASSERT_TRUE(http.ok()) << http.status().ToString();
  const int port = (*http)->port();
  EXPECT_THAT(testing::HttpGet(port, "/readyz"), HasSubstr(" 503 ")) << "ready before the loop ran";

  std::atomic<bool> wedged{false};
  std::atomic<bool> stop{false};
  std::thread loop([&] {
    Status s = (*server)->Run([&] {
      while (wedged.load()) std::this_thread::sleep_for(milliseconds(5));
      return stop.load();
    });
    EXPECT_TRUE(s.ok()) << s.ToString();
  });
  // Polls /healthz until its status line has `code`; the answer and how long that took.
  auto await = [&](const std::string& code) {
    const auto t0 = Clock::now();
    std::string answer;
    while (Clock::now() - t0 < kWait) {
      answer = testing::HttpGet(port, "/healthz");
      if (answer.find(" " + code + " ") < answer.find("\r\n")) break;
      std::this_thread::sleep_for(milliseconds(10));
    }
    return std::make_pair(answer, Clock::now() - t0);
  };

  std::this_thread::sleep_for(3 * kBound);  // idle
  EXPECT_THAT(testing::HttpGet(port, "/healthz"), HasSubstr(" 200 OK\r\n"));
  EXPECT_THAT(testing::HttpGet(port, "/readyz"), HasSubstr(" 200 OK\r\n"));

  wedged.store(true);
  const auto [unhealthy, took] = await("503");
  EXPECT_THAT(unhealthy, HasSubstr("unhealthy: the main loop last turned "));
  // The last turn began at most one 100 ms poll before the wedge.
  EXPECT_LT(took, kBound + milliseconds(400)) << unhealthy;

  wedged.store(false);
  const auto [healthy, back] = await("200");
  EXPECT_THAT(healthy, HasSubstr("\r\n\r\nok\n"));
  EXPECT_LT(back, milliseconds(500));

  stop.store(true);
  loop.join();
}

}  // namespace
}  // namespace parasync
