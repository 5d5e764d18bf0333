// The parameter server's training modes over the wire (sync, ssp:K, async with staleness)
// and worker liveness, with real clients over ZeroMQ on loopback.
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
#include "worker/heartbeater.h"
#include "tests/ps/server_test_util.h"
#include "tests/support/temp_dir.h"
#include "worker/ps_client.h"

namespace parasync {
namespace {

using namespace server_test;  // this file's helpers: tests/ps/server_test_util.h
using ::testing::HasSubstr;

// --- Training modes over the wire: sync, ssp:K, liveness ---

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
    server_ = std::make_unique<InProcessServer>(context_, options);
    return server_->started();
  }

  // A registered PsClient for `rank`, or nullptr with a failure recorded; with `group`, in
  // that local group.
  std::unique_ptr<PsClient> Worker(int rank, const ModelRegistration& reg,
                                   std::optional<LocalGroupOptions> group = std::nullopt) {
    PsClientOptions options;
    options.ps_addresses = {server_->endpoint()};
    options.rank = rank;
    options.local_group = std::move(group);
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

  // A sync server for two workers, both registered, and the gradients each rank pushes.
  struct SyncPair {
    ModelRegistration reg;
    std::unique_ptr<PsClient> w0;
    std::unique_ptr<PsClient> w1;
    std::vector<std::vector<float>> g0;
    std::vector<std::vector<float>> g1;
  };
  // Call through ASSERT_NO_FATAL_FAILURE.
  void StartSyncPair(SyncPair& pair) {
    ASSERT_TRUE(Start(ModeOptions("sync", 2)));
    pair.reg = ModeModel("sync");
    pair.w0 = Worker(0, pair.reg);
    pair.w1 = Worker(1, pair.reg);
    ASSERT_TRUE(pair.w0 && pair.w1);
    pair.g0 = GradientsOfRank(pair.reg, 0);
    pair.g1 = GradientsOfRank(pair.reg, 1);
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
  std::unique_ptr<InProcessServer> server_;
};

// How long a pull that must wait is watched for an early answer.
constexpr milliseconds kStillParked{200};

// A worker's data position (for resuming) comes back at Register once its gradient counts:
// at once in async mode, in sync mode only when the step it went into is applied.
TEST_F(ModeServerTest, ARanksDataPositionIsToldAtRegisterOnceItsGradientCounts) {
  SyncPair pair;
  ASSERT_NO_FATAL_FAILURE(StartSyncPair(pair));
  auto& [reg, w0, w1, g0, g1] = pair;
  EXPECT_TRUE(w0->recorded_progress().empty());
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

// A SIGKILL between the shards' replies can leave one shard a push of a worker ahead; the
// restarted worker resumes from the other's position and pushes that batch again. Here it was
// applied already: acknowledged, not applied twice. Past it, pushes apply as ever.
TEST_F(ModeServerTest, ARestartedRanksPushOfExamplesAppliedHereIsNotAppliedAgain) {
  ASSERT_TRUE(Start(ModeOptions("async", 1)));
  const ModelRegistration reg = ModeModel("async");
  std::unique_ptr<PsClient> w0 = Worker(0, reg);
  ASSERT_NE(w0, nullptr);
  std::vector<std::vector<float>> g = GradientsOfRank(reg, 0);
  w0->set_progress({1, 4, 12});
  ASSERT_TRUE(w0->Push(Pointers<const float>(g), 4).ok());
  w0->set_progress({1, 8, 12});
  ASSERT_TRUE(w0->Push(Pointers<const float>(g), 4).ok());
  ASSERT_EQ(StatsOf(*w0).version, 2);
  w0.reset();  // the process dies

  std::unique_ptr<PsClient> again = Worker(0, reg);
  ASSERT_NE(again, nullptr);
  ASSERT_EQ(again->recorded_progress(), (DataProgress{1, 8, 12}));
  // It resumed from 4 (another shard's record): the batch up to 8 was applied here.
  again->set_progress({1, 8, 12});
  ASSERT_TRUE(again->Push(Pointers<const float>(g), 4).ok());
  EXPECT_EQ(StatsOf(*again).version, 2) << "the batch was applied a second time";
  again->set_progress({1, 12, 12});
  ASSERT_TRUE(again->Push(Pointers<const float>(g), 4).ok());
  EXPECT_EQ(StatsOf(*again).version, 3);
  // Its next epoch starts over in the same data: new examples, applied.
  again->set_progress({2, 4, 12});
  ASSERT_TRUE(again->Push(Pointers<const float>(g), 4).ok());
  EXPECT_EQ(StatsOf(*again).version, 4);
}

TEST_F(ModeServerTest, SyncPullWaitsForEveryRankThenSeesTheMeanGradient) {
  SyncPair pair;
  ASSERT_NO_FATAL_FAILURE(StartSyncPair(pair));
  auto& [reg, w0, w1, g0, g1] = pair;

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
  SyncPair pair;
  ASSERT_NO_FATAL_FAILURE(StartSyncPair(pair));
  auto& [reg, w0, w1, g0, g1] = pair;
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
  SyncPair pair;
  ASSERT_NO_FATAL_FAILURE(StartSyncPair(pair));
  auto& [reg, w0, w1, g0, g1] = pair;
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

// Local aggregation (worker/local_group.h): ranks 0 and 1 are a group, rank 2 pushes alone.
// The group's leader pushes g0 + g1 naming rank 1; the step counts three contributors and
// applies the mean of all three gradients, which every rank reads.
TEST_F(ModeServerTest, ALocalGroupsPushCountsItsMembersAndTheStepIsTheMeanOverEveryWorker) {
  ASSERT_TRUE(Start(ModeOptions("sync", 3)));
  const ModelRegistration reg = ModeModel("sync");
  testing::TempDir dir;
  LocalGroupOptions group;
  group.endpoint = "ipc://" + dir.path() + "/group.sock";
  group.ranks = {0, 1};
  group.rank = 0;
  auto w0 = Worker(0, reg, group);
  group.rank = 1;
  auto w1 = Worker(1, reg, group);
  auto w2 = Worker(2, reg);
  ASSERT_TRUE(w0 && w1 && w2);
  std::vector<std::vector<std::vector<float>>> g = {GradientsOfRank(reg, 0),
                                                    GradientsOfRank(reg, 1), Gradients(reg)};
  for (float& x : g[2][0]) x *= 0.25f;  // a third gradient unlike the others
  std::vector<std::vector<std::vector<float>>> params = {NewParams(), NewParams(), NewParams()};
  std::vector<PsClient*> workers = {w0.get(), w1.get(), w2.get()};
  std::vector<std::future<Status>> steps;
  for (size_t r = 0; r < 3; ++r) {
    steps.push_back(std::async(std::launch::async, [&, r] {
      return workers[r]->PushPull(Pointers<const float>(g[r]), 8, Pointers<float>(params[r]),
                                  PsClient::kNextStep);
    }));
  }
  for (size_t r = 0; r < 3; ++r) {
    ASSERT_EQ(steps[r].wait_for(kWait), std::future_status::ready) << "rank " << r;
    Status s = steps[r].get();
    ASSERT_TRUE(s.ok()) << "rank " << r << ": " << s.ToString();
    EXPECT_EQ(workers[r]->last_version(), 1) << "rank " << r;
  }
  const std::vector<std::vector<float>> init = InitialValues(reg);
  for (size_t v = 0; v < init.size(); ++v) {
    for (size_t i = 0; i < init[v].size(); ++i) {
      const float mean = ((g[0][v][i] + g[1][v][i]) + g[2][v][i]) / 3.0f;
      const float want = init[v][i] - kLearningRate * mean;
      for (size_t r = 0; r < 3; ++r) {
        EXPECT_NEAR(params[r][v][i], want, 1e-6f) << "rank " << r << " " << v << "[" << i << "]";
      }
    }
  }
  const ShardStats stats = StatsOf(*w2);
  EXPECT_EQ(stats.version, 1);
  EXPECT_EQ(stats.examples, 24);
  ASSERT_EQ(stats.workers.size(), 3u);
  EXPECT_EQ(stats.workers[0].gradients, 1);
  EXPECT_EQ(stats.workers[1].gradients, 0) << "the member pushed to the server itself";
  EXPECT_EQ(stats.workers[2].gradients, 1);
  // Without a step, a group member's lone push has nothing to join: refused before sending.
  EXPECT_EQ(w1->Push(Pointers<const float>(g[1]), 8).code(), StatusCode::kFailedPrecondition);

  // The leader's training ends (Leave): the member's next step finds the group closed and
  // goes to the servers itself, as does rank 2; the step is theirs alone.
  ASSERT_TRUE(w0->Leave(kWait).ok());
  steps.clear();
  for (size_t r = 1; r < 3; ++r) {
    steps.push_back(std::async(std::launch::async, [&, r] {
      return workers[r]->PushPull(Pointers<const float>(g[r]), 8, Pointers<float>(params[r]),
                                  PsClient::kNextStep);
    }));
  }
  for (size_t r = 1; r < 3; ++r) {
    ASSERT_EQ(steps[r - 1].wait_for(kWait), std::future_status::ready) << "rank " << r;
    Status s = steps[r - 1].get();
    ASSERT_TRUE(s.ok()) << "rank " << r << ": " << s.ToString();
    EXPECT_EQ(workers[r]->last_version(), 2) << "rank " << r;
  }
  EXPECT_EQ(params[1], params[2]);
  const ShardStats after = StatsOf(*w2);
  EXPECT_EQ(after.version, 2);
  EXPECT_EQ(after.workers[1].gradients, 1) << "the member's own push after the group closed";
}

// A group's push is refused where it cannot be what it says: outside a sync mode, or naming
// the sender itself, a rank outside the cluster, or one rank twice.
TEST_F(ModeServerTest, ALocalGroupsPushIsRefusedOutsideSyncAndForRanksThatAreNotOthers) {
  Header push;
  push.type = MsgType::kPush;
  push.rank = 0;
  push.batch_examples = 4;
  push.slices = {{0, 0, 50}};
  const std::vector<float> g(50, 0.5f);
  for (const char* mode : {"async", "ssp:2"}) {
    ASSERT_TRUE(Start(ModeOptions(mode, 2)));
    auto client = Worker(0, ModeModel(mode));
    ASSERT_TRUE(client);
    RawPeer peer(context_, server_->endpoint());
    push.ranks = {1};
    peer.SendHeader(push, {FloatBytes(g)});
    Result<Header> reply = peer.Receive();
    ASSERT_TRUE(reply.ok());
    EXPECT_EQ(reply->status.code(), StatusCode::kFailedPrecondition) << mode;
    EXPECT_THAT(reply->status.message(), HasSubstr("needs a sync mode"));
    EXPECT_EQ(server_->Rejected(RejectReason::kUnsupported), 1.0) << mode;
    EXPECT_EQ(StatsOf(*client).workers[0].gradients, 0) << mode;
  }
  ASSERT_TRUE(Start(ModeOptions("sync", 3)));
  auto client = Worker(0, ModeModel("sync"));
  ASSERT_TRUE(client);
  RawPeer peer(context_, server_->endpoint());
  double refused = 0;
  for (const std::vector<int32_t>& ranks :
       {std::vector<int32_t>{0}, std::vector<int32_t>{3}, std::vector<int32_t>{-1},
        std::vector<int32_t>{1, 1}}) {
    push.ranks = ranks;
    peer.SendHeader(push, {FloatBytes(g)});
    Result<Header> reply = peer.Receive();
    ASSERT_TRUE(reply.ok());
    EXPECT_EQ(reply->status.code(), StatusCode::kInvalidArgument) << reply->status.message();
    EXPECT_EQ(server_->Rejected(RejectReason::kBadRank), ++refused);
  }
  EXPECT_EQ(StatsOf(*client).version, 0);
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

}  // namespace
}  // namespace parasync
