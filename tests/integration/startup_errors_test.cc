// Every startup error a retry cannot fix, binary by binary: the real process exits with
// status 2 and says so in exactly one line on stderr, "<program>: <what>", naming the flag,
// port, path or the values that disagree (common/cli.h). Orchestrators rely on it: systemd's
// RestartPreventExitStatus=2, a Kubernetes podFailurePolicy on exit 2. And the one that a
// retry may fix, a store locked by another process, exits 1.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/ports.h"
#include "tests/support/process_util.h"
#include "tests/support/temp_dir.h"

namespace parasync {
namespace {

using namespace std::chrono_literals;
using testing::BinDir;
using testing::Finished;
using testing::TempDir;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string Bin(const std::string& name) { return BinDir() + "/" + name; }

std::string Loopback(int port) { return "127.0.0.1:" + std::to_string(port); }

// Holds a free port the way another program would: bound and listening on 127.0.0.1.
class HeldPort {
 public:
  HeldPort() : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    auto bound = BindBelowEphemeral([&](int port) -> Result<bool> {
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      addr.sin_port = htons(static_cast<uint16_t>(port));
      if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) return true;
      if (errno == EADDRINUSE) return false;
      return Status::Unavailable(std::strerror(errno));
    });
    held_ = fd_ >= 0 && bound.ok() && *bound != 0 && listen(fd_, 1) == 0;
    port_ = held_ ? *bound : 0;
  }
  ~HeldPort() {
    if (fd_ >= 0) close(fd_);
  }
  HeldPort(const HeldPort&) = delete;
  HeldPort& operator=(const HeldPort&) = delete;
  bool held() const { return held_; }
  int port() const { return port_; }

 private:
  int fd_;
  bool held_ = false;
  int port_ = 0;
};

// Runs `argv` to its end and checks the contract: exit status 2, one line on stderr, from
// `program`, containing every one of `named`.
void ExpectRefused(const std::vector<std::string>& argv, const std::string& dir,
                   const std::vector<std::string>& named) {
  const std::string program = std::filesystem::path(argv[0]).filename();
  std::string command;
  for (const std::string& a : argv) command += " " + a;
  const Finished run = testing::RunToExit(argv, dir, 20s);
  SCOPED_TRACE(command + "\nstderr:\n" + run.err + "stdout:\n" + run.out);
  EXPECT_EQ(run.exit_code, 2);
  const std::vector<std::string> lines = run.ErrLines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], StartsWith(program + ": "));
  for (const std::string& n : named) EXPECT_THAT(lines[0], HasSubstr(n));
}

// One server on a free port (0) of its own, its /metrics on `metrics_port` (0: a free one).
// Workers bind none of their addresses: 127.0.0.1:1, :2 and so on name them.
std::vector<std::string> PsArgs(int metrics_port = 0, int num_workers = 1) {
  std::string workers;
  for (int i = 0; i < num_workers; ++i) workers += (i == 0 ? "" : ",") + Loopback(1 + i);
  return {Bin("parasync-ps"), "--ps-hosts", Loopback(0), "--worker-hosts", workers,
          "--task-index", "0", "--metrics-port", std::to_string(metrics_port)};
}

// Where a worker or a tool is sent when the test expects a refusal before any connection:
// a privileged port, where no test's server listens.
const std::string kNoServer = Loopback(1);

TEST(StartupErrorsTest, BadFlagsAreOneLineAndExitTwoInEveryBinary) {
  TempDir dir;
  // Refused before anything binds or connects.
  const std::vector<std::string> cluster = {"--ps-hosts", kNoServer, "--worker-hosts",
                                            Loopback(2), "--task-index", "0"};
  auto with = [](std::vector<std::string> argv, const std::vector<std::string>& more) {
    argv.insert(argv.end(), more.begin(), more.end());
    return argv;
  };
  ExpectRefused({Bin("parasync-ps"), "--no-such-flag"}, dir.path(), {"--no-such-flag"});
  ExpectRefused(with({Bin("parasync-ps")}, with(cluster, {"--worker-timeout", "soon"})),
                dir.path(), {"--worker-timeout", "soon"});
  ExpectRefused(with({Bin("parasync-ps")}, with(cluster, {"--table-expire-after", "3w"})),
                dir.path(), {"--table-expire-after", "'3w'"});
  ExpectRefused(with({Bin("parasync-ps")}, with(cluster, {"--table-expire-after", "0"})),
                dir.path(), {"--table-expire-after", "above 0"});
  ExpectRefused({Bin("parasync-worker"), "--no-such-flag"}, dir.path(), {"--no-such-flag"});
  ExpectRefused(with({Bin("parasync-worker")}, with(cluster, {"--request-timeout", "abc"})),
                dir.path(), {"--request-timeout", "abc"});
  ExpectRefused(
      with({Bin("parasync-worker")}, with(cluster, {"--step-delay", "1", "--step-delay-ms", "5"})),
      dir.path(), {"--step-delay", "--step-delay-ms"});
  ExpectRefused({Bin("parasync-export"), "--ps-hosts", kNoServer}, dir.path(), {"--out"});
  ExpectRefused({Bin("parasync-export"), "--out", dir.File("m.psm"), "--timeout", "-1"},
                dir.path(), {"--timeout"});
  // These were CLI11's own exit codes 106 and 109, without the program's name.
  ExpectRefused({Bin("parasync-keygen")}, dir.path(), {"names"});
  ExpectRefused({Bin("parasync-keygen"), "--no-such-flag", "a"}, dir.path(), {"--no-such-flag"});
  ExpectRefused({Bin("parasync-launch"), "--no-such-flag"}, dir.path(), {"--no-such-flag"});
  ExpectRefused({Bin("parasync-launch"), "--grace-seconds", "x"}, dir.path(), {"--grace-seconds"});
  ExpectRefused({Bin("parasync-launch"), "--workers", "0", "--log-dir", dir.File("runs")},
                dir.path(), {"--workers"});
}

