// ps/checkpoint_store.h over damaged stores: a flipped byte or a missing file is refused, naming
// it, and the store is left as it was.
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
#include "tests/support/in_child.h"
#include "tests/support/temp_dir.h"

namespace parasync {
namespace {

// This file's helpers: tests/ps/checkpoint_store_test_util.h.
using namespace checkpoint_store_test;
using testing::RunInChild;
using testing::TempDir;

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
