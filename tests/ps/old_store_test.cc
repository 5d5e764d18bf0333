// A store written by an earlier build restores in this one: the on-disk format
// "parasync-ps/1" is a promise to every existing data directory, whatever the code around it
// becomes. The stores in tests/ps/testdata/ were written by CheckpointStore::Save at commit
// 7ed2456 (before the ps/ refactor of issue 24) from the snapshot OldSnapshot() spells out;
// tests/ps/testdata/README.md says how.
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "ps/checkpoint_store.h"
#include "tests/support/temp_dir.h"

#ifndef PARASYNC_TESTDATA_DIR
#error "PARASYNC_TESTDATA_DIR must name tests/ps/testdata"
#endif

namespace parasync {
namespace {

// What the stored snapshot holds, spelled out: shard 1 of 3, a momentum optimizer (one slot),
// three slices of different sizes, rank records with and without data progress.
ShardSnapshot OldSnapshot() {
  ShardSnapshot snap;
  ModelRegistration& reg = snap.registration;
  reg.variables = {{"conv/kernel", {3, 3, 1, 4}, DType::kFloat32, {InitKind::kUniform, 0.25f}},
                   {"conv/bias", {4}, DType::kFloat32, {InitKind::kZeros, 0.0f}}};
  reg.optimizer.kind = OptimizerKind::kMomentum;
  reg.optimizer.learning_rate = 0.05f;
  reg.optimizer.momentum = 0.5f;
  reg.seed = 20261124;
  reg.max_slice_elements = 16;
  reg.num_shards = 3;
  reg.mode = "sync";
  reg.model = R"({"layers":["conv"]})";
  snap.version = 977;
  snap.examples = 977 * 64;
  for (uint32_t id : {0u, 4u, 9u}) {
    SliceSnapshot slice;
    slice.id = id;
    slice.updates = 100 + id;
    const int n = 16 - static_cast<int>(id);
    slice.slots.resize(1);
    for (int i = 0; i < n; ++i) {
      slice.values.push_back(static_cast<float>(id) - 0.125f * static_cast<float>(i));
      slice.slots[0].push_back(1e-3f * static_cast<float>(i * (id + 1)));
    }
    snap.slices.push_back(std::move(slice));
  }
  snap.ranks = {{0, 4294967296ull + 17, {5, 640, 1000}}, {1, 33, {}}, {3, 4294967296ull * 2, {6, 0, 1000}}};
  return snap;
}

// store-0.2 was closed cleanly (its data in a table file); store-0.2-wal is what a process
// killed right after its write left (its data only in the write-ahead log).
class OldStoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  // A copy of the stored directory: opening a store writes to it.
  std::string CopyOfStore() {
    const std::string store = dir_.File("store");
    std::filesystem::copy(std::string(PARASYNC_TESTDATA_DIR) + "/" + GetParam(), store,
                          std::filesystem::copy_options::recursive);
    return store;
  }

  testing::TempDir dir_;
};

TEST_P(OldStoreTest, AStoreWrittenBeforeTheRefactorRestoresWhole) {
  const std::string store = CopyOfStore();
  Result<std::unique_ptr<CheckpointStore>> opened = CheckpointStore::Open(store, 1, 3);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Result<ShardSnapshot> loaded = (*opened)->Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const ShardSnapshot expected = OldSnapshot();
  EXPECT_EQ(loaded->registration, expected.registration);
  EXPECT_EQ(loaded->version, expected.version);
  EXPECT_EQ(loaded->examples, expected.examples);
  EXPECT_EQ(loaded->slices, expected.slices);
  EXPECT_EQ(loaded->ranks, expected.ranks);
}

TEST_P(OldStoreTest, IsStillRefusedForAnotherShard) {
  const std::string store = CopyOfStore();
  Result<std::unique_ptr<CheckpointStore>> opened = CheckpointStore::Open(store, 0, 3);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), StatusCode::kFailedPrecondition) << opened.status().ToString();
}

INSTANTIATE_TEST_SUITE_P(Stores, OldStoreTest, ::testing::Values("store-0.2", "store-0.2-wal"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "store-0.2" ? std::string("Closed")
                                                            : std::string("Killed");
                         });

}  // namespace
}  // namespace parasync
