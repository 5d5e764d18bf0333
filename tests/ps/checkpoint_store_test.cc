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
#include "tests/support/in_child.h"
#include "tests/support/temp_dir.h"

namespace parasync {
namespace {

namespace fs = std::filesystem;

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

using testing::RunInChild;
using testing::TempDir;

ModelRegistration AdamModel(int num_shards) {
  ModelRegistration reg;
  reg.variables = {{"dense/kernel", {6, 5}, DType::kFloat32, {InitKind::kUniform, 0.5f}},
                   {"dense/bias", {5}, DType::kFloat32, {InitKind::kZeros, 0.0f}}};
  reg.optimizer.kind = OptimizerKind::kAdam;
  reg.optimizer.learning_rate = 0.001f;
  reg.optimizer.beta1 = 0.8f;
  reg.optimizer.staleness_aware = true;
  // A restored server goes on along its schedule: the schedule is part of what is stored.
  reg.optimizer.schedule = LrSchedule::kCosine;
  reg.optimizer.decay_examples = 600000;
  reg.optimizer.final_lr_fraction = 0.05f;
  reg.seed = 987654321;
  reg.max_slice_elements = 8;
  reg.num_shards = num_shards;
  reg.mode = "ssp:2";
  return reg;
}

// A slice of `n` elements whose values and two Adam slots are distinct from every other slice's
// (`salt`).
SliceSnapshot MakeSlice(uint32_t id, int n, float salt, int64_t updates) {
  SliceSnapshot s;
  s.id = id;
  s.updates = updates;
  for (int i = 0; i < n; ++i) s.values.push_back(salt + 0.25f * static_cast<float>(i));
  s.slots.resize(2);
  for (int i = 0; i < n; ++i) {
    s.slots[0].push_back(-salt - static_cast<float>(i));
    s.slots[1].push_back(salt * 1e-3f + static_cast<float>(i) * 1e-6f);
  }
  return s;
}

ShardSnapshot MakeSnapshot() {
  ShardSnapshot snap;
  snap.registration = AdamModel(2);
  snap.version = 41;
  snap.examples = 41 * 32;
  snap.slices = {MakeSlice(1, 8, 1.0f, 17), MakeSlice(3, 7, 3.0f, 5), MakeSlice(5, 5, 5.0f, 0)};
  // Rank 0's record carries its data progress; the others have none (as before 0.2).
  snap.ranks = {{-1, 3, {}}, {0, 40, {3, 120, 600}}, {2, 12345678901ull, {}}};
  return snap;
}

std::unique_ptr<CheckpointStore> MustOpen(const std::string& dir, int shard, int num_shards) {
  Result<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Open(dir, shard, num_shards);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  return store.ok() ? std::move(*store) : nullptr;
}

ShardSnapshot MustLoad(CheckpointStore& store) {
  Result<ShardSnapshot> snap = store.Load();
  EXPECT_TRUE(snap.ok()) << snap.status().ToString();
  return snap.ok() ? std::move(*snap) : ShardSnapshot{};
}

// Runs `fn` on the database in `dir` opened directly, without CheckpointStore.
template <typename F>
void WithRawDb(const std::string& dir, bool create, F&& fn) {
  rocksdb::Options options;
  options.create_if_missing = create;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, dir, &raw);
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::unique_ptr<rocksdb::DB> db(raw);
  fn(db.get());
  ASSERT_TRUE(db->Close().ok());
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Every file under `dir` with its content.
std::vector<std::pair<std::string, std::string>> DirContents(const std::string& dir) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    out.emplace_back(e.path().filename().string(), ReadFile(e.path().string()));
  }
  std::sort(out.begin(), out.end());
  return out;
}

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


// ---- Failing disks (StorageFaults) ----------------------------------------------------------------

std::unique_ptr<CheckpointStore> MustOpenWith(const std::string& dir, int shard, int num_shards,
                                              std::shared_ptr<StorageFaults> faults) {
  Result<std::unique_ptr<CheckpointStore>> store =
      CheckpointStore::Open(dir, shard, num_shards, std::move(faults));
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  return store.ok() ? std::move(*store) : nullptr;
}

