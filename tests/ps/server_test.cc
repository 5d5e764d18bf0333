// The parameter server over real ZeroMQ on loopback: hostile raw messages from a DEALER, then
// the real client (worker/ps_client.h) against the same server.
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
#include "tests/support/process_util.h"
#include "worker/heartbeater.h"
#include "worker/ps_client.h"

namespace parasync {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

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
    std::vector<std::vector<uint8_t>> frames;
    frames.reserve(tensors.size() + 1);
    frames.push_back(EncodeHeader(h));
    for (std::vector<uint8_t>& t : tensors) frames.push_back(std::move(t));
    Send(frames);
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

std::unique_ptr<PsClient> ConnectClient(zmq::context_t& context,
                                        const std::vector<std::string>& addresses,
                                        int copy_threads, DType wire = DType::kFloat32) {
  PsClientOptions options;
  options.ps_addresses = addresses;
  options.request_timeout = kWait;
  options.copy_threads = copy_threads;
  options.wire_dtype = wire;
  auto client = PsClient::Connect(context, options);
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  return client.ok() ? std::move(client).value() : nullptr;
}

// Two shards and one client (rank -1, one copy thread) that registered `reg_` on them.
class TwoShardsTest : public ::testing::Test {
 protected:
  explicit TwoShardsTest(ModelRegistration reg) : reg_(std::move(reg)) {}

  void SetUp() override {
    ASSERT_TRUE(s0_.started() && s1_.started());
    client_ = ConnectClient(context_, {s0_.endpoint(), s1_.endpoint()}, 1);
    ASSERT_NE(client_, nullptr);
    ASSERT_TRUE(client_->Register(reg_, kWait).ok());
  }

  zmq::context_t context_;  // declared first: outlives every socket
  RunningServer s0_{context_, 0, 2};
  RunningServer s1_{context_, 1, 2};
  const ModelRegistration reg_;
  std::unique_ptr<PsClient> client_;
};

// TwoShardsTest of SmallModel(2).
class ServerShardsTest : public TwoShardsTest {
 protected:
  ServerShardsTest() : TwoShardsTest(SmallModel(2)) {}

  // params must be the initial values minus `steps` SGD steps of grads.
  void ExpectSgdSteps(const std::vector<std::vector<float>>& params,
                      const std::vector<std::vector<float>>& grads, int steps) const {
    const std::vector<std::vector<float>> w0 = InitialValues(reg_);
    for (size_t v = 0; v < params.size(); ++v) {
      for (size_t i = 0; i < params[v].size(); ++i) {
        EXPECT_FLOAT_EQ(params[v][i],
                        w0[v][i] - static_cast<float>(steps) * kLearningRate * grads[v][i])
            << "after " << steps << " step(s): " << reg_.variables[v].name << "[" << i << "]";
      }
    }
  }
};

TEST_F(ServerShardsTest, TwoShardsServeTheirSlicesAndPullSeesSgdUpdate) {
  std::vector<std::vector<float>> grads = Gradients(reg_);
  ASSERT_TRUE(client_->Push(Pointers<const float>(grads), 8).ok());
  std::vector<std::vector<float>> params = {std::vector<float>(200), std::vector<float>(10)};
  ASSERT_TRUE(client_->Pull(Pointers<float>(params)).ok());
  ExpectSgdSteps(params, grads, 1);
  Result<std::vector<ShardStats>> stats = client_->Stats();
  ASSERT_TRUE(stats.ok());
  ASSERT_EQ(stats->size(), 2u);
  EXPECT_EQ((*stats)[0].num_elements + (*stats)[1].num_elements, 210);
  EXPECT_GT((*stats)[0].num_slices, 0);
  EXPECT_GT((*stats)[1].num_slices, 0);
  EXPECT_EQ((*stats)[0].version, 1);
  EXPECT_EQ((*stats)[1].version, 1);
}

TEST_F(ServerShardsTest, PushPullAppliesThePushBeforeAnsweringThePullOnEveryShard) {
  std::vector<std::vector<float>> grads = Gradients(reg_);
  std::vector<std::vector<float>> params = {std::vector<float>(200), std::vector<float>(10)};
  // Twice: the second pull must see both pushes (each reply after its own push).
  for (int round = 1; round <= 2; ++round) {
    PsClient::PushPullTimes times;
    const auto t0 = std::chrono::steady_clock::now();
    Status s = client_->PushPull(Pointers<const float>(grads), 8, Pointers<float>(params), 0, &times);
    const double total =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(client_->last_version(), round);
    EXPECT_FALSE(client_->last_push_dropped());
    // The split is of the call's own time: both parts present, together no more than it.
    EXPECT_GT(times.push_seconds, 0.0);
    EXPECT_GE(times.pull_seconds, 0.0);
    EXPECT_LE(times.push_seconds + times.pull_seconds, total);
    ExpectSgdSteps(params, grads, round);
  }
}

// --wire-dtype: a client that sends and receives bfloat16 or float16 against two shards,
// beside a float32 client that sees what the servers really hold.
class WireDTypeTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(s0_.started() && s1_.started());
    narrow_ = Connect(GetParam());
    exact_ = Connect(DType::kFloat32);
    ASSERT_TRUE(narrow_ && exact_);
    ASSERT_TRUE(narrow_->Register(reg_, kWait).ok());
    ASSERT_TRUE(exact_->Register(reg_, kWait).ok());
  }

  std::unique_ptr<PsClient> Connect(DType wire) {
    PsClientOptions options;
    options.ps_addresses = {s0_.endpoint(), s1_.endpoint()};
    options.request_timeout = kWait;
    options.wire_dtype = wire;
    auto client = PsClient::Connect(context_, options);
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    return client.ok() ? std::move(client).value() : nullptr;
  }

  // `values` as they arrive after one trip in the test's wire dtype.
  std::vector<float> Narrowed(const std::vector<float>& values) const {
    std::vector<uint8_t> wire(values.size() * 2);
    EncodeFloats(values.data(), values.size(), GetParam(), wire.data());
    std::vector<float> out(values.size());
    DecodeFloats(wire.data(), values.size(), GetParam(), out.data());
    return out;
  }

  double Rejected(RejectReason reason) const { return s0_.Rejected(reason) + s1_.Rejected(reason); }

  zmq::context_t context_;  // declared first: outlives every socket
  RunningServer s0_{context_, 0, 2};
  RunningServer s1_{context_, 1, 2};
  const ModelRegistration reg_ = SmallModel(2);
  std::unique_ptr<PsClient> narrow_;
  std::unique_ptr<PsClient> exact_;
};

