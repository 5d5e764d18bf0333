// parasync-launch's multi-host mode without a second machine: the real parasync-ps and
// parasync-worker, reached through a fake ssh that runs the command here (127.0.0.2 and
// 127.0.0.3 are loopback addresses the binaries can bind, yet "remote" to the launcher).
// The preflight (--check) must name a port in use, an unreachable host, a role-count
// mismatch and a build whose schema differs; --dry-run must print the ssh commands; and a
// short run must train and stop its "remote" processes through the ssh connection.
// Also the real processes of single-host runs, whose servers pick their own ports: two runs
// started together, and a server killed and restarted on its address.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/ready_file.h"
#include "tests/support/process_util.h"

namespace parasync {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::Child;
using testing::ExitCode;
using testing::TempDir;

// The fake ssh: `fake-ssh HOST COMMAND`. "badhost" fails as ssh does for an unknown host
// (status 255); for "oldhost" the remote binary directory /REMOTE is a directory of fakes
// reporting an older build; elsewhere /REMOTE is the real binary directory.
constexpr const char* kFakeSsh = R"sh(#!/bin/sh
host=$1; shift
case "$host" in
  badhost) echo "ssh: Could not resolve hostname badhost: Name or service not known" >&2
           exit 255 ;;
  oldhost) dir=$OLD_BIN ;;
  *) dir=$REAL_BIN ;;
esac
exec sh -c "$(printf '%s' "$1" | sed "s#/REMOTE#$dir#g")"
)sh";

constexpr const char* kOldBinary = R"sh(#!/bin/sh
echo "check version 0.0.9 protocol 2 schema 000000000000"
)sh";

class PreflightTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ssh_ = dir_.path() + "/fake-ssh";
    WriteExecutable(ssh_, kFakeSsh);
    old_bin_ = dir_.path() + "/old";
    std::filesystem::create_directories(old_bin_);
    WriteExecutable(old_bin_ + "/parasync-ps", kOldBinary);
    WriteExecutable(old_bin_ + "/parasync-worker", kOldBinary);
  }

  static void WriteExecutable(const std::string& path, const std::string& text) {
    std::ofstream(path) << text;
    std::filesystem::permissions(path, std::filesystem::perms::owner_all);
  }

  // Runs parasync-launch with the fake ssh; returns its exit code and output.
  std::pair<int, std::string> Launch(std::vector<std::string> args, std::chrono::seconds limit = 60s) {
    std::vector<std::string> argv = {testing::BinDir() + "/parasync-launch", "--ssh-command",
                                     ssh_, "--remote-bin-dir", "/REMOTE", "--log-dir",
                                     dir_.path() + "/run"};
    if (std::find(args.begin(), args.end(), "--data") == args.end()) {
      argv.insert(argv.end(), {"--data", testing::DataDir()});
    }
    argv.insert(argv.end(), args.begin(), args.end());
    const std::string out = dir_.path() + "/out";
    std::filesystem::remove(out);
    Child child = Child::Start(argv, out,
                               {"REAL_BIN=" + testing::BinDir(), "OLD_BIN=" + old_bin_});
    auto status = child.Wait(limit);
    EXPECT_TRUE(status.has_value()) << testing::ReadFile(out);
    return {status ? ExitCode(*status) : -1, testing::ReadFile(out)};
  }

  // A --port-base of this test's own: ports base..base+4 and base+500..base+504 on
  // 127.0.0.2 and 127.0.0.3, free now. Multi-host ports are fixed, so they are chosen before
  // the processes bind them; no other test binds those addresses, but this file's tests run
  // side by side (ctest --parallel), so each takes one of kSlots bases, 20000 + 1000 * slot,
  // by an exclusive lock on /tmp/parasync-preflight-port-slot-<slot> held for the test's
  // life (the kernel drops it with the process, however that ends), skipping a slot whose
  // ports something else holds. All below the ephemeral range: no outgoing connection takes
  // one meanwhile. A test failure (and 0) when no slot is free within 60 s.
  int PortBase() {
    if (base_ > 0) return base_;
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (std::chrono::steady_clock::now() < deadline) {
      for (int slot = 0; slot < kSlots; ++slot) {
        const std::string path = "/tmp/parasync-preflight-port-slot-" + std::to_string(slot);
        const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
        if (fd < 0) continue;
        if (flock(fd, LOCK_EX | LOCK_NB) != 0 || !SlotFree(20000 + 1000 * slot)) {
          close(fd);
          continue;
        }
        slot_lock_ = fd;
        return base_ = 20000 + 1000 * slot;
      }
      std::this_thread::sleep_for(100ms);
    }
    ADD_FAILURE() << "no free port base within 60 s";
    return 0;
  }

  void TearDown() override {
    if (slot_lock_ >= 0) close(slot_lock_);
  }

  static constexpr int kSlots = 12;  // the last: ports 31000-31504

  TempDir dir_;
  std::string ssh_;
  std::string old_bin_;
  int base_ = 0;
  int slot_lock_ = -1;

 private:
  // Whether the ten ports of `base` can be bound on both addresses (as a server binds:
  // SO_REUSEADDR).
  static bool SlotFree(int base) {
    for (const char* host : {"127.0.0.2", "127.0.0.3"}) {
      for (int port : {base, base + 1, base + 2, base + 3, base + 4, base + 500, base + 501,
                       base + 502, base + 503, base + 504}) {
        const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        const int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_port = htons(static_cast<uint16_t>(port));
        inet_pton(AF_INET, host, &addr.sin_addr);
        const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
        close(fd);
        if (!bound) return false;
      }
    }
    return true;
  }
};

