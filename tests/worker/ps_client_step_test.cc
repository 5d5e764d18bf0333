// PsClient's step in parts (BeginStep, GradientReady, FinishStep) and registration with
// rank 0's initial values, against real servers over ZeroMQ on loopback.
#include "worker/ps_client.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "common/wire.h"
#include "tests/ps/server_test_util.h"
#include "tests/support/in_process_server.h"
#include "tests/support/small_model.h"

namespace parasync {
namespace {

using namespace server_test;  // tests/ps/server_test_util.h
using ::testing::HasSubstr;
using std::chrono::milliseconds;

// Three variables over two shards: a 20x10 kernel in four 50-element slices (two per shard)
// and two small ones, placed on one shard each by the size-balanced rule.
ModelRegistration ThreeVariables(int num_shards, InitKind kind = InitKind::kConstant) {
  std::vector<VariableSpec> vars = testing::DenseLayer("dense", 20, 10, 0.1f, {kind, 0.25f});
  vars.push_back({"scale", {7}, DType::kFloat32, {kind, 1.5f}});
  if (kind == InitKind::kProvided) vars[0].init = {InitKind::kProvided, 0};
  return testing::SmallModel(std::move(vars), /*max_slice_elements=*/50, num_shards, 7,
                             kLearningRate);
}

double Pushes(const testing::InProcessServer& s) {
  return s.metrics().requests[static_cast<size_t>(MsgType::kPush)]->Value();
}

// Waits (bounded) until `s` has received `n` pushes.
bool AwaitPushes(const testing::InProcessServer& s, double n) {
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  while (Pushes(s) < n) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(2));
  }
  return true;
}

class StepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(s0_.started() && s1_.started());
    client_ = ConnectClient(context_, {s0_.endpoint(), s1_.endpoint()}, 1);
    ASSERT_NE(client_, nullptr);
    ASSERT_TRUE(client_->Register(reg_, kWait).ok());
    for (const VariableSpec& v : reg_.variables) {
      params_.emplace_back(static_cast<size_t>(v.num_elements()));
    }
  }

  // The variables shard s holds slices of.
  std::vector<size_t> VariablesOf(int s) const {
    std::vector<size_t> vars;
    for (uint32_t id : client_->slice_map().SlicesOfShard(s)) {
      const size_t v = client_->slice_map().slices()[id].var_index;
      if (std::find(vars.begin(), vars.end(), v) == vars.end()) vars.push_back(v);
    }
    return vars;
  }

  const ModelRegistration reg_ = ThreeVariables(2);
  // GradientReady sends these borrowed: declared before the context and the client, so a test
  // that fails mid-step cannot free them under frames the client's sockets still hold.
  std::vector<std::vector<float>> grads_ = Gradients(reg_);
  zmq::context_t context_;
  testing::InProcessServer s0_{context_, 0, 2};
  testing::InProcessServer s1_{context_, 1, 2};
  std::unique_ptr<PsClient> client_;
  std::vector<std::vector<float>> params_;
};

