// The parameter server over real ZeroMQ on loopback: hostile raw messages from a DEALER, then
// the real client (worker/ps_client.h) against the same server.
#include "ps/server.h"

#include <gtest/gtest.h>

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

#include "common/wire.h"
#include "worker/ps_client.h"

namespace parasync {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kWait{5000};  // bound on every wait in this file
constexpr float kLearningRate = 0.5f;

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A 20x10 kernel in four 50-element slices and a 10-element bias, trained with SGD.
ModelRegistration SmallModel(int num_shards) {
  ModelRegistration reg;
  reg.variables = {{"dense/kernel", {20, 10}, DType::kFloat32, {InitKind::kUniform, 0.1f}},
                   {"dense/bias", {10}, DType::kFloat32, {InitKind::kConstant, 0.25f}}};
  reg.optimizer.kind = OptimizerKind::kSgd;
  reg.optimizer.learning_rate = kLearningRate;
  reg.seed = 99;
  reg.max_slice_elements = 50;
  reg.num_shards = num_shards;
  return reg;
}

std::vector<std::vector<float>> InitialValues(const ModelRegistration& reg) {
  std::vector<std::vector<float>> out;
  for (uint32_t v = 0; v < reg.variables.size(); ++v) {
    std::vector<float> values(static_cast<size_t>(reg.variables[v].num_elements()));
    InitializeElements(reg.variables[v].init, reg.seed, v, 0, values.data(),
                       static_cast<int64_t>(values.size()));
    out.push_back(std::move(values));
  }
  return out;
}

std::vector<std::vector<float>> Gradients(const ModelRegistration& reg) {
  std::vector<std::vector<float>> out;
  for (const VariableSpec& v : reg.variables) {
    std::vector<float> g(static_cast<size_t>(v.num_elements()));
    for (size_t i = 0; i < g.size(); ++i) g[i] = 0.01f * static_cast<float>(i % 17) - 0.08f;
    out.push_back(std::move(g));
  }
  return out;
}

template <typename T>
std::vector<T*> Pointers(std::vector<std::vector<float>>& arrays) {
  std::vector<T*> out;
  for (auto& a : arrays) out.push_back(a.data());
  return out;
}

// One shard's Server, bound to a free loopback port and serving in its own thread until
// stopped or destroyed.
class RunningServer {
 public:
  RunningServer(zmq::context_t& context, int shard_index, int num_shards)
      : metrics_(shard_index, 1) {
    ServerOptions options;
    options.endpoint = "tcp://127.0.0.1:*";
    options.shard_index = shard_index;
    options.num_shards = num_shards;
    auto server = Server::Create(context, options, &metrics_);
    if (!server.ok()) {
      ADD_FAILURE() << server.status().ToString();
      return;
    }
    server_ = std::move(server).value();
    endpoint_ = server_->endpoint();
    done_ = result_.get_future();
    thread_ = std::thread([this] {
      result_.set_value(server_->Run([this] { return should_stop_.load(); }));
    });
  }

  ~RunningServer() {
    if (thread_.joinable()) {
      EXPECT_TRUE(StopAndWait().ok());
    }
  }

  bool started() const { return server_ != nullptr; }
  const std::string& endpoint() const { return endpoint_; }
  PsMetrics& metrics() { return metrics_; }
  double Rejected(RejectReason reason) const {
    return metrics_.rejected[static_cast<size_t>(reason)]->Value();
  }

  // Waits (bounded) for Run() to return on its own and joins it; Run's status, or TimedOut.
  Status WaitForExit() {
    if (!thread_.joinable()) return Status::Internal("server thread not running");
    if (done_.wait_for(kWait) != std::future_status::ready) {
      return Status::TimedOut("Run() did not return within the bound");
    }
    thread_.join();
    return done_.get();
  }

  // Raises the should_stop flag, then as WaitForExit. Run checks it at least every 100 ms.
  Status StopAndWait() {
    should_stop_.store(true);
    Status s = WaitForExit();
    if (s.code() == StatusCode::kTimedOut) {
      server_->Stop();  // a last resort so that the join below ends
      thread_.join();
    }
    return s;
  }