// `snap` after the every-update write number `i` of EveryUpdate().
void ApplyUpdate(ShardSnapshot* snap, int i) {
  snap->version += 1;
  snap->examples += 32;
  snap->slices[0].values[0] = static_cast<float>(1000 + i);
  snap->slices[0].updates += 1;
}

Status EveryUpdate(CheckpointStore& store, ShardSnapshot* snap, int i, bool sync) {
  ShardSnapshot next = *snap;
  ApplyUpdate(&next, i);
  Status s = store.SaveUpdate(next.version, next.examples, {&next.slices[0]}, {}, sync);
  if (s.ok()) *snap = std::move(next);
  return s;
}

// Runs `scenario` (returning "" when every check held, else what failed) in a child process, a
// death test that re-runs this binary, so that a SIGABRT inside RocksDB fails this test instead
// of ending the whole test binary.
// Checks that `s` is the Unavailable of a full disk in `dir`; "" if so.
std::string CheckNoSpace(const Status& s, const std::string& dir, const char* what) {
  if (s.code() != StatusCode::kUnavailable || !Contains(s.message(), "no space left on device") ||
      !Contains(s.message(), dir)) {
    return std::string(what) + " returned " + s.ToString();
  }
  return "";
}

TEST(CheckpointStoreFaultTest, SyncEioFailsTheWriteNamingItAndEveryLaterWriteFailsTheSameWay) {
  TempDir tmp;
  auto faults = std::make_shared<StorageFaults>();
  ShardSnapshot snap = MakeSnapshot();
  snap.registration = AdamModel(1);
  constexpr int kGood = 5;
  {
    auto store = MustOpenWith(tmp.path(), 0, 1, faults);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Save(snap, true).ok());
    for (int i = 0; i < kGood; ++i) ASSERT_TRUE(EveryUpdate(*store, &snap, i, true).ok());
    EXPECT_FALSE(store->failure().has_value());

    faults->syncs_before_eio = 0;
    ShardSnapshot failed = snap;
    const Status first = EveryUpdate(*store, &failed, kGood, true);
    EXPECT_EQ(first.code(), StatusCode::kUnavailable) << first.ToString();
    EXPECT_TRUE(Contains(first.message(), "Input/output error")) << first.ToString();
    EXPECT_TRUE(Contains(first.message(), tmp.path())) << first.ToString();
    ASSERT_TRUE(store->failure().has_value());
    EXPECT_EQ(*store->failure(), first.message());

    // The disk works again, but the store stays failed and does not even try: no sync is
    // taken from the budget.
    faults->syncs_before_eio = 1000;
    const Status again = EveryUpdate(*store, &failed, kGood + 1, true);
    EXPECT_EQ(again.code(), first.code());
    EXPECT_EQ(again.message(), first.message());
    const Status save = store->Save(snap, false);
    EXPECT_EQ(save.message(), first.message());
    EXPECT_EQ(faults->syncs_before_eio.load(), 1000);
    EXPECT_EQ(*store->failure(), first.message());

    // What this process reads is the last acknowledged state.
    EXPECT_EQ(MustLoad(*store), snap);
  }
  // After a restart the acknowledged writes are all there. The write whose fsync failed had
  // reached the WAL before the sync, and RocksDB replays it: the restart shows it although the
  // caller was told it failed. Either way the state is one whole write, never a mix.
  auto store = MustOpen(tmp.path(), 0, 1);
  ASSERT_NE(store, nullptr);
  ShardSnapshot with_failed = snap;
  ApplyUpdate(&with_failed, kGood);
  const ShardSnapshot restored = MustLoad(*store);
  EXPECT_TRUE(restored == snap || restored == with_failed) << "version " << restored.version;
  std::cout << "after the EIO, a restart shows version " << restored.version << " (last acknowledged "
            << snap.version << ")\n";
}

