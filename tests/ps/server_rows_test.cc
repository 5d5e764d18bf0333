// ps/server.h with embedding rows over real ZeroMQ: rows by id in pulls and pushes, every
// malformed row request refused with its reason and nothing changed, rows spread over the
// shards by id, and a sync step that averages each row over the ranks that pushed it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include <zmq.hpp>

#include "common/embedding.h"
#include "common/wire.h"
#include "ps/optimizer.h"
#include "tests/ps/server_test_util.h"
#include "worker/ps_client.h"

namespace parasync {
namespace {

using namespace server_test;

// One dense scalar, a fixed table of 100 rows x 4 and an unbounded one of 2 columns; SGD at
// learning rate 1 so an update is exactly "minus the gradient".
ModelRegistration RowsModel(int num_shards, const std::string& mode = "async") {
  ModelRegistration reg;
  reg.variables = {{"bias", {1}, DType::kFloat32, {InitKind::kZeros, 0.0f}}};
  reg.tables = {{"fixed", 100, 4, {InitKind::kUniform, 0.5f}},
                {"hashed", 0, 2, {InitKind::kConstant, 0.25f}}};
  reg.optimizer.learning_rate = 1.0f;
  reg.seed = 5;
  reg.num_shards = num_shards;
  reg.mode = mode;
  return reg;
}

std::vector<uint8_t> IdBytes(const std::vector<uint64_t>& ids) {
  std::vector<uint8_t> out(ids.size() * sizeof(uint64_t));
  std::memcpy(out.data(), ids.data(), out.size());
  return out;
}

std::vector<float> InitialRows(const ModelRegistration& reg, uint32_t table,
                               const std::vector<uint64_t>& ids) {
  const auto dim = static_cast<size_t>(reg.tables[table].dim);
  std::vector<float> out(ids.size() * dim);
  for (size_t i = 0; i < ids.size(); ++i) {
    InitializeRow(reg.tables[table].init, reg.seed, table, ids[i], out.data() + i * dim,
                  static_cast<int64_t>(dim));
  }
  return out;
}

class ServerRowsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<InProcessServer>(context_, 0, 1);
    ASSERT_TRUE(server_->started());
    client_ = ConnectClient(context_, {server_->endpoint()}, 1);
    ASSERT_NE(client_, nullptr);
    ASSERT_TRUE(client_->Register(reg_, kWait).ok());
  }

  // A raw push of `rows` (ids frame, values frame each) with the dense gradient first.
  Result<Header> RawPush(const std::vector<RowRange>& rows,
                         std::vector<std::vector<uint8_t>> row_frames) {
    RawPeer peer(context_, server_->endpoint());
    Header push;
    push.type = MsgType::kPush;
    push.batch_examples = 1;
    push.slices = {{0, 0, 1}};
    push.rows = rows;
    std::vector<std::vector<uint8_t>> frames = {FloatBytes({0.5f})};
    for (auto& f : row_frames) frames.push_back(std::move(f));
    peer.SendHeader(push, std::move(frames));
    return peer.Receive();
  }

  void ExpectRefused(const Result<Header>& reply, RejectReason reason, double times) {
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    EXPECT_EQ(reply->status.code(), StatusCode::kInvalidArgument) << reply->status.ToString();
    EXPECT_EQ(server_->Rejected(reason), times) << RejectReasonName(reason);
  }

  zmq::context_t context_;
  const ModelRegistration reg_ = RowsModel(1);
  std::unique_ptr<InProcessServer> server_;
  std::unique_ptr<PsClient> client_;
};

