// A Server with --durability every-update over a store whose filesystem fails (a RocksDB
// FileSystem wrapper, ps/storage_faults.h): nothing is acknowledged that is not durable, a
// refused push is not acknowledged as applied when it is sent again, a failed fsync and a
// full disk are answered alike (ServerOptions::every_update), and memory is rolled back to
// what the store holds. Real ZeroMQ on loopback, a real RocksDB in a temp dir.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "common/slice_map.h"
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

// A worker's pushes sent by hand over a DEALER of its own, so that a test can send the same
// seq again and read every field of the reply.
class RawPusher {
 public:
  RawPusher(zmq::context_t& context, const std::string& endpoint, const SliceMap& map)
      : socket_(context, zmq::socket_type::dealer), map_(map) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.set(zmq::sockopt::rcvtimeo, static_cast<int>(kWait.count()));
    socket_.connect(endpoint);
  }

  // Pushes a gradient of 0.5 for every slice of shard 0 as `rank`, with push seq `seq`,
  // computed from `version`; returns the reply's header.
  Header Push(int rank, uint64_t seq, int64_t version) {
    Header h;
    h.type = MsgType::kPush;
    h.rank = rank;
    h.request_id = ++requests_;
    h.seq = (uint64_t{77 + static_cast<uint64_t>(rank)} << 32) | seq;
    h.version = version;
    h.batch_examples = 4;
    for (uint32_t id : map_.SlicesOfShard(0)) h.slices.push_back({id, 0, map_.slices()[id].length});
    const std::vector<uint8_t> header = EncodeHeader(h);
    socket_.send(zmq::buffer(header), zmq::send_flags::sndmore);
    for (size_t i = 0; i < h.slices.size(); ++i) {
      socket_.send(zmq::buffer(gradient_.data(), static_cast<size_t>(h.slices[i].count) * 4),
                   i + 1 < h.slices.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
    zmq::message_t reply;
    EXPECT_TRUE(socket_.recv(reply).has_value()) << "no reply";
    auto decoded = DecodeHeader(reply.data(), reply.size());
    EXPECT_TRUE(decoded.ok());
    return decoded.ok() ? *decoded : Header{};
  }

 private:
  zmq::socket_t socket_;
  const SliceMap& map_;
  const std::vector<float> gradient_ = std::vector<float>(1024, 0.5f);
  uint64_t requests_ = 0;
};

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

    RawPusher pusher(context, server.endpoint(), client->slice_map());
    auto push = [&](uint64_t seq) { return pusher.Push(0, seq, 0); };

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

// The two ways a disk fails a durable write (ps/storage_faults.h), which the server answers
// alike.
enum class DiskFault { kSyncEio, kFull };

std::string FaultName(const ::testing::TestParamInfo<DiskFault>& param) {
  return param.param == DiskFault::kSyncEio ? "FsyncFailsWithEio" : "DiskFullWithEnospc";
}

class SyncStepWriteFailureTest : public ::testing::TestWithParam<DiskFault> {};

// Two ranks, so a step has a push that only joins it and one that completes it. From the
// failed write on, the push that completed the step and its resend are Unavailable, naming the
// failure; the other rank's push, answered Ok before the write was tried, learns it from
// its next-step pull.
TEST_P(SyncStepWriteFailureTest, ThePushThatCompletesAStepWhoseWriteFailsIsUnavailableAndSoIsItsResend) {
  testing::TempDir dir;
  auto faults = std::make_shared<StorageFaults>();
  {
    auto store = CheckpointStore::Open(dir.path(), 0, 1, faults);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    zmq::context_t context;
    ServerOptions options = StoreOptions("sync", store->get());
    options.num_workers = 2;
    testing::InProcessServer server(context, options);
    auto client = Client(context, server.endpoint());
    ASSERT_TRUE(client->Register(Model("sync"), kWait).ok());
    std::vector<float> w(64 * 32), b(32);
    std::vector<float*> params = {w.data(), b.data()};
    RawPusher rank0(context, server.endpoint(), client->slice_map());
    RawPusher rank1(context, server.endpoint(), client->slice_map());

    // Step 1 is durable.
    ASSERT_TRUE(rank0.Push(0, 1, 0).status.ok());
    ASSERT_TRUE(rank1.Push(1, 1, 0).status.ok());
    ASSERT_TRUE(client->Pull(params, 1).ok());
    ASSERT_EQ(client->last_version(), 1);
    const std::vector<float> durable = w;

    if (GetParam() == DiskFault::kSyncEio) {
      faults->syncs_before_eio = 0;
    } else {
      faults->space_left_bytes = 0;
    }
    const Header joined = rank0.Push(0, 2, 1);  // step 2 is not written yet: nothing fails
    EXPECT_TRUE(joined.status.ok()) << joined.status.ToString();
    EXPECT_FALSE(joined.dropped);
    const Header completed = rank1.Push(1, 2, 1);  // step 2 is written, and the write fails
    EXPECT_EQ(completed.status.code(), StatusCode::kUnavailable) << completed.status.ToString();
    EXPECT_NE(completed.status.message().find("failed a durable write (step 2"),
              std::string::npos)
        << completed.status.message();
    const std::string cause =
        GetParam() == DiskFault::kSyncEio ? "write failed" : "no space left on device";
    EXPECT_NE(completed.status.message().find(cause), std::string::npos)
        << completed.status.message();
    // Sent again with the same seq: rolled back with the step, so not "already applied".
    const Header again = rank1.Push(1, 2, 1);
    EXPECT_FALSE(again.replayed);
    EXPECT_EQ(again.status.code(), StatusCode::kUnavailable) << again.status.ToString();
    // The step is refused on the pull too; what is durable is still served.
    const Status next = client->Pull(params, 2);
    EXPECT_EQ(next.code(), StatusCode::kUnavailable) << next.ToString();
    ASSERT_TRUE(client->Pull(params).ok());
    EXPECT_EQ(client->last_version(), 1);
    EXPECT_EQ(w, durable);
    EXPECT_EQ(server.metrics().store_failed->Value(), 1.0);
  }
  // Restarted on the store: step 1 and the ranks' seqs of step 1; a failed fsync may have
  // left step 2 in the WAL (CheckpointStore::SaveUpdate), a full disk cannot have.
  const ShardSnapshot restored = Reopened(dir.path());
  EXPECT_GE(restored.version, 1);
  if (GetParam() == DiskFault::kFull) {
    EXPECT_EQ(restored.version, 1);
  }
}

INSTANTIATE_TEST_SUITE_P(Faults, SyncStepWriteFailureTest,
                         ::testing::Values(DiskFault::kSyncEio, DiskFault::kFull), FaultName);

// ---- tiered embedding tables (--table-evict demote) on a failing disk ------------------------

ServerOptions TieredOptions(CheckpointStore* store, bool every_update) {
  ServerOptions options = StoreOptions("async", store);
  options.every_update = every_update;
  options.max_table_rows = 4;
  options.table_demote = true;
  return options;
}

ModelRegistration TableModel() {
  ModelRegistration reg = Model("async");
  reg.tables = {{"ids", 0, 4, {InitKind::kUniform, 0.05f}}};
  reg.optimizer.kind = OptimizerKind::kAdagrad;
  return reg;
}

// Pushes a zero dense gradient and a gradient of `g` for rows `ids`.
Status PushRows(PsClient& client, std::vector<uint64_t> ids, float g) {
  static const std::vector<float> zw(64 * 32, 0.0f), zb(32, 0.0f);
  std::vector<const float*> dense = {zw.data(), zb.data()};
  std::vector<float> grad(ids.size() * 4, g);
  const RowsOf rows{0, ids, grad.data()};
  return client.Push(dense, 4, PsClient::kLastRead, {&rows, 1});
}

// Periodic durability: a row demoted to make room is written to the store; when the disk is
// full that write fails, and the push that needed the room is refused naming the cause, with
// the store latched failed like any failed durable write.
TEST(StoreFailureTest, AFullDiskWhileDemotingARowRefusesThePush) {
  testing::TempDir dir;
  auto faults = std::make_shared<StorageFaults>();
  auto store = CheckpointStore::Open(dir.path(), 0, 1, faults);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  zmq::context_t context;
  testing::InProcessServer server(context, TieredOptions(store->get(), false));
  auto client = Client(context, server.endpoint());
  ASSERT_TRUE(client->Register(TableModel(), kWait).ok());
  ASSERT_TRUE(PushRows(*client, {0, 1, 2, 3}, 0.5f).ok());  // memory full, every row changed
  faults->space_left_bytes = 0;
  const Status refused = PushRows(*client, {4}, 0.5f);  // row 0 must go to the store first
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable) << refused.ToString();
  EXPECT_NE(refused.message().find("no space left"), std::string::npos) << refused.message();
  EXPECT_EQ(server.metrics().store_failed->Value(), 1.0);
  EXPECT_EQ(PushRows(*client, {5}, 0.5f).code(), StatusCode::kUnavailable)
      << "a failed store acknowledges nothing more";
}

