// A store written by an earlier build restores in this one: the on-disk format
// "parasync-ps/1" is a promise to every existing data directory, whatever the code around it
// becomes. The stores in tests/ps/testdata/ were written by CheckpointStore::Save at commit
// 7ed2456 (before the ps/ refactor of issue 24) from the snapshot OldSnapshot() spells out
// (tests/ps/testdata/old_snapshot.h); tests/ps/testdata/README.md says how.
#include <filesystem>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "ps/checkpoint_store.h"
#include "tests/ps/testdata/old_snapshot.h"
#include "tests/support/temp_dir.h"

namespace parasync {
namespace {

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
  testing::ExpectHoldsOldSnapshot(CopyOfStore());
}

TEST_P(OldStoreTest, IsStillRefusedForAnotherShard) {
  const std::string store = CopyOfStore();
  Result<std::unique_ptr<CheckpointStore>> opened = CheckpointStore::Open(store, 0, 3);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), StatusCode::kFailedPrecondition) << opened.status().ToString();
}

INSTANTIATE_TEST_SUITE_P(Stores, OldStoreTest, ::testing::Values("store-0.2", "store-0.2-wal"),
                         testing::StoreCaseName);

}  // namespace
}  // namespace parasync