// A listening socket on host:port for the test's lifetime, or -1.
int Listen(const char* host, int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, host, &addr.sin_addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 1) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

TEST_F(PreflightTest, AllClearPassesAndNamesTheBuild) {
  auto [code, out] = Launch({"--ps", "127.0.0.2:1", "-H", "127.0.0.2:1,127.0.0.3:1",
                             "--port-base", std::to_string(PortBase()), "--check"});
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("check passed: 3 processes on 2 host(s), all 0.1.0 protocol"));
}

// On a single host the servers are told port 0: their --check has no port of theirs to find
// in use, and the workers' --check takes placeholders for the servers' ports.
TEST_F(PreflightTest, ALocalClusterCheckPassesWithItsServersOnPortZero) {
  auto [code, out] = Launch({"--ps", "2", "--workers", "2", "--check"});
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("check passed: 4 processes on 1 host(s)"));
}

// A port the user gave is still checked.
TEST_F(PreflightTest, ALocalClusterCheckNamesAMetricsPortTheUserGaveThatIsInUse) {
  const int busy = Listen("127.0.0.1", 0);
  ASSERT_GE(busy, 0);
  sockaddr_in addr{};
  socklen_t length = sizeof(addr);
  ASSERT_EQ(getsockname(busy, reinterpret_cast<sockaddr*>(&addr), &length), 0);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  auto [code, out] =
      Launch({"--ps", "1", "--workers", "1", "--ps-arg=--metrics-port=" + port, "--check"});
  close(busy);
  EXPECT_EQ(code, 1) << out;
  EXPECT_THAT(out, HasSubstr("check: ps0 on 127.0.0.1: "));
  EXPECT_THAT(out, HasSubstr("port " + port + " on 127.0.0.1 is in use\n"));
  EXPECT_EQ(testing::ReadLines(dir_.path() + "/out").size(), 1u) << out;
}

TEST_F(PreflightTest, EachProblemIsOneLine) {
  const int base = PortBase();
  const int busy = Listen("127.0.0.2", base);
  ASSERT_GE(busy, 0);
  auto [code, out] = Launch({"--ps", "127.0.0.2:1,oldhost:1", "-H", "badhost:1,127.0.0.3:1",
                             "--port-base", std::to_string(base), "--check"});
  close(busy);
  EXPECT_EQ(code, 1) << out;
  // A wrong port: ps0's is taken.
  EXPECT_THAT(out, HasSubstr("check: ps0 on 127.0.0.2: port " + std::to_string(base) +
                             " on 127.0.0.2 is in use\n"));
  // A schema-version mismatch.
  EXPECT_THAT(out, HasSubstr("check: ps1 on oldhost: parasync-ps is 0.0.9 protocol 2 schema "
                             "000000000000, but parasync-launch is 0.1.0 protocol"));
  // A missing host, said once although it would run a process.
  EXPECT_THAT(out, HasSubstr("check: host badhost is unreachable: ssh: Could not resolve"));
  EXPECT_EQ(testing::ReadLines(dir_.path() + "/out").size(), 3u) << out;
}