// Every-update durability with a 4-row budget: rows demoted and promoted through the store
// while the disk fills up. Every push acknowledged before the disk was full is in the store
// after a restart, each row bitwise what a server with room for every row made of the same
// acknowledged pushes; the first push the disk refused is in it nowhere.
TEST(StoreFailureTest, AFullDiskUnderATieredTableLosesNoAcknowledgedRow) {
  testing::TempDir dir, twin_dir;
  auto faults = std::make_shared<StorageFaults>();
  std::vector<std::vector<uint64_t>> acknowledged;
  {
    auto store = CheckpointStore::Open(dir.path(), 0, 1, faults);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    zmq::context_t context;
    testing::InProcessServer server(context, TieredOptions(store->get(), true));
    auto client = Client(context, server.endpoint());
    ASSERT_TRUE(client->Register(TableModel(), kWait).ok());
    for (uint64_t step = 0; step < 40; ++step) {
      if (step == 20) faults->space_left_bytes = 64 << 10;  // the disk fills up from here
      const std::vector<uint64_t> ids = {step % 10, 10 + step % 7};
      const Status pushed = PushRows(*client, ids, 0.1f * static_cast<float>(step + 1));
      if (!pushed.ok()) {
        EXPECT_EQ(pushed.code(), StatusCode::kUnavailable) << pushed.ToString();
        break;
      }
      acknowledged.push_back(ids);
    }
    ASSERT_GT(acknowledged.size(), 20u);
    ASSERT_LT(acknowledged.size(), 40u) << "the disk never filled up";
  }
  // The twin: room for every row, no store, the acknowledged pushes only.
  std::vector<float> want(17 * 4);
  {
    zmq::context_t context;
    ServerOptions options = StoreOptions("async", nullptr);
    options.every_update = false;
    testing::InProcessServer twin(context, options);
    auto client = Client(context, twin.endpoint());
    ASSERT_TRUE(client->Register(TableModel(), kWait).ok());
    for (size_t step = 0; step < acknowledged.size(); ++step) {
      ASSERT_TRUE(PushRows(*client, acknowledged[step], 0.1f * static_cast<float>(step + 1)).ok());
    }
    std::vector<uint64_t> all(17);
    for (uint64_t id = 0; id < 17; ++id) all[id] = id;
    std::vector<float> w(64 * 32), b(32);
    std::vector<float*> params = {w.data(), b.data()};
    const RowsOf rows{0, all, want.data()};
    ASSERT_TRUE(client->Pull(params, 0, {&rows, 1}).ok());
  }
  const ShardSnapshot restored = Reopened(dir.path());
  ASSERT_EQ(restored.rows.size(), 17u) << "a row of an acknowledged push is missing";
  for (const RowSnapshot& r : restored.rows) {
    const std::vector<float> expected(want.begin() + static_cast<int64_t>(r.id) * 4,
                                      want.begin() + static_cast<int64_t>(r.id + 1) * 4);
    EXPECT_EQ(r.values, expected) << "row " << r.id;
  }
  EXPECT_EQ(restored.version, static_cast<int64_t>(acknowledged.size()));
}

}  // namespace
}  // namespace parasync
