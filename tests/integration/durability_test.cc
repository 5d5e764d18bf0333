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

#include "tests/support/process_util.h"
#include "worker/ps_client.h"

namespace parasync {
namespace {

using namespace std::chrono_literals;
using testing::Child;
using testing::TempDir;

// One parameter server the test can kill and start again on the same data directory.
class Server {
 public:
  Server(const TempDir& dir, std::vector<std::string> flags) : dir_(dir.path()), flags_(std::move(flags)) {
    const auto ports = testing::FreePorts(2);
    address_ = "127.0.0.1:" + std::to_string(ports[0]);
    worker_ = "127.0.0.1:" + std::to_string(ports[1]);
    Start();
  }
  void Start() {
    std::vector<std::string> argv = {testing::BinDir() + "/parasync-ps", "--ps-hosts", address_,
                                     "--worker-hosts", worker_, "--task-index", "0"};
    argv.insert(argv.end(), flags_.begin(), flags_.end());
    child_ = std::make_unique<Child>(
        Child::Start(argv, dir_ + "/ps" + std::to_string(starts_++) + ".log"));
  }
  void Kill() {
    child_->Signal(SIGKILL);
    ASSERT_TRUE(child_->Wait(10s).has_value());
  }
  std::string Log(int start) const {
    return testing::ReadFile(dir_ + "/ps" + std::to_string(start) + ".log");
  }
  const std::string& address() const { return address_; }

 private:
  std::string dir_;
  std::vector<std::string> flags_;
  std::string address_;
  std::string worker_;
  int starts_ = 0;
  std::unique_ptr<Child> child_;
};

// A model with one counter-like variable: SGD with learning rate 1 and gradient -1 adds
// exactly 1 per applied push (exact in float32 far beyond these counts).
ModelRegistration CounterModel() {
  ModelRegistration reg;
  reg.variables = {{"counter", {1}, DType::kFloat32, {InitKind::kZeros, 0.0f}}};
  reg.optimizer.kind = OptimizerKind::kSgd;
  reg.optimizer.learning_rate = 1.0f;
  reg.num_shards = 1;
  return reg;
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
  Server server(dir, {"--data-dir", dir.path() + "/data", "--durability", "every-update"});
  zmq::context_t ctx;
  auto client = CounterClient(ctx, server.address());
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  const auto kill_after = std::chrono::milliseconds(std::uniform_int_distribution<int>(200, 900)(rng));
  std::cout << "seed " << seed << ": kill -9 after " << kill_after.count() << " ms of pushing\n";

  std::atomic<bool> restarted{false};
  std::thread killer([&] {
    std::this_thread::sleep_for(kill_after);  // the random moment, not a wait for a condition
    server.Kill();
    server.Start();
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
  EXPECT_NE(server.Log(1).find("restored from"), std::string::npos) << server.Log(1);
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
  Server server(dir, {"--data-dir", dir.path() + "/data", "--checkpoint-every", "0",
                      "--checkpoint-every-versions", std::to_string(kEvery)});
  zmq::context_t ctx;
  auto client = CounterClient(ctx, server.address());
  for (int i = 0; i < kPushes; ++i) ASSERT_TRUE(Increment(*client).ok());
  server.Kill();
  server.Start();
  const float restored = Counter(*client);
  std::cout << kPushes << " acknowledged, " << restored << " restored (snapshots every " << kEvery
            << " versions)\n";
  EXPECT_LE(restored, static_cast<float>(kPushes));
  EXPECT_GT(restored, static_cast<float>(kPushes - kEvery)) << "lost more than the interval";
  EXPECT_NE(server.Log(1).find("restored from"), std::string::npos);
}

TEST(DurabilityTest, PushWhoseAcknowledgementWasLostIsAppliedExactlyOnce) {
  TempDir dir;
  // The server applies every third push but does not acknowledge it, as if the connection
  // broke between apply and reply: the client sends it again, the server must not apply it
  // a second time.
  Server server(dir, {"--fault-drop-push-reply-every", "3"});
  zmq::context_t ctx;
  auto client = CounterClient(ctx, server.address());
  constexpr int kPushes = 12;
  for (int i = 0; i < kPushes; ++i) ASSERT_TRUE(Increment(*client).ok());
  EXPECT_EQ(Counter(*client), static_cast<float>(kPushes));
  EXPECT_GE(client->resends(), kPushes / 3);
  const std::string log = server.Log(0);
  size_t drops = 0;
  for (size_t at = log.find("fault injection"); at != std::string::npos;
       at = log.find("fault injection", at + 1)) {
    ++drops;
  }
  EXPECT_EQ(drops, static_cast<size_t>(kPushes / 3)) << log;
}

}  // namespace
}  // namespace parasync