// Fills the disk under a store in the middle of work, for writes of `floats` floats each.
std::string FullDiskScenario(int floats, int64_t space_after_first_save) {
  TempDir tmp;
  auto faults = std::make_shared<StorageFaults>();
  ShardSnapshot snap;
  snap.registration = AdamModel(1);
  snap.slices = {MakeSlice(0, floats, 1.0f, 1)};
  auto opened = CheckpointStore::Open(tmp.path(), 0, 1, faults);
  if (!opened.ok()) return "Open: " + opened.status().ToString();
  std::unique_ptr<CheckpointStore> store = std::move(*opened);
  if (Status s = store->Save(snap, true); !s.ok()) return "first Save: " + s.ToString();
  faults->space_left_bytes = space_after_first_save;
  // A few writes may still fit; the disk is full long before 1000.
  Status failed;
  int ok = 0;
  while (ok < 1000 && (failed = EveryUpdate(*store, &snap, ok, false)).ok()) ++ok;
  if (std::string e = CheckNoSpace(failed, tmp.path(), "SaveUpdate"); !e.empty()) return e;
  // Later writes, while RocksDB goes on logging, and after the LOG's own 5 s flush interval.
  for (int i = 0; i < 3; ++i) {
    if (std::string e = CheckNoSpace(store->Save(snap, true), tmp.path(), "Save"); !e.empty()) {
      return e;
    }
  }
  if (!store->failure() || *store->failure() != failed.message()) return "failure() is wrong";
  std::fprintf(stderr, "%d writes of %d floats fitted; then: %s\n", ok, floats,
               failed.message().c_str());
  store.reset();  // closing a failed store must not abort either
  // Nothing acknowledged is lost once there is space again.
  faults->space_left_bytes = -1;
  opened = CheckpointStore::Open(tmp.path(), 0, 1);
  if (!opened.ok()) return "reopen: " + opened.status().ToString();
  Result<ShardSnapshot> loaded = (*opened)->Load();
  if (!loaded.ok()) return "Load: " + loaded.status().ToString();
  if (!(*loaded == snap)) return "reopened store lost acknowledged writes";
  return "";
}

TEST(CheckpointStoreFaultTest, FullDiskFailsSmallWritesWithoutAborting) {
  EXPECT_IN_CHILD([] { return FullDiskScenario(8, 0); });
}

TEST(CheckpointStoreFaultTest, FullDiskFailsLargeWritesHalfWrittenWithoutAborting) {
  // 1.5 MiB per write with its slots; the disk fills in the middle of the second one.
  EXPECT_IN_CHILD([] { return FullDiskScenario(128 * 1024, 2 << 20); });
}

TEST(CheckpointStoreFaultTest, OpenOnAFullDiskFailsWithoutAbortingAndDamagesNothing) {
  EXPECT_IN_CHILD([] {
    TempDir tmp;
    {
      auto store = MustOpen(tmp.path(), 0, 1);
      ShardSnapshot snap = MakeSnapshot();
      snap.registration = AdamModel(1);
      if (!store || !store->Save(snap, true).ok()) return std::string("setup failed");
    }
    auto faults = std::make_shared<StorageFaults>();
    faults->space_left_bytes = 0;
    auto full = CheckpointStore::Open(tmp.path(), 0, 1, faults);
    if (full.ok()) return std::string("Open on a full disk succeeded");
    if (std::string e = CheckNoSpace(full.status(), tmp.path(), "Open"); !e.empty()) return e;
    auto later = CheckpointStore::Open(tmp.path(), 0, 1);
    if (!later.ok()) return "Open with space again: " + later.status().ToString();
    ShardSnapshot expected = MakeSnapshot();
    expected.registration = AdamModel(1);
    Result<ShardSnapshot> loaded = (*later)->Load();
    if (!loaded.ok() || !(*loaded == expected)) return std::string("the data changed");
    return std::string();
  });
}

