// ps/checkpoint_store.h: what a store saves it loads, across shards and restarts.
// (Failing disks: checkpoint_store_fault_test.cc; damaged stores:
// checkpoint_store_damage_test.cc.)
#include "ps/checkpoint_store.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ps/storage_faults.h"
#include "tests/ps/checkpoint_store_test_util.h"
#include "tests/support/dir_image.h"
#include "tests/support/in_child.h"
#include "tests/support/temp_dir.h"

namespace parasync {
namespace {

// This file's helpers: tests/ps/checkpoint_store_test_util.h.
using namespace checkpoint_store_test;
using testing::RunInChild;
using testing::TempDir;

TEST(CheckpointStoreTest, SaveThenLoadRoundTripsEveryField) {
  TempDir tmp;
  auto store = MustOpen(tmp.path(), 1, 2);
  ASSERT_NE(store, nullptr);
  const ShardSnapshot snap = MakeSnapshot();
  ASSERT_TRUE(store->Save(snap, /*sync=*/true).ok());

  const ShardSnapshot got = MustLoad(*store);
  EXPECT_TRUE(got.registration == snap.registration);
  EXPECT_EQ(got.version, 41);
  EXPECT_EQ(got.examples, 41 * 32);
  ASSERT_EQ(got.slices.size(), 3u);
  EXPECT_EQ(got.slices[0].updates, 17);
  EXPECT_EQ(got.slices[1].slots[1], snap.slices[1].slots[1]);
  EXPECT_EQ(got.ranks, snap.ranks);
  EXPECT_TRUE(got == snap);
  EXPECT_EQ(store->dir(), tmp.path());
}

TEST(CheckpointStoreTest, SlicesWithoutSlotsAndEmptySnapshotsRoundTrip) {
  TempDir tmp;
  auto store = MustOpen(tmp.path(), 0, 1);
  ASSERT_NE(store, nullptr);
  ShardSnapshot snap;
  snap.registration = AdamModel(1);
  ASSERT_TRUE(store->Save(snap, false).ok());
  EXPECT_TRUE(MustLoad(*store) == snap);

  SliceSnapshot sgd;
  sgd.id = 0;
  sgd.values = {1.5f, -2.5f};
  snap.slices = {sgd};
  ASSERT_TRUE(store->Save(snap, false).ok());
  EXPECT_TRUE(MustLoad(*store) == snap);
}

TEST(CheckpointStoreTest, LoadOnFreshStoreIsNotFound) {
  TempDir tmp;
  auto store = MustOpen(tmp.path(), 0, 1);
  ASSERT_NE(store, nullptr);
  Result<ShardSnapshot> snap = store->Load();
  ASSERT_FALSE(snap.ok());
  EXPECT_EQ(snap.status().code(), StatusCode::kNotFound) << snap.status().ToString();
}

TEST(CheckpointStoreTest, OpenCreatesMissingDirectory) {
  TempDir tmp;
  const std::string dir = tmp.File("a/b/shard-0");
  auto store = MustOpen(dir, 0, 1);
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(fs::is_directory(dir));
  EXPECT_EQ(store->Load().status().code(), StatusCode::kNotFound);
}

TEST(CheckpointStoreTest, SecondSaveReplacesTheFirstCompletely) {
  TempDir tmp;
  auto store = MustOpen(tmp.path(), 1, 2);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Save(MakeSnapshot(), false).ok());

  ShardSnapshot second;
  second.registration = AdamModel(2);
  second.version = 7;
  second.examples = 70;
  second.slices = {MakeSlice(3, 7, 30.0f, 2)};
  second.ranks = {{1, 9, {}}};
  ASSERT_TRUE(store->Save(second, false).ok());