TEST_F(StepTest, AShardsPushGoesOutOnceItsVariablesAreReadyAndTheRestAtFinish) {
  std::vector<std::vector<float>>& grads = grads_;
  // The shard that holds fewer variables completes first when those are marked.
  const int early = VariablesOf(0).size() <= VariablesOf(1).size() ? 0 : 1;
  const testing::InProcessServer& early_server = early == 0 ? s0_ : s1_;
  const testing::InProcessServer& late_server = early == 0 ? s1_ : s0_;
  const std::vector<size_t> early_vars = VariablesOf(early);
  ASSERT_LT(early_vars.size(), reg_.variables.size()) << "the late shard must need another one";
  ASSERT_TRUE(client_->BeginStep(8).ok());
  for (size_t v : early_vars) ASSERT_TRUE(client_->GradientReady(v, grads[v].data()).ok());
  // Sent without FinishStep: the early shard receives it while the other has nothing.
  ASSERT_TRUE(AwaitPushes(early_server, 1)) << "the early shard's push never arrived";
  EXPECT_EQ(Pushes(late_server), 0);
  // The last variable completes the other shard: its push goes out then, still before
  // FinishStep.
  for (size_t v = 0; v < reg_.variables.size(); ++v) {
    if (std::find(early_vars.begin(), early_vars.end(), v) != early_vars.end()) continue;
    ASSERT_TRUE(client_->GradientReady(v, grads[v].data()).ok());
  }
  ASSERT_TRUE(AwaitPushes(late_server, 1)) << "the late shard's push never arrived";
  PsClient::PushPullTimes times;
  ASSERT_TRUE(client_->FinishStep(Pointers<float>(params_), 0, &times).ok());
  EXPECT_EQ(times.early_pushes, 2);
  EXPECT_LE(times.first_push_sent, times.last_push_sent);
  EXPECT_LE(times.last_push_sent, times.pushes_acked);
  EXPECT_EQ(Pushes(early_server), 1);  // awaited, not sent again
  EXPECT_EQ(Pushes(late_server), 1);
  // One SGD step of the whole gradient, seen by the pull that came with the finish.
  const std::vector<std::vector<float>> w0 = InitialValues(reg_);
  for (size_t v = 0; v < params_.size(); ++v) {
    for (size_t i = 0; i < params_[v].size(); ++i) {
      ASSERT_FLOAT_EQ(params_[v][i], w0[v][i] - kLearningRate * grads[v][i])
          << reg_.variables[v].name << "[" << i << "]";
    }
  }
  auto stats = client_->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ((*stats)[0].version, 1);
  EXPECT_EQ((*stats)[1].version, 1);
}

TEST_F(StepTest, AStepInPartsEndsWhereAPushPullEnds) {
  std::vector<std::vector<float>>& grads = grads_;
  ASSERT_TRUE(client_->BeginStep(8).ok());
  for (size_t v = reg_.variables.size(); v-- > 0;) {  // in backward's order
    ASSERT_TRUE(client_->GradientReady(v, grads[v].data()).ok());
  }
  ASSERT_TRUE(client_->FinishStep(Pointers<float>(params_)).ok());
  std::vector<std::vector<float>> by_parts = params_;
  ASSERT_TRUE(client_->PushPull(Pointers<const float>(grads), 8, Pointers<float>(params_)).ok());
  const std::vector<std::vector<float>> w0 = InitialValues(reg_);
  for (size_t v = 0; v < params_.size(); ++v) {
    for (size_t i = 0; i < params_[v].size(); ++i) {
      const float once = w0[v][i] - kLearningRate * grads[v][i];
      ASSERT_FLOAT_EQ(by_parts[v][i], once);
      ASSERT_FLOAT_EQ(params_[v][i], once - kLearningRate * grads[v][i]);
    }
  }
  auto stats = client_->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ((*stats)[0].examples, 16);
  EXPECT_EQ((*stats)[1].examples, 16);
}

