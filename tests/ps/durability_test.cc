// Durability (ps/durability.h): when snapshots are written, what an every-update write
// stores, and the failure latch.
#include "ps/durability.h"

#include <gtest/gtest.h>

#include "tests/support/temp_dir.h"

namespace parasync {
namespace {

using Clock = std::chrono::steady_clock;
using testing::TempDir;

// SGD on one shard in async mode (the defaults), in two slices (SliceMap cuts the 12 elements
// near-equally under max_slice_elements: two of 6).
const ModelRegistration kModel{
    .variables = {{"dense/kernel", {4, 3}, DType::kFloat32, {InitKind::kUniform, 0.5f}}},
    .optimizer = {.learning_rate = 0.1f},
    .seed = 7,
    .max_slice_elements = 8,
    .model = {},
    .tables = {}};

class DurabilityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto opened = CheckpointStore::Open(tmp_.path() + "/store", 0, 1);
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    store_ = std::move(opened).value();
    RejectReason reason = RejectReason::kNone;
    ASSERT_TRUE(shard_.Register(kModel, &reason).ok());
    ASSERT_EQ(FirstSlice().count, 6);
  }
  // The whole of the first slice: Shard::Apply expects ranges the server has validated.
  SliceRange FirstSlice() const {
    return {0, 0, static_cast<int64_t>(shard_.SnapshotOfSlice(0).values.size())};
  }
  // Applies one push of ones to the first slice.
  void Push() {
    const SliceRange range = FirstSlice();
    const std::vector<float> grad(static_cast<size_t>(range.count), 1.0f);
    const float* g = grad.data();
    RejectReason reason = RejectReason::kNone;
    ASSERT_TRUE(shard_.Apply({&range, 1}, {&g, 1}, 1, &reason).ok());
  }
  Durability::Options Periodic(int64_t versions, std::chrono::milliseconds every = {}) {
    return {store_.get(), false, every, versions, false, 0};
  }

  TempDir tmp_;
  std::unique_ptr<CheckpointStore> store_;
  PsMetrics metrics_{0, 1};
  Shard shard_{0, 1, 0, 1};
  PushLedger ledger_{2};
};

TEST_F(DurabilityTest, WithoutAStoreNothingIsWrittenAndSavingSucceeds) {
  Durability d({}, &metrics_, Clock::now());
  EXPECT_FALSE(d.has_store());
  EXPECT_FALSE(d.every_update());
  EXPECT_TRUE(d.Save(shard_, ledger_, /*force=*/true).ok());
  d.MaybeSave(shard_, ledger_, Clock::now() + std::chrono::hours(1));
}

TEST_F(DurabilityTest, SaveWritesTheShardAndTheLedgerOnlyWhenTheVersionMoved) {
  Durability d(Periodic(0), &metrics_, Clock::now());
  ledger_.RecordSeq(1, PushSeq(3, 9));
  ASSERT_TRUE(d.Save(shard_, ledger_, /*force=*/false).ok());
  auto loaded = store_->Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->version, 0);
  EXPECT_EQ(loaded->ranks, ledger_.AllRecords());
  // Unchanged version: not written again unless forced.
  ledger_.RecordSeq(1, PushSeq(3, 10));
  ASSERT_TRUE(d.Save(shard_, ledger_, /*force=*/false).ok());
  EXPECT_EQ(store_->Load()->ranks[0].last_seq, PushSeq(3, 9).raw());
  ASSERT_TRUE(d.Save(shard_, ledger_, /*force=*/true).ok());
  EXPECT_EQ(store_->Load()->ranks[0].last_seq, PushSeq(3, 10).raw());
}

TEST_F(DurabilityTest, PeriodicSnapshotFallsDueAfterTheVersionsTrigger) {
  const auto t0 = Clock::now();
  Durability d(Periodic(2), &metrics_, t0);
  d.MarkSaved(0);
  Push();
  d.MaybeSave(shard_, ledger_, t0);
  EXPECT_EQ(store_->Load().status().code(), StatusCode::kNotFound);
  Push();
  d.MaybeSave(shard_, ledger_, t0);
  auto loaded = store_->Load();
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(loaded->version, 2);
}

TEST_F(DurabilityTest, PeriodicSnapshotFallsDueAfterTheTimeTrigger) {
  const auto t0 = Clock::now();
  Durability d(Periodic(0, std::chrono::seconds(30)), &metrics_, t0);
  Push();
  d.MaybeSave(shard_, ledger_, t0 + std::chrono::seconds(29));
  EXPECT_EQ(store_->Load().status().code(), StatusCode::kNotFound);
  d.MaybeSave(shard_, ledger_, t0 + std::chrono::seconds(30));
  ASSERT_TRUE(store_->Load().ok());
  EXPECT_EQ(store_->Load()->version, 1);
}

TEST_F(DurabilityTest, EveryUpdateWritesTheUpdateAndItsRecords) {
  Durability d({store_.get(), true, {}, 0, false, 0}, &metrics_, Clock::now());
  EXPECT_TRUE(d.every_update());
  ASSERT_TRUE(d.Save(shard_, ledger_, /*force=*/true).ok());  // the registered model
  Push();
  const SliceRange range = FirstSlice();
  const RankRecord record{0, PushSeq(1, 1).raw(), DataProgress{}};
  ASSERT_TRUE(d.SaveUpdate(shard_, {&range, 1}, {record}).ok());
  auto loaded = store_->Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->version, 1);
  EXPECT_EQ(loaded->ranks, std::vector<RankRecord>{record});
  EXPECT_EQ(loaded->slices[0].values, shard_.SnapshotOfSlice(0).values);
}

TEST_F(DurabilityTest, TheFirstFailureIsLatchedAndNamedAndEveryOneCounted) {
  Durability d({store_.get(), true, {}, 0, false, 0}, &metrics_, Clock::now());
  EXPECT_FALSE(d.failure().has_value());
  EXPECT_TRUE(d.LatchFailure(Status::Unavailable("disk full"), "push of rank 0"));
  ASSERT_TRUE(d.failure().has_value());
  EXPECT_NE(d.failure()->find("ps shard 0: the store in " + store_->dir() +
                              " failed a durable write (push of rank 0: disk full)"),
            std::string::npos)
      << *d.failure();
  const std::string first = *d.failure();
  EXPECT_FALSE(d.LatchFailure(Status::Unavailable("again"), "step 3"));
  EXPECT_EQ(*d.failure(), first);
  EXPECT_EQ(metrics_.checkpoint_failures->Value(), 2);
  EXPECT_EQ(metrics_.store_failed->Value(), 1);
}

}  // namespace
}  // namespace parasync