TEST(StartupErrorsTest, EveryBinaryHasVersionAndHelpInOneStyle) {
  TempDir dir;
  for (const char* name : {"parasync-ps", "parasync-worker", "parasync-export", "parasync-keygen",
                           "parasync-launch", "parasync-fuzz-corpus"}) {
    SCOPED_TRACE(name);
    const Finished version = testing::RunToExit({Bin(name), "--version"}, dir.path(), 10s);
    EXPECT_EQ(version.exit_code, 0);
    EXPECT_THAT(version.out, StartsWith(std::string(name) + " "));
    const Finished help = testing::RunToExit({Bin(name), "--help"}, dir.path(), 10s);
    EXPECT_EQ(help.exit_code, 0);
    EXPECT_THAT(help.out, StartsWith(std::string(name) + ": "));
    EXPECT_THAT(help.out, HasSubstr("\nUsage: " + std::string(name)));
    EXPECT_THAT(help.out, HasSubstr("\nExit status: 0 done; 1 "));
    EXPECT_THAT(help.out, HasSubstr("\nExamples:\n"));
  }
  EXPECT_FALSE(std::filesystem::exists("--help")) << "parasync-fuzz-corpus made a directory";
}

TEST(StartupErrorsTest, PortsInUseAreNamedWithTheirFlag) {
  TempDir dir;
  HeldPort taken;
  ASSERT_TRUE(taken.held());
  const std::string port = std::to_string(taken.port());
  // The server's own port, then its metrics port.
  ExpectRefused({Bin("parasync-ps"), "--ps-hosts", Loopback(taken.port()), "--worker-hosts",
                 Loopback(1), "--task-index", "0"},
                dir.path(), {"--ps-hosts", port, "in use"});
  ExpectRefused({Bin("parasync-ps"), "--ps-hosts", Loopback(0), "--worker-hosts", Loopback(1),
                 "--task-index", "0", "--bind", Loopback(taken.port())},
                dir.path(), {"--bind", port, "in use"});
  ExpectRefused(PsArgs(taken.port()), dir.path(), {"--metrics-port " + port, "in use"});
  // The worker checks its metrics port before it loads any data.
  ExpectRefused({Bin("parasync-worker"), "--ps-hosts", kNoServer, "--worker-hosts", Loopback(2),
                 "--task-index", "0", "--metrics-port", port, "--log-dir", dir.File("w")},
                dir.path(), {"--metrics-port " + port, "in use"});
  // The launcher, before it starts anything: a metrics port in use, one given to two servers.
  ExpectRefused({Bin("parasync-launch"), "--ps", "1", "--workers", "1", "--log-dir",
                 dir.File("run1"), "--ps-arg=--metrics-port=" + port},
                dir.path(), {"--metrics-port " + port, "in use"});
  // (A port nobody holds, so that the one problem is that two servers are given it.)
  const std::string free_port = std::to_string(PickFreeLoopbackPorts(1)[0]);
  ExpectRefused({Bin("parasync-launch"), "--ps", "2", "--workers", "1", "--log-dir",
                 dir.File("run2"), "--ps-arg=--metrics-port=" + free_port},
                dir.path(), {"--metrics-port " + free_port, "ps0", "ps1"});
  EXPECT_FALSE(std::filesystem::exists(dir.File("run1"))) << "the launcher started the run";
  EXPECT_FALSE(std::filesystem::exists(dir.File("run2"))) << "the launcher started the run";
}