 private:
  PsMetrics metrics_;  // outlives server_
  std::unique_ptr<Server> server_;
  std::string endpoint_;
  std::atomic<bool> should_stop_{false};
  std::promise<Status> result_;
  std::future<Status> done_;
  std::thread thread_;
};

// A raw DEALER that sends whatever bytes it is given, with bounded sends and receives.
class RawPeer {
 public:
  RawPeer(zmq::context_t& context, const std::string& endpoint)
      : socket_(context, zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.set(zmq::sockopt::rcvtimeo, static_cast<int>(kWait.count()));
    socket_.set(zmq::sockopt::sndtimeo, static_cast<int>(kWait.count()));
    socket_.connect(endpoint);
  }

  void Send(const std::vector<std::vector<uint8_t>>& frames) {
    for (size_t i = 0; i < frames.size(); ++i) {
      const auto flags = i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
      zmq::message_t m(frames[i].data(), frames[i].size());
      ASSERT_TRUE(socket_.send(m, flags).has_value()) << "send timed out";
    }
  }

  void SendHeader(const Header& h, std::vector<std::vector<uint8_t>> tensors = {}) {
    tensors.insert(tensors.begin(), EncodeHeader(h));
    Send(tensors);
  }

  // The reply's decoded header (TimedOut if none came); *frames gets the tensor frames.
  Result<Header> Receive(std::vector<std::vector<uint8_t>>* frames = nullptr) {
    std::vector<zmq::message_t> parts;
    for (;;) {
      zmq::message_t part;
      if (!socket_.recv(part, zmq::recv_flags::none)) return Status::TimedOut("no reply");
      const bool more = part.more();
      parts.push_back(std::move(part));
      if (!more) break;
    }
    if (frames != nullptr) {
      frames->clear();
      for (size_t i = 1; i < parts.size(); ++i) {
        const auto* p = static_cast<const uint8_t*>(parts[i].data());
        frames->emplace_back(p, p + parts[i].size());
      }
    }
    return DecodeHeader(parts[0].data(), parts[0].size());
  }

 private:
  zmq::socket_t socket_;
};

std::vector<uint8_t> FloatBytes(const std::vector<float>& values) {
  std::vector<uint8_t> out(values.size() * sizeof(float));
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(n);
  for (uint8_t& b : out) b = static_cast<uint8_t>(rng() & 0xff);
  return out;
}

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<RunningServer>(context_, 0, 1);
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
  std::unique_ptr<RunningServer> server_;
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

TEST(ServerShardsTest, TwoShardsServeTheirSlicesAndPullSeesSgdUpdate) {
  zmq::context_t context;
  RunningServer s0(context, 0, 2);
  RunningServer s1(context, 1, 2);
  ASSERT_TRUE(s0.started() && s1.started());
  PsClientOptions options;
  options.ps_addresses = {s0.endpoint(), s1.endpoint()};
  options.request_timeout = kWait;
  auto connected = PsClient::Connect(context, options);
  ASSERT_TRUE(connected.ok());
  std::unique_ptr<PsClient> client = std::move(connected).value();

  const ModelRegistration reg = SmallModel(2);
  ASSERT_TRUE(client->Register(reg, kWait).ok());
  std::vector<std::vector<float>> grads = Gradients(reg);
  ASSERT_TRUE(client->Push(Pointers<const float>(grads), 8).ok());
  std::vector<std::vector<float>> params = {std::vector<float>(200), std::vector<float>(10)};
  ASSERT_TRUE(client->Pull(Pointers<float>(params)).ok());
  const std::vector<std::vector<float>> w0 = InitialValues(reg);
  for (size_t v = 0; v < params.size(); ++v) {
    for (size_t i = 0; i < params[v].size(); ++i) {
      EXPECT_FLOAT_EQ(params[v][i], w0[v][i] - kLearningRate * grads[v][i])
          << reg.variables[v].name << "[" << i << "]";
    }
  }
  Result<std::vector<ShardStats>> stats = client->Stats();
  ASSERT_TRUE(stats.ok());
  ASSERT_EQ(stats->size(), 2u);
  EXPECT_EQ((*stats)[0].num_elements + (*stats)[1].num_elements, 210);
  EXPECT_GT((*stats)[0].num_slices, 0);
  EXPECT_GT((*stats)[1].num_slices, 0);
  EXPECT_EQ((*stats)[0].version, 1);
  EXPECT_EQ((*stats)[1].version, 1);
}

TEST(ServerCreateTest, BindToAddressInUseIsUnavailable) {
  zmq::context_t context;
  RunningServer first(context, 0, 1);
  ASSERT_TRUE(first.started());
  PsMetrics metrics(0, 1);
  ServerOptions options;
  options.endpoint = first.endpoint();
  auto second = Server::Create(context, options, &metrics);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace parasync