TEST_F(PreflightTest, RoleCountMismatchIsOneLineAndExitCode2) {
  auto [code, out] = Launch({"--ps", "127.0.0.2:1", "-H", "127.0.0.2:2", "--workers", "3",
                             "--check"});
  EXPECT_EQ(code, 2) << out;
  EXPECT_THAT(out, HasSubstr("role counts: --workers 3, but -H places 2 workers"));
  EXPECT_EQ(testing::ReadLines(dir_.path() + "/out").size(), 1u) << out;
}

TEST_F(PreflightTest, MissingDataIsNamed) {
  auto [code, out] = Launch({"--ps", "127.0.0.2:1", "-H", "127.0.0.3:1", "--port-base",
                             std::to_string(PortBase()), "--check", "--data", "/nonexistent"});
  EXPECT_EQ(code, 1) << out;
  EXPECT_THAT(out, HasSubstr("check: worker0 on 127.0.0.3: --dataset /nonexistent lacks "
                             "train-images-idx3-ubyte[.gz]"));
}

TEST_F(PreflightTest, AWorkerCommandIsCheckedWithoutRunningIt) {
  const std::string mark = dir_.path() + "/ran";
  const std::string command = "touch " + mark;
  // On this host: its data set need only be a directory (its format is the program's).
  auto passed = Launch({"--ps", "1", "--workers", "1", "--worker-command", command, "--data",
                        dir_.path(), "--check"});
  EXPECT_EQ(passed.first, 0) << passed.second;
  EXPECT_THAT(passed.second, HasSubstr("check passed: 2 processes on 1 host(s)"));
  auto missing = Launch({"--ps", "1", "--workers", "1", "--worker-command", command, "--data",
                         "/nonexistent", "--check"});
  EXPECT_EQ(missing.first, 1) << missing.second;
  EXPECT_THAT(missing.second,
              HasSubstr("check: worker0 on 127.0.0.1: --dataset /nonexistent is not a "
                        "directory\n"));
  // On other hosts, over ssh: that the host answers and has the data set.
  auto remote = Launch({"--ps", "127.0.0.2:1", "-H", "badhost:1,127.0.0.3:1", "--port-base",
                        std::to_string(PortBase()), "--worker-command", command, "--data",
                        "/nonexistent", "--check"});
  EXPECT_EQ(remote.first, 1) << remote.second;
  EXPECT_THAT(remote.second, HasSubstr("check: host badhost is unreachable: ssh: Could not "
                                       "resolve"));
  EXPECT_THAT(remote.second, HasSubstr("check: worker1 on 127.0.0.3: --dataset /nonexistent is "
                                       "not a directory there\n"));
  EXPECT_EQ(testing::ReadLines(dir_.path() + "/out").size(), 2u) << remote.second;
  EXPECT_FALSE(std::filesystem::exists(mark)) << "--check ran the worker command";
}

TEST_F(PreflightTest, DryRunPrintsEveryCommandWithItsHostAndLocalRank) {
  auto [code, out] = Launch({"--ps", "n1:1", "-H", "n1:2,n2:1", "--dry-run"});
  EXPECT_EQ(code, 0) << out;
  const auto lines = testing::ReadLines(dir_.path() + "/out");
  ASSERT_EQ(lines.size(), 4u) << out;
  EXPECT_THAT(lines[0], HasSubstr("ps0 on n1: " + ssh_ +
                                  " n1 'exec 3<&0; PARASYNC_LOG_PREFIXED=1 /REMOTE/parasync-ps "
                                  "--ps-hosts n1:29500 --worker-hosts n1:29501,n1:29502,n2:29500"));
  EXPECT_THAT(lines[3], HasSubstr("worker2 on n2: " + ssh_ + " n2 "));
  EXPECT_THAT(lines[3], HasSubstr("--local-rank 0"));  // the first worker on n2
  EXPECT_THAT(lines[2], HasSubstr("--local-rank 1"));
  EXPECT_FALSE(std::filesystem::exists(dir_.path() + "/run")) << "a dry run starts nothing";
}

