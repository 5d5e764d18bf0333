// The real parasync-ps restores a store an earlier build wrote (tests/ps/testdata/store-0.2*)
// and, stopped, leaves it holding what it held: the on-disk format read and written back by
// the whole server (its start-up checks, Server::Restore, its snapshot on shutdown), not
// just by CheckpointStore.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/ps/testdata/old_snapshot.h"
#include "tests/support/process_util.h"

namespace parasync {
namespace {

using namespace std::chrono_literals;

class OldStoreProcessTest : public ::testing::TestWithParam<std::string> {};

TEST_P(OldStoreProcessTest, ServerRestoresItAndLeavesItWhole) {
  testing::TempDir dir;
  const std::string state = dir.File("state");
  std::filesystem::copy(std::string(PARASYNC_TESTDATA_DIR) + "/" + GetParam(), state,
                        std::filesystem::copy_options::recursive);
  const std::string log = dir.File("ps1.log");
  // Shard 1 of 3, in the stored mode; the other two shards need not run for a restore.
  testing::Child ps = testing::Child::Start(
      {testing::BinDir() + "/parasync-ps", "--ps-hosts", "127.0.0.1:0,127.0.0.1:0,127.0.0.1:0",
       "--worker-hosts", "127.0.0.1:1", "--task-index", "1", "--mode", "sync", "--state-dir",
       state},
      log);
  const std::string restored = "restored from " + state + ": version 977, 62528 examples, 3 slices";
  ASSERT_TRUE(testing::WaitFor(
      [&] { return testing::ReadFile(log).find(restored) != std::string::npos; }, 60s))
      << "no \"" << restored << "\" in the log:\n"
      << testing::ReadFile(log);
  ps.Signal(SIGTERM);
  const std::optional<int> status = ps.Wait(60s);
  ASSERT_TRUE(status.has_value()) << "parasync-ps did not stop within 60 s of SIGTERM";
  EXPECT_EQ(testing::ExitCode(*status), 0) << testing::ReadFile(log);

  testing::ExpectHoldsOldSnapshot(state);
}

INSTANTIATE_TEST_SUITE_P(Stores, OldStoreProcessTest, ::testing::Values("store-0.2", "store-0.2-wal"),
                         testing::StoreCaseName);

}  // namespace
}  // namespace parasync
