// ps/checkpoint_store.h over failing disks (ps/storage_faults.h, a full tmpfs): errors, never
// aborts, and nothing half-written is loaded.
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

// ---- Failing disks (StorageFaults) ----------------------------------------------------------------

std::unique_ptr<CheckpointStore> MustOpenWith(const std::string& dir, int shard, int num_shards,
                                              std::shared_ptr<StorageFaults> faults) {
  Result<std::unique_ptr<CheckpointStore>> store =
      CheckpointStore::Open(dir, shard, num_shards, std::move(faults));
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  return store.ok() ? std::move(*store) : nullptr;
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

}  // namespace
}  // namespace parasync