// --ps colocated: one server on every -H host (in -H's order), each beside its workers; it
// needs -H, said in one line with status 2.
TEST_F(PreflightTest, ColocatedPutsOneServerOnEveryWorkerHost) {
  auto [code, out] = Launch({"--ps", "colocated", "-H", "n1:2,n2:1,n1:1", "--dry-run"});
  EXPECT_EQ(code, 0) << out;
  const auto lines = testing::ReadLines(dir_.path() + "/out");
  ASSERT_EQ(lines.size(), 6u) << out;
  EXPECT_THAT(lines[0], HasSubstr("ps0 on n1: " + ssh_ + " n1 "));
  EXPECT_THAT(lines[1], HasSubstr("ps1 on n2: " + ssh_ + " n2 "));
  EXPECT_THAT(lines[0], HasSubstr("--ps-hosts n1:29500,n2:29500 "));
  EXPECT_THAT(lines[2], HasSubstr("worker0 on n1: "));
  EXPECT_THAT(lines[5], HasSubstr("worker3 on n1: "));
  // Each server also listens on a unix socket, in the run's directory of a name no other user
  // can guess (the servers make it private), and the workers on its host reach it there
  // (n1's workers shard 0's, n2's shard 1's), not the other host's.
  std::smatch found;
  ASSERT_TRUE(std::regex_search(lines[0], found,
                                std::regex("--ipc (/tmp/parasync-[0-9a-f]{16})/ps0\\.sock")))
      << lines[0];
  const std::string sockets = found[1];
  EXPECT_THAT(lines[1], HasSubstr("--ipc " + sockets + "/ps1.sock"));
  for (size_t w : {2u, 3u, 5u}) {
    EXPECT_THAT(lines[w], HasSubstr("--ps-ipc 0=" + sockets + "/ps0.sock"));
    EXPECT_THAT(lines[w], Not(HasSubstr("--ps-ipc 1=")));
  }
  EXPECT_THAT(lines[4], HasSubstr("--ps-ipc 1=" + sockets + "/ps1.sock"));
  EXPECT_THAT(lines[4], Not(HasSubstr("--ps-ipc 0=")));
  // --no-ipc: TCP everywhere; and without colocated, --ipc asks for it.
  auto [tcp_code, tcp_out] =
      Launch({"--ps", "colocated", "-H", "n1:2,n2:1,n1:1", "--no-ipc", "--dry-run"});
  EXPECT_EQ(tcp_code, 0) << tcp_out;
  EXPECT_THAT(testing::ReadFile(dir_.path() + "/out"), Not(HasSubstr("ipc")));
  auto [local_code, local_out] = Launch({"--ps", "1", "--workers", "1", "--ipc", "--dry-run"});
  EXPECT_EQ(local_code, 0) << local_out;
  EXPECT_THAT(testing::ReadFile(dir_.path() + "/out"), HasSubstr("--ps-ipc 0=/tmp/parasync-"));
  // Another run: another directory.
  auto [again_code, again_out] = Launch({"--ps", "1", "--workers", "1", "--ipc", "--dry-run"});
  EXPECT_EQ(again_code, 0) << again_out;
  EXPECT_THAT(testing::ReadFile(dir_.path() + "/out"), Not(HasSubstr(sockets)));

  auto [bad, said] = Launch({"--ps", "colocated", "--dry-run"});
  EXPECT_EQ(bad, 2) << said;
  EXPECT_THAT(said, HasSubstr("--ps colocated puts one parameter server on every -H host: it "
                              "needs -H"));
}

TEST_F(PreflightTest, RemoteProcessesTrainAndStopThroughTheirConnection) {
  if (!testing::DataAvailable()) GTEST_SKIP() << "Fashion-MNIST not installed";
  auto [code, out] = Launch({"--ps", "127.0.0.2:1", "-H", "127.0.0.2:1,127.0.0.3:1",
                             "--port-base", std::to_string(PortBase()), "--epochs", "1",
                             "--worker-arg=--train-examples=6000", "--mode", "sync"},
                            120s);
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("[127.0.0.3 worker1] "));
  EXPECT_THAT(out, HasSubstr("final test accuracy"));
  // The PS, stopped by closing its connection, exited cleanly (SIGTERM through the wrapper).
  EXPECT_THAT(out, HasSubstr("exit status: ps0 exit 0, worker0 exit 0, worker1 exit 0"));
  const auto cluster = nlohmann::json::parse(testing::ReadFile(dir_.path() + "/run/cluster.json"));
  EXPECT_EQ(cluster["processes"][2]["host"], "127.0.0.3");
}

// ---- single host: the servers pick their ports -----------------------------------------

