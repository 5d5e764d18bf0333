// The real parasync-ps restores a store an earlier build wrote (tests/ps/testdata/store-0.2*)
// and, stopped, leaves it holding what it held: the on-disk format read and written back by
// the whole server (its start-up checks, Server::Restore, its snapshot on shutdown), not
// just by CheckpointStore.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "ps/checkpoint_store.h"
#include "tests/support/process_util.h"
#include "tests/ps/testdata/old_snapshot.h"

namespace parasync {
namespace {

using namespace std::chrono_literals;
using testing::Child;
using testing::ExitCode;
using testing::TempDir;

class OldStoreProcessTest : public ::testing::TestWithParam<std::string> {};

TEST_P(OldStoreProcessTest, ServerRestoresItAndLeavesItWhole) {
  TempDir dir;
  const std::string state = dir.File("state");
  std::filesystem::copy(std::string(PARASYNC_TESTDATA_DIR) + "/" + GetParam(), state,
                        std::filesystem::copy_options::recursive);
  const std::vector<int> ports = testing::FreePorts(5);
  std::vector<std::string> ps_hosts;
  for (int i = 0; i < 3; ++i) ps_hosts.push_back("127.0.0.1:" + std::to_string(ports[i]));
  const std::string log = dir.File("ps1.log");
  // Shard 1 of 3, in the stored mode; the other two shards need not run for a restore.
  Child ps = Child::Start(
      {testing::BinDir() + "/parasync-ps", "--ps-hosts", testing::JoinHosts(ps_hosts),
       "--worker-hosts", "127.0.0.1:" + std::to_string(ports[3]), "--task-index", "1", "--mode",
       "sync", "--state-dir", state, "--metrics-port", std::to_string(ports[4])},
      log);
  const std::string restored = "restored from " + state + ": version 977, 62528 examples, 3 slices";
  ASSERT_TRUE(testing::WaitFor(
      [&] { return testing::ReadFile(log).find(restored) != std::string::npos; }, 60s))
      << "no \"" << restored << "\" in the log:\n"
      << testing::ReadFile(log);
  ps.Signal(SIGTERM);
  const std::optional<int> status = ps.Wait(60s);
  ASSERT_TRUE(status.has_value()) << "parasync-ps did not stop within 60 s of SIGTERM";
  EXPECT_EQ(ExitCode(*status), 0) << testing::ReadFile(log);

  Result<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Open(state, 1, 3);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  Result<ShardSnapshot> loaded = (*store)->Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const ShardSnapshot expected = testing::OldSnapshot();
  EXPECT_EQ(loaded->registration, expected.registration);
  EXPECT_EQ(loaded->version, expected.version);
  EXPECT_EQ(loaded->examples, expected.examples);
  EXPECT_EQ(loaded->slices, expected.slices);
  EXPECT_EQ(loaded->ranks, expected.ranks);
}

INSTANTIATE_TEST_SUITE_P(Stores, OldStoreProcessTest, ::testing::Values("store-0.2", "store-0.2-wal"),
                         testing::StoreCaseName);

}  // namespace
}  // namespace parasync