TEST_F(ServerRowsTest, PushedRowsAreUpdatedAndOthersReadAsTheirInitialValue) {
  const std::vector<uint64_t> ids = {1, 7, 99};
  const std::vector<float> grad = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  const float bias_grad = 0.0f;
  const float* dense[] = {&bias_grad};
  const RowsOf push{0, ids, const_cast<float*>(grad.data())};
  ASSERT_TRUE(client_->Push(dense, 1, PsClient::kLastRead, {&push, 1}).ok());

  const std::vector<uint64_t> read = {0, 1, 7, 50, 99};
  std::vector<float> got(read.size() * 4);
  std::vector<float> hashed(2 * 2);
  const std::vector<uint64_t> hashed_ids = {42, 0xffffffffffffffffULL};
  float bias = -1;
  float* params[] = {&bias};
  const RowsOf pulls[] = {{0, read, got.data()}, {1, hashed_ids, hashed.data()}};
  ASSERT_TRUE(client_->Pull(params, 0, pulls).ok());
  std::vector<float> want = InitialRows(reg_, 0, read);
  for (size_t r : {1u, 2u, 4u}) {
    const size_t g = r == 1 ? 0 : r == 2 ? 1 : 2;
    for (size_t d = 0; d < 4; ++d) want[r * 4 + d] -= grad[g * 4 + d];
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(hashed, std::vector<float>(4, 0.25f));
  auto stats = client_->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ((*stats)[0].rows_held, 3);  // pulls create no rows
  EXPECT_EQ((*stats)[0].version, 1);
  // Counted from the first push on: the series exist from the registration.
  const PsMetrics& m = server_->metrics();
  ASSERT_EQ(m.tables.size(), 2u);
  EXPECT_EQ(m.tables[0].rows_pushed->Value(), 3.0);
  EXPECT_EQ(m.tables[0].rows_pulled->Value(), 5.0);
  EXPECT_EQ(m.tables[1].rows_pulled->Value(), 2.0);
}

TEST_F(ServerRowsTest, BadRowRequestsAreRefusedWithTheirReasonAndChangeNothing) {
  const std::vector<float> values = {1, 1, 1, 1, 1, 1, 1, 1};
  ExpectRefused(RawPush({{0, 2}}, {IdBytes({9, 3}), FloatBytes(values)}), RejectReason::kOrder, 1);
  ExpectRefused(RawPush({{0, 2}}, {IdBytes({3, 3}), FloatBytes(values)}), RejectReason::kOrder, 2);
  ExpectRefused(RawPush({{0, 2}}, {IdBytes({3, 9}), FloatBytes({1, 1, 1})}),
                RejectReason::kByteLength, 1);
  ExpectRefused(RawPush({{0, 2}}, {IdBytes({3, 100}), FloatBytes(values)}),
                RejectReason::kRange, 1);
  ExpectRefused(RawPush({{0, 2}}, {IdBytes({3, 9})}), RejectReason::kFrameCount, 1);
  ExpectRefused(RawPush({{0, 3}}, {IdBytes({3, 9}), FloatBytes(values)}),
                RejectReason::kByteLength, 2);
  ExpectRefused(RawPush({{2, 2}}, {IdBytes({3, 9}), FloatBytes(values)}),
                RejectReason::kUnknownSlice, 1);
  ExpectRefused(RawPush({{1, 1}, {0, 1}}, {IdBytes({3}), FloatBytes({1, 1}), IdBytes({3}),
                                          FloatBytes({1, 1, 1, 1})}),
                RejectReason::kOrder, 3);
  std::vector<float> nan = values;
  nan[5] = std::numeric_limits<float>::quiet_NaN();
  ExpectRefused(RawPush({{0, 2}}, {IdBytes({3, 9}), FloatBytes(nan)}), RejectReason::kNonFinite, 1);
  {
    RawPeer peer(context_, server_->endpoint());
    Header pull;
    pull.type = MsgType::kPull;
    pull.rows = {{0, 2}};
    peer.SendHeader(pull, {});  // no ids frame
    ExpectRefused(peer.Receive(), RejectReason::kFrameCount, 2);
    pull.rows = {{0, 1}};
    peer.SendHeader(pull, {std::vector<uint8_t>(5, 0)});  // not whole uint64s
    ExpectRefused(peer.Receive(), RejectReason::kByteLength, 3);
  }
  // Nothing changed: no row, no version, the dense value as it was.
  auto stats = client_->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ((*stats)[0].rows_held, 0);
  EXPECT_EQ((*stats)[0].version, 0);
  const std::vector<uint64_t> ids = {3, 9};
  std::vector<float> got(8);
  float bias = -1;
  float* params[] = {&bias};
  const RowsOf pull{0, ids, got.data()};
  ASSERT_TRUE(client_->Pull(params, 0, {&pull, 1}).ok());
  EXPECT_EQ(got, InitialRows(reg_, 0, ids));
  EXPECT_EQ(bias, 0.0f);
}

TEST_F(ServerRowsTest, SixteenBitRowsAreWidenedOnTheWayInAndNarrowedOnTheWayOut) {
  // Values bfloat16 and float16 both hold exactly, so every step is exact. The "hashed" table
  // starts each row at 0.25; SGD at rate 1 subtracts each push's gradient.
  const std::vector<uint64_t> ids = {4, 40};
  const std::vector<float> grad = {0.5f, -1.0f, 2.0f, 0.25f};
  std::vector<float> want(4, 0.25f);
  for (DType wire : {DType::kBfloat16, DType::kFloat16}) {
    auto narrow = ConnectClient(context_, {server_->endpoint()}, 1, wire);
    ASSERT_NE(narrow, nullptr);
    ASSERT_TRUE(narrow->Register(reg_, kWait).ok());
    const float bias_grad = 0.0f;
    const float* dense[] = {&bias_grad};
    const RowsOf push{1, ids, const_cast<float*>(grad.data())};
    ASSERT_TRUE(narrow->Push(dense, 1, PsClient::kLastRead, {&push, 1}).ok());
    for (size_t k = 0; k < want.size(); ++k) want[k] -= grad[k];
    std::vector<float> got(4, -9.0f);
    float bias = -1;
    float* params[] = {&bias};
    const RowsOf pull{1, ids, got.data()};
    ASSERT_TRUE(narrow->Pull(params, 0, {&pull, 1}).ok());
    EXPECT_EQ(got, want) << DTypeName(wire);
  }
}

TEST_F(ServerRowsTest, TheClientRefusesUnsortedIdsAndUnknownTablesWithoutSending) {
  const std::vector<uint64_t> unsorted = {5, 2};
  std::vector<float> values(8, 1.0f);
  const float bias_grad = 0.0f;
  const float* dense[] = {&bias_grad};
  const RowsOf bad{0, unsorted, values.data()};
  EXPECT_EQ(client_->Push(dense, 1, PsClient::kLastRead, {&bad, 1}).code(),
            StatusCode::kInvalidArgument);
  const std::vector<uint64_t> ids = {2, 5};
  const RowsOf unknown{7, ids, values.data()};
  float bias = -1;
  float* params[] = {&bias};
  EXPECT_EQ(client_->Pull(params, 0, {&unknown, 1}).code(), StatusCode::kInvalidArgument);
  auto stats = client_->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ((*stats)[0].version, 0);
  EXPECT_EQ((*stats)[0].rejected, 0);  // refused here, never sent
}

TEST(ServerRowsShardsTest, RowsSpreadOverTheShardsByIdAndReadBackWhole) {
  zmq::context_t context;
  InProcessServer s0(context, 0, 2);
  InProcessServer s1(context, 1, 2);
  ASSERT_TRUE(s0.started() && s1.started());
  auto client = ConnectClient(context, {s0.endpoint(), s1.endpoint()}, 1);
  ASSERT_NE(client, nullptr);
  const ModelRegistration reg = RowsModel(2);
  ASSERT_TRUE(client->Register(reg, kWait).ok());
  std::vector<uint64_t> ids;
  for (uint64_t id = 0; id < 1000; id += 3) ids.push_back(id * 0x9e3779b97f4a7c15ULL >> 1);
  std::sort(ids.begin(), ids.end());
  std::vector<float> grad(ids.size() * 2);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>(i % 7);
  const float bias_grad = 0.0f;
  const float* dense[] = {&bias_grad};
  const RowsOf push{1, ids, grad.data()};
  ASSERT_TRUE(client->Push(dense, 1, PsClient::kLastRead, {&push, 1}).ok());
  std::vector<float> got(ids.size() * 2);
  float bias = -1;
  float* params[] = {&bias};
  const RowsOf pull{1, ids, got.data()};
  ASSERT_TRUE(client->Pull(params, 0, {&pull, 1}).ok());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], 0.25f - grad[i]) << i;
  auto stats = client->Stats();
  ASSERT_TRUE(stats.ok());
  const int64_t held0 = (*stats)[0].rows_held;
  const int64_t held1 = (*stats)[1].rows_held;
  EXPECT_EQ(held0 + held1, static_cast<int64_t>(ids.size()));
  // Both shards hold a fair share (the hash spreads ids; 334 rows, a binomial spread).
  EXPECT_GT(held0, 100);
  EXPECT_GT(held1, 100);
}