TEST_F(StepTest, MisusedStepsAreRefusedAndSendNothingMore) {
  std::vector<std::vector<float>>& grads = grads_;
  EXPECT_EQ(client_->GradientReady(0, grads[0].data()).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(client_->FinishStep(Pointers<float>(params_)).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(client_->BeginStep(8).ok());
  EXPECT_EQ(client_->BeginStep(8).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(client_->GradientReady(99, grads[0].data()).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(client_->GradientReady(2, grads[2].data()).ok());
  const Status twice = client_->GradientReady(2, grads[2].data());
  EXPECT_EQ(twice.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(twice.message(), HasSubstr("scale"));
  // Another request while the step is open would swallow the early push's reply.
  EXPECT_EQ(client_->Stats().status().code(), StatusCode::kFailedPrecondition);
  const Status missing = client_->FinishStep(Pointers<float>(params_));
  EXPECT_EQ(missing.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.message(), HasSubstr("dense/kernel"));
  EXPECT_FALSE(client_->in_step());
  // The step is closed: the client works on.
  ASSERT_TRUE(client_->PushPull(Pointers<const float>(grads), 8, Pointers<float>(params_)).ok());
}

TEST(StepSyncTest, TwoWorkersStepsInPartsMakeOneAveragedStep) {
  // Each rank's gradient, sent borrowed: declared before the context and the clients, so a
  // step that fails between GradientReady and FinishStep cannot free it under a held frame.
  std::vector<std::vector<std::vector<float>>> grads(2);
  zmq::context_t context;
  ServerOptions options;
  options.num_shards = 2;
  options.num_workers = 2;
  options.mode = *TrainingMode::Parse("sync");
  options.shard_index = 0;
  testing::InProcessServer s0(context, options);
  options.shard_index = 1;
  testing::InProcessServer s1(context, options);
  ModelRegistration reg = ThreeVariables(2);
  reg.mode = "sync";
  std::vector<std::unique_ptr<PsClient>> clients;
  for (int rank = 0; rank < 2; ++rank) {
    PsClientOptions o;
    o.ps_addresses = {s0.endpoint(), s1.endpoint()};
    o.rank = rank;
    o.request_timeout = kWait;
    o.blocking_timeout = kWait;
    o.pulls_may_wait = true;
    auto c = PsClient::Connect(context, o);
    ASSERT_TRUE(c.ok());
    clients.push_back(std::move(c).value());
    ASSERT_TRUE(clients.back()->Register(reg, kWait).ok());
  }
  // Rank r's gradient is (r + 1) times the base one: the step applies their average, 1.5x.
  std::vector<std::vector<float>> base = Gradients(reg);
  std::vector<std::vector<std::vector<float>>> params(2);
  std::vector<std::future<Status>> steps;
  for (int rank = 0; rank < 2; ++rank) {
    steps.push_back(std::async(std::launch::async, [&, rank] {
      std::vector<std::vector<float>>& g = grads[rank];
      g = base;
      for (auto& v : g) {
        for (float& x : v) x *= static_cast<float>(rank + 1);
      }
      for (const VariableSpec& v : reg.variables) {
        params[rank].emplace_back(static_cast<size_t>(v.num_elements()));
      }
      PsClient& c = *clients[rank];
      PARASYNC_RETURN_IF_ERROR(c.BeginStep(4));
      for (size_t v = g.size(); v-- > 0;) PARASYNC_RETURN_IF_ERROR(c.GradientReady(v, g[v].data()));
      return c.FinishStep(Pointers<float>(params[rank]), PsClient::kNextStep);
    }));
  }
  for (auto& s : steps) {
    const Status st = s.get();
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  const std::vector<std::vector<float>> w0 = InitialValues(reg);
  for (int rank = 0; rank < 2; ++rank) {
    for (size_t v = 0; v < w0.size(); ++v) {
      for (size_t i = 0; i < w0[v].size(); ++i) {
        ASSERT_FLOAT_EQ(params[rank][v][i], w0[v][i] - 1.5f * kLearningRate * base[v][i])
            << "rank " << rank << " " << reg.variables[v].name << "[" << i << "]";
      }
    }
  }
}

// sync:delayed: a gradient computed from the parameters before the latest pull (the worker
// computed it while the step before was exchanged) is one of the next step's; plain sync
// drops it as stale.
TEST(StepSyncTest, DelayedSyncTakesAGradientReadOneStepBeforeTheLatestPull) {
  for (const std::string mode : {"sync:delayed", "sync"}) {
    SCOPED_TRACE(mode);
    zmq::context_t context;
    ServerOptions options;
    options.num_shards = 2;
    options.num_workers = 1;
    options.mode = *TrainingMode::Parse(mode);
    options.shard_index = 0;
    testing::InProcessServer s0(context, options);
    options.shard_index = 1;
    testing::InProcessServer s1(context, options);
    ModelRegistration reg = ThreeVariables(2);
    reg.mode = mode;
    PsClientOptions o;
    o.ps_addresses = {s0.endpoint(), s1.endpoint()};
    o.rank = 0;
    o.request_timeout = kWait;
    o.blocking_timeout = kWait;
    o.pulls_may_wait = true;
    auto c = PsClient::Connect(context, o);
    ASSERT_TRUE(c.ok());
    PsClient& client = **c;
    ASSERT_TRUE(client.Register(reg, kWait).ok());
    std::vector<std::vector<float>> params;
    for (const VariableSpec& v : reg.variables) params.emplace_back(static_cast<size_t>(v.num_elements()));
    ASSERT_TRUE(client.Pull(Pointers<float>(params), PsClient::kNextStep).ok());
    const PsClient::ReadPoint at0 = client.read_point();
    EXPECT_THAT(at0.versions, ::testing::ElementsAre(0, 0));
    std::vector<std::vector<float>> g = Gradients(reg);
    ASSERT_TRUE(client.PushPull(Pointers<const float>(g), 4, Pointers<float>(params),
                                PsClient::kNextStep).ok());
    EXPECT_THAT(client.read_point().versions, ::testing::ElementsAre(1, 1));
    std::vector<std::vector<float>> g2 = g;
    for (auto& v : g2) {
      for (float& x : v) x *= 2.0f;
    }
    if (mode == "sync") {
      // Read at version 0, offered to step 1: dropped by both shards, nothing applied.
      ASSERT_TRUE(client.Push(Pointers<const float>(g2), 4, /*read_version=*/0).ok());
      EXPECT_TRUE(client.last_push_dropped());
      auto stats = client.Stats();
      ASSERT_TRUE(stats.ok());
      EXPECT_EQ((*stats)[0].version, 1);
      EXPECT_EQ((*stats)[1].version, 1);
      continue;
    }
    // The second gradient, computed from version 0, makes step 1, and the pull waits for it.
    PsClient::PushPullTimes times;
    ASSERT_TRUE(client.PushPull(Pointers<const float>(g2), 4, Pointers<float>(params),
                                PsClient::kNextStep, &times, {}, {}, &at0).ok());
    EXPECT_FALSE(client.last_push_dropped());
    EXPECT_EQ(client.last_push_staleness(), 1);
    EXPECT_THAT(client.read_point().versions, ::testing::ElementsAre(2, 2));
    const std::vector<std::vector<float>> w0 = InitialValues(reg);
    for (size_t v = 0; v < w0.size(); ++v) {
      for (size_t i = 0; i < w0[v].size(); ++i) {
        // Two steps of SGD (g, then 2 g), rounded once each: not one of 3 g to the last bit.
        ASSERT_NEAR(params[v][i], w0[v][i] - 3.0f * kLearningRate * g[v][i], 1e-6)
            << reg.variables[v].name << "[" << i << "]";
      }
    }
    // A read point of the wrong shape is refused before anything is sent.
    PsClient::ReadPoint wrong{{0}, {0}};
    const Status refused = client.PushPull(Pointers<const float>(g), 4, Pointers<float>(params),
                                           PsClient::kNextStep, nullptr, {}, {}, &wrong);
    EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.ToString();
    EXPECT_FALSE(client.in_step());
  }
}

class ProvidedValuesTest : public ::testing::Test {
 protected:
  std::unique_ptr<PsClient> Client(int rank, milliseconds timeout = kWait) {
    PsClientOptions o;
    o.ps_addresses = {s0_.endpoint(), s1_.endpoint()};
    o.rank = rank;
    o.request_timeout = timeout;
    auto c = PsClient::Connect(context_, o);
    EXPECT_TRUE(c.ok());
    return c.ok() ? std::move(c).value() : nullptr;
  }

  std::vector<std::vector<float>> Values() const {
    std::vector<std::vector<float>> out;
    for (const VariableSpec& v : reg_.variables) {
      std::vector<float> x(static_cast<size_t>(v.num_elements()));
      for (size_t i = 0; i < x.size(); ++i) x[i] = 0.001f * static_cast<float>(i) - 0.3f;
      out.push_back(std::move(x));
    }
    return out;
  }

  static ServerOptions TwoWorkers(int shard) {
    ServerOptions options;
    options.shard_index = shard;
    options.num_shards = 2;
    options.num_workers = 2;
    return options;
  }

  zmq::context_t context_;
  testing::InProcessServer s0_{context_, TwoWorkers(0)};
  testing::InProcessServer s1_{context_, TwoWorkers(1)};
  const ModelRegistration reg_ = ThreeVariables(2, InitKind::kProvided);
};

TEST_F(ProvidedValuesTest, RankZerosValuesAreWhatEveryoneReadsAndLaterValuesAreIgnored) {
  auto chief = Client(0);
  std::vector<std::vector<float>> values = Values();
  ASSERT_TRUE(chief->Register(reg_, kWait, Pointers<const float>(values)).ok());
  // Another rank's values do not replace them: the model exists.
  std::vector<std::vector<float>> other = values;
  for (auto& v : other) std::fill(v.begin(), v.end(), 9.0f);
  auto worker = Client(1);
  ASSERT_TRUE(worker->Register(reg_, kWait, Pointers<const float>(other)).ok());
  std::vector<std::vector<float>> params;
  for (const auto& v : values) params.emplace_back(v.size());
  ASSERT_TRUE(worker->Pull(Pointers<float>(params)).ok());
  EXPECT_EQ(params, values);
}

TEST_F(ProvidedValuesTest, AWorkerWithoutValuesWaitsForRankZero) {
  auto worker = Client(1);
  std::future<Status> joined = std::async(std::launch::async, [&] {
    return worker->Register(reg_, kWait);
  });
  // Still waiting: nobody created the model.
  EXPECT_EQ(joined.wait_for(milliseconds(500)), std::future_status::timeout);
  auto chief = Client(0);
  std::vector<std::vector<float>> values = Values();
  ASSERT_TRUE(chief->Register(reg_, kWait, Pointers<const float>(values)).ok());
  const Status s = joined.get();
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::vector<std::vector<float>> params;
  for (const auto& v : values) params.emplace_back(v.size());
  ASSERT_TRUE(worker->Pull(Pointers<float>(params)).ok());
  EXPECT_EQ(params, values);
}

TEST_F(ProvidedValuesTest, AWorkerWithoutValuesGivesUpAtItsTimeoutSayingWhy) {
  auto worker = Client(1);
  const auto start = std::chrono::steady_clock::now();
  const Status s = worker->Register(reg_, milliseconds(1000));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("rank 0"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(3000));
}

TEST_F(ProvidedValuesTest, AShardWithoutProvidedSlicesNeedsNoValues) {
  // One small provided variable: a single slice, on one shard; the other holds none of it.
  ModelRegistration reg = testing::SmallModel(
      {{"w", {4}, DType::kFloat32, {InitKind::kProvided, 0}}}, 50, 2, 7, kLearningRate);
  auto chief = Client(0);
  const std::vector<float> w = {1, 2, 3, 4};
  const std::vector<const float*> values = {w.data()};
  const Status s = chief->Register(reg, kWait, values);
  ASSERT_TRUE(s.ok()) << s.ToString();
  auto worker = Client(1);
  ASSERT_TRUE(worker->Register(reg, kWait).ok());
  std::vector<float> read(4);
  std::vector<float*> params = {read.data()};
  ASSERT_TRUE(worker->Pull(params).ok());
  EXPECT_EQ(read, w);
}

TEST_F(ProvidedValuesTest, ValuesThatAreNotFiniteAreRefusedAndCreateNothing) {
  auto chief = Client(0);
  std::vector<std::vector<float>> values = Values();
  values[0][17] = std::numeric_limits<float>::quiet_NaN();
  const Status s = chief->Register(reg_, kWait, Pointers<const float>(values));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("dense/kernel"));
  values[0][17] = 0.5f;
  ASSERT_TRUE(chief->Register(reg_, kWait, Pointers<const float>(values)).ok());
}

TEST(RowsPullTest, RowsAloneArePulledWithoutTheSlices) {
  // A model with a table: rows by id, read as their initial value until updated.
  zmq::context_t context;
  testing::InProcessServer server(context, 0, 1);
  auto client = ConnectClient(context, {server.endpoint()}, 1);
  ModelRegistration reg = ThreeVariables(1);
  reg.tables.push_back({"words", 0, 4, {InitKind::kConstant, 0.75f}});
  ASSERT_TRUE(client->Register(reg, kWait).ok());
  const std::vector<uint64_t> ids = {3, 17, 1ULL << 63};
  std::vector<float> rows(ids.size() * 4, -1.0f);
  const std::vector<RowsOf> set = {{0, ids, rows.data()}};
  ASSERT_TRUE(client->Pull({}, 0, set).ok());
  EXPECT_EQ(rows, std::vector<float>(ids.size() * 4, 0.75f));
  // The reply's frames: 48 bytes of rows, not the 868 of the model's slices besides.
  const double sent = server.metrics().bytes_sent[static_cast<size_t>(MsgType::kPull)]->Value();
  EXPECT_LT(sent, 200.0) << "the slices came along";
}

}  // namespace
}  // namespace parasync