TEST(StartupErrorsTest, MissingDataForeignStateAndUnwritableFilesAreNamed) {
  TempDir dir;
  // A --state-dir (or its old name --data-dir) that holds something else.
  const std::string foreign = dir.File("foreign");
  std::filesystem::create_directories(foreign + "/ps0");
  std::ofstream(foreign + "/notes.txt") << "not a store\n";
  std::ofstream(foreign + "/ps0/notes.txt") << "not a store\n";
  for (const char* flag : {"--state-dir", "--data-dir"}) {
    std::vector<std::string> argv = PsArgs();
    argv.insert(argv.end(), {flag, foreign});
    ExpectRefused(argv, dir.path(), {foreign, "notes.txt"});
    ExpectRefused({Bin("parasync-launch"), "--ps", "1", "--workers", "1", "--log-dir",
                   dir.File("run"), flag, foreign},
                  dir.path(), {"--state-dir " + foreign + "/ps0", "notes.txt"});
  }
  // A data set that is not there, by the new name and the old.
  for (const char* flag : {"--dataset", "--data"}) {
    ExpectRefused({Bin("parasync-worker"), "--ps-hosts", kNoServer, "--worker-hosts",
                   Loopback(2), "--task-index", "0", flag, dir.File("none"), "--log-dir",
                   dir.File("w")},
                  dir.path(), {"--dataset " + dir.File("none")});
    ExpectRefused({Bin("parasync-launch"), "--ps", "1", "--workers", "1", "--log-dir",
                   dir.File("run"), flag, dir.File("none")},
                  dir.path(), {"--dataset " + dir.File("none")});
  }
  EXPECT_FALSE(std::filesystem::exists(dir.File("run"))) << "the launcher started the run";
  // Files that cannot be written, or exist already.
  ExpectRefused({Bin("parasync-export"), "--ps-hosts", kNoServer, "--out",
                 dir.File("none/model.psm")},
                dir.path(), {"--out " + dir.File("none/model.psm")});
  ExpectRefused({Bin("parasync-keygen"), "--dir", dir.File("keys"), "a", "a/b"}, dir.path(),
                {"a/b"});
  ASSERT_EQ(testing::RunToExit({Bin("parasync-keygen"), "--dir", dir.File("keys"), "k"},
                               dir.path(), 10s)
                .exit_code,
            0);
  ExpectRefused({Bin("parasync-keygen"), "--dir", dir.File("keys"), "k"}, dir.path(),
                {dir.File("keys/k")});
}

// A --state-dir or --log-dir (a server's, a worker's or the launcher's) that cannot be created for a reason no retry fixes — a place
// that holds no directories (/proc), a file on the way, a file system that refuses (/sys:
// read-only or not permitted) — is a configuration to change: status 2 and one line naming
// the flag and the path. (A full disk would be 1: it may be freed.)
TEST(StartupErrorsTest, DirectoriesThatCannotBeCreatedAreRefusedWithStatusTwo) {
  TempDir dir;
  std::ofstream(dir.File("a-file")) << "in the way\n";
  const std::vector<std::string> paths = {"/proc/parasync-no-such-dir/ps0",
                                          dir.File("a-file/ps0"), "/sys/parasync-no-such-dir"};
  for (const std::string& path : paths) {
    std::vector<std::string> ps = PsArgs();
    ps.insert(ps.end(), {"--state-dir", path});
    ExpectRefused(ps, dir.path(), {"--state-dir " + path});
    ps = PsArgs();
    ps.insert(ps.end(), {"--log-dir", path});
    ExpectRefused(ps, dir.path(), {"--log-dir " + path});
    ExpectRefused({Bin("parasync-worker"), "--ps-hosts", kNoServer, "--worker-hosts", Loopback(2),
                   "--task-index", "0", "--log-dir", path},
                  dir.path(), {"--log-dir " + path});
  }
  EXPECT_FALSE(std::filesystem::exists("/proc/parasync-no-such-dir"));
  // The launcher's parameter server refuses it at start; the launcher's status is its 2.
  if (!testing::DataAvailable()) GTEST_SKIP() << "no dataset at " << testing::DataDir();
  const Finished launched = testing::RunToExit(
      {Bin("parasync-launch"), "--ps", "1", "--workers", "1", "--log-dir", dir.File("run"),
       "--grace-seconds", "2", "--dataset", testing::DataDir(), "--state-dir",
       "/proc/parasync-no-such-dir"},
      dir.path(), 60s);
  EXPECT_EQ(launched.exit_code, 2) << launched.out << launched.err;
  EXPECT_THAT(testing::ReadFile(dir.File("run/ps0.log")),
              HasSubstr("--state-dir /proc/parasync-no-such-dir/ps0"));
  // The launcher's own --log-dir: refused before anything starts, with its one line.
  const Finished logs = testing::RunToExit(
      {Bin("parasync-launch"), "--ps", "1", "--workers", "1", "--log-dir",
       "/proc/parasync-no-such-dir/run", "--dataset", testing::DataDir()},
      dir.path(), 60s);
  EXPECT_EQ(logs.exit_code, 2) << logs.out << logs.err;
  EXPECT_THAT(logs.err, HasSubstr("cannot create log directory /proc/parasync-no-such-dir/run"));
}