  const ShardSnapshot got = MustLoad(*store);
  EXPECT_TRUE(got == second);
  ASSERT_EQ(got.slices.size(), 1u);  // slices 1 and 5 are gone
  EXPECT_EQ(got.slices[0].values, second.slices[0].values);
  ASSERT_EQ(got.ranks.size(), 1u);  // ranks -1, 0 and 2 are gone
  EXPECT_EQ(got.ranks[0].rank, 1);
}

TEST(CheckpointStoreTest, SaveUpdateChangesOnlyTheNamedSlicesAndTheState) {
  TempDir tmp;
  auto store = MustOpen(tmp.path(), 1, 2);
  ASSERT_NE(store, nullptr);
  const ShardSnapshot before = MakeSnapshot();
  ASSERT_TRUE(store->Save(before, false).ok());

  const SliceSnapshot updated = MakeSlice(3, 7, 33.0f, 6);
  ASSERT_TRUE(
      store->SaveUpdate(42, 42 * 32, {&updated}, {RankRecord{0, 41, {3, 180, 600}}}, true).ok());

  ShardSnapshot expected = before;
  expected.version = 42;
  expected.examples = 42 * 32;
  expected.slices[1] = updated;
  expected.ranks[1].last_seq = 41;
  expected.ranks[1].progress = {3, 180, 600};
  EXPECT_TRUE(MustLoad(*store) == expected);

  // A rank seen for the first time is added; no rank leaves the others alone.
  ASSERT_TRUE(store->SaveUpdate(43, 43 * 32, {}, {RankRecord{1, 1, {}}}, false).ok());
  ASSERT_TRUE(store->SaveUpdate(44, 44 * 32, {}, {}, false).ok());
  expected.version = 44;
  expected.examples = 44 * 32;
  expected.ranks.insert(expected.ranks.begin() + 2, RankRecord{1, 1, {}});
  EXPECT_TRUE(MustLoad(*store) == expected);
}

TEST(CheckpointStoreTest, SaveUpdateBeforeAnySaveIsFailedPrecondition) {
  TempDir tmp;
  auto store = MustOpen(tmp.path(), 0, 1);
  ASSERT_NE(store, nullptr);
  const SliceSnapshot slice = MakeSlice(0, 4, 1.0f, 1);
  Status s = store->SaveUpdate(1, 8, {&slice}, {}, false);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_EQ(store->Load().status().code(), StatusCode::kNotFound);
}

TEST(CheckpointStoreTest, SaveRefusesBadSnapshotsAndWritesNothing) {
  TempDir tmp;
  auto store = MustOpen(tmp.path(), 1, 2);
  ASSERT_NE(store, nullptr);
  const ShardSnapshot good = MakeSnapshot();
  ASSERT_TRUE(store->Save(good, false).ok());

  ShardSnapshot short_slot = good;
  short_slot.version = 100;
  short_slot.slices[2].slots[1].pop_back();
  EXPECT_EQ(store->Save(short_slot, false).code(), StatusCode::kInvalidArgument);

  ShardSnapshot unordered = good;
  std::swap(unordered.slices[0], unordered.slices[1]);
  EXPECT_EQ(store->Save(unordered, false).code(), StatusCode::kInvalidArgument);

  ShardSnapshot twice = good;
  twice.ranks.push_back({0, 1, {}});
  EXPECT_EQ(store->Save(twice, false).code(), StatusCode::kInvalidArgument);

  ShardSnapshot other_count = good;
  other_count.registration.num_shards = 3;
  EXPECT_EQ(store->Save(other_count, false).code(), StatusCode::kInvalidArgument);

  const SliceSnapshot bad = short_slot.slices[2];
  EXPECT_EQ(store->SaveUpdate(100, 1, {&bad}, {}, false).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(MustLoad(*store) == good);
}

TEST(CheckpointStoreTest, ReopenAfterCloseKeepsTheData) {
  TempDir tmp;
  ShardSnapshot expected = MakeSnapshot();
  {
    auto store = MustOpen(tmp.path(), 1, 2);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Save(expected, false).ok());
    const SliceSnapshot updated = MakeSlice(5, 5, 55.0f, 1);
    ASSERT_TRUE(
        store->SaveUpdate(50, 1600, {&updated}, {RankRecord{2, 12345678902ull, {}}}, false).ok());
    expected.version = 50;
    expected.examples = 1600;
    expected.slices[2] = updated;
    expected.ranks[2].last_seq = 12345678902ull;
  }
  auto store = MustOpen(tmp.path(), 1, 2);
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(MustLoad(*store) == expected);
  // The stored registration counts as the Save that SaveUpdate needs.
  EXPECT_TRUE(store->SaveUpdate(51, 1632, {}, {}, true).ok());
  EXPECT_EQ(MustLoad(*store).version, 51);
}

// The cold tier's side of expiry: a row's stamp is stored only when it has one (a row
// without reads back as before), survives a reopen, and Scan lists the rows in key order
// from where the last call stopped.
TEST(CheckpointStoreTest, RowStampsRoundTripAndScanListsRowsInOrder) {
  TempDir tmp;
  const RowSnapshot stamped{0, 7, 3, {1.5f, -2.0f}, {{0.25f, 0.5f}}, 1234};
  const RowSnapshot plain{0, 9, 1, {4.0f, 5.0f}, {{6.0f, 7.0f}}, 0};
  const RowSnapshot other{1, 2, 2, {8.0f}, {{9.0f}}, 99};
  {
    auto store = MustOpen(tmp.path(), 1, 2);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Save(MakeSnapshot(), /*sync=*/true).ok());
    const std::vector<RowSnapshot> rows = {other, plain, stamped};
    ASSERT_TRUE(store->Write(rows).ok());
    std::vector<ColdTier::Stamp> got;
    bool at_end = true;
    ASSERT_TRUE(store->Scan(std::nullopt, 2, &got, &at_end).ok());
    ASSERT_EQ(got.size(), 2u);
    EXPECT_FALSE(at_end);
    EXPECT_EQ(got[0].key, (RowKey{0, 7}));
    EXPECT_EQ(got[0].touched, 1234);
    EXPECT_EQ(got[1].key, (RowKey{0, 9}));
    EXPECT_EQ(got[1].touched, 0);
    ASSERT_TRUE(store->Scan(got[1].key, 2, &got, &at_end).ok());
    ASSERT_EQ(got.size(), 1u);
    EXPECT_TRUE(at_end);
    EXPECT_EQ(got[0].key, (RowKey{1, 2}));
    EXPECT_EQ(got[0].touched, 99);
  }
  auto store = MustOpen(tmp.path(), 1, 2);
  ASSERT_NE(store, nullptr);
  const std::vector<RowKey> keys = {{0, 7}, {0, 9}, {1, 2}, {1, 3}};
  std::vector<std::optional<RowSnapshot>> read;
  ASSERT_TRUE(store->Read(keys, &read).ok());
  ASSERT_EQ(read.size(), 4u);
  EXPECT_EQ(read[0], stamped);
  EXPECT_EQ(read[1], plain);
  EXPECT_EQ(read[2], other);
  EXPECT_FALSE(read[3].has_value());
  // Keys in any order, one written after the reopen (in the memtable, the others in a table
  // file or the log): each answer in its key's place.
  const RowSnapshot later{1, 1, 4, {3.0f}, {{2.0f}}, 0};
  ASSERT_TRUE(store->Write(std::vector<RowSnapshot>{later}).ok());
  const std::vector<RowKey> shuffled = {{1, 3}, {1, 1}, {0, 9}, {1, 2}, {0, 7}};
  ASSERT_TRUE(store->Read(shuffled, &read).ok());
  ASSERT_EQ(read.size(), 5u);
  EXPECT_FALSE(read[0].has_value());
  EXPECT_EQ(read[1], later);
  EXPECT_EQ(read[2], plain);
  EXPECT_EQ(read[3], other);
  EXPECT_EQ(read[4], stamped);
}