// The servers apply exactly the narrowed gradient (widened back) to float32 values, and a
// narrow pull returns those values narrowed once: nothing else is lost on the way.
TEST_P(WireDTypeTest, PushPullAppliesTheNarrowedGradientAndReturnsNarrowedValues) {
  std::vector<std::vector<float>> grads = Gradients(reg_);
  grads[0][3] = 1.0f / 3.0f;  // not exact in 16 bits: the rounding must show
  std::vector<std::vector<float>> params = {std::vector<float>(200), std::vector<float>(10)};
  ASSERT_TRUE(narrow_->PushPull(Pointers<const float>(grads), 8, Pointers<float>(params)).ok());
  EXPECT_EQ(narrow_->last_version(), 1);
  std::vector<std::vector<float>> held = {std::vector<float>(200), std::vector<float>(10)};
  ASSERT_TRUE(exact_->Pull(Pointers<float>(held)).ok());
  const std::vector<std::vector<float>> w0 = InitialValues(reg_);
  int rounded = 0;
  for (size_t v = 0; v < held.size(); ++v) {
    const std::vector<float> g = Narrowed(grads[v]);
    const std::vector<float> seen = Narrowed(held[v]);
    for (size_t i = 0; i < held[v].size(); ++i) {
      ASSERT_FLOAT_EQ(held[v][i], w0[v][i] - kLearningRate * g[i])
          << reg_.variables[v].name << "[" << i << "]";
      ASSERT_EQ(params[v][i], seen[i]) << reg_.variables[v].name << "[" << i << "]";
      rounded += held[v][i] != seen[i];
    }
  }
  EXPECT_NE(Narrowed({1.0f / 3.0f})[0], 1.0f / 3.0f);
  EXPECT_GT(rounded, 0) << "a narrow pull must differ from the float32 values somewhere";
  // The push frames were half the bytes of float32 on both shards.
  const double pushed = s0_.metrics().bytes_received[static_cast<size_t>(MsgType::kPush)]->Value() +
                        s1_.metrics().bytes_received[static_cast<size_t>(MsgType::kPush)]->Value();
  EXPECT_EQ(pushed, 210 * 2);
}

// NaN and Inf survive the narrowing and are refused as before; a finite gradient beyond the
// 16-bit range is saturated, not turned into Inf, and applied.
TEST_P(WireDTypeTest, NonFiniteGradientIsStillRefusedAndALargeFiniteOneSaturates) {
  std::vector<std::vector<float>> grads = Gradients(reg_);
  grads[1][4] = std::numeric_limits<float>::quiet_NaN();
  Status s = narrow_->Push(Pointers<const float>(grads), 8);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_EQ(Rejected(RejectReason::kNonFinite), 1);
  grads[1][4] = -std::numeric_limits<float>::infinity();
  EXPECT_FALSE(narrow_->Push(Pointers<const float>(grads), 8).ok());
  EXPECT_EQ(Rejected(RejectReason::kNonFinite), 2);

  grads = Gradients(reg_);
  grads[1][4] = 1e6f;  // beyond float16's 65504
  ASSERT_TRUE(narrow_->Push(Pointers<const float>(grads), 8).ok());
  std::vector<std::vector<float>> held = {std::vector<float>(200), std::vector<float>(10)};
  ASSERT_TRUE(exact_->Pull(Pointers<float>(held)).ok());
  const float applied = Narrowed({1e6f})[0];
  EXPECT_TRUE(std::isfinite(held[1][4]));
  EXPECT_FLOAT_EQ(held[1][4], InitialValues(reg_)[1][4] - kLearningRate * applied);
  if (GetParam() == DType::kFloat16) {
    EXPECT_EQ(applied, 65504.0f);
  }
}

INSTANTIATE_TEST_SUITE_P(Narrow, WireDTypeTest,
                         ::testing::Values(DType::kBfloat16, DType::kFloat16),
                         [](const ::testing::TestParamInfo<DType>& p) {
                           return std::string(DTypeName(p.param));
                         });

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

// ---- copying a pull reply into the caller's parameters -----------------------------------

// One variable of 8 slices x 64Ki elements (2 MiB) by default, above
// PsClient::kParallelCopyElements.
ModelRegistration LargeModel(int num_shards, int64_t elements = 8 * 65536) {
  ModelRegistration reg;
  reg.variables = {{"w", {elements}, DType::kFloat32, {InitKind::kUniform, 0.1f}}};
  reg.optimizer.kind = OptimizerKind::kSgd;
  reg.optimizer.learning_rate = kLearningRate;
  reg.seed = 7;
  reg.max_slice_elements = 65536;
  reg.num_shards = num_shards;
  return reg;
}

// TwoShardsTest of LargeModel(2).
class PullCopyTest : public TwoShardsTest {
 protected:
  PullCopyTest() : TwoShardsTest(LargeModel(2)) {}
};