// A real server: what it refuses at registration is for good (2); a store it holds locked
// may be free later (1). Stopped, its store of one --mode is refused by a launcher of another.
TEST(StartupErrorsTest, RefusalsOfARunningServerAndItsStore) {
  if (!testing::DataAvailable()) GTEST_SKIP() << "no dataset at " << testing::DataDir();
  TempDir dir;
  const std::string state = dir.File("state");
  std::vector<std::string> ps = PsArgs(0, 2);
  ps.insert(ps.end(), {"--mode", "async", "--state-dir", state + "/ps0"});
  testing::Serving serving = testing::StartServing(ps, dir.File("ps.log"));
  ASSERT_TRUE(serving.ready) << serving.why;
  testing::Child& server = serving.child;
  auto worker = [&](int rank, const std::vector<std::string>& more) {
    std::vector<std::string> argv = {Bin("parasync-worker"), "--ps-hosts", serving.ready->address,
                                     "--worker-hosts", Loopback(1) + "," + Loopback(2),
                                     "--task-index", std::to_string(rank), "--dataset",
                                     testing::DataDir(), "--device", "cpu", "--log-level",
                                     "error", "--log-dir", dir.File("w"), "--max-steps", "1",
                                     "--connect-timeout", "20"};
    argv.insert(argv.end(), more.begin(), more.end());
    return argv;
  };
  // The first registration makes the model; rank 1 trains one step and is done.
  const Finished first = testing::RunToExit(worker(1, {"--model", "784-16-10"}), dir.path(), 30s);
  ASSERT_EQ(first.exit_code, 0) << first.err << testing::ReadFile(dir.File("ps.log"));
  ExpectRefused(worker(0, {"--model", "784-16-10", "--mode", "sync"}), dir.path(),
                {"--mode sync", "--mode async"});
  ExpectRefused(worker(0, {"--model", "784-32-10"}), dir.path(), {"model differs"});

  // Another server on the same store while this one holds it: retryable.
  std::vector<std::string> second = PsArgs(0, 2);
  second.insert(second.end(), {"--mode", "async", "--state-dir", state + "/ps0"});
  const Finished locked = testing::RunToExit(second, dir.path(), 20s);
  EXPECT_EQ(locked.exit_code, 1) << locked.err;
  EXPECT_EQ(locked.ErrLines().size(), 1u) << locked.err;
  EXPECT_THAT(locked.err, StartsWith("parasync-ps: --state-dir "));

  server.Signal(SIGTERM);
  const auto stopped = server.Wait(20s);
  ASSERT_TRUE(stopped.has_value() && testing::ExitCode(*stopped) == 0)
      << testing::ReadFile(dir.File("ps.log"));
  // The launcher finds the store of another mode, and one of another shard count, before it
  // starts anything.
  ExpectRefused({Bin("parasync-launch"), "--ps", "1", "--workers", "1", "--mode", "sync",
                 "--state-dir", state, "--log-dir", dir.File("run")},
                dir.path(), {state + "/ps0", "mode async", "--mode sync"});
  std::filesystem::rename(state + "/ps0", state + "/ps1");
  ExpectRefused({Bin("parasync-launch"), "--ps", "1", "--workers", "1", "--state-dir", state,
                 "--log-dir", dir.File("run")},
                dir.path(), {"--state-dir " + state, "2 parameter servers", "--ps 1"});
  EXPECT_FALSE(std::filesystem::exists(dir.File("run"))) << "the launcher started the run";

  // A process that exits 2 once started makes the launcher's status 2 as well.
  const Finished launched = testing::RunToExit(
      {Bin("parasync-launch"), "--ps", "1", "--workers", "1", "--log-dir", dir.File("run3"),
       "--grace-seconds", "2", "--worker-arg=--lr-scaling=bogus"},
      dir.path(), 30s);
  EXPECT_EQ(launched.exit_code, 2) << launched.out << launched.err;
}

}  // namespace
}  // namespace parasync