TEST(CheckpointStoreTest, ApproximateBytesGrowsWithSavedData) {
  TempDir tmp;
  auto store = MustOpen(tmp.path(), 0, 1);
  ASSERT_NE(store, nullptr);
  const int64_t empty = store->ApproximateBytes();
  EXPECT_GT(empty, 0);
  ShardSnapshot snap;
  snap.registration = AdamModel(1);
  snap.slices = {MakeSlice(0, 64 * 1024, 1.0f, 1)};  // 768 KiB with two slots
  ASSERT_TRUE(store->Save(snap, true).ok());
  EXPECT_GE(store->ApproximateBytes(), empty + 3 * 4 * 64 * 1024);
}

TEST(CheckpointStoreTest, OpenRefusesDirWithStrayFileAndLeavesItUntouched) {
  TempDir tmp;
  const std::string notes = tmp.File("notes.txt");
  std::ofstream(notes) << "my experiment notes\n";
  Result<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Open(tmp.path(), 0, 1);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(store.status().message(), "notes.txt")) << store.status().ToString();
  EXPECT_TRUE(Contains(store.status().message(), "not a parasync-ps data directory"));
  const auto contents = DirContents(tmp.path());
  ASSERT_EQ(contents.size(), 1u);
  EXPECT_EQ(contents[0].first, "notes.txt");
  EXPECT_EQ(contents[0].second, "my experiment notes\n");
}

