// parasync-launch's multi-host mode without a second machine: the real parasync-ps and
// parasync-worker, reached through a fake ssh that runs the command here (127.0.0.2 and
// 127.0.0.3 are loopback addresses the binaries can bind, yet "remote" to the launcher).
// The preflight (--check) must name a port in use, an unreachable host, a role-count
// mismatch and a build whose schema differs; --dry-run must print the ssh commands; and a
// short run must train and stop its "remote" processes through the ssh connection.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/ports.h"
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

  TempDir dir_;
  std::string ssh_;
  std::string old_bin_;
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

int FreePortBase() {
  // Ports base..base+4 and base+500..base+504 on 127.0.0.2/3, from a port free on 127.0.0.1.
  return PickFreeLoopbackPorts(1).front() % 20000 + 20000;
}

TEST_F(PreflightTest, AllClearPassesAndNamesTheBuild) {
  auto [code, out] = Launch({"--ps", "127.0.0.2:1", "-H", "127.0.0.2:1,127.0.0.3:1",
                             "--port-base", std::to_string(FreePortBase()), "--check"});
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("check passed: 3 processes on 2 host(s), all 0.1.0 protocol"));
}

TEST_F(PreflightTest, LocalClusterCheckPassesDespiteTheLaunchersOwnPortReservation) {
  auto [code, out] = Launch({"--ps", "1", "--workers", "1", "--check"});
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("check passed: 2 processes on 1 host(s)"));
}

TEST_F(PreflightTest, EachProblemIsOneLine) {
  const int base = FreePortBase();
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
                             std::to_string(FreePortBase()), "--check", "--data", "/nonexistent"});
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
                        std::to_string(FreePortBase()), "--worker-command", command, "--data",
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
  // Each server also listens on a unix socket, and the workers on its host reach it there
  // (n1's workers shard 0's, n2's shard 1's), not the other host's.
  EXPECT_THAT(lines[0], HasSubstr("--ipc /tmp/parasync-ps-n1-29500.sock"));
  EXPECT_THAT(lines[1], HasSubstr("--ipc /tmp/parasync-ps-n2-29500.sock"));
  for (size_t w : {2u, 3u, 5u}) {
    EXPECT_THAT(lines[w], HasSubstr("--ps-ipc 0=/tmp/parasync-ps-n1-29500.sock"));
    EXPECT_THAT(lines[w], Not(HasSubstr("--ps-ipc 1=")));
  }
  EXPECT_THAT(lines[4], HasSubstr("--ps-ipc 1=/tmp/parasync-ps-n2-29500.sock"));
  EXPECT_THAT(lines[4], Not(HasSubstr("--ps-ipc 0=")));
  // --no-ipc: TCP everywhere; and without colocated, --ipc asks for it.
  auto [tcp_code, tcp_out] =
      Launch({"--ps", "colocated", "-H", "n1:2,n2:1,n1:1", "--no-ipc", "--dry-run"});
  EXPECT_EQ(tcp_code, 0) << tcp_out;
  EXPECT_THAT(testing::ReadFile(dir_.path() + "/out"), Not(HasSubstr("ipc")));
  auto [local_code, local_out] = Launch({"--ps", "1", "--workers", "1", "--ipc", "--dry-run"});
  EXPECT_EQ(local_code, 0) << local_out;
  EXPECT_THAT(testing::ReadFile(dir_.path() + "/out"), HasSubstr("--ps-ipc 0=/tmp/parasync-ps-"));

  auto [bad, said] = Launch({"--ps", "colocated", "--dry-run"});
  EXPECT_EQ(bad, 2) << said;
  EXPECT_THAT(said, HasSubstr("--ps colocated puts one parameter server on every -H host: it "
                              "needs -H"));
}

TEST_F(PreflightTest, RemoteProcessesTrainAndStopThroughTheirConnection) {
  if (!testing::DataAvailable()) GTEST_SKIP() << "Fashion-MNIST not installed";
  auto [code, out] = Launch({"--ps", "127.0.0.2:1", "-H", "127.0.0.2:1,127.0.0.3:1",
                             "--port-base", std::to_string(FreePortBase()), "--epochs", "1",
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

}  // namespace
}  // namespace parasync
