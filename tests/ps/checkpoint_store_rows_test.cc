// ps/checkpoint_store.h: embedding rows — only what changed is written, evicted rows are
// removed, and a load returns every stored row.
#include <gtest/gtest.h>

#include <vector>

#include "ps/checkpoint_store.h"
#include "tests/ps/checkpoint_store_test_util.h"
#include "tests/support/temp_dir.h"

namespace parasync {
namespace {

using namespace checkpoint_store_test;
using testing::TempDir;

RowSnapshot MakeRow(uint32_t table, uint64_t id, float salt, int64_t updates) {
  RowSnapshot row{table, id, updates, {salt, salt + 1, salt + 2, salt + 3}, {}};
  row.slots.push_back({-salt, -salt - 1, -salt - 2, -salt - 3});
  return row;
}

TEST(CheckpointStoreRowsTest, RowsAreUpsertedDeletedAndLoadedInKeyOrder) {
  TempDir tmp;
  auto store = MustOpen(tmp.path(), 1, 2);
  ASSERT_NE(store, nullptr);
  ShardSnapshot snap = MakeSnapshot();
  // Ids across the 64-bit range: fixed-width hex keys keep them in numeric order.
  snap.rows = {MakeRow(1, 7, 1.0f, 3), MakeRow(0, 0xfedcba9876543210ULL, 2.0f, 1),
               MakeRow(0, 5, 3.0f, 2)};
  ASSERT_TRUE(store->Save(snap, true).ok());
  ShardSnapshot got = MustLoad(*store);
  ASSERT_EQ(got.rows.size(), 3u);
  EXPECT_EQ(got.rows[0], snap.rows[2]);
  EXPECT_EQ(got.rows[1], snap.rows[1]);
  EXPECT_EQ(got.rows[2], snap.rows[0]);

  // The next snapshot names only what changed: one row updated, one evicted, one new.
  ShardSnapshot next = MakeSnapshot();
  next.rows = {MakeRow(0, 5, 30.0f, 3), MakeRow(2, 1, 4.0f, 1)};
  next.deleted_rows = {{1, 7}};
  ASSERT_TRUE(store->Save(next, true).ok());
  got = MustLoad(*store);
  ASSERT_EQ(got.rows.size(), 3u);
  EXPECT_EQ(got.rows[0], next.rows[0]);
  EXPECT_EQ(got.rows[1], snap.rows[1]);  // untouched: kept as stored
  EXPECT_EQ(got.rows[2], next.rows[1]);

  // Every-update writes carry rows too.
  ASSERT_TRUE(store->SaveUpdate(50, 1600, {}, {}, true, {MakeRow(2, 1, 9.0f, 2)},
                                {{0, 0xfedcba9876543210ULL}}).ok());
  got = MustLoad(*store);
  ASSERT_EQ(got.rows.size(), 2u);
  EXPECT_EQ(got.rows[0], next.rows[0]);
  EXPECT_EQ(got.rows[1], MakeRow(2, 1, 9.0f, 2));
  EXPECT_EQ(got.version, 50);

  // replace_rows drops every row the snapshot does not hold.
  ShardSnapshot full = MakeSnapshot();
  full.rows = {MakeRow(3, 3, 5.0f, 1)};
  full.replace_rows = true;
  ASSERT_TRUE(store->Save(full, true).ok());
  got = MustLoad(*store);
  ASSERT_EQ(got.rows.size(), 1u);
  EXPECT_EQ(got.rows[0], full.rows[0]);
}

TEST(CheckpointStoreRowsTest, ARowWithAMisSizedSlotIsRefusedAndNothingWritten) {
  TempDir tmp;
  auto store = MustOpen(tmp.path(), 0, 1);
  ASSERT_NE(store, nullptr);
  ShardSnapshot snap = MakeSnapshot();
  snap.registration.num_shards = 1;
  ASSERT_TRUE(store->Save(snap, true).ok());
  ShardSnapshot bad = snap;
  bad.rows = {MakeRow(0, 1, 1.0f, 1)};
  bad.rows[0].slots[0].pop_back();
  bad.version = 99;
  EXPECT_EQ(store->Save(bad, true).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MustLoad(*store).version, snap.version);
  EXPECT_TRUE(MustLoad(*store).rows.empty());
}

TEST(CheckpointStoreRowsTest, ADamagedRowIsCorruptionNamingItsKey) {
  TempDir tmp;
  {
    auto store = MustOpen(tmp.path(), 1, 2);
    ASSERT_NE(store, nullptr);
    ShardSnapshot snap = MakeSnapshot();
    snap.rows = {MakeRow(0, 42, 1.0f, 1)};
    ASSERT_TRUE(store->Save(snap, true).ok());
  }
  {
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), tmp.path(), &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    std::string value;
    const std::string key = "row/00000000/000000000000002a";
    ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), key, &value).ok());
    value[12] ^= 0x01;  // a bit of the values: the CRC no longer matches
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), key, value).ok());
  }
  auto opened = CheckpointStore::Open(tmp.path(), 1, 2);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), StatusCode::kCorruption);
  EXPECT_NE(opened.status().message().find("row/00000000/000000000000002a"), std::string::npos)
      << opened.status().message();
}

}  // namespace
}  // namespace parasync