TEST(CheckpointStoreTest, OpenRefusesAPlainFile) {
  TempDir tmp;
  const std::string file = tmp.File("file");
  std::ofstream(file) << "x";
  Result<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Open(file, 0, 1);
  EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition) << store.status().ToString();
  EXPECT_EQ(ReadFile(file), "x");
}

TEST(CheckpointStoreTest, OpenRefusesAForeignRocksDbAndLeavesItUntouched) {
  TempDir tmp;
  WithRawDb(tmp.path(), /*create=*/true, [](rocksdb::DB* db) {
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), "user/42", "somebody else's data").ok());
  });
  const auto before = DirContents(tmp.path());
  Result<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Open(tmp.path(), 0, 1);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition) << store.status().ToString();
  EXPECT_TRUE(Contains(store.status().message(), "not a parasync-ps data directory"));
  EXPECT_EQ(DirContents(tmp.path()), before);
}

TEST(CheckpointStoreTest, OpenRefusesAStoreOfAnotherModeNamingBothBeforeWritingAnything) {
  TempDir tmp;
  {
    auto store = MustOpen(tmp.path(), 0, 2);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Save(MakeSnapshot(), /*sync=*/true).ok());  // registered in ssp:2
  }
  const auto before = testing::DirImage(tmp.path());
  Result<std::unique_ptr<CheckpointStore>> store =
      CheckpointStore::Open(tmp.path(), 0, 2, nullptr, *TrainingMode::Parse("sync"));
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kInvalidArgument) << store.status().ToString();
  EXPECT_TRUE(Contains(store.status().message(), "mode ssp:2")) << store.status().ToString();
  EXPECT_TRUE(Contains(store.status().message(), "--mode sync")) << store.status().ToString();
  EXPECT_TRUE(Contains(store.status().message(), tmp.path()));
  EXPECT_EQ(testing::DirChanges(before, testing::DirImage(tmp.path())), "");
  // Its own mode opens it, and so does an Open that names none.
  EXPECT_TRUE(CheckpointStore::Open(tmp.path(), 0, 2, nullptr, *TrainingMode::Parse("ssp:2")).ok());
  EXPECT_NE(MustOpen(tmp.path(), 0, 2), nullptr);
}

TEST(CheckpointStoreTest, OpenWhereNoDirectoryCanBeMadeIsFailedPrecondition) {
  TempDir tmp;
  std::ofstream(tmp.path() + "/a-file") << "x";
  for (const std::string& dir :
       {std::string("/proc/parasync-no-such-dir/ps0"), tmp.path() + "/a-file/ps0"}) {
    Result<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Open(dir, 0, 1);
    EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition) << store.status().ToString();
    EXPECT_TRUE(Contains(store.status().message(), dir)) << store.status().ToString();
  }
  const Status in_proc = CheckpointStore::Open("/proc/parasync-no-such-dir/ps0", 0, 1).status();
  EXPECT_TRUE(Contains(in_proc.message(), "no directory can be made in /proc"))
      << in_proc.ToString();
}

TEST(CheckpointStoreTest, OpenOfAStoreThatIsAlreadyOpenIsUnavailable) {
  TempDir tmp;
  auto first = MustOpen(tmp.path(), 0, 1);
  ASSERT_NE(first, nullptr);
  Result<std::unique_ptr<CheckpointStore>> second = CheckpointStore::Open(tmp.path(), 0, 1);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable) << second.status().ToString();
  EXPECT_TRUE(Contains(second.status().message(), tmp.path()));
}