// A real full filesystem: a 2 MiB tmpfs in a private mount namespace (user namespaces must be
// allowed). Shows that the wrapper's failures are the ones RocksDB meets on a real full disk.
bool CanMountTmpfs() {
  const int status = RunInChild([] { return unshare(CLONE_NEWUSER | CLONE_NEWNS) == 0 ? 0 : 1; });
  return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

bool WriteProcFile(const char* path, const std::string& text) {
  const int fd = open(path, O_WRONLY);
  if (fd < 0) return false;
  const bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  return ok;
}

TEST(CheckpointStoreFaultTest, RealFullTmpfsFailsWritesAndOpenWithoutAborting) {
  if (!CanMountTmpfs()) GTEST_SKIP() << "unshare(CLONE_NEWUSER | CLONE_NEWNS) is not permitted here";
  EXPECT_IN_CHILD([] {
    const std::string uid = std::to_string(getuid());
    const std::string gid = std::to_string(getgid());
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) return std::string("unshare failed");
    if (!WriteProcFile("/proc/self/setgroups", "deny") ||
        !WriteProcFile("/proc/self/uid_map", "0 " + uid + " 1") ||
        !WriteProcFile("/proc/self/gid_map", "0 " + gid + " 1")) {
      return std::string("cannot map ids");
    }
    TempDir mount_point;
    if (mount("tmpfs", mount_point.path().c_str(), "tmpfs", 0, "size=2m") != 0) {
      return std::string("mount tmpfs failed");
    }
    const std::string dir = mount_point.File("store");
    std::string failure;
    {
      auto opened = CheckpointStore::Open(dir, 0, 1);
      if (!opened.ok()) return "Open: " + opened.status().ToString();
      ShardSnapshot snap;
      snap.registration = AdamModel(1);
      snap.slices = {MakeSlice(0, 8 * 1024, 1.0f, 1)};
      if (!(*opened)->Save(snap, true).ok()) return std::string("first Save failed");
      Status failed;
      int ok = 0;
      while (ok < 1000 && (failed = EveryUpdate(**opened, &snap, ok, false)).ok()) ++ok;
      if (std::string e = CheckNoSpace(failed, dir, "SaveUpdate"); !e.empty()) return e;
      for (int i = 0; i < 3; ++i) {
        if (std::string e = CheckNoSpace((*opened)->Save(snap, true), dir, "Save"); !e.empty()) {
          return e;
        }
      }
      failure = failed.message();
    }
    auto again = CheckpointStore::Open(dir, 0, 1);
    if (again.ok()) return std::string("Open on the full tmpfs succeeded");
    if (std::string e = CheckNoSpace(again.status(), dir, "Open"); !e.empty()) return e;
    std::fprintf(stderr, "tmpfs: %s; reopen: %s\n", failure.c_str(),
                 again.status().message().c_str());
    umount(mount_point.path().c_str());
    return std::string();
  });
}

// ---- Damaged stores --------------------------------------------------------------------------------

// The names of the files in `dir` that start with `prefix` (and end with `suffix`).
std::vector<std::string> FilesNamed(const std::string& dir, const std::string& prefix,
                                    const std::string& suffix = "") {
  std::vector<std::string> out;
  for (const auto& [name, bytes] : DirContents(dir)) {
    if (name.starts_with(prefix) && name.ends_with(suffix)) out.push_back(name);
  }
  return out;
}

void FlipByte(const std::string& path, size_t offset, char mask = 0x01) {
  std::string bytes = ReadFile(path);
  ASSERT_LT(offset, bytes.size()) << path;
  bytes[offset] = static_cast<char>(bytes[offset] ^ mask);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

ShardSnapshot OneShardSnapshot() {
  ShardSnapshot snap = MakeSnapshot();
  snap.registration = AdamModel(1);
  return snap;
}

// A cleanly closed store holding OneShardSnapshot() in a table file.
void MakeClosedStore(const std::string& dir) {
  auto store = MustOpen(dir, 0, 1);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Save(OneShardSnapshot(), true).ok());
}

