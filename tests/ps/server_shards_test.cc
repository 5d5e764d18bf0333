// Two parameter-server shards over real ZeroMQ on loopback and one real client: the slices
// each serves, narrow wire dtypes, and copying pull replies into the caller's parameters.
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

#include "common/denormals.h"
#include "common/metrics.h"
#include "common/wire.h"
#include "ps/shard.h"
#include "tests/support/small_model.h"
#include "worker/heartbeater.h"
#include "tests/ps/server_test_util.h"
#include "worker/ps_client.h"

namespace parasync {
namespace {

using namespace server_test;  // this file's helpers: tests/ps/server_test_util.h
using ::testing::HasSubstr;

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
  InProcessServer s0_{context_, 0, 2};
  InProcessServer s1_{context_, 1, 2};
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

// ---- copying a pull reply into the caller's parameters -----------------------------------

// One variable of 8 slices x 64Ki elements (2 MiB) by default, above
// PsClient::kParallelCopyElements.
ModelRegistration LargeModel(int num_shards, int64_t elements = 8 * 65536) {
  return testing::SmallModel({{"w", {elements}, DType::kFloat32, {InitKind::kUniform, 0.1f}}},
                             /*max_slice_elements=*/65536, num_shards, /*seed=*/7,
                             kLearningRate);
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
  InProcessServer server(context, 0, 1);
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

// The server's loop and its apply helpers flush denormals to zero (common/denormals.h),
// whatever the thread that started the server had: an SGD step whose every result is a
// denormal stores zeros. The push is 2 MiB over 8 slices, so the helpers apply some of it.
TEST(ServerDenormalsTest, AnApplyWhoseResultsAreDenormalStoresZerosOnEveryApplyThread) {
  KeepDenormalsOnThisThread();  // the server's thread starts from this thread's bits
  zmq::context_t context;
  ServerOptions options;
  options.apply_threads = 2;
  InProcessServer server(context, options);
  ASSERT_TRUE(server.started());
  constexpr float kStart = 1.5e-38f;  // normal (FLT_MIN is 1.18e-38)
  constexpr float kEnd = 1e-39f;      // denormal
  ModelRegistration reg = testing::SmallModel(
      {{"w", {8 * 65536}, DType::kFloat32, {InitKind::kConstant, kStart}}},
      /*max_slice_elements=*/65536, /*num_shards=*/1, /*seed=*/7, kLearningRate);
  auto client = ConnectClient(context, {server.endpoint()}, 1);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Register(reg, kWait).ok());
  // w - lr * g lands on about kEnd in IEEE arithmetic.
  std::vector<std::vector<float>> grads = {
      std::vector<float>(8 * 65536, (kStart - kEnd) / kLearningRate)};
  ASSERT_TRUE(client->Push(Pointers<const float>(grads), 8).ok());
  std::vector<std::vector<float>> params = {std::vector<float>(8 * 65536, -1.0f)};
  ASSERT_TRUE(client->Pull(Pointers<float>(params)).ok());
  const auto kept = std::find_if(params[0].begin(), params[0].end(), [](float v) { return v != 0.0f; });
  EXPECT_EQ(kept, params[0].end()) << "element " << (kept - params[0].begin()) << " is " << *kept
                                   << ": applied with denormals on";
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

}  // namespace
}  // namespace parasync
