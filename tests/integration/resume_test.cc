// A run killed mid-epoch and launched again on its state directories goes on where it
// stopped, as Keras's BackupAndRestore does: the chief's eval.jsonl continues from the epoch
// it had reached, and the examples trained add up to an uninterrupted run's within one batch
// per worker. Real parasync-launch, parasync-ps and parasync-worker over loopback; the whole
// cluster killed with SIGKILL, the servers and workers before the launcher (whose death
// would send them SIGTERM, PR_SET_PDEATHSIG, and a graceful stop saves what a kill loses),
// and each of them seen to die of that SIGKILL.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/process_util.h"
#include "tests/support/data_files.h"

namespace parasync {
namespace {

using namespace std::chrono_literals;
using testing::Child;
using testing::ExitCode;
using testing::TempDir;

constexpr int kTrain = 2400;
constexpr int kWorkers = 2;
constexpr int kBatch = 50;
constexpr int kEpochs = 4;
constexpr int kShard = kTrain / kWorkers;  // examples per worker per epoch

class ResumeTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    data_ = dir_.path() + "/data";
    std::filesystem::create_directories(data_);
    ASSERT_TRUE(testing::WriteLinearSplit(data_, "train", kTrain, 1));
    ASSERT_TRUE(testing::WriteLinearSplit(data_, "test", 300, 2));
  }

  // The launcher's command line for a run keeping its state in `state` and its logs in `log`.
  // Every update is durable (a SIGKILL loses nothing acknowledged); the workers pause a few
  // ms a step, so an epoch lasts long enough to be killed in, and log their progress. The
  // chief pauses least: its final evaluation waits for the other worker's last epoch (the
  // launcher's default), so that an uninterrupted run's last row counts exactly
  // kEpochs * kTrain examples.
  std::vector<std::string> Command(const std::string& state, const std::string& log) const {
    return {testing::BinDir() + "/parasync-launch", "--ps", "2", "--workers",
            std::to_string(kWorkers), "--mode", GetParam(), "--epochs", std::to_string(kEpochs),
            "--dataset", data_, "--model", "12-16-3", "--batch-size", std::to_string(kBatch),
            "--lr", "0.05", "--state-dir", state, "--log-dir", log, "--grace-seconds", "5",
            "--ps-arg=--durability=every-update", "--rank-arg", "0:--step-delay=0.015",
            "--rank-arg", "1:--step-delay=0.025", "--worker-arg=--log-every=0.05"};
  }

  // Runs the launcher to its end; returns its exit code (-1 on timeout).
  int RunToEnd(const std::vector<std::string>& argv, const std::string& out) {
    Child child = Child::Start(argv, out);
    const auto status = child.Wait(180s);
    return status ? ExitCode(*status) : -1;
  }

  TempDir dir_;
  std::string data_;
};

struct EvalRow {
  int epoch = 0;
  int64_t examples = 0;
};

std::vector<EvalRow> ReadEval(const std::string& path) {
  std::vector<EvalRow> rows;
  for (const std::string& line : testing::ReadLines(path)) {
    if (line.empty()) continue;
    const auto row = nlohmann::json::parse(line);
    rows.push_back({row["epoch"].get<int>(), row["examples"].get<int64_t>()});
  }
  return rows;
}

std::vector<int> Epochs(const std::vector<EvalRow>& rows) {
  std::vector<int> epochs;
  for (const EvalRow& r : rows) epochs.push_back(r.epoch);
  return epochs;
}

// The examples of worker 0's current epoch its last progress line reports in `epoch`, or -1.
int64_t ProgressInEpoch(const std::string& log, int epoch) {
  const std::regex line("epoch " + std::to_string(epoch) + "/" + std::to_string(kEpochs) +
                        ": ([0-9]+) of " + std::to_string(kShard) + " examples");
  int64_t done = -1;
  for (const std::string& text : testing::ReadLines(log)) {
    std::smatch m;
    if (std::regex_search(text, m, line)) done = std::stoll(m[1].str());
  }
  return done;
}