// Opens the damaged store in `dir`: refused as Corruption naming `dir` and `file`, and not one
// byte or file name in `dir` changed.
void ExpectRefusedUntouched(const std::string& dir, const std::string& file) {
  const auto before = DirContents(dir);
  Result<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Open(dir, 0, 1);
  ASSERT_FALSE(store.ok()) << "a store with a damaged " << file << " was opened";
  std::cout << "refused: " << store.status().ToString() << "\n";
  EXPECT_EQ(store.status().code(), StatusCode::kCorruption) << store.status().ToString();
  EXPECT_TRUE(Contains(store.status().message(), dir)) << store.status().ToString();
  EXPECT_TRUE(Contains(store.status().message(), file)) << store.status().ToString();
  EXPECT_EQ(DirContents(dir), before) << "the refused store was written";
}

TEST(CheckpointStoreDamageTest, FlippedByteInATableDataBlockIsRefusedAndLeftUntouched) {
  TempDir tmp;
  MakeClosedStore(tmp.path());
  const auto tables = FilesNamed(tmp.path(), "", ".sst");
  ASSERT_EQ(tables.size(), 1u);
  // The first data block starts at offset 0; 10 is inside its first key.
  FlipByte(tmp.File(tables[0]), 10);
  ExpectRefusedUntouched(tmp.path(), tables[0]);
}

TEST(CheckpointStoreDamageTest, FlippedByteInADataBlockOnlyLoadReadsIsRefusedAndLeftUntouched) {
  // Slices of 16 KiB each fill data blocks of their own after the block of the meta records,
  // which is all that opening the store used to read before writing to it.
  TempDir tmp;
  ShardSnapshot snap = OneShardSnapshot();
  snap.slices = {MakeSlice(1, 8, 1.0f, 1), MakeSlice(2, 1365, 2.0f, 1),
                 MakeSlice(3, 1365, 1234.5f, 1)};
  {
    auto store = MustOpen(tmp.path(), 0, 1);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Save(snap, true).ok());
  }
  const auto tables = FilesNamed(tmp.path(), "", ".sst");
  ASSERT_EQ(tables.size(), 1u);
  // A value of the last slice, found by its bytes.
  const float marker = snap.slices[2].values[700];
  const std::string bytes = ReadFile(tmp.File(tables[0]));
  const size_t at = bytes.find(std::string(reinterpret_cast<const char*>(&marker), sizeof(float)));
  ASSERT_NE(at, std::string::npos);
  ASSERT_GT(at, 16u * 1024) << "the slice is in the first block";
  FlipByte(tmp.File(tables[0]), at);
  ExpectRefusedUntouched(tmp.path(), tables[0]);
}

TEST(CheckpointStoreDamageTest, FlippedByteInTheManifestIsRefusedAndLeftUntouched) {
  TempDir tmp;
  MakeClosedStore(tmp.path());
  const auto manifests = FilesNamed(tmp.path(), "MANIFEST-");
  ASSERT_EQ(manifests.size(), 1u);
  FlipByte(tmp.File(manifests[0]), ReadFile(tmp.File(manifests[0])).size() / 2);
  ExpectRefusedUntouched(tmp.path(), manifests[0]);
}

TEST(CheckpointStoreDamageTest, FlippedByteInCurrentIsRefusedAndLeftUntouched) {
  TempDir tmp;
  MakeClosedStore(tmp.path());
  const std::string current = ReadFile(tmp.File("CURRENT"));
  ASSERT_TRUE(current.starts_with("MANIFEST-")) << current;
  // The last digit of the manifest number: CURRENT then names a manifest that is not there.
  FlipByte(tmp.File("CURRENT"), current.size() - 2);
  ExpectRefusedUntouched(tmp.path(), "MANIFEST-");
}