TEST_F(PullCopyTest, ThreeCopyThreadsFillTheParametersExactlyAsOne) {
  static_assert(8 * 65536 >= PsClient::kParallelCopyElements);
  std::vector<std::vector<float>> grads = Gradients(reg_);
  ASSERT_TRUE(client_->Push(Pointers<const float>(grads), 8).ok());  // values not the initial ones
  const std::vector<float> expected = [&] {
    std::vector<float> w = InitialValues(reg_)[0];
    for (size_t i = 0; i < w.size(); ++i) w[i] -= kLearningRate * grads[0][i];
    return w;
  }();
  for (DType wire : {DType::kFloat32, DType::kBfloat16}) {
    std::vector<std::vector<float>> by_threads;
    for (int threads : {1, 3}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(wire) << ", " << threads << " thread(s)");
      auto client = ConnectClient(context_, {s0_.endpoint(), s1_.endpoint()}, threads, wire);
      ASSERT_NE(client, nullptr);
      ASSERT_TRUE(client->Register(reg_, kWait).ok());
      // Each round starts from NaN everywhere: any slice left out shows.
      for (int round = 0; round < 5; ++round) {
        std::vector<std::vector<float>> params = {
            std::vector<float>(expected.size(), std::numeric_limits<float>::quiet_NaN())};
        ASSERT_TRUE(client->Pull(Pointers<float>(params)).ok());
        EXPECT_EQ(client->last_version(), 1);
        for (size_t i = 0; i < expected.size(); ++i) {
          const float want = wire == DType::kFloat32
                                 ? expected[i]
                                 : Bfloat16ToFloat(FloatToBfloat16(expected[i]));
          ASSERT_FLOAT_EQ(params[0][i], want) << "element " << i;
        }
        if (round == 0) by_threads.push_back(params[0]);
      }
    }
    ASSERT_EQ(by_threads.size(), 2u);
    EXPECT_EQ(0, std::memcmp(by_threads[0].data(), by_threads[1].data(),
                             by_threads[0].size() * sizeof(float)))
        << "bit for bit";
  }
}

// A pull of PsClient::kStreamingCopyElements or more is copied with streaming stores, after a
// push the server applied with them (Shard::kStreamingApplyElements): the parameters are the
// initial values minus lr * g bit for bit, on one copy thread and on two.
TEST(PullStreamingTest, ALargePushAndPullGiveTheSgdResultBitForBit) {
  constexpr int64_t kElements = int64_t{32} * 65536;  // 8 MiB
  static_assert(kElements >= PsClient::kStreamingCopyElements);
  static_assert(kElements >= Shard::kStreamingApplyElements);
  zmq::context_t context;
  RunningServer server(context, 0, 1);
  ASSERT_TRUE(server.started());
  const ModelRegistration reg = LargeModel(1, kElements);
  std::vector<std::vector<float>> grads = Gradients(reg);
  std::vector<float> expected = InitialValues(reg)[0];
  for (int threads : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << threads << " copy thread(s)");
    auto client = ConnectClient(context, {server.endpoint()}, threads);
    ASSERT_NE(client, nullptr);
    ASSERT_TRUE(client->Register(reg, kWait).ok());
    ASSERT_TRUE(client->Push(Pointers<const float>(grads), 8).ok());
    for (size_t i = 0; i < expected.size(); ++i) expected[i] -= kLearningRate * grads[0][i];
    std::vector<std::vector<float>> params = {
        std::vector<float>(expected.size(), std::numeric_limits<float>::quiet_NaN())};
    ASSERT_TRUE(client->Pull(Pointers<float>(params)).ok());
    ASSERT_EQ(0, std::memcmp(params[0].data(), expected.data(), expected.size() * sizeof(float)))
        << "first differing element "
        << std::mismatch(params[0].begin(), params[0].end(), expected.begin()).first -
               params[0].begin();
  }
}

