#include "ps/checkpoint_store.h"

#include <gtest/gtest.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace parasync {
namespace {

namespace fs = std::filesystem;

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A fresh directory under the system temp dir, removed with everything in it at the end.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "checkpoint_store_test.XXXXXX").string();
    char* made = mkdtemp(pattern.data());
    if (made == nullptr) std::abort();
    path_ = made;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

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
  snap.ranks = {{-1, 3}, {0, 40}, {2, 12345678901ull}};
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
  const std::string dir = tmp.Sub("a/b/shard-0");
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
  second.ranks = {{1, 9}};
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
  ASSERT_TRUE(store->SaveUpdate(42, 42 * 32, {&updated}, RankRecord{0, 41}, true).ok());

  ShardSnapshot expected = before;
  expected.version = 42;
  expected.examples = 42 * 32;
  expected.slices[1] = updated;
  expected.ranks[1].last_seq = 41;
  EXPECT_TRUE(MustLoad(*store) == expected);

  // A rank seen for the first time is added; no rank leaves the others alone.
  ASSERT_TRUE(store->SaveUpdate(43, 43 * 32, {}, RankRecord{1, 1}, false).ok());
  ASSERT_TRUE(store->SaveUpdate(44, 44 * 32, {}, std::nullopt, false).ok());
  expected.version = 44;
  expected.examples = 44 * 32;
  expected.ranks.insert(expected.ranks.begin() + 2, RankRecord{1, 1});
  EXPECT_TRUE(MustLoad(*store) == expected);
}

TEST(CheckpointStoreTest, SaveUpdateBeforeAnySaveIsFailedPrecondition) {
  TempDir tmp;
  auto store = MustOpen(tmp.path(), 0, 1);
  ASSERT_NE(store, nullptr);
  const SliceSnapshot slice = MakeSlice(0, 4, 1.0f, 1);
  Status s = store->SaveUpdate(1, 8, {&slice}, std::nullopt, false);
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
  twice.ranks.push_back({0, 1});
  EXPECT_EQ(store->Save(twice, false).code(), StatusCode::kInvalidArgument);

  ShardSnapshot other_count = good;
  other_count.registration.num_shards = 3;
  EXPECT_EQ(store->Save(other_count, false).code(), StatusCode::kInvalidArgument);

  const SliceSnapshot bad = short_slot.slices[2];
  EXPECT_EQ(store->SaveUpdate(100, 1, {&bad}, std::nullopt, false).code(),
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
    ASSERT_TRUE(store->SaveUpdate(50, 1600, {&updated}, RankRecord{2, 12345678902ull}, false).ok());
    expected.version = 50;
    expected.examples = 1600;
    expected.slices[2] = updated;
    expected.ranks[2].last_seq = 12345678902ull;
  }
  auto store = MustOpen(tmp.path(), 1, 2);
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(MustLoad(*store) == expected);
  // The stored registration counts as the Save that SaveUpdate needs.
  EXPECT_TRUE(store->SaveUpdate(51, 1632, {}, std::nullopt, true).ok());
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
  const std::string notes = tmp.Sub("notes.txt");
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
  const std::string file = tmp.Sub("file");
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

TEST(CheckpointStoreTest, LoadReportsCorruptionNamingTheKeyOfAFlippedByte) {
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
  auto store = MustOpen(tmp.path(), 1, 2);
  ASSERT_NE(store, nullptr);
  Result<ShardSnapshot> snap = store->Load();
  ASSERT_FALSE(snap.ok());
  EXPECT_EQ(snap.status().code(), StatusCode::kCorruption) << snap.status().ToString();
  EXPECT_TRUE(Contains(snap.status().message(), "slice/00000003")) << snap.status().ToString();
}

TEST(CheckpointStoreTest, LoadReportsCorruptionForARecordMovedToAnotherKey) {
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
  auto store = MustOpen(tmp.path(), 1, 2);
  ASSERT_NE(store, nullptr);
  Result<ShardSnapshot> snap = store->Load();
  EXPECT_EQ(snap.status().code(), StatusCode::kCorruption) << snap.status().ToString();
  EXPECT_TRUE(Contains(snap.status().message(), "slice/00000004")) << snap.status().ToString();
}

}  // namespace
}  // namespace parasync