TEST(CheckpointStoreDamageTest, FlippedByteInAnOptionsFileIsRefusedAndLeftUntouched) {
  TempDir tmp;
  MakeClosedStore(tmp.path());
  const auto options = FilesNamed(tmp.path(), "OPTIONS-");
  ASSERT_FALSE(options.empty());
  const std::string path = tmp.File(options.back());
  const size_t at = ReadFile(path).find("write_buffer_size=");
  ASSERT_NE(at, std::string::npos);
  FlipByte(path, at + 1);  // "wbite_buffer_size": an option RocksDB does not know
  ExpectRefusedUntouched(tmp.path(), options.back());
}

// A copy of `dir` taken while its store is open and has written `updates` every-update writes
// after a Save: what a kill -9 leaves behind, WAL included.
ShardSnapshot MakeCrashedStore(const std::string& dir, const std::string& copy, int updates) {
  ShardSnapshot snap = OneShardSnapshot();
  auto store = MustOpen(dir, 0, 1);
  EXPECT_NE(store, nullptr);
  if (!store) return snap;
  EXPECT_TRUE(store->Save(snap, true).ok());
  for (int i = 0; i < updates; ++i) EXPECT_TRUE(EveryUpdate(*store, &snap, i, true).ok());
  fs::copy(dir, copy);
  return snap;
}

TEST(CheckpointStoreDamageTest, FlippedByteInAWalRecordBeforeTheLastIsRefusedAndLeftUntouched) {
  TempDir tmp;
  MakeCrashedStore(tmp.File("live"), tmp.File("crashed"), 5);
  const auto wals = FilesNamed(tmp.File("crashed"), "", ".log");
  ASSERT_EQ(wals.size(), 1u);
  // The first record (the Save) is followed by five more: the default point-in-time recovery
  // would silently stop the replay there and lose all six acknowledged writes.
  ASSERT_GT(ReadFile(tmp.File("crashed/" + wals[0])).size(), 200u);
  FlipByte(tmp.File("crashed/" + wals[0]), 100);
  ExpectRefusedUntouched(tmp.File("crashed"), wals[0]);
}

TEST(CheckpointStoreDamageTest, TornLastWalRecordOfACrashIsAcceptedWithTheWritesBeforeIt) {
  TempDir tmp;
  const ShardSnapshot last = MakeCrashedStore(tmp.File("live"), tmp.File("crashed"), 5);
  const auto wals = FilesNamed(tmp.File("crashed"), "", ".log");
  ASSERT_EQ(wals.size(), 1u);
  const std::string wal = tmp.File("crashed/" + wals[0]);
  fs::resize_file(wal, fs::file_size(wal) - 3);  // the crash hit the middle of the last write
  auto store = MustOpen(tmp.File("crashed"), 0, 1);
  ASSERT_NE(store, nullptr);
  const ShardSnapshot restored = MustLoad(*store);
  EXPECT_EQ(restored.version, last.version - 1);
  EXPECT_EQ(restored.slices[0].values[0], 1000.0f + 3);  // the fourth update, index 3
}

TEST(CheckpointStoreDamageTest, CleanCrashImageOpensWithEveryWrite) {
  TempDir tmp;
  const ShardSnapshot last = MakeCrashedStore(tmp.File("live"), tmp.File("crashed"), 5);
  auto store = MustOpen(tmp.File("crashed"), 0, 1);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(MustLoad(*store), last);
}

// The info LOG and IDENTITY carry no checksum and the store does not depend on them: a flip in
// either cannot be seen, and the store opens with all its data.
TEST(CheckpointStoreDamageTest, FlippedByteInTheInfoLogOrIdentityIsAcceptedWithTheData) {
  for (const std::string name : {"LOG", "IDENTITY"}) {
    TempDir tmp;
    MakeClosedStore(tmp.path());
    FlipByte(tmp.File(name), 5);
    const std::string damaged = ReadFile(tmp.File(name));
    auto store = MustOpen(tmp.path(), 0, 1);
    ASSERT_NE(store, nullptr) << name;
    EXPECT_EQ(MustLoad(*store), OneShardSnapshot()) << name;
    if (name == "IDENTITY") {
      EXPECT_EQ(ReadFile(tmp.File(name)), damaged);
    }
  }
}

}  // namespace
}  // namespace parasync