TEST_F(PullCopyTest, ABadReplyFromOneShardLeavesEveryParameterAsItWas) {
  // Shard 0 answers properly; "shard 1" is a bare ROUTER that answers the pull with no slices.
  // The good shard's reply comes first, yet nothing of it may be written either.
  auto fake = Socket::Bind(context_, "tcp://127.0.0.1:*");
  ASSERT_TRUE(fake.ok()) << fake.status().ToString();
  std::promise<Status> fake_done;
  std::future<Status> fake_result = fake_done.get_future();
  // A jthread: a failed ASSERT below returns early, and the thread ends by its deadline.
  std::jthread fake_shard([&] {
    const auto deadline = std::chrono::steady_clock::now() + kWait;
    while (std::chrono::steady_clock::now() < deadline) {
      auto in = (*fake)->Receive(milliseconds(100));
      if (!in.ok()) {
        fake_done.set_value(in.status());
        return;
      }
      if (!in->has_value() || !(*in)->header.ok()) continue;
      Header reply;
      reply.type = (*in)->header->type;
      reply.request_id = (*in)->header->request_id;
      reply.version = 1;  // and no slices, no frames
      fake_done.set_value((*fake)->Send(&(*in)->identity, reply, {}));
      return;
    }
    fake_done.set_value(Status::TimedOut("no pull reached the fake shard"));
  });
  {
    auto client = ConnectClient(context_, {s0_.endpoint(), (*fake)->LastEndpoint()}, 3);
    ASSERT_NE(client, nullptr);
    ASSERT_TRUE(client->Adopt(reg_).ok());
    std::vector<std::vector<float>> params = {std::vector<float>(8 * 65536, 7.0f)};
    const Status s = client->Pull(Pointers<float>(params));
    EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
    EXPECT_TRUE(Contains(s.message(), "shard 1")) << s.message();
    EXPECT_EQ(std::count(params[0].begin(), params[0].end(), 7.0f),
              static_cast<std::ptrdiff_t>(params[0].size()));
  }
  fake_shard.join();
  EXPECT_TRUE(fake_result.get().ok());
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


// --- Training modes over the wire: sync, ssp:K, liveness ---

// A single-shard Server with `options` (endpoint and metrics filled in here) serving in its
// own thread until destroyed.
class ModeServer {
 public:
  ModeServer(zmq::context_t& context, ServerOptions options) : metrics_(0, options.num_workers) {
    options.endpoint = "tcp://127.0.0.1:*";
    auto server = Server::Create(context, options, &metrics_);
    if (!server.ok()) {
      ADD_FAILURE() << server.status().ToString();
      return;
    }
    server_ = std::move(server).value();
    endpoint_ = server_->endpoint();
    thread_ = std::thread([this] { result_ = server_->Run([] { return false; }); });
  }

  ~ModeServer() {
    if (!thread_.joinable()) return;
    server_->Stop();  // Run checks it at least every 100 ms
    thread_.join();
    EXPECT_TRUE(result_.ok()) << result_.ToString();
  }

  bool started() const { return server_ != nullptr; }
  const std::string& endpoint() const { return endpoint_; }
  double Rejected(RejectReason reason) const {
    return metrics_.rejected[static_cast<size_t>(reason)]->Value();
  }

 private:
  PsMetrics metrics_;  // outlives server_
  std::unique_ptr<Server> server_;
  std::string endpoint_;
  Status result_;  // written by the thread, read after the join
  std::thread thread_;
};

ServerOptions ModeOptions(const std::string& mode, int num_workers) {
  ServerOptions o;
  Result<TrainingMode> m = TrainingMode::Parse(mode);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (m.ok()) o.mode = *m;
  o.num_workers = num_workers;
  o.worker_timeout = milliseconds(10000);  // tests of liveness shorten it
  o.barrier_timeout = milliseconds(4000);
  return o;
}

ModelRegistration ModeModel(const std::string& mode) {
  ModelRegistration reg = SmallModel(1);
  reg.mode = mode;
  return reg;
}

// Two workers' gradients, distinct so that their mean differs from either.
std::vector<std::vector<float>> GradientsOfRank(const ModelRegistration& reg, int rank) {
  std::vector<std::vector<float>> g = Gradients(reg);
  if (rank == 0) return g;
  for (auto& v : g) {
    for (size_t i = 0; i < v.size(); ++i) v[i] = -2.0f * v[i] + 0.001f * static_cast<float>(i % 5);
  }
  return g;
}

class ModeServerTest : public ::testing::Test {
 protected:
  // Starts the server; false (with a failure recorded) if it could not bind.
  bool Start(const ServerOptions& options) {
    server_ = std::make_unique<ModeServer>(context_, options);
    return server_->started();
  }

  // A registered PsClient for `rank`, or nullptr with a failure recorded.
  std::unique_ptr<PsClient> Worker(int rank, const ModelRegistration& reg) {
    PsClientOptions options;
    options.ps_addresses = {server_->endpoint()};
    options.rank = rank;
    options.request_timeout = kWait;
    options.blocking_timeout = kWait;
    auto client = PsClient::Connect(context_, options);
    if (!client.ok()) {
      ADD_FAILURE() << client.status().ToString();
      return nullptr;
    }
    if (Status s = (*client)->Register(reg, kWait); !s.ok()) {
      ADD_FAILURE() << "rank " << rank << " Register: " << s.ToString();
      return nullptr;
    }
    return std::move(client).value();
  }

  static std::vector<std::vector<float>> NewParams() {
    return {std::vector<float>(200), std::vector<float>(10)};
  }

  // Pulls (blocking in the server's sense) on another thread; the client must not be used
  // elsewhere until the future is ready.
  static std::future<Status> PullAsync(PsClient& client, std::vector<std::vector<float>>& params,
                                       int64_t min_version) {
    return std::async(std::launch::async, [&client, &params, min_version] {
      return client.Pull(Pointers<float>(params), min_version);
    });
  }

  static ShardStats StatsOf(PsClient& client) {
    Result<std::vector<ShardStats>> stats = client.Stats();
    EXPECT_TRUE(stats.ok()) << stats.status().ToString();
    if (!stats.ok() || stats->size() != 1) return {};
    return (*stats)[0];
  }

  zmq::context_t context_;  // declared first: outlives every socket
  std::unique_ptr<ModeServer> server_;
};

// How long a pull that must wait is watched for an early answer.
constexpr milliseconds kStillParked{200};

// A worker's data position (for resuming) comes back at Register once its gradient counts:
// at once in async mode, in sync mode only when the step it went into is applied.
TEST_F(ModeServerTest, ARanksDataPositionIsToldAtRegisterOnceItsGradientCounts) {
  ASSERT_TRUE(Start(ModeOptions("sync", 2)));
  const ModelRegistration reg = ModeModel("sync");
  std::unique_ptr<PsClient> w0 = Worker(0, reg);
  std::unique_ptr<PsClient> w1 = Worker(1, reg);
  ASSERT_TRUE(w0 && w1);
  EXPECT_TRUE(w0->recorded_progress().empty());
  std::vector<std::vector<float>> g0 = GradientsOfRank(reg, 0);
  std::vector<std::vector<float>> g1 = GradientsOfRank(reg, 1);
  w0->set_progress({1, 4, 12});
  ASSERT_TRUE(w0->Push(Pointers<const float>(g0), 4).ok());
  // Aggregated, not applied: a restarted rank 0 would train that batch again.
  std::unique_ptr<PsClient> again = Worker(0, reg);
  ASSERT_NE(again, nullptr);
  EXPECT_TRUE(again->recorded_progress().empty());
  w1->set_progress({1, 4, 12});
  ASSERT_TRUE(w1->Push(Pointers<const float>(g1), 4).ok());
  ASSERT_EQ(StatsOf(*w1).version, 1);  // the step is applied before the push is answered
  again = Worker(0, reg);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->recorded_progress(), (DataProgress{1, 4, 12}));

  // A position that is no position in a data shard is refused as malformed.
  w1->set_progress({1, 13, 12});
  EXPECT_EQ(w1->Push(Pointers<const float>(g1), 4).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(server_->Rejected(RejectReason::kMalformed), 1.0);
}

TEST_F(ModeServerTest, AnAsyncPushsDataPositionIsToldAtRegisterAtOnce) {
  ASSERT_TRUE(Start(ModeOptions("async", 1)));
  const ModelRegistration reg = ModeModel("async");
  std::unique_ptr<PsClient> w0 = Worker(0, reg);
  ASSERT_NE(w0, nullptr);
  w0->set_progress({3, 12, 12});
  std::vector<std::vector<float>> g = GradientsOfRank(reg, 0);
  ASSERT_TRUE(w0->Push(Pointers<const float>(g), 4).ok());
  std::unique_ptr<PsClient> again = Worker(0, reg);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->recorded_progress(), (DataProgress{3, 12, 12}));
}

