// Durability with a real parasync-ps process and RocksDB in a temp dir: what a kill -9 may
// and may not lose, and that a push is applied once however often it is sent.
#include <signal.h>

#include <chrono>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/process_cluster.h"
#include "tests/support/process_util.h"
#include "tests/support/small_model.h"
#include "worker/ps_client.h"

namespace parasync {
namespace {

using namespace std::chrono_literals;
using testing::ProcessCluster;
using testing::TempDir;

// A model with one counter-like variable: SGD with learning rate 1 and gradient -1 adds
// exactly 1 per applied push (exact in float32 far beyond these counts).
ModelRegistration CounterModel() {
  return testing::SmallModel({{"counter", {1}, DType::kFloat32, {InitKind::kZeros, 0.0f}}},
                             kDefaultMaxSliceElements, /*num_shards=*/1, /*seed=*/0,
                             /*learning_rate=*/1.0f);
}

std::unique_ptr<PsClient> CounterClient(zmq::context_t& ctx, const std::string& address) {
  PsClientOptions o;
  o.ps_addresses = {address};
  o.rank = 0;
  o.request_timeout = 30s;
  o.resend_after = 200ms;
  o.resend_max = 400ms;
  auto c = PsClient::Connect(ctx, o);
  EXPECT_TRUE(c.ok());
  EXPECT_TRUE((*c)->Register(CounterModel(), 20s).ok());
  return std::move(c).value();
}

Status Increment(PsClient& client) {
  const float minus_one = -1.0f;
  const float* grads[] = {&minus_one};
  return client.Push(grads, 1);
}

float Counter(PsClient& client) {
  float value = -1;
  float* params[] = {&value};
  EXPECT_TRUE(client.Pull(params).ok());
  return value;
}

TEST(DurabilityTest, EveryUpdateModeLosesNoAcknowledgedPushWhenKilledAtARandomMoment) {
  TempDir dir;
  // One server the test kills and starts again (ps0.log, then ps1.log).
  ProcessCluster server(1, 1, "",
                        {"--data-dir", dir.path() + "/data", "--durability", "every-update"},
                        dir.path());
  zmq::context_t ctx;
  auto client = CounterClient(ctx, server.addresses()[0]);
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  const auto kill_after = std::chrono::milliseconds(std::uniform_int_distribution<int>(200, 900)(rng));
  std::cout << "seed " << seed << ": kill -9 after " << kill_after.count() << " ms of pushing\n";

  std::atomic<bool> restarted{false};
  std::thread killer([&] {
    std::this_thread::sleep_for(kill_after);  // the random moment, not a wait for a condition
    server.KillPs(0);
    server.StartPs(0, "ps1");
    restarted = true;
  });
  int64_t acknowledged = 0;
  int64_t after_restart = 0;
  Status failure;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (after_restart < 50 && std::chrono::steady_clock::now() < deadline) {
    const bool was_restarted = restarted.load();
    failure = Increment(*client);
    if (!failure.ok()) break;
    ++acknowledged;
    if (was_restarted) ++after_restart;
  }
  // Joined before any assertion can return: a joinable thread would end the test binary and
  // leave the restarted server running.
  killer.join();
  ASSERT_TRUE(failure.ok()) << failure.ToString();
  ASSERT_EQ(after_restart, 50) << "the client did not get through to the restarted server";
  const std::string restarted_log = testing::ReadFile(server.Log("ps1"));
  EXPECT_NE(restarted_log.find("restored from"), std::string::npos) << restarted_log;
  EXPECT_EQ(Counter(*client), static_cast<float>(acknowledged))
      << acknowledged << " pushes were acknowledged";
  auto stats = client->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ((*stats)[0].version, acknowledged);
}

TEST(DurabilityTest, PeriodicModeLosesAtMostTheCheckpointInterval) {
  TempDir dir;
  constexpr int kEvery = 10;
  constexpr int kPushes = 57;
  // One server the test kills and starts again (ps0.log, then ps1.log).
  ProcessCluster server(1, 1, "",
                        {"--data-dir", dir.path() + "/data", "--checkpoint-every", "0",
                         "--checkpoint-every-versions", std::to_string(kEvery)},
                        dir.path());
  zmq::context_t ctx;
  auto client = CounterClient(ctx, server.addresses()[0]);
  for (int i = 0; i < kPushes; ++i) ASSERT_TRUE(Increment(*client).ok());
  server.KillPs(0);
  server.StartPs(0, "ps1");
  const float restored = Counter(*client);
  std::cout << kPushes << " acknowledged, " << restored << " restored (snapshots every " << kEvery
            << " versions)\n";
  EXPECT_LE(restored, static_cast<float>(kPushes));
  EXPECT_GT(restored, static_cast<float>(kPushes - kEvery)) << "lost more than the interval";
  EXPECT_NE(testing::ReadFile(server.Log("ps1")).find("restored from"), std::string::npos);
}

TEST(DurabilityTest, PushWhoseAcknowledgementWasLostIsAppliedExactlyOnce) {
  TempDir dir;
  // The server applies every third push but does not acknowledge it, as if the connection
  // broke between apply and reply: the client sends it again, the server must not apply it
  // a second time.
  ProcessCluster server(1, 1, "", {"--fault-drop-push-reply-every", "3"}, dir.path());
  zmq::context_t ctx;
  auto client = CounterClient(ctx, server.addresses()[0]);
  constexpr int kPushes = 12;
  for (int i = 0; i < kPushes; ++i) ASSERT_TRUE(Increment(*client).ok());
  EXPECT_EQ(Counter(*client), static_cast<float>(kPushes));
  EXPECT_GE(client->resends(), kPushes / 3);
  const std::string log = testing::ReadFile(server.Log("ps0"));
  size_t drops = 0;
  for (size_t at = log.find("fault injection"); at != std::string::npos;
       at = log.find("fault injection", at + 1)) {
    ++drops;
  }
  EXPECT_EQ(drops, static_cast<size_t>(kPushes / 3)) << log;
}

}  // namespace
}  // namespace parasync
