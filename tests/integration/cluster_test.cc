// End-to-end tests: the real parasync-launch starting real parasync-ps and parasync-worker
// processes over loopback, training on Fashion-MNIST; and the binaries' handling of bad
// flags and missing data.
#include <csignal>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/process_util.h"

namespace parasync {
namespace {

using namespace std::chrono_literals;
using testing::Child;
using testing::ExitCode;
using testing::TempDir;

TEST(ClusterTest, AsyncTwoPsTwoWorkersLearnsWellAboveChanceAndStopsCleanly) {
  if (!testing::DataAvailable()) GTEST_SKIP() << "Fashion-MNIST not installed at " << testing::DataDir();
  TempDir dir;
  const std::string out = dir.path() + "/launch.out";
  Child launch = Child::Start(
      {testing::BinDir() + "/parasync-launch", "--ps", "2", "--workers", "2", "--mode", "async",
       "--epochs", "1", "--max-steps", "150", "--log-dir", dir.path() + "/run", "--data",
       testing::DataDir(), "--grace-seconds", "10", "--eval-every", "60"},
      out);
  auto status = launch.Wait(240s);
  ASSERT_TRUE(status.has_value()) << "the launcher did not finish in 240 s:\n" << testing::ReadFile(out);
  const std::string printed = testing::ReadFile(out);
  ASSERT_EQ(ExitCode(*status), 0) << printed;

  // Progress reached the user with role prefixes, and the summary says where things are.
  EXPECT_NE(printed.find("[worker0]"), std::string::npos) << printed;
  EXPECT_NE(printed.find("[ps1]"), std::string::npos) << printed;
  EXPECT_NE(printed.find("final test accuracy"), std::string::npos) << printed;

  // The chief's evaluation log: epoch 0 (before training), after its steps 60 and 120 within
  // the epoch (--eval-every 60: 30,000 examples a worker, 469 steps an epoch), and after
  // the run.
  auto lines = testing::ReadLines(dir.path() + "/run/eval.jsonl");
  ASSERT_EQ(lines.size(), 4u) << printed;
  for (size_t i : {1u, 2u}) {
    const auto within = nlohmann::json::parse(lines[i]);
    EXPECT_EQ(within.value("within_epoch", false), true) << lines[i];
    EXPECT_NEAR(within["epoch"].get<double>(), 60.0 * static_cast<double>(i) * 64 / 30000, 1e-4)
        << lines[i];
    EXPECT_GT(within["step"].get<int64_t>(), nlohmann::json::parse(lines[i - 1])["step"].get<int64_t>());
  }
  EXPECT_FALSE(nlohmann::json::parse(lines.back()).contains("within_epoch")) << lines.back();
  const auto first = nlohmann::json::parse(lines.front());
  const auto last = nlohmann::json::parse(lines.back());
  for (const char* key : {"mode", "workers", "epoch", "step", "examples", "wall_s", "train_loss",
                          "test_loss", "test_accuracy"}) {
    EXPECT_TRUE(last.contains(key)) << key << " missing in " << lines.back();
  }
  EXPECT_EQ(last["mode"], "async");
  EXPECT_EQ(last["workers"], 2);
  // Chance is 0.10; 150 steps of each worker must get far beyond it.
  EXPECT_GE(last["test_accuracy"].get<double>(), 0.6) << lines.back();
  EXPECT_GT(last["test_accuracy"].get<double>(), first["test_accuracy"].get<double>());
  EXPECT_LT(last["test_loss"].get<double>(), first["test_loss"].get<double>());
  // Both workers pushed: the servers saw more than the chief's own 150 steps.
  EXPECT_GT(last["step"].get<int64_t>(), 150);

  // No process of the cluster is left behind.
  const auto cluster = nlohmann::json::parse(testing::ReadFile(dir.path() + "/run/cluster.json"));
  ASSERT_EQ(cluster["processes"].size(), 4u);
  for (const auto& p : cluster["processes"]) {
    const pid_t pid = p["pid"].get<pid_t>();
    EXPECT_TRUE(testing::WaitFor([&] { return !testing::ProcessAlive(pid); }, 5s))
        << p["name"] << " (pid " << pid << ") is still running";
  }
  // Every process left its final metrics.
  for (const char* f : {"metrics-ps0.prom", "metrics-ps1.prom", "metrics-worker0.prom",
                        "metrics-worker1.prom"}) {
    EXPECT_FALSE(testing::ReadFile(dir.path() + "/run/" + f).empty()) << f;
  }
  EXPECT_NE(testing::ReadFile(dir.path() + "/run/metrics-worker0.prom")
                .find("parasync_worker_examples_total"),
            std::string::npos);
}

// --ipc / --ps-ipc: the worker is given a TCP address where nothing listens for the shard,
// and the shard's unix socket: it can only train by reaching the shard over the socket.
TEST(ClusterTest, AWorkerReachesTheShardOnItsHostOverAUnixSocket) {
  if (!testing::DataAvailable()) GTEST_SKIP() << "Fashion-MNIST not installed at " << testing::DataDir();
  TempDir dir;
  // Port 1: privileged, so no test's server listens there.
  const std::string worker = "127.0.0.1:1", nowhere = "127.0.0.1:1";
  const std::string sock = dir.path() + "/ps0.sock", ready_file = dir.path() + "/ps0.ready";
  Child ps = Child::Start({testing::BinDir() + "/parasync-ps", "--ps-hosts", "127.0.0.1:0",
                           "--worker-hosts", worker, "--task-index", "0", "--mode", "sync",
                           "--ipc", sock, "--ready-file", ready_file},
                          dir.path() + "/ps0.log");
  std::string why;
  const auto ready = testing::WaitReady(ps, ready_file, 60s, &why);
  ASSERT_TRUE(ready) << why << "\n" << testing::ReadFile(dir.path() + "/ps0.log");
  // The address it reports is its TCP one, which its unix socket's bind came after.
  EXPECT_TRUE(ready->address.starts_with("127.0.0.1:")) << ready->address;
  Child trainer = Child::Start(
      {testing::BinDir() + "/parasync-worker", "--ps-hosts", nowhere, "--worker-hosts", worker,
       "--task-index", "0", "--mode", "sync", "--ps-ipc", "0=" + sock, "--data",
       testing::DataDir(), "--epochs", "1", "--max-steps", "30", "--log-dir", dir.path()},
      dir.path() + "/worker0.log");
  auto status = trainer.Wait(180s);
  ASSERT_TRUE(status.has_value()) << testing::ReadFile(dir.path() + "/worker0.log");
  ASSERT_EQ(ExitCode(*status), 0) << testing::ReadFile(dir.path() + "/worker0.log");
  const auto last = nlohmann::json::parse(testing::ReadLines(dir.path() + "/eval.jsonl").back());
  EXPECT_EQ(last["step"].get<int64_t>(), 30);
  EXPECT_TRUE(std::filesystem::exists(sock));
  ps.Signal(SIGTERM);
  auto stopped = ps.Wait(30s);
  ASSERT_TRUE(stopped.has_value());
  EXPECT_EQ(ExitCode(*stopped), 0) << testing::ReadFile(dir.path() + "/ps0.log");
  EXPECT_FALSE(std::filesystem::exists(sock)) << "the server left its socket behind";
}

TEST(ClusterTest, WorkerFailureFailsTheLaunchAndLeavesNothingRunning) {
  if (!testing::DataAvailable()) GTEST_SKIP() << "Fashion-MNIST not installed";
  TempDir dir;
  const std::string out = dir.path() + "/launch.out";
  // Workers refuse a model whose input width does not match the data: they exit 2, which a
  // retry cannot fix, and so does the launcher.
  Child launch = Child::Start(
      {testing::BinDir() + "/parasync-launch", "--ps", "1", "--workers", "2", "--epochs", "1",
       "--model", "100-10", "--log-dir", dir.path() + "/run", "--data", testing::DataDir(),
       "--grace-seconds", "5"},
      out);
  auto status = launch.Wait(120s);
  ASSERT_TRUE(status.has_value()) << testing::ReadFile(out);
  EXPECT_EQ(ExitCode(*status), 2) << testing::ReadFile(out);
  const auto cluster = nlohmann::json::parse(testing::ReadFile(dir.path() + "/run/cluster.json"));
  for (const auto& p : cluster["processes"]) {
    const pid_t pid = p["pid"].get<pid_t>();
    EXPECT_TRUE(testing::WaitFor([&] { return !testing::ProcessAlive(pid); }, 5s)) << p["name"];
  }
}

struct BadInvocation {
  std::string binary;
  std::vector<std::string> args;
  std::string expected;  // a piece of the one error line
};

class BadInvocationTest : public ::testing::TestWithParam<BadInvocation> {};

TEST_P(BadInvocationTest, EndsWithOneClearLineAndExitCode2) {
  const BadInvocation& c = GetParam();
  TempDir dir;
  std::vector<std::string> argv = {testing::BinDir() + "/" + c.binary};
  argv.insert(argv.end(), c.args.begin(), c.args.end());
  const std::string out = dir.path() + "/out";
  Child child = Child::Start(argv, out);
  auto status = child.Wait(30s);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(ExitCode(*status), 2) << testing::ReadFile(out);
  auto lines = testing::ReadLines(out);
  ASSERT_EQ(lines.size(), 1u) << testing::ReadFile(out);
  EXPECT_NE(lines[0].find(c.expected), std::string::npos) << lines[0];
}

const std::string kCluster = "--ps-hosts=127.0.0.1:1,127.0.0.1:2";
const std::string kWorkerHosts = "--worker-hosts=127.0.0.1:3";

INSTANTIATE_TEST_SUITE_P(
    Binaries, BadInvocationTest,
    ::testing::Values(
        BadInvocation{"parasync-ps", {"--bogus"}, "--bogus"},
        BadInvocation{"parasync-ps", {kCluster, kWorkerHosts, "--task-index=5"}, "task index 5"},
        BadInvocation{"parasync-ps", {kWorkerHosts, "--task-index=0"}, "no parameter servers"},
        BadInvocation{"parasync-ps", {"--ps-hosts=localhost", kWorkerHosts}, "not host:port"},
        BadInvocation{"parasync-ps", {kCluster, kWorkerHosts, "--mode=turbo"}, "turbo"},
        BadInvocation{"parasync-worker", {kCluster, kWorkerHosts, "--data=/nonexistent/dir"},
                      "/nonexistent/dir"},
        BadInvocation{"parasync-worker", {kCluster, kWorkerHosts, "--optimizer=lamb"}, "lamb"},
        BadInvocation{"parasync-worker", {kCluster, kWorkerHosts, "--model=784-x-10"}, "784-x-10"},
        BadInvocation{"parasync-worker", {kCluster, kWorkerHosts, "--lr=-1"}, "learning rate"},
        BadInvocation{"parasync-worker", {kCluster, kWorkerHosts, "--device=tpu"}, "tpu"},
        BadInvocation{"parasync-worker", {kCluster, kWorkerHosts, "--lr-schedule=step"}, "step"},
        BadInvocation{"parasync-worker", {kCluster, kWorkerHosts, "--lr-decay-epochs=3"},
                      "--lr-schedule cosine"},
        BadInvocation{"parasync-worker",
                      {kCluster, kWorkerHosts, "--lr-schedule=cosine", "--lr-final-fraction=2"},
                      "--lr-final-fraction"},
        BadInvocation{"parasync-launch", {"--lr-schedule=linear"}, "linear"},
        BadInvocation{"parasync-worker", {kCluster, kWorkerHosts, "--epochs=0"}, "--epochs"},
        BadInvocation{"parasync-launch", {"--workers=0"}, "--workers"},
        BadInvocation{"parasync-ps", {kCluster, kWorkerHosts, "--ipc=ps.sock"}, "absolute path"},
        BadInvocation{"parasync-ps", {kCluster, kWorkerHosts, "--ipc=/nonexistent/dir/ps.sock"},
                      "no directory /nonexistent/dir"},
        BadInvocation{"parasync-ps", {kCluster, kWorkerHosts, "--ipc=/" + std::string(120, 'x')},
                      "at most 107"},
        BadInvocation{"parasync-worker", {kCluster, kWorkerHosts, "--ps-ipc=/tmp/ps.sock"},
                      "SHARD=PATH"},
        BadInvocation{"parasync-worker", {kCluster, kWorkerHosts, "--ps-ipc=2=/tmp/ps.sock"},
                      "the cluster has 2 shards"},
        BadInvocation{"parasync-worker",
                      {kCluster, kWorkerHosts, "--ps-ipc=0=/a.sock", "--ps-ipc=0=/b.sock"},
                      "shard 0 is given twice"},
        BadInvocation{"parasync-worker", {kCluster, kWorkerHosts, "--mode=sync:eventually"},
                      "sync:delayed"}));

TEST(CliTest, TfConfigSuppliesTheClusterAndFlagsWin) {
  TempDir dir;
  const std::string out = dir.path() + "/out";
  // TF_CONFIG names 1 PS; the flag says task 3, which does not exist: the flag must win.
  Child child = Child::Start(
      {testing::BinDir() + "/parasync-ps", "--task-index=3"}, out,
      {"TF_CONFIG={\"cluster\":{\"ps\":[\"127.0.0.1:1\"],\"worker\":[\"127.0.0.1:2\"]},"
       "\"task\":{\"type\":\"ps\",\"index\":0}}"});
  auto status = child.Wait(30s);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(ExitCode(*status), 2);
  EXPECT_NE(testing::ReadFile(out).find("task index 3"), std::string::npos) << testing::ReadFile(out);
}

TEST(CliTest, HelpDescribesEveryBinaryAndExitsZero) {
  for (const char* binary : {"parasync-ps", "parasync-worker", "parasync-launch"}) {
    TempDir dir;
    const std::string out = dir.path() + "/out";
    Child child = Child::Start({testing::BinDir() + "/" + binary, "--help"}, out);
    auto status = child.Wait(30s);
    ASSERT_TRUE(status.has_value()) << binary;
    EXPECT_EQ(ExitCode(*status), 0) << binary;
    const std::string text = testing::ReadFile(out);
    EXPECT_NE(text.find("Example"), std::string::npos) << binary << ":\n" << text;
  }
}

}  // namespace
}  // namespace parasync