TEST_F(ModeServerTest, SyncPullWaitsForEveryRankThenSeesTheMeanGradient) {
  ASSERT_TRUE(Start(ModeOptions("sync", 2)));
  const ModelRegistration reg = ModeModel("sync");
  std::unique_ptr<PsClient> w0 = Worker(0, reg);
  std::unique_ptr<PsClient> w1 = Worker(1, reg);
  ASSERT_TRUE(w0 && w1);
  std::vector<std::vector<float>> g0 = GradientsOfRank(reg, 0);
  std::vector<std::vector<float>> g1 = GradientsOfRank(reg, 1);

  ASSERT_TRUE(w0->Push(Pointers<const float>(g0), 8, 0).ok());
  EXPECT_FALSE(w0->last_push_dropped());
  std::vector<std::vector<float>> params = NewParams();
  std::future<Status> pull = PullAsync(*w0, params, 1);
  EXPECT_EQ(pull.wait_for(kStillParked), std::future_status::timeout)
      << "the pull for version 1 was answered before rank 1 pushed";

  ASSERT_TRUE(w1->Push(Pointers<const float>(g1), 8, 0).ok());
  ASSERT_EQ(pull.wait_for(kWait), std::future_status::ready);
  Status pulled = pull.get();
  ASSERT_TRUE(pulled.ok()) << pulled.ToString();
  EXPECT_EQ(w0->last_version(), 1);
  const std::vector<std::vector<float>> init = InitialValues(reg);
  for (size_t v = 0; v < params.size(); ++v) {
    for (size_t i = 0; i < params[v].size(); ++i) {
      const float mean = (g0[v][i] + g1[v][i]) * 0.5f;
      EXPECT_FLOAT_EQ(params[v][i], init[v][i] - kLearningRate * mean)
          << reg.variables[v].name << "[" << i << "]";
    }
  }
  const ShardStats stats = StatsOf(*w0);
  EXPECT_EQ(stats.version, 1);
  EXPECT_EQ(stats.examples, 16);
  EXPECT_EQ(stats.mode, "sync");
  EXPECT_EQ(stats.live_workers, 2);
  EXPECT_GE(stats.blocked_pulls, 1);
}

TEST_F(ModeServerTest, SyncPushPullOfTheNextStepWaitsForTheOtherRankAndSeesTheMean) {
  ASSERT_TRUE(Start(ModeOptions("sync", 2)));
  const ModelRegistration reg = ModeModel("sync");
  std::unique_ptr<PsClient> w0 = Worker(0, reg);
  std::unique_ptr<PsClient> w1 = Worker(1, reg);
  ASSERT_TRUE(w0 && w1);
  std::vector<std::vector<float>> g0 = GradientsOfRank(reg, 0);
  std::vector<std::vector<float>> g1 = GradientsOfRank(reg, 1);
  std::vector<std::vector<float>> p0 = NewParams();
  std::vector<std::vector<float>> p1 = NewParams();
  ASSERT_TRUE(w0->Pull(Pointers<float>(p0)).ok());  // version 0: what step 0 is computed from
  ASSERT_TRUE(w1->Pull(Pointers<float>(p1)).ok());

  std::future<Status> step0 = std::async(std::launch::async, [&] {
    return w0->PushPull(Pointers<const float>(g0), 8, Pointers<float>(p0), PsClient::kNextStep);
  });
  EXPECT_EQ(step0.wait_for(kStillParked), std::future_status::timeout)
      << "rank 0's pull of step 1 was answered before rank 1 pushed";
  Status s1 = w1->PushPull(Pointers<const float>(g1), 8, Pointers<float>(p1), PsClient::kNextStep);
  ASSERT_TRUE(s1.ok()) << s1.ToString();
  ASSERT_EQ(step0.wait_for(kWait), std::future_status::ready);
  Status s0 = step0.get();
  ASSERT_TRUE(s0.ok()) << s0.ToString();
  EXPECT_EQ(w0->last_version(), 1);
  EXPECT_EQ(w1->last_version(), 1);
  const std::vector<std::vector<float>> init = InitialValues(reg);
  for (size_t v = 0; v < p0.size(); ++v) {
    for (size_t i = 0; i < p0[v].size(); ++i) {
      const float mean = (g0[v][i] + g1[v][i]) * 0.5f;
      EXPECT_FLOAT_EQ(p0[v][i], init[v][i] - kLearningRate * mean);
      EXPECT_FLOAT_EQ(p1[v][i], p0[v][i]);
    }
  }
  // The next step's gradients are computed from version 1 and accepted for step 2.
  ASSERT_TRUE(w1->Push(Pointers<const float>(g1), 8).ok());
  EXPECT_FALSE(w1->last_push_dropped());
}

TEST_F(ModeServerTest, PushPullWhosePushIsNotAnsweredFailsAfterTheRequestTimeout) {
  // A server that never answers (a bound socket nobody serves): the push must give up after
  // request_timeout although the sync pull beside it may wait for blocking_timeout.
  zmq::context_t silent_context;
  auto silent = Socket::Bind(silent_context, "tcp://127.0.0.1:*");
  ASSERT_TRUE(silent.ok());
  PsClientOptions options;
  options.ps_addresses = {(*silent)->LastEndpoint()};
  options.rank = 0;
  options.request_timeout = milliseconds(300);
  options.blocking_timeout = std::chrono::seconds(60);  // a broken bound fails, not hangs
  options.pulls_may_wait = true;
  auto client = PsClient::Connect(context_, options);
  ASSERT_TRUE(client.ok());
  const ModelRegistration reg = ModeModel("sync");
  ASSERT_TRUE((*client)->Adopt(reg).ok());
  std::vector<std::vector<float>> g = GradientsOfRank(reg, 0);
  std::vector<std::vector<float>> p = NewParams();
  const auto t0 = std::chrono::steady_clock::now();
  Status s = (*client)->PushPull(Pointers<const float>(g), 8, Pointers<float>(p),
                                 PsClient::kNextStep);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(s.code(), StatusCode::kTimedOut) << s.ToString();
  EXPECT_LT(waited, 30.0) << "the push waited for the pull's blocking timeout";
}