// The "serving ... on tcp://ADDRESS" line of `name` in a launcher's output, every one in order.
std::vector<std::string> ServingAddresses(const std::string& out, const std::string& name) {
  std::vector<std::string> addresses;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("[" + name + "] ", 0) != 0) continue;
    const size_t at = line.find(" on tcp://");
    if (line.find(" serving ") == std::string::npos || at == std::string::npos) continue;
    const size_t start = at + std::strlen(" on tcp://");
    addresses.push_back(line.substr(start, line.find(' ', start) - start));
  }
  return addresses;
}

// Two runs started at the same moment on one host both train: no port is picked before its
// server binds it, so none can be taken by the other run in between. Each run's cluster.json
// holds what its processes bound, as their ready files and the servers' own lines say.
TEST_F(PreflightTest, TwoLocalRunsStartedTogetherBothTrainOnThePortsTheirServersBound) {
  if (!testing::DataAvailable()) GTEST_SKIP() << "Fashion-MNIST not installed";
  std::vector<Child> launches;
  for (int i = 0; i < 2; ++i) {
    const std::string run = dir_.path() + "/run" + std::to_string(i);
    launches.push_back(Child::Start(
        {testing::BinDir() + "/parasync-launch", "--ps", "2", "--workers", "2", "--epochs",
         "1", "--max-steps", "30", "--model", "784-10", "--log-dir", run, "--data",
         testing::DataDir(), "--grace-seconds", "5"},
        run + ".out"));
  }
  std::set<std::string> addresses;
  for (int i = 0; i < 2; ++i) {
    const std::string run = dir_.path() + "/run" + std::to_string(i);
    SCOPED_TRACE(run);
    const std::optional<int> status = launches[static_cast<size_t>(i)].Wait(150s);
    const std::string out = testing::ReadFile(run + ".out");
    ASSERT_TRUE(status.has_value()) << out;
    ASSERT_EQ(ExitCode(*status), 0) << out;
    const auto cluster = nlohmann::json::parse(testing::ReadFile(run + "/cluster.json"));
    ASSERT_EQ(cluster["processes"].size(), 4u);
    for (const nlohmann::json& process : cluster["processes"]) {
      const std::string name = process["name"].get<std::string>();
      const Result<ReadyInfo> ready = ReadReadyFile(run + "/" + name + ".ready");
      ASSERT_TRUE(ready.ok()) << ready.status().ToString();
      EXPECT_EQ(process["pid"], ready->pid) << name;
      EXPECT_EQ(process["address"], ready->address) << name;
      EXPECT_EQ(process["metrics_port"], ready->metrics_port) << name;
      if (process["role"] != "ps") continue;
      EXPECT_THAT(ServingAddresses(out, name), ::testing::ElementsAre(ready->address)) << name;
      EXPECT_TRUE(addresses.insert(ready->address).second) << "two servers on " << ready->address;
    }
  }
}

// A server killed and restarted (--kill) comes back on the address it bound at first, where
// the workers reconnect, and the run succeeds.
TEST_F(PreflightTest, ALocalServerKilledAndRestartedServesAgainOnItsAddress) {
  if (!testing::DataAvailable()) GTEST_SKIP() << "Fashion-MNIST not installed";
  const std::string run = dir_.path() + "/run";
  Child launch = Child::Start(
      {testing::BinDir() + "/parasync-launch", "--ps", "2", "--workers", "2", "--epochs", "1",
       "--max-steps", "60", "--model", "784-10", "--log-dir", run, "--data",
       testing::DataDir(), "--state-dir", dir_.path() + "/state", "--kill", "ps:1@0.5+0.5",
       "--grace-seconds", "5"},
      run + ".out");
  const std::optional<int> status = launch.Wait(150s);
  const std::string out = testing::ReadFile(run + ".out");
  ASSERT_TRUE(status.has_value()) << out;
  ASSERT_EQ(ExitCode(*status), 0) << out;
  const std::vector<std::string> served = ServingAddresses(out, "ps1");
  ASSERT_EQ(served.size(), 2u) << out;
  EXPECT_EQ(served[1], served[0]);
  const auto cluster = nlohmann::json::parse(testing::ReadFile(run + "/cluster.json"));
  EXPECT_EQ(cluster["processes"][1]["address"], served[0]);
  EXPECT_EQ(cluster["cluster"]["ps"][1], served[0]);
  const auto summary = nlohmann::json::parse(testing::ReadFile(run + "/summary.json"));
  EXPECT_EQ(summary["processes"][1]["restarts"], 1);
}

}  // namespace
}  // namespace parasync
