// A Server with --durability every-update over a store whose filesystem fails (a RocksDB
// FileSystem wrapper, ps/storage_faults.h): nothing is acknowledged that is not durable, a
// refused push is not acknowledged as applied when it is sent again, and memory is rolled
// back to what the store holds. Real ZeroMQ on loopback, a real RocksDB in a temp dir.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "common/wire.h"
#include "ps/checkpoint_store.h"
#include "ps/server.h"
#include "ps/storage_faults.h"
#include "tests/support/in_process_server.h"
#include "tests/support/small_model.h"
#include "tests/support/temp_dir.h"
#include "worker/ps_client.h"

namespace parasync {
namespace {

using namespace std::chrono_literals;
constexpr auto kWait = std::chrono::milliseconds(10000);

ModelRegistration Model(const std::string& mode) {
  ModelRegistration reg = testing::SmallModel(
      {{"w", {64, 32}, DType::kFloat32, {InitKind::kUniform, 0.1f}},
       {"b", {32}, DType::kFloat32, {InitKind::kZeros, 0.0f}}},
      /*max_slice_elements=*/1024, /*num_shards=*/1, /*seed=*/5, /*learning_rate=*/0.1f);
  reg.mode = mode;
  return reg;
}

// A Server over `store` with --durability every-update, serving until destroyed.
ServerOptions StoreOptions(const std::string& mode, CheckpointStore* store) {
  ServerOptions options;
  auto parsed = TrainingMode::Parse(mode);
  EXPECT_TRUE(parsed.ok());
  options.mode = *parsed;
  options.store = store;
  options.every_update = true;
  return options;
}

std::unique_ptr<PsClient> Client(zmq::context_t& context, const std::string& endpoint) {
  PsClientOptions o;
  o.ps_addresses = {endpoint};
  o.rank = 0;
  o.request_timeout = kWait;
  o.blocking_timeout = kWait;
  auto c = PsClient::Connect(context, o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::move(c).value();
}

// What the store holds once its server is gone, read through a store opened afresh.
ShardSnapshot Reopened(const std::string& dir) {
  auto store = CheckpointStore::Open(dir, 0, 1);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  if (!store.ok()) return {};
  auto snap = (*store)->Load();
  EXPECT_TRUE(snap.ok()) << snap.status().ToString();
  return snap.ok() ? *snap : ShardSnapshot{};
}

TEST(StoreFailureTest, SyncEveryUpdateAcknowledgesNoStepTheStoreFailedToPersist) {
  testing::TempDir dir;
  auto faults = std::make_shared<StorageFaults>();
  int64_t acknowledged = 0;  // the highest version a pull reply showed the worker
  std::string refusal;
  {
    auto store = CheckpointStore::Open(dir.path(), 0, 1, faults);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    zmq::context_t context;
    testing::InProcessServer server(context, StoreOptions("sync", store->get()));
    auto client = Client(context, server.endpoint());
    const ModelRegistration reg = Model("sync");
    ASSERT_TRUE(client->Register(reg, kWait).ok());
    std::vector<float> w(64 * 32), b(32), gw(64 * 32, 0.01f), gb(32, 0.02f);
    std::vector<float*> params = {w.data(), b.data()};
    std::vector<const float*> grads = {gw.data(), gb.data()};
    for (int step = 0; step < 12; ++step) {
      if (step == 6) faults->syncs_before_eio = 0;  // the disk fails from step 7 on
      Status pushed = client->Push(grads, 8);
      if (!pushed.ok()) {
        refusal = pushed.ToString();
        break;
      }
      Status pulled = client->Pull(params, PsClient::kNextStep);
      if (!pulled.ok()) {
        refusal = pulled.ToString();
        break;
      }
      acknowledged = std::max(acknowledged, client->last_version());
    }
    EXPECT_EQ(acknowledged, 6) << "steps 1-6 were durable";
    EXPECT_NE(refusal.find("failed a durable write"), std::string::npos) << refusal;
    EXPECT_EQ(server.metrics().store_failed->Value(), 1.0);
    EXPECT_GE(server.metrics().checkpoint_failures->Value(), 1.0);
    // Pulls of what is durable are still served.
    EXPECT_TRUE(client->Pull(params).ok());
    EXPECT_EQ(client->last_version(), 6);
  }
  const ShardSnapshot restored = Reopened(dir.path());
  std::printf("sync every-update, EIO from step 7: acknowledged %lld, restored %lld\n",
              static_cast<long long>(acknowledged), static_cast<long long>(restored.version));
  EXPECT_GE(restored.version, acknowledged) << "an acknowledged step was lost";
}

TEST(StoreFailureTest, AsyncPushRefusedAsNotDurableIsNotAcknowledgedWhenSentAgain) {
  testing::TempDir dir;
  auto faults = std::make_shared<StorageFaults>();
  {
    auto store = CheckpointStore::Open(dir.path(), 0, 1, faults);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    zmq::context_t context;
    testing::InProcessServer server(context, StoreOptions("async", store->get()));
    auto client = Client(context, server.endpoint());
    const ModelRegistration reg = Model("async");
    ASSERT_TRUE(client->Register(reg, kWait).ok());
    std::vector<float> w(64 * 32), b(32);
    std::vector<float*> params = {w.data(), b.data()};

    zmq::socket_t raw(context, zmq::socket_type::dealer);
    raw.set(zmq::sockopt::linger, 0);
    raw.set(zmq::sockopt::rcvtimeo, static_cast<int>(kWait.count()));
    raw.connect(server.endpoint());
    const std::vector<float> gradient(1024, 0.5f);
    auto push = [&](uint64_t seq) -> Header {
      Header h;
      h.type = MsgType::kPush;
      h.rank = 0;
      h.request_id = seq;
      h.seq = (uint64_t{77} << 32) | seq;
      h.batch_examples = 4;
      for (uint32_t id : client->slice_map().SlicesOfShard(0)) {
        h.slices.push_back({id, 0, client->slice_map().slices()[id].length});
      }
      const std::vector<uint8_t> header = EncodeHeader(h);
      raw.send(zmq::buffer(header), zmq::send_flags::sndmore);
      for (size_t i = 0; i < h.slices.size(); ++i) {
        raw.send(zmq::buffer(gradient.data(), static_cast<size_t>(h.slices[i].count) * 4),
                 i + 1 < h.slices.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
      }
      zmq::message_t reply;
      EXPECT_TRUE(raw.recv(reply).has_value()) << "no reply";
      auto decoded = DecodeHeader(reply.data(), reply.size());
      EXPECT_TRUE(decoded.ok());
      return decoded.ok() ? *decoded : Header{};
    };

    ASSERT_TRUE(push(1).status.ok());
    ASSERT_TRUE(client->Pull(params).ok());
    const std::vector<float> durable = w;
    faults->syncs_before_eio = 0;
    const Header refused = push(2);
    EXPECT_EQ(refused.status.code(), StatusCode::kUnavailable) << refused.status.ToString();
    EXPECT_NE(refused.status.message().find("failed a durable write"), std::string::npos)
        << refused.status.message();
    // Sent again with the same seq: it was never durable, so never "already applied".
    const Header again = push(2);
    EXPECT_FALSE(again.replayed);
    EXPECT_EQ(again.status.code(), StatusCode::kUnavailable) << again.status.ToString();
    // Memory holds what is durable, not the update that was refused.
    ASSERT_TRUE(client->Pull(params).ok());
    EXPECT_EQ(client->last_version(), 1);
    EXPECT_EQ(w, durable);
    EXPECT_EQ(server.metrics().store_failed->Value(), 1.0);
  }
  // The store holds the acknowledged push (and no more than what was written).
  const ShardSnapshot restored = Reopened(dir.path());
  EXPECT_GE(restored.version, 1);
}

}  // namespace
}  // namespace parasync