TEST_F(ModeServerTest, AFailedPushLeavesNothingQueuedThatReadsTheFreedGradientsLater) {
  // Push frames are the caller's memory (no copy). A push to a server that is not up yet
  // waits in the socket's queue; once Push has failed the caller frees its gradients, so
  // that queued push must never go out. The server that comes up later must see the next
  // request first.
  zmq::context_t server_context;
  // A port held but not listened on while the client pushes: its connects are refused, and
  // no other process can take the port meanwhile (a freed ephemeral port was once taken by
  // a concurrent test's server, which answered the push). SO_REUSEADDR on both sides lets
  // the server below bind it while it is still held (Linux refuses only a listener).
  const int holder = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(holder, 0);
  const int one = 1;
  ASSERT_EQ(setsockopt(holder, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)), 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(bind(holder, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(getsockname(holder, reinterpret_cast<sockaddr*>(&address), &length), 0);
  struct CloseAtExit {
    int fd;
    ~CloseAtExit() { close(fd); }
  } close_holder{holder};
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(ntohs(address.sin_port));
  PsClientOptions options;
  options.ps_addresses = {endpoint};
  options.rank = 0;
  // Also the Stats request's bound below, which must cover the reconnection (every 100 ms).
  options.request_timeout = kWait;
  auto client = PsClient::Connect(context_, options);
  ASSERT_TRUE(client.ok());
  const ModelRegistration reg = ModeModel("async");
  ASSERT_TRUE((*client)->Adopt(reg).ok());
  {
    std::vector<std::vector<float>> g = GradientsOfRank(reg, 0);
    Status s = (*client)->Push(Pointers<const float>(g), 8);
    EXPECT_EQ(s.code(), StatusCode::kTimedOut) << s.ToString();
    std::fill(g[0].begin(), g[0].end(), -7.0f);  // what a freed-and-reused buffer would hold
  }
  auto server = Socket::Bind(server_context, endpoint);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto stats = std::async(std::launch::async, [&] { return (*client)->Stats(); });
  // The first message the server gets is the Stats request (answered, so Stats returns).
  Result<std::optional<Inbound>> first = Status::Internal("nothing received");
  for (int i = 0; i < 100; ++i) {
    first = (*server)->Receive(milliseconds(100));
    if (!first.ok() || first->has_value()) break;
  }
  ASSERT_TRUE(first.ok() && first->has_value()) << "the server received nothing";
  ASSERT_TRUE((*first)->header.ok());
  EXPECT_EQ((*first)->header->type, MsgType::kStats)
      << "a push queued before the failure went out after it";
  Header reply;
  reply.type = MsgType::kStats;
  reply.request_id = (*first)->header->request_id;
  reply.stats = ShardStats{};
  ASSERT_TRUE((*server)->Send(&(*first)->identity, reply, {}).ok());
  ASSERT_EQ(stats.wait_for(kWait), std::future_status::ready);
  EXPECT_TRUE(stats.get().ok());
}

TEST_F(ModeServerTest, SyncGradientForAnAppliedStepIsDroppedAndASecondForTheOpenStepNotCounted) {
  ASSERT_TRUE(Start(ModeOptions("sync", 2)));
  const ModelRegistration reg = ModeModel("sync");
  std::unique_ptr<PsClient> w0 = Worker(0, reg);
  std::unique_ptr<PsClient> w1 = Worker(1, reg);
  ASSERT_TRUE(w0 && w1);
  std::vector<std::vector<float>> g0 = GradientsOfRank(reg, 0);
  std::vector<std::vector<float>> g1 = GradientsOfRank(reg, 1);
  ASSERT_TRUE(w0->Push(Pointers<const float>(g0), 8, 0).ok());
  ASSERT_TRUE(w1->Push(Pointers<const float>(g1), 8, 0).ok());
  std::vector<std::vector<float>> after_step = NewParams();
  ASSERT_TRUE(w0->Pull(Pointers<float>(after_step), 1).ok());
  ASSERT_EQ(w0->last_version(), 1);

  // Step 0 is applied: another gradient computed from version 0 is stale.
  ASSERT_TRUE(w0->Push(Pointers<const float>(g0), 8, 0).ok());
  EXPECT_TRUE(w0->last_push_dropped());
  // Step 1 is open: rank 0's first gradient joins it; a second one (a replacement process of
  // the rank, say) is not aggregated: it comes back dropped, so the sender just goes on.
  ASSERT_TRUE(w0->Push(Pointers<const float>(g0), 8, 1).ok());
  EXPECT_FALSE(w0->last_push_dropped());
  ASSERT_TRUE(w0->Push(Pointers<const float>(g1), 8, 1).ok());
  EXPECT_TRUE(w0->last_push_dropped());
  EXPECT_EQ(server_->Rejected(RejectReason::kDuplicate), 1.0);

  std::vector<std::vector<float>> params = NewParams();
  ASSERT_TRUE(w0->Pull(Pointers<float>(params), 1).ok());
  EXPECT_EQ(w0->last_version(), 1);
  EXPECT_EQ(params, after_step) << "the dropped or refused gradient changed the model";
  ShardStats stats = StatsOf(*w0);
  EXPECT_EQ(stats.dropped_stale, 1);
  ASSERT_EQ(stats.workers.size(), 2u);
  EXPECT_EQ(stats.workers[0].dropped, 2);  // the stale one and the duplicate
  EXPECT_EQ(stats.workers[0].gradients, 2);  // step 0 and step 1
  EXPECT_EQ(stats.workers[1].gradients, 1);

  // Rank 1 completes step 1 with rank 0's first gradient for it, not the refused one.
  ASSERT_TRUE(w1->Push(Pointers<const float>(g1), 8, 1).ok());
  ASSERT_TRUE(w0->Pull(Pointers<float>(params), 2).ok());
  EXPECT_EQ(w0->last_version(), 2);
  for (size_t v = 0; v < params.size(); ++v) {
    for (size_t i = 0; i < params[v].size(); ++i) {
      const float mean = (g0[v][i] + g1[v][i]) * 0.5f;
      EXPECT_FLOAT_EQ(params[v][i], after_step[v][i] - kLearningRate * mean)
          << reg.variables[v].name << "[" << i << "]";
    }
  }
}

TEST_F(ModeServerTest, SyncPullTimesOutAfterTheBarrierTimeoutNamingTheMissingRank) {
  ServerOptions options = ModeOptions("sync", 3);
  options.barrier_timeout = milliseconds(1500);
  ASSERT_TRUE(Start(options));
  const ModelRegistration reg = ModeModel("sync");
  std::unique_ptr<PsClient> w0 = Worker(0, reg);
  std::unique_ptr<PsClient> w2 = Worker(2, reg);
  ASSERT_TRUE(w0 && w2);
  std::vector<std::vector<float>> g = Gradients(reg);
  ASSERT_TRUE(w0->Push(Pointers<const float>(g), 8, 0).ok());
  ASSERT_TRUE(w2->Push(Pointers<const float>(g), 8, 0).ok());

  std::vector<std::vector<float>> params = NewParams();
  const auto start = std::chrono::steady_clock::now();
  Status s = w0->Pull(Pointers<float>(params), 1);
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(s.code(), StatusCode::kTimedOut) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "missing ranks: 1)")) << s.message();
  EXPECT_GE(waited, options.barrier_timeout);
  EXPECT_LT(waited, options.barrier_timeout + milliseconds(1000));
  EXPECT_EQ(server_->Rejected(RejectReason::kBarrierTimeout), 1.0);
}