TEST(CheckpointStoreTest, OpenRefusesAnotherShardIndexNamingBoth) {
  TempDir tmp;
  ASSERT_NE(MustOpen(tmp.path(), 1, 2), nullptr);
  Result<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Open(tmp.path(), 0, 2);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(store.status().message(), "shard 1 of 2")) << store.status().ToString();
  EXPECT_TRUE(Contains(store.status().message(), "shard 0 of 2")) << store.status().ToString();
  EXPECT_TRUE(Contains(store.status().message(), tmp.path()));
}

TEST(CheckpointStoreTest, OpenRefusesAnotherShardCountNamingBoth) {
  TempDir tmp;
  ASSERT_NE(MustOpen(tmp.path(), 1, 2), nullptr);
  Result<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Open(tmp.path(), 1, 3);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(store.status().message(), "shard 1 of 2")) << store.status().ToString();
  EXPECT_TRUE(Contains(store.status().message(), "shard 1 of 3")) << store.status().ToString();
}

TEST(CheckpointStoreTest, OpenRefusesShardOutsideTheCluster) {
  TempDir tmp;
  EXPECT_EQ(CheckpointStore::Open(tmp.path(), 2, 2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(fs::is_empty(tmp.path()));
}

TEST(CheckpointStoreTest, OpenRefusesAnUnknownFormat) {
  TempDir tmp;
  ASSERT_NE(MustOpen(tmp.path(), 0, 1), nullptr);
  WithRawDb(tmp.path(), false, [](rocksdb::DB* db) {
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), "meta/format", "garbage").ok());
  });
  Result<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Open(tmp.path(), 0, 1);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition) << store.status().ToString();
  EXPECT_TRUE(Contains(store.status().message(), "garbage")) << store.status().ToString();
  EXPECT_TRUE(Contains(store.status().message(), "parasync-ps/1"));
}

TEST(CheckpointStoreTest, OpenReportsADamagedShardRecordAsCorruptionWithThePath) {
  TempDir tmp;
  ASSERT_NE(MustOpen(tmp.path(), 0, 1), nullptr);
  WithRawDb(tmp.path(), false, [](rocksdb::DB* db) {
    std::string value;
    ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), "meta/shard", &value).ok());
    value[0] = static_cast<char>(value[0] ^ 0x01);
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), "meta/shard", value).ok());
  });
  Result<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Open(tmp.path(), 0, 1);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kCorruption) << store.status().ToString();
  EXPECT_TRUE(Contains(store.status().message(), tmp.path()));
  EXPECT_TRUE(Contains(store.status().message(), "meta/shard"));
}

TEST(CheckpointStoreTest, OpenRefusesARecordWithAFlippedByteNamingItsKey) {
  TempDir tmp;
  {
    auto store = MustOpen(tmp.path(), 1, 2);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Save(MakeSnapshot(), true).ok());
  }
  WithRawDb(tmp.path(), false, [](rocksdb::DB* db) {
    std::string value;
    ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), "slice/00000003", &value).ok());
    value[value.size() / 2] = static_cast<char>(value[value.size() / 2] ^ 0x10);
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), "slice/00000003", value).ok());
  });
  // Every record is checked before the store is opened for writing: Open refuses it.
  const auto before = DirContents(tmp.path());
  Result<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Open(tmp.path(), 1, 2);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kCorruption) << store.status().ToString();
  EXPECT_TRUE(Contains(store.status().message(), "slice/00000003")) << store.status().ToString();
  EXPECT_EQ(DirContents(tmp.path()), before);
}

TEST(CheckpointStoreTest, OpenRefusesARecordMovedToAnotherKey) {
  TempDir tmp;
  {
    auto store = MustOpen(tmp.path(), 1, 2);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Save(MakeSnapshot(), true).ok());
  }
  // The CRC covers the key, so a valid value under the wrong id is caught too.
  WithRawDb(tmp.path(), false, [](rocksdb::DB* db) {
    std::string value;
    ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), "slice/00000005", &value).ok());
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), "slice/00000004", value).ok());
  });
  Result<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Open(tmp.path(), 1, 2);
  EXPECT_EQ(store.status().code(), StatusCode::kCorruption) << store.status().ToString();
  EXPECT_TRUE(Contains(store.status().message(), "slice/00000004")) << store.status().ToString();
}

}  // namespace
}  // namespace parasync