// Rank 0 pushes rows 1 and 2, rank 1 rows 2 and 3: the step applies to row 2 the average of
// both gradients and to rows 1 and 3 their one gradient each (TensorFlow's
// SyncReplicasOptimizer with IndexedSlices), not half of it.
TEST(ServerRowsSyncTest, ASyncStepAveragesEachRowOverTheRanksThatPushedIt) {
  zmq::context_t context;
  ServerOptions options;
  options.mode = *TrainingMode::Parse("sync");
  options.num_workers = 2;
  InProcessServer server(context, options);
  ASSERT_TRUE(server.started());
  const ModelRegistration reg = RowsModel(1, "sync");
  std::unique_ptr<PsClient> w[2];
  for (int r = 0; r < 2; ++r) {
    PsClientOptions o;
    o.ps_addresses = {server.endpoint()};
    o.rank = r;
    o.request_timeout = kWait;
    o.pulls_may_wait = true;
    o.blocking_timeout = kWait;
    auto c = PsClient::Connect(context, o);
    ASSERT_TRUE(c.ok());
    w[r] = std::move(c).value();
    ASSERT_TRUE(w[r]->Register(reg, kWait).ok());
  }
  const float bias_grad = 0.0f;
  const float* dense[] = {&bias_grad};
  const std::vector<uint64_t> ids0 = {1, 2};
  const std::vector<uint64_t> ids1 = {2, 3};
  std::vector<float> g0 = {1, 1, 1, 1, 2, 2, 2, 2};
  std::vector<float> g1 = {4, 4, 4, 4, 8, 8, 8, 8};
  const RowsOf p1{0, ids1, g1.data()};
  const RowsOf p0{0, ids0, g0.data()};
  ASSERT_TRUE(w[1]->Push(dense, 1, PsClient::kLastRead, {&p1, 1}).ok());
  ASSERT_TRUE(w[0]->Push(dense, 1, PsClient::kLastRead, {&p0, 1}).ok());
  const std::vector<uint64_t> ids = {1, 2, 3};
  std::vector<float> got(12);
  float bias = -1;
  float* params[] = {&bias};
  const RowsOf pull{0, ids, got.data()};
  ASSERT_TRUE(w[0]->Pull(params, 1, {&pull, 1}).ok());
  std::vector<float> want = InitialRows(reg, 0, ids);
  for (size_t d = 0; d < 4; ++d) {
    want[0 + d] -= 1.0f;                 // rank 0 alone
    want[4 + d] -= (2.0f + 4.0f) / 2.0f;  // both ranks
    want[8 + d] -= 8.0f;                 // rank 1 alone
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(w[0]->last_version(), 1);
}

}  // namespace
}  // namespace parasync