TEST_F(ModeServerTest, SilentWorkerIsDeclaredDeadAndTheBarrierGoesOnWithoutItUntilItReturns) {
  ServerOptions options = ModeOptions("sync", 2);
  // 20 heartbeat intervals: under ThreadSanitizer on a loaded 2-core machine, rank 0's 50 ms
  // heartbeats were once 300 ms apart, and rank 0 was declared dead too.
  options.worker_timeout = milliseconds(1000);
  ASSERT_TRUE(Start(options));
  const ModelRegistration reg = ModeModel("sync");
  // Rank 0 heartbeats, as a worker does from its own thread; rank 1 is never heard from.
  auto beats0 = Heartbeater::Start(context_, {server_->endpoint()}, 0, milliseconds(50));
  ASSERT_TRUE(beats0.ok());
  std::unique_ptr<PsClient> w0 = Worker(0, reg);
  ASSERT_TRUE(w0);
  std::vector<std::vector<float>> g = Gradients(reg);
  ASSERT_TRUE(w0->Push(Pointers<const float>(g), 8, 0).ok());

  std::vector<std::vector<float>> params = NewParams();
  Status pulled = w0->Pull(Pointers<float>(params), 1);  // bounded by blocking_timeout
  ASSERT_TRUE(pulled.ok()) << pulled.ToString();
  EXPECT_EQ(w0->last_version(), 1);
  const std::vector<std::vector<float>> init = InitialValues(reg);
  for (size_t v = 0; v < params.size(); ++v) {
    for (size_t i = 0; i < params[v].size(); ++i) {
      EXPECT_FLOAT_EQ(params[v][i], init[v][i] - kLearningRate * g[v][i]);
    }
  }
  ShardStats stats = StatsOf(*w0);
  EXPECT_EQ(stats.live_workers, 1);
  EXPECT_EQ(stats.workers_declared_dead, 1);
  ASSERT_EQ(stats.workers.size(), 2u);
  EXPECT_TRUE(stats.workers[0].live);
  EXPECT_FALSE(stats.workers[1].live);

  // Rank 1 speaks: it is live again, at the slowest live clock (rank 0's: 1).
  auto beats1 = Heartbeater::Start(context_, {server_->endpoint()}, 1, milliseconds(50));
  ASSERT_TRUE(beats1.ok());
  RawPeer peer(context_, server_->endpoint());
  Header heartbeat;
  heartbeat.type = MsgType::kHeartbeat;
  heartbeat.rank = 1;
  peer.SendHeader(heartbeat);
  Result<Header> reply = peer.Receive();
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_TRUE(reply->status.ok()) << reply->status.ToString();
  stats = StatsOf(*w0);
  EXPECT_EQ(stats.live_workers, 2);
  EXPECT_EQ(stats.workers_declared_dead, 1);
  ASSERT_EQ(stats.workers.size(), 2u);
  EXPECT_TRUE(stats.workers[1].live);
  EXPECT_EQ(stats.workers[1].clock, 1);
}

TEST_F(ModeServerTest, LeaveOfTheOtherRankReleasesAParkedSyncPull) {
  ASSERT_TRUE(Start(ModeOptions("sync", 2)));
  const ModelRegistration reg = ModeModel("sync");
  std::unique_ptr<PsClient> w0 = Worker(0, reg);
  std::unique_ptr<PsClient> w1 = Worker(1, reg);
  ASSERT_TRUE(w0 && w1);
  std::vector<std::vector<float>> g = Gradients(reg);
  ASSERT_TRUE(w0->Push(Pointers<const float>(g), 8, 0).ok());
  std::vector<std::vector<float>> params = NewParams();
  std::future<Status> pull = PullAsync(*w0, params, 1);
  EXPECT_EQ(pull.wait_for(kStillParked), std::future_status::timeout);

  ASSERT_TRUE(w1->Leave(kWait).ok());
  ASSERT_EQ(pull.wait_for(kWait), std::future_status::ready);
  Status pulled = pull.get();
  ASSERT_TRUE(pulled.ok()) << pulled.ToString();
  EXPECT_EQ(w0->last_version(), 1);
  const std::vector<std::vector<float>> init = InitialValues(reg);
  EXPECT_FLOAT_EQ(params[1][3], init[1][3] - kLearningRate * g[1][3]);

  // Later steps need rank 0 alone.
  ASSERT_TRUE(w0->Push(Pointers<const float>(g), 8, 1).ok());
  ASSERT_TRUE(w0->Pull(Pointers<float>(params), 2).ok());
  EXPECT_EQ(w0->last_version(), 2);
  const ShardStats stats = StatsOf(*w0);
  EXPECT_EQ(stats.live_workers, 1);
  EXPECT_EQ(stats.workers_declared_dead, 0);
}

