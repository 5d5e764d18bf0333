// Issue-3 acceptance with real processes over loopback: sync equals large-batch SGD, the ssp
// bound holds against a straggler, backup workers and dead workers do not stop training,
// uneven shards never deadlock, and every mode runs through parasync-launch.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/process_cluster.h"
#include "tests/support/process_util.h"
#include "tests/support/prometheus_text.h"
#include "worker/compute/backend.h"
#include "worker/data/dataset.h"
#include "tests/support/test_models.h"
#include "worker/ps_client.h"

namespace parasync {
namespace {

using namespace std::chrono_literals;
using testing::Child;
using testing::ExitCode;
using testing::ProcessCluster;
using testing::TempDir;

// What parasync-worker registers for these flags (see worker/main.cc).
ModelRegistration WorkerRegistration(const std::string& widths, float lr, int shards,
                                     const std::string& mode) {
  ModelRegistration reg;
  reg.variables = testing::MakeModel(widths, {1, 28, 28}).variables();
  reg.optimizer.kind = OptimizerKind::kSgd;
  reg.optimizer.learning_rate = lr;
  reg.seed = 42;
  reg.num_shards = shards;
  reg.mode = mode;
  return reg;
}

struct Params {
  explicit Params(const std::vector<VariableSpec>& vars) {
    for (const auto& v : vars) data.emplace_back(static_cast<size_t>(v.num_elements()));
    for (auto& d : data) ptrs.push_back(d.data());
    for (auto& d : data) cptrs.push_back(d.data());
  }
  std::vector<std::vector<float>> data;
  std::vector<float*> ptrs;
  std::vector<const float*> cptrs;
};

// Four sync workers, 20 steps of 16 examples each, against one process doing SGD with batch
// 64 on the same examples; with `cosine`, the servers' schedule decays the learning rate over
// exactly those 1280 examples and the one process applies the same factors step by step.
// With `delayed` (sync:delayed, --no-weight-prediction) every worker computes step t's gradient
// from the parameters of step t - 1 (step 0's from the initial ones); with `predicted` too (the
// default), from 2 w[t-1] - w[t-2] once there are two (steps 2 on). The one process does the
// same.
// With `grouped`, local aggregation (worker/local_group.h): ranks 0,1 and 2,3 are two hosts'
// groups, each pushing its sum once; the result must be the same SGD.
enum class Delay { kNone, kDelayed, kPredicted };
void ExpectSyncEqualsOneProcessSgd(bool cosine, Delay delay = Delay::kNone, bool grouped = false) {
  const bool delayed = delay != Delay::kNone;
  constexpr int kWorkers = 4, kBatch = 16, kSteps = 20;
  constexpr float kLr = 0.1f;
  const std::string widths = "784-32-10";
  const std::string mode = delayed ? "sync:delayed" : "sync";
  TempDir dir;
  ProcessCluster cluster(2, kWorkers, mode, {}, dir.path());
  zmq::context_t ctx;
  auto client = cluster.Client(ctx);
  ModelRegistration reg = WorkerRegistration(widths, kLr, 2, mode);
  std::vector<std::string> args = {"--model", widths, "--optimizer", "sgd", "--lr", "0.1",
                                   "--batch-size", std::to_string(kBatch), "--no-shuffle",
                                   "--max-steps", std::to_string(kSteps), "--epochs", "1"};
  if (delay == Delay::kDelayed) args.push_back("--no-weight-prediction");
  if (cosine) {
    constexpr int kExamples = kWorkers * kBatch * kSteps;
    reg.optimizer.schedule = LrSchedule::kCosine;
    reg.optimizer.decay_examples = kExamples;
    args.insert(args.end(), {"--lr-schedule", "cosine", "--lr-decay-epochs", "1",
                             "--train-examples", std::to_string(kExamples)});
  }
  ASSERT_TRUE(client->Register(reg, 20s).ok());
  Params start(reg.variables);
  ASSERT_TRUE(client->Pull(start.ptrs).ok());

  for (int r = 0; r < kWorkers; ++r) {
    std::vector<std::string> worker_args = args;
    if (grouped) {
      const int lowest = r / 2 * 2;
      worker_args.insert(worker_args.end(),
                         {"--local-group", std::to_string(lowest) + "," + std::to_string(lowest + 1),
                          "--local-group-endpoint",
                          "ipc://" + dir.path() + "/group" + std::to_string(lowest) + ".sock"});
    }
    cluster.StartWorker(r, worker_args);
  }
  for (int code : cluster.WaitWorkers(120s)) ASSERT_EQ(code, 0) << cluster.Dump();
  Params trained(reg.variables);
  ASSERT_TRUE(client->Pull(trained.ptrs).ok());
  auto stats = ProcessCluster::Stats(*client);
  ASSERT_FALSE(stats.empty());
  EXPECT_EQ(stats[0].version, kSteps);  // one optimizer step per 4 gradients
  EXPECT_EQ(stats[0].examples, kSteps * kWorkers * kBatch);
  for (const ShardStats& s : stats) {
    ASSERT_EQ(s.workers.size(), static_cast<size_t>(kWorkers));
    for (int r = 0; r < kWorkers; ++r) {
      // Grouped, each group's leader pushed every step and its member never did.
      const int64_t pushes = !grouped || r % 2 == 0 ? kSteps : 0;
      EXPECT_EQ(s.workers[static_cast<size_t>(r)].gradients, pushes)
          << "shard " << s.shard << " rank " << r;
    }
  }

  // One process: SGD with batch 4b. Worker r's step t used examples 4(16t+j)+r, j < 16;
  // together the contiguous block [64t, 64t+64).
  auto data = LoadIdxDataset(testing::DataDir(), "train");
  ASSERT_TRUE(data.ok());
  auto backend = CreateCpuBackend(testing::MakeModel(widths, {1, 28, 28}));
  ASSERT_TRUE(backend.ok());
  Params reference(reg.variables), grad(reg.variables), before(reg.variables),
      at(reg.variables);
  reference.data = start.data;
  before.data = start.data;  // delayed: the parameters of the step before
  const int big = kWorkers * kBatch;
  std::vector<float> x(static_cast<size_t>(big * data->dim));
  std::vector<uint8_t> y(static_cast<size_t>(big));
  for (int t = 0; t < kSteps; ++t) {
    std::vector<int64_t> idx(static_cast<size_t>(big));
    for (int j = 0; j < big; ++j) idx[static_cast<size_t>(j)] = int64_t{big} * t + j;
    GatherBatch(*data, idx, x.data(), y.data());
    const Params* read = delayed ? &before : &reference;
    if (delay == Delay::kPredicted && t >= 2) {
      // before holds w[t-1]; at gets 2 w[t-1] - w[t-2], with w[t-2] kept in `at` itself.
      for (size_t v = 0; v < at.data.size(); ++v) {
        for (size_t i = 0; i < at.data[v].size(); ++i) {
          at.data[v][i] = 2.0f * before.data[v][i] - at.data[v][i];
        }
      }
      read = &at;
    }
    ASSERT_TRUE((*backend)->ForwardBackward(read->cptrs, x.data(), y.data(), big, 0, grad.ptrs).ok());
    if (delayed) {
      at.data = before.data;  // w[t-1], the w[t-2] of the next step's prediction
      before.data = reference.data;
    }
    const float lr = kLr * LrScheduleFactor(reg.optimizer, int64_t{big} * t);
    for (size_t v = 0; v < reference.data.size(); ++v) {
      for (size_t i = 0; i < reference.data[v].size(); ++i) {
        reference.data[v][i] -= lr * grad.data[v][i];
      }
    }
  }
  double max_diff = 0, max_move = 0;
  for (size_t v = 0; v < reference.data.size(); ++v) {
    for (size_t i = 0; i < reference.data[v].size(); ++i) {
      max_diff = std::max(max_diff, double{std::fabs(trained.data[v][i] - reference.data[v][i])});
      max_move = std::max(max_move, double{std::fabs(trained.data[v][i] - start.data[v][i])});
    }
  }
  std::cout << "max |" << mode << " - one-process SGD| = " << max_diff << ", largest parameter move "
            << max_move << "\n";
  EXPECT_LE(max_diff, 1e-5) << "sync training differs from batch-64 SGD";
  EXPECT_GT(max_move, 1e-3) << "the parameters did not move: the comparison proves nothing";
}

TEST(SyncModeTest, FourWorkersEqualOneProcessDoingSgdWithFourTimesTheBatch) {
  if (!testing::DataAvailable()) GTEST_SKIP() << "Fashion-MNIST not installed";
  ExpectSyncEqualsOneProcessSgd(/*cosine=*/false);
}

TEST(SyncModeTest, DelayedSyncIsOneProcessDoingSgdWithGradientsOneStepOld) {
  if (!testing::DataAvailable()) GTEST_SKIP() << "Fashion-MNIST not installed";
  ExpectSyncEqualsOneProcessSgd(/*cosine=*/false, Delay::kDelayed);
}

TEST(SyncModeTest, DelayedSyncPredictsTheParametersItsGradientIsComputedAt) {
  if (!testing::DataAvailable()) GTEST_SKIP() << "Fashion-MNIST not installed";
  ExpectSyncEqualsOneProcessSgd(/*cosine=*/false, Delay::kPredicted);
}

TEST(SyncModeTest, TwoLocalGroupsOfTwoEqualOneProcessDoingSgdWithFourTimesTheBatch) {
  if (!testing::DataAvailable()) GTEST_SKIP() << "Fashion-MNIST not installed";
  ExpectSyncEqualsOneProcessSgd(/*cosine=*/false, Delay::kNone, /*grouped=*/true);
}

TEST(SyncModeTest, LocalGroupsUnderDelayedSyncPredictTheParametersAsFlat) {
  if (!testing::DataAvailable()) GTEST_SKIP() << "Fashion-MNIST not installed";
  ExpectSyncEqualsOneProcessSgd(/*cosine=*/false, Delay::kPredicted, /*grouped=*/true);
}

// Local aggregation when the group's leader dies (SIGKILL, mid-run): its member finds the
// leader's process gone, exchanges its own steps with the servers from then on, and the run
// ends for the member and for the worker outside the group.
TEST(SyncModeTest, WhenALocalGroupsLeaderIsKilledItsMemberGoesOnAlone) {
  if (!testing::DataAvailable()) GTEST_SKIP() << "Fashion-MNIST not installed";
  TempDir dir;
  ProcessCluster cluster(1, 3, "sync", {"--worker-timeout", "2"}, dir.path());
  zmq::context_t ctx;
  auto client = cluster.Client(ctx);
  ASSERT_NE(client, nullptr);
  const std::vector<std::string> args = {"--model", "784-32-10", "--batch-size", "16",
                                         "--max-steps", "120", "--epochs", "1",
                                         "--step-delay-ms", "20"};
  const std::vector<std::string> group = {"--local-group", "0,1", "--local-group-endpoint",
                                          "ipc://" + dir.path() + "/group.sock"};
  for (int r = 0; r < 3; ++r) {
    std::vector<std::string> a = args;
    if (r < 2) a.insert(a.end(), group.begin(), group.end());
    cluster.StartWorker(r, a);
  }
  // Some steps in, the leader dies.
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  int64_t version = 0;
  while (version < 15 && std::chrono::steady_clock::now() < deadline) {
    auto stats = client->Stats();
    if (stats.ok() && !stats->empty()) version = (*stats)[0].version;
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_GE(version, 15) << cluster.Dump();
  ASSERT_NO_FATAL_FAILURE(cluster.KillWorker(0));
  const std::vector<int> codes = cluster.WaitWorkers(120s);
  ASSERT_EQ(codes.size(), 3u);
  EXPECT_EQ(codes[0], 128 + SIGKILL);
  EXPECT_EQ(codes[1], 0) << cluster.Dump();
  EXPECT_EQ(codes[2], 0) << cluster.Dump();
  std::ifstream log(dir.path() + "/worker1.log");
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("exchanges its steps with the servers itself"), std::string::npos) << text;
  auto stats = ProcessCluster::Stats(*client);
  ASSERT_FALSE(stats.empty());
  ASSERT_EQ(stats[0].workers.size(), 3u);
  EXPECT_GT(stats[0].workers[1].gradients, 0) << "the member never pushed on its own";
  EXPECT_GT(stats[0].version, version) << "no step after the leader died";
}

TEST(SyncModeTest, TheServersCosineScheduleIsOneProcessesCosineStepForStep) {
  if (!testing::DataAvailable()) GTEST_SKIP() << "Fashion-MNIST not installed";
  ExpectSyncEqualsOneProcessSgd(/*cosine=*/true);
}

TEST(SspModeTest, StragglerNeverCausesClockStalenessAboveTheBoundAndFastWorkersBlock) {
  if (!testing::DataAvailable()) GTEST_SKIP() << "Fashion-MNIST not installed";
  TempDir dir;
  ProcessCluster cluster(2, 3, "ssp:2", {}, dir.path());
  const std::vector<std::string> common = {"--model", "784-32-10", "--batch-size", "16",
                                           "--max-steps", "60", "--epochs", "1"};
  for (int r = 0; r < 3; ++r) {
    std::vector<std::string> args = common;
    if (r == 2) args.insert(args.end(), {"--step-delay-ms", "30"});  // the straggler
    cluster.StartWorker(r, args);
  }
  for (int code : cluster.WaitWorkers(120s)) ASSERT_EQ(code, 0) << cluster.Dump();
  zmq::context_t ctx;
  auto client = cluster.Client(ctx);
  for (const ShardStats& s : ProcessCluster::Stats(*client)) {
    std::cout << "shard " << s.shard << ": max clock staleness " << s.max_clock_staleness
              << ", blocked pulls " << s.blocked_pulls << ", max version staleness "
              << s.max_version_staleness << "\n";
    EXPECT_EQ(s.mode, "ssp:2");
    EXPECT_LE(s.max_clock_staleness, 2) << "shard " << s.shard;
    EXPECT_GT(s.blocked_pulls, 0) << "the fast workers never waited for the straggler";
    ASSERT_EQ(s.workers.size(), 3u);
    for (const WorkerStats& w : s.workers) EXPECT_EQ(w.gradients, 60);
  }
}

// The value of the first sample of `name` whose labels include `labels` in a Prometheus text
// page or file (NAN when absent).
double Sample(const std::string& text, const std::string& name,
              const testing::PrometheusLabels& labels = {}) {
  return testing::PrometheusValue(text, name, labels).value_or(NAN);
}

// Stragglers are named: the PS pins barrier waits on the slow rank, exports it as the
// straggler, and logs it.
class StragglerTest : public ::testing::TestWithParam<std::string> {};

TEST_P(StragglerTest, TheSlowRankIsExportedAsTheStragglerAndLogged) {
  if (!testing::DataAvailable()) GTEST_SKIP() << "Fashion-MNIST not installed";
  TempDir dir;
  ProcessCluster cluster(1, 3, GetParam(), {"--straggler-log-seconds", "0.02"}, dir.path());
  const int metrics_port = cluster.metrics_port(0);
  for (int r = 0; r < 3; ++r) {
    std::vector<std::string> args = {"--model", "784-32-10", "--batch-size", "16",
                                     "--max-steps", "40", "--epochs", "1"};
    // The straggler. 100 ms a step, well above what a busy machine (other tests beside this
    // one) adds to the others' steps now and then: their waits reached 0.45 s in 40 steps.
    if (r == 2) args.insert(args.end(), {"--step-delay-ms", "100"});
    cluster.StartWorker(r, args);
  }
  for (int code : cluster.WaitWorkers(120s)) ASSERT_EQ(code, 0) << cluster.Dump();
  const std::string page = testing::HttpGet(metrics_port, "/metrics");
  const std::string waited = "parasync_ps_barrier_waited_for_seconds_total";
  const double slow = Sample(page, waited, {{"rank", "2"}});
  const double fast = std::max(Sample(page, waited, {{"rank", "0"}}),
                               Sample(page, waited, {{"rank", "1"}}));
  std::cout << GetParam() << ": barrier waited for rank 2 " << slow << " s, for the others at "
            << "most " << fast << " s; parasync_ps_straggler_rank "
            << Sample(page, "parasync_ps_straggler_rank") << "\n";
  EXPECT_EQ(Sample(page, "parasync_ps_straggler", {{"rank", "2"}}), 1) << page;
  EXPECT_EQ(Sample(page, "parasync_ps_straggler", {{"rank", "0"}}), 0) << page;
  EXPECT_EQ(Sample(page, "parasync_ps_straggler", {{"rank", "1"}}), 0) << page;
  EXPECT_EQ(Sample(page, "parasync_ps_straggler_rank"), 2) << page;  // deprecated, kept in 0.1
  // 40 steps of a 100 ms delay: most of it is pinned on rank 2, little on the others.
  EXPECT_GT(slow, 1.5) << page;
  EXPECT_LT(fast, slow / 4) << page;
  EXPECT_NE(testing::ReadFile(cluster.Log("ps0")).find("straggler: waited"), std::string::npos)
      << testing::ReadFile(cluster.Log("ps0"));
  EXPECT_NE(testing::ReadFile(cluster.Log("ps0")).find("for rank 2"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Modes, StragglerTest, ::testing::Values("sync", "ssp:1"),
                         [](const ::testing::TestParamInfo<std::string>& param_info) {
                           return param_info.param == "sync" ? std::string("sync")
                                                       : std::string("ssp_1");
                         });

TEST(SyncModeTest, BackupWorkersKeepTrainingWhileOneIsStoppedAndItsLateGradientIsDropped) {
  if (!testing::DataAvailable()) GTEST_SKIP() << "Fashion-MNIST not installed";
  TempDir dir;
  ProcessCluster cluster(1, 4, "sync", {"--replicas-to-aggregate", "3", "--worker-timeout", "2"},
                         dir.path());
  for (int r = 0; r < 4; ++r) {
    std::vector<std::string> args = {"--model", "784-32-10", "--batch-size", "16",
                                     "--max-steps", "300", "--epochs", "1",
                                     "--step-delay-ms", r == 3 ? "40" : "5"};
    cluster.StartWorker(r, args);
  }
  zmq::context_t ctx;
  auto client = cluster.Client(ctx);
  auto version = [&] {
    auto s = ProcessCluster::Stats(*client);
    return s.empty() ? int64_t{-1} : s[0].version;
  };
  ASSERT_TRUE(testing::WaitFor([&] { return version() >= 10; }, 60s)) << cluster.Dump();

  cluster.worker(3).Signal(SIGSTOP);
  const int64_t at_stop = version();
  // Training goes on without it: 3 of 4 gradients complete a step.
  ASSERT_TRUE(testing::WaitFor([&] { return version() >= at_stop + 30; }, 30s))
      << "training stalled with one backup worker stopped\n" << cluster.Dump();
  const int64_t dropped_before = ProcessCluster::Stats(*client)[0].workers[3].dropped;
  cluster.worker(3).Signal(SIGCONT);

  for (int code : cluster.WaitWorkers(120s)) ASSERT_EQ(code, 0) << cluster.Dump();
  const ShardStats s = ProcessCluster::Stats(*client)[0];
  std::cout << "dropped stale: " << s.dropped_stale << " in all, rank 3: " << dropped_before
            << " before it was resumed, " << s.workers[3].dropped << " at the end\n";
  EXPECT_GT(s.dropped_stale, 0);
  EXPECT_GT(s.workers[3].dropped, dropped_before)
      << "the stopped worker's gradient for an old step was not dropped when it resumed";
}

TEST(SyncModeTest, KilledWorkerIsDroppedWithinTheTimeoutAndARestartedOneRejoins) {
  if (!testing::DataAvailable()) GTEST_SKIP() << "Fashion-MNIST not installed";
  TempDir dir;
  constexpr auto kWorkerTimeout = 2s;
  ProcessCluster cluster(1, 3, "sync", {"--worker-timeout", "2"}, dir.path());
  const std::vector<std::string> args = {"--model", "784-32-10", "--batch-size", "16",
                                         "--max-steps", "100000", "--epochs", "100",
                                         "--step-delay-ms", "5"};
  for (int r = 0; r < 3; ++r) cluster.StartWorker(r, args);
  zmq::context_t ctx;
  auto client = cluster.Client(ctx);
  auto stats = [&] { return ProcessCluster::Stats(*client)[0]; };
  ASSERT_TRUE(testing::WaitFor([&] { return stats().version >= 10; }, 60s)) << cluster.Dump();

  cluster.worker(2).Signal(SIGKILL);
  ASSERT_TRUE(cluster.worker(2).Wait(5s).has_value());
  const auto killed_at = std::chrono::steady_clock::now();
  const int64_t at_kill = stats().version;
  // The barrier waits for the dead rank at most until it is declared dead.
  ASSERT_TRUE(testing::WaitFor([&] { return stats().version >= at_kill + 2; },
                               kWorkerTimeout + 1s))
      << "the others did not proceed within --worker-timeout + 1 s\n" << cluster.Dump();
  const auto proceeded_after = std::chrono::steady_clock::now() - killed_at;
  EXPECT_EQ(stats().workers_declared_dead, 1);
  EXPECT_FALSE(stats().workers[2].live);
  const int64_t gradients_before = stats().workers[2].gradients;

  cluster.StartWorker(2, args);  // a replacement with the same rank
  ASSERT_TRUE(testing::WaitFor([&] { return stats().workers[2].gradients >= gradients_before + 5; },
                               60s))
      << "the restarted worker does not contribute\n" << cluster.Dump();
  EXPECT_TRUE(stats().workers[2].live);
  EXPECT_EQ(stats().live_workers, 3);
  for (int r = 0; r < 3; ++r) cluster.worker(r).Signal(SIGTERM);
  for (int code : cluster.WaitWorkers(30s)) EXPECT_EQ(code, 0);
  std::cout << "proceeded " << std::chrono::duration<double>(proceeded_after).count()
            << " s after the kill (worker timeout 2 s)\n";
}

TEST(SyncModeTest, UnevenShardsFinishEveryEpochWithoutAHang) {
  if (!testing::DataAvailable()) GTEST_SKIP() << "Fashion-MNIST not installed";
  TempDir dir;
  // 991 examples over 3 workers: shards of 331, 330 and 330, i.e. 34, 33 and 33 batches of 10.
  Child launch = Child::Start(
      {testing::BinDir() + "/parasync-launch", "--ps", "1", "--workers", "3", "--mode", "sync",
       "--epochs", "3", "--batch-size", "10", "--model", "784-32-10", "--log-dir",
       dir.path() + "/run", "--data", testing::DataDir(), "--worker-arg=--train-examples=991"},
      dir.path() + "/out");
  auto status = launch.Wait(180s);
  ASSERT_TRUE(status.has_value()) << "hang:\n" << testing::ReadFile(dir.path() + "/out");
  ASSERT_EQ(ExitCode(*status), 0) << testing::ReadFile(dir.path() + "/out");
  for (int r = 0; r < 3; ++r) {
    const std::string log = testing::ReadFile(dir.path() + "/run/worker" + std::to_string(r) + ".log");
    EXPECT_NE(log.find("epoch 3/3"), std::string::npos) << "worker " << r << ":\n" << log;
  }
  const auto last = nlohmann::json::parse(testing::ReadLines(dir.path() + "/run/eval.jsonl").back());
  EXPECT_EQ(last["epoch"], 3);
  EXPECT_EQ(last["mode"], "sync");
}

class LaunchModeTest : public ::testing::TestWithParam<std::string> {};

TEST_P(LaunchModeTest, LauncherRunsTheModeToTheEnd) {
  if (!testing::DataAvailable()) GTEST_SKIP() << "Fashion-MNIST not installed";
  TempDir dir;
  Child launch = Child::Start(
      {testing::BinDir() + "/parasync-launch", "--ps", "2", "--workers", "2", "--mode",
       GetParam(), "--epochs", "1", "--max-steps", "100", "--log-dir", dir.path() + "/run",
       "--data", testing::DataDir()},
      dir.path() + "/out");
  auto status = launch.Wait(120s);
  ASSERT_TRUE(status.has_value()) << testing::ReadFile(dir.path() + "/out");
  ASSERT_EQ(ExitCode(*status), 0) << testing::ReadFile(dir.path() + "/out");
  const auto last = nlohmann::json::parse(testing::ReadLines(dir.path() + "/run/eval.jsonl").back());
  EXPECT_EQ(last["mode"], GetParam());
  EXPECT_GE(last["test_accuracy"].get<double>(), 0.6);
}

std::string ModeTestName(const ::testing::TestParamInfo<std::string>& param_info) {
  std::string n = param_info.param;
  for (char& c : n) c = c == ':' ? '_' : c;
  return n;
}

INSTANTIATE_TEST_SUITE_P(Modes, LaunchModeTest, ::testing::Values("async", "sync", "ssp:2"),
                         ModeTestName);

// --wire-dtype with real processes: a sync cluster whose workers send and receive bfloat16
// trains (the servers keep float32), and every tensor byte the server moved was 16-bit.
TEST(WireDTypeTest, Bfloat16WireTrainsAndMovesTwoBytesPerElement) {
  if (!testing::DataAvailable()) GTEST_SKIP() << "Fashion-MNIST not installed";
  TempDir dir;
  const std::string widths = "784-64-10";
  constexpr int64_t kElements = 784 * 64 + 64 + 64 * 10 + 10;
  Child launch = Child::Start(
      {testing::BinDir() + "/parasync-launch", "--ps", "1", "--workers", "2", "--mode", "sync",
       "--epochs", "1", "--max-steps", "100", "--model", widths, "--log-dir",
       dir.path() + "/run", "--data", testing::DataDir(), "--wire-dtype", "bfloat16"},
      dir.path() + "/out");
  auto status = launch.Wait(120s);
  ASSERT_TRUE(status.has_value()) << testing::ReadFile(dir.path() + "/out");
  ASSERT_EQ(ExitCode(*status), 0) << testing::ReadFile(dir.path() + "/out");
  EXPECT_NE(testing::ReadFile(dir.path() + "/out").find("travel as bfloat16"), std::string::npos);
  const auto last = nlohmann::json::parse(testing::ReadLines(dir.path() + "/run/eval.jsonl").back());
  EXPECT_EQ(last["step"], 100);
  EXPECT_GE(last["test_accuracy"].get<double>(), 0.6) << last.dump();

  const std::string prom = testing::ReadFile(dir.path() + "/run/metrics-ps0.prom");
  const double pushes = Sample(prom, "parasync_ps_requests_total", {{"type", "push"}});
  const double pulls = Sample(prom, "parasync_ps_requests_total", {{"type", "pull"}});
  const double bytes_in =
      Sample(prom, "parasync_ps_bytes_total", {{"type", "push"}, {"direction", "in"}});
  const double bytes_out =
      Sample(prom, "parasync_ps_bytes_total", {{"type", "pull"}, {"direction", "out"}});
  ASSERT_GE(pushes, 200) << prom;  // 100 steps of 2 workers
  EXPECT_EQ(bytes_in, pushes * kElements * 2) << prom;
  // Pulls of the evaluation and of tools may be float32; the workers' are not: the bytes
  // sent are less than 4 per element per pull, and at least 2 per element for each of the
  // 200 steps' pulls. (Not 2 per pull counted: on a busy machine a sync pull waiting at the
  // barrier is sent again, and counted again, but answered once.)
  ASSERT_GE(pulls, 200) << prom;
  EXPECT_GE(bytes_out, 200.0 * kElements * 2) << prom;
  EXPECT_LT(bytes_out, pulls * kElements * 4) << prom;
}

TEST(SyncModeTest, TwoPsTwoWorkersReachEightyFivePercentInFiveEpochs) {
  if (!testing::DataAvailable()) GTEST_SKIP() << "Fashion-MNIST not installed";
  TempDir dir;
  Child launch = Child::Start(
      {testing::BinDir() + "/parasync-launch", "--ps", "2", "--workers", "2", "--mode", "sync",
       "--epochs", "5", "--log-dir", dir.path() + "/run", "--data", testing::DataDir()},
      dir.path() + "/out");
  auto status = launch.Wait(300s);
  ASSERT_TRUE(status.has_value()) << testing::ReadFile(dir.path() + "/out");
  ASSERT_EQ(ExitCode(*status), 0) << testing::ReadFile(dir.path() + "/out");
  const auto last = nlohmann::json::parse(testing::ReadLines(dir.path() + "/run/eval.jsonl").back());
  EXPECT_EQ(last["epoch"], 5);
  EXPECT_GE(last["test_accuracy"].get<double>(), 0.85);
}

}  // namespace
}  // namespace parasync