TEST_P(ResumeTest, AClusterKilledMidEpochGoesOnFromWhereItStopped) {
  const std::vector<int> all_epochs = {0, 1, 2, 3, 4};
  // The uninterrupted run: the figure to match.
  const std::string whole_log = dir_.path() + "/whole";
  ASSERT_EQ(RunToEnd(Command(dir_.path() + "/whole-state", whole_log), dir_.path() + "/whole.out"),
            0)
      << testing::ReadFile(dir_.path() + "/whole.out");
  const std::vector<EvalRow> whole = ReadEval(whole_log + "/eval.jsonl");
  ASSERT_EQ(Epochs(whole), all_epochs);
  const int64_t uninterrupted = whole.back().examples;
  EXPECT_EQ(uninterrupted, int64_t{kEpochs} * kTrain);
  // The slower worker finished its last epoch by itself, and the workers' own counts agree
  // with the final evaluation's.
  const auto summary = nlohmann::json::parse(testing::ReadFile(whole_log + "/summary.json"));
  EXPECT_EQ(summary["workers_finished"], nlohmann::json("all")) << summary.dump(2);
  EXPECT_EQ(summary["examples_source"], nlohmann::json("worker_snapshots"));
  EXPECT_EQ(summary["examples"], uninterrupted);

  // The same run, killed whole (SIGKILL: launcher, servers, workers) in the middle of epoch 2.
  const std::string state = dir_.path() + "/state";
  const std::string log = dir_.path() + "/run";
  int64_t killed_at = -1;
  {
    Child launcher = Child::Start(Command(state, log), dir_.path() + "/first.out");
    const bool mid_epoch = testing::WaitFor(
        [&] {
          killed_at = ProgressInEpoch(log + "/worker0.log", 2);
          return killed_at > 0 && killed_at < kShard / 2;
        },
        120s);
    ASSERT_TRUE(mid_epoch) << testing::ReadFile(dir_.path() + "/first.out");
    const auto cluster = nlohmann::json::parse(testing::ReadFile(log + "/cluster.json"));
    std::vector<pid_t> pids;
    for (const auto& p : cluster["processes"]) pids.push_back(p["pid"].get<pid_t>());
    // The servers and workers first. The launcher is held meanwhile (SIGSTOP: no parent-death
    // signal), so it reaps none of them and each stays a zombie whose status says how it died.
    launcher.Signal(SIGSTOP);
    for (pid_t pid : pids) kill(pid, SIGKILL);
    for (size_t i = 0; i < pids.size(); ++i) {
      std::optional<int> status;
      const bool dead = testing::WaitFor(
          [&] { return (status = testing::ZombieWaitStatus(pids[i])).has_value(); }, 10s);
      EXPECT_TRUE(dead) << cluster["processes"][i]["name"] << " did not die";
      if (!status) continue;
      EXPECT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL)
          << cluster["processes"][i]["name"] << " ended with wait status " << *status;
    }
    launcher.Signal(SIGKILL);
    ASSERT_TRUE(launcher.Wait(10s).has_value());
    ASSERT_TRUE(testing::WaitFor(
        [&] {
          return std::none_of(pids.begin(), pids.end(),
                              [](pid_t p) { return testing::ProcessAlive(p); });
        },
        10s));
    // No graceful stop: a process that stops on a signal writes its final metrics (and a
    // server its final snapshot) first.
    for (const auto& p : cluster["processes"]) {
      const std::string snapshot = log + "/metrics-" + p["name"].get<std::string>() + ".prom";
      EXPECT_FALSE(std::filesystem::exists(snapshot)) << snapshot;
    }
  }
  const std::vector<EvalRow> before = ReadEval(log + "/eval.jsonl");
  ASSERT_EQ(Epochs(before), (std::vector<int>{0, 1}));

  // Launched again on the same directories: it goes on in epoch 2.
  const std::string again_out = dir_.path() + "/again.out";
  ASSERT_EQ(RunToEnd(Command(state, log), again_out), 0) << testing::ReadFile(again_out);
  const std::string again = testing::ReadFile(again_out);
  EXPECT_NE(again.find("resuming where the servers recorded rank 0: epoch 2"), std::string::npos)
      << again;
  // Rank 1 is slower: it was in epoch 1 or 2.
  EXPECT_TRUE(again.find("resuming where the servers recorded rank 1: epoch") != std::string::npos)
      << again;
  const std::vector<EvalRow> rows = ReadEval(log + "/eval.jsonl");
  std::printf("[ resume   ] killed at worker 0's example %lld of epoch 2; examples trained: "
              "uninterrupted %lld, killed and resumed %lld\n",
              static_cast<long long>(killed_at), static_cast<long long>(uninterrupted),
              static_cast<long long>(rows.empty() ? -1 : rows.back().examples));
  EXPECT_EQ(Epochs(rows), all_epochs);  // epochs 0 and 1 are not evaluated again
  ASSERT_FALSE(rows.empty());
  // A SIGKILL can leave one server a push of a worker ahead of the other; that push is made
  // again (async: acknowledged there, not applied again; sync: applied again), and each
  // server's snapshot may hold a different step: the count may exceed the uninterrupted one
  // by a batch per worker, never more.
  EXPECT_GE(rows.back().examples, uninterrupted);
  EXPECT_LE(rows.back().examples, uninterrupted + int64_t{kWorkers} * kBatch);
}

INSTANTIATE_TEST_SUITE_P(Modes, ResumeTest, ::testing::Values("async", "sync"),
                         [](const auto& param_info) { return param_info.param; });

}  // namespace
}  // namespace parasync