TEST_F(ModeServerTest, SspPullOfARankTooFarAheadWaitsForTheSlowRank) {
  ASSERT_TRUE(Start(ModeOptions("ssp:1", 2)));
  const ModelRegistration reg = ModeModel("ssp:1");
  std::unique_ptr<PsClient> w0 = Worker(0, reg);
  std::unique_ptr<PsClient> w1 = Worker(1, reg);
  ASSERT_TRUE(w0 && w1);
  std::vector<std::vector<float>> g = Gradients(reg);
  std::vector<std::vector<float>> params = NewParams();
  ASSERT_TRUE(w0->Pull(Pointers<float>(params)).ok());  // clock 0: within the bound
  ASSERT_TRUE(w0->Push(Pointers<const float>(g), 8, 0).ok());
  ASSERT_TRUE(w0->Push(Pointers<const float>(g), 8, 1).ok());
  // Rank 0 is at clock 2, rank 1 at 0: more than one ahead.
  std::future<Status> pull = PullAsync(*w0, params, 0);
  EXPECT_EQ(pull.wait_for(kStillParked), std::future_status::timeout)
      << "rank 0 read while two clocks ahead of rank 1 under ssp:1";

  ASSERT_TRUE(w1->Push(Pointers<const float>(g), 8, 0).ok());
  ASSERT_EQ(pull.wait_for(kWait), std::future_status::ready);
  Status pulled = pull.get();
  ASSERT_TRUE(pulled.ok()) << pulled.ToString();
  EXPECT_EQ(w0->last_version(), 3);  // ssp applies every gradient on arrival
  const ShardStats stats = StatsOf(*w0);
  EXPECT_LE(stats.max_clock_staleness, 1);
  EXPECT_GE(stats.blocked_pulls, 1);
  EXPECT_EQ(stats.mode, "ssp:1");
  ASSERT_EQ(stats.workers.size(), 2u);
  EXPECT_EQ(stats.workers[0].clock, 2);
  EXPECT_EQ(stats.workers[1].clock, 1);
}

TEST_F(ModeServerTest, RegisterWithAnotherModeIsFailedPreconditionNamingBothModes) {
  ASSERT_TRUE(Start(ModeOptions("sync", 2)));
  PsClientOptions options;
  options.ps_addresses = {server_->endpoint()};
  options.rank = 0;
  options.request_timeout = kWait;
  auto client = PsClient::Connect(context_, options);
  ASSERT_TRUE(client.ok());
  Status s = (*client)->Register(ModeModel("async"), kWait);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  std::string message = s.message();
  const size_t theirs = message.find("async");  // "sync" is part of "async": find it first
  ASSERT_NE(theirs, std::string::npos) << s.message();
  message.erase(theirs, 5);
  EXPECT_TRUE(Contains(message, "sync")) << s.message();
  EXPECT_EQ(server_->Rejected(RejectReason::kRegisterMismatch), 1.0);
  const ShardStats stats = StatsOf(**client);
  EXPECT_FALSE(stats.registered);
}

TEST_F(ModeServerTest, PullFromARankOutsideTheClusterIsInvalidArgument) {
  ASSERT_TRUE(Start(ModeOptions("sync", 2)));
  std::unique_ptr<PsClient> w0 = Worker(0, ModeModel("sync"));
  ASSERT_TRUE(w0);
  RawPeer peer(context_, server_->endpoint());
  Header pull;
  pull.type = MsgType::kPull;
  pull.rank = 7;
  pull.slices = {{0, 0, 50}};
  peer.SendHeader(pull);
  Result<Header> reply = peer.Receive();
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->status.code(), StatusCode::kInvalidArgument) << reply->status.ToString();
  EXPECT_TRUE(Contains(reply->status.message(), "rank 7")) << reply->status.message();
  EXPECT_EQ(server_->Rejected(RejectReason::kBadRank), 1.0);
  const ShardStats stats = StatsOf(*w0);
  EXPECT_EQ(stats.live_workers, 2);
  EXPECT_EQ(stats.blocked_pulls, 0);
}

}  // namespace
}  // namespace parasync

namespace parasync {
namespace {

TEST_F(ModeServerTest, StalenessAwareAsyncDividesEachUpdateByItsStaleness) {
  ASSERT_TRUE(Start(ModeOptions("async", 2)));
  ModelRegistration reg = ModeModel("async");
  reg.optimizer.staleness_aware = true;
  std::unique_ptr<PsClient> w0 = Worker(0, reg);
  std::unique_ptr<PsClient> w1 = Worker(1, reg);
  ASSERT_TRUE(w0 && w1);
  std::vector<std::vector<float>> w = NewParams();
  ASSERT_TRUE(w0->Pull(Pointers<float>(w)).ok());
  std::vector<std::vector<float>> g = Gradients(reg);
  // Both read version 0. Rank 0's gradient is applied at version 0 (staleness 0: full
  // step), rank 1's at version 1 (staleness 1: full step), rank 0's second, still from
  // version 0, at version 2 (staleness 2: half a step).
  ASSERT_TRUE(w0->Push(Pointers<const float>(g), 8, 0).ok());
  ASSERT_TRUE(w1->Push(Pointers<const float>(g), 8, 0).ok());
  ASSERT_TRUE(w0->Push(Pointers<const float>(g), 8, 0).ok());
  std::vector<std::vector<float>> after = NewParams();
  ASSERT_TRUE(w0->Pull(Pointers<float>(after)).ok());
  for (size_t v = 0; v < w.size(); ++v) {
    for (size_t i = 0; i < w[v].size(); ++i) {
      float expected = w[v][i];
      expected -= kLearningRate * g[v][i];
      expected -= kLearningRate * g[v][i];
      expected -= (kLearningRate * 0.5f) * g[v][i];
      EXPECT_FLOAT_EQ(after[v][i], expected) << "variable " << v << " element " << i;
    }
  }
  EXPECT_EQ(StatsOf(*w0).max_version_staleness, 2);
}

TEST_F(ModeServerTest, PushFromAVersionTheShardHasNotReachedIsRefused) {
  ASSERT_TRUE(Start(ModeOptions("async", 1)));
  const ModelRegistration reg = ModeModel("async");
  std::unique_ptr<PsClient> w0 = Worker(0, reg);
  ASSERT_TRUE(w0);
  std::vector<std::vector<float>> g = Gradients(reg);
  Status s = w0->Push(Pointers<const float>(g), 8, 5);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_EQ(StatsOf(*w0).version, 0);
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
  // Stopping civetweb takes up to 2 s (common/metrics.h); the test process's exit is sooner.
  MetricsServer::KeepUntilExit(std::move(http).value());
}

}  // namespace
}  // namespace parasync
