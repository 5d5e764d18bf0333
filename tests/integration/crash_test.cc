// Persistence with real processes over loopback: a parameter server killed with SIGKILL in the
// middle of a run restarts from its RocksDB data directory and the run ends where an
// uninterrupted one does; a data directory that is foreign, belongs to another shard or is
// damaged is refused with one line and left as it was; parasync-launch --data-dir resumes a
// model from an earlier launch.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/dir_image.h"
#include "tests/support/process_cluster.h"
#include "tests/support/process_util.h"
#include "tests/support/sanitized.h"
#include "tests/support/small_model.h"
#include "worker/ps_client.h"

namespace parasync {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::Child;
using testing::DirChanges;
using testing::DirImage;
using testing::ExitCode;
using testing::NonEmptyLines;
using testing::ProcessCluster;
using testing::TempDir;

// Overwrites `path` with seeded random bytes of the same size, so size checks still pass and only
// the content gives the damage away.
void Garble(const std::string& path) {
  const auto size = fs::file_size(path);
  std::mt19937 random(7);
  std::string garbage(static_cast<size_t>(size), '\0');
  for (char& c : garbage) c = static_cast<char>(random() & 0xff);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(garbage.data(), static_cast<std::streamsize>(garbage.size()));
  ASSERT_TRUE(out.good()) << path;
}

// The test accuracy of the last line of a chief's eval.jsonl, which must be epoch `epoch`.
std::optional<double> FinalAccuracy(const std::string& eval_path, int epoch) {
  const auto lines = testing::ReadLines(eval_path);
  if (lines.empty()) return std::nullopt;
  const auto last = nlohmann::json::parse(lines.back(), nullptr, /*allow_exceptions=*/false);
  if (!last.is_object() || last.value("epoch", -1) != epoch) return std::nullopt;
  return last["test_accuracy"].get<double>();
}

// The version in "restored from DIR: version V, ..." (parasync-ps, at start), or nullopt.
std::optional<int64_t> RestoredVersion(const std::string& log) {
  static const std::regex kRestored(R"(restored from \S+: version (\d+),)");
  std::smatch m;
  if (!std::regex_search(log, m, kRestored)) return std::nullopt;
  return std::stoll(m[1].str());
}

// A run without the kill took 7-12 s on the 2-core VM when this was written; everything waits
// well beyond that, never forever.
constexpr auto kRunTimeout = 150s;

struct RunOutcome {
  double final_accuracy = 0;
  int64_t killed_at_version = 0;  // shard 1's version just before it was killed (0: no kill)
  int64_t restored_version = 0;   // what the restarted shard 1 restored
};

// Trains the default model with 2 servers and 2 workers for `epochs` epochs in `mode`, every
// server snapshotting each 20 versions. With `kill_after_version`, shard 1 is killed with
// SIGKILL once it has applied that many versions and restarted on the same data directory.
void TrainTwoByTwo(const std::string& mode, int epochs, std::optional<int64_t> kill_after_version,
                   RunOutcome* outcome) {
  TempDir dir;
  ProcessCluster cluster(2, 2, mode, {"--checkpoint-every-versions", "20"}, dir.path(),
                         ProcessCluster::kPsDataDirs);
  // The chief evaluates after both workers' last epochs, as under parasync-launch: otherwise
  // the final accuracy is of a model missing a varying part of worker 1's last epoch, and the
  // two runs' difference measures that, not the restart (one fresh-clone run: 0.8677 against
  // 0.8799, 0.0022 past the bound).
  for (int r = 0; r < 2; ++r) {
    cluster.StartWorker(r, {"--epochs", std::to_string(epochs), "--seed", "42",
                            "--wait-for-workers", "60"});
  }
  if (kill_after_version) {
    zmq::context_t ctx;
    auto client = cluster.Client(ctx);
    ASSERT_NE(client, nullptr);
    int64_t version = -1;
    ASSERT_TRUE(testing::WaitFor(
        [&] {
          auto stats = client->Stats();
          if (stats.ok() && stats->size() == 2) version = (*stats)[1].version;
          return version >= *kill_after_version;
        },
        60s))
        << "shard 1 never reached version " << *kill_after_version << "\n" << cluster.Dump();
    client.reset();  // before the server goes: nothing of ours is left waiting on it
    ASSERT_NO_FATAL_FAILURE(cluster.KillPs(1));
    outcome->killed_at_version = version;
    cluster.StartPs(1, "ps1-restart");
    ASSERT_TRUE(testing::WaitFor(
        [&] { return RestoredVersion(testing::ReadFile(cluster.Log("ps1-restart"))).has_value(); },
        20s))
        << "the restarted shard 1 did not restore its data directory\n" << cluster.Dump();
    outcome->restored_version = *RestoredVersion(testing::ReadFile(cluster.Log("ps1-restart")));
  }
  const std::vector<int> codes = cluster.WaitWorkers(kRunTimeout);
  for (size_t r = 0; r < codes.size(); ++r) {
    ASSERT_EQ(codes[r], 0) << "worker " << r << "\n" << cluster.Dump();
  }
  if (kill_after_version) {
    // The run went on through the restarted process: it applied pushes past what it restored.
    // (Whether a worker had to resend is printed, not required: one with nothing in flight to
    // shard 1 while it was down finds the new process already answering, seen in 2 of ~30
    // runs, and both did once under a sanitizer on a loaded machine.)
    for (int r = 0; r < 2; ++r) {
      const bool said = testing::ReadFile(cluster.Log("worker" + std::to_string(r)))
                            .find("restarted; sending again") != std::string::npos;
      std::cout << "worker " << r << (said ? " resent to" : " did not resend to")
                << " the restarted shard 1\n";
    }
    zmq::context_t ctx;
    auto client = cluster.Client(ctx);
    ASSERT_NE(client, nullptr);
    const std::vector<ShardStats> stats = ProcessCluster::Stats(*client);
    ASSERT_EQ(stats.size(), 2u);
    EXPECT_GT(stats[1].version, outcome->restored_version + 100)
        << "the restarted shard 1 took no part in the rest of the run\n" << cluster.Dump();
  }
  for (int code : cluster.StopPs()) EXPECT_EQ(code, 0) << cluster.Dump();
  const auto accuracy = FinalAccuracy(cluster.EvalLog(), epochs);
  ASSERT_TRUE(accuracy.has_value()) << "no evaluation of epoch " << epochs << " in eval.jsonl\n"
                                    << testing::ReadFile(cluster.EvalLog());
  outcome->final_accuracy = *accuracy;
}

// The bound both modes are held to: a restart costs less than one point of test accuracy (two
// for async under a sanitizer: see below).
void ExpectKilledServerCostsUnderOnePoint(const std::string& mode, int epochs) {
  if (!testing::DataAvailable()) GTEST_SKIP() << "Fashion-MNIST not installed";
  RunOutcome uninterrupted;
  ASSERT_NO_FATAL_FAILURE(TrainTwoByTwo(mode, epochs, std::nullopt, &uninterrupted));
  RunOutcome crashed;
  ASSERT_NO_FATAL_FAILURE(TrainTwoByTwo(mode, epochs, 300, &crashed));
  std::cout << mode << ": uninterrupted accuracy " << uninterrupted.final_accuracy
            << ", with shard 1 killed at version " << crashed.killed_at_version
            << " and restored at version " << crashed.restored_version << ": "
            << crashed.final_accuracy << "\n";
  // Restored a recent snapshot (every 20 versions; a tick of slack), not a fresh start.
  EXPECT_GE(crashed.restored_version, 300 - 2 * 20);
  // A cost is a loss: an async crashed run that ends higher (arrival order) costs nothing.
  // Under a sanitizer two async runs differ by more than a point with nothing lost: fresh-clone
  // ASan runs had the crashed run 0.0122 above its baseline (0.8775 vs 0.8653) and, restored
  // at the very version it was killed at, 0.0117 below (0.8720 vs 0.8837). There the bound is
  // two points; the main build, whose async runs spread by ~0.002 after 5 epochs, keeps one.
  const double bound = mode == "async" && testing::kSanitized ? 0.02 : 0.01;
  EXPECT_GE(crashed.final_accuracy, uninterrupted.final_accuracy - bound);
  EXPECT_GE(uninterrupted.final_accuracy, 0.8) << "the baseline did not learn: the check is weak";
}

TEST(CrashRecoveryTest, AsyncRunSurvivesAKilledParameterServerWithinOnePointOfAnUninterruptedRun) {
  // Two async runs differ even without a crash (arrival order). After 3 epochs the final
  // accuracy of identical runs spread with a standard deviation of ~0.004 (0.852-0.866 over 16
  // runs measured while writing this; one pair 0.009 apart), too close to the bound; after 5 it
  // was ~0.002.
  ExpectKilledServerCostsUnderOnePoint("async", 5);
}

TEST(CrashRecoveryTest, SyncRunSurvivesAKilledParameterServerWithinOnePointOfAnUninterruptedRun) {
  ExpectKilledServerCostsUnderOnePoint("sync", 3);
}

struct PsRun {
  int exit_code = -1;
  std::string output;
};

// Runs parasync-ps as shard `shard` of `num_shards` on `data_dir`, with `env` ("K=V") added to
// its environment and `args` to its flags; a server that starts is stopped (SIGTERM) once it
// says it serves, so a wrong acceptance fails instead of hanging.
PsRun RunPs(const TempDir& dir, const std::string& data_dir, int shard, int num_shards,
            const std::vector<std::string>& env = {}, const std::vector<std::string>& args = {}) {
  const std::vector<std::string> ps(static_cast<size_t>(num_shards), "127.0.0.1:0");
  static int runs = 0;
  const std::string log = dir.path() + "/ps-run" + std::to_string(runs++) + ".log";
  std::vector<std::string> argv = {
      testing::BinDir() + "/parasync-ps", "--ps-hosts", testing::JoinHosts(ps), "--worker-hosts",
      "127.0.0.1:1", "--task-index", std::to_string(shard), "--data-dir", data_dir};
  argv.insert(argv.end(), args.begin(), args.end());
  Child child = Child::Start(argv, log, env);
  PsRun run;
  std::optional<int> status;
  testing::WaitFor(
      [&] {
        status = child.Wait(0ms);
        return status.has_value() || testing::ReadFile(log).find("serving") != std::string::npos;
      },
      30s);
  if (!status) {
    child.Signal(SIGTERM);
    status = child.Wait(20s);
  }
  run.exit_code = status ? ExitCode(*status) : -1;
  run.output = testing::ReadFile(log);
  return run;
}

// Expects `run` to be a refusal: status 2, one line, naming every string in `names`, and
// neither a fresh start nor a restore.
void ExpectRefused(const PsRun& run, const std::vector<std::string>& names) {
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_EQ(NonEmptyLines(run.output).size(), 1u) << run.output;
  for (const auto& name : names) EXPECT_NE(run.output.find(name), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("new data directory"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("restored from"), std::string::npos) << run.output;
}

TEST(DataDirTest, ForeignOrCorruptDataDirIsRefusedAndLeftUntouched) {
  if (!testing::DataAvailable()) GTEST_SKIP() << "Fashion-MNIST not installed";
  TempDir dir;

  // Someone else's directory.
  const std::string foreign = dir.path() + "/foreign";
  fs::create_directories(foreign);
  { std::ofstream(foreign + "/notes.txt") << "not a checkpoint\n"; }
  auto before = DirImage(foreign);
  ExpectRefused(RunPs(dir, foreign, 0, 1), {foreign, "notes.txt"});
  EXPECT_EQ(DirChanges(before, DirImage(foreign)), "") << "the foreign directory was changed";

  // A real store of shard 0 of 1: a server and a short worker write snapshots, SIGTERM keeps the
  // last one.
  const std::string store = dir.path() + "/store";
  {
    const std::string worker = "127.0.0.1:1";
    testing::Serving serving = testing::StartServing(
        {testing::BinDir() + "/parasync-ps", "--ps-hosts", "127.0.0.1:0", "--worker-hosts",
         worker, "--task-index", "0", "--data-dir", store, "--checkpoint-every-versions", "20"},
        dir.path() + "/writer-ps.log");
    ASSERT_TRUE(serving.ready) << serving.why;
    Child& server = serving.child;
    const std::string ps = serving.ready->address;
    Child trainer = Child::Start({testing::BinDir() + "/parasync-worker", "--ps-hosts", ps,
                                  "--worker-hosts", worker, "--task-index", "0", "--data",
                                  testing::DataDir(), "--log-dir", dir.path(), "--epochs", "1",
                                  "--max-steps", "100"},
                                 dir.path() + "/writer-worker.log");
    const auto trained = trainer.Wait(120s);
    ASSERT_TRUE(trained.has_value()) << testing::ReadFile(dir.path() + "/writer-worker.log");
    ASSERT_EQ(ExitCode(*trained), 0) << testing::ReadFile(dir.path() + "/writer-worker.log");
    server.Signal(SIGTERM);
    const auto stopped = server.Wait(20s);
    ASSERT_TRUE(stopped.has_value());
    ASSERT_EQ(ExitCode(*stopped), 0) << testing::ReadFile(dir.path() + "/writer-ps.log");
    ASSERT_NE(testing::ReadFile(dir.path() + "/writer-ps.log").find("on disk: version 100"),
              std::string::npos)
        << testing::ReadFile(dir.path() + "/writer-ps.log");
  }

  // Another shard's store.
  before = DirImage(store);
  ExpectRefused(RunPs(dir, store, 1, 2), {store, "shard 0 of 1", "shard 1 of 2"});
  EXPECT_EQ(DirChanges(before, DirImage(store)), "") << "the store of another shard was changed";

  // The same store, damaged: its largest table file, or its manifest, overwritten with garbage.
  std::string largest_sst, manifest;
  for (const auto& entry : fs::directory_iterator(store)) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() == ".sst" &&
        (largest_sst.empty() || entry.file_size() > fs::file_size(store + "/" + largest_sst))) {
      largest_sst = name;
    }
    if (name.rfind("MANIFEST-", 0) == 0) manifest = name;
  }
  // Five snapshots of the model (~2.8 MB each with Adam's slots) overflow RocksDB's 8 MB
  // write buffer: there must be a table file.
  ASSERT_FALSE(largest_sst.empty()) << "no *.sst in the store: nothing to damage";
  ASSERT_FALSE(manifest.empty()) << "no MANIFEST-* in the store";
  for (const std::string& victim : {largest_sst, manifest}) {
    SCOPED_TRACE("garbled " + victim);
    const std::string damaged = dir.path() + "/damaged-" + victim;
    fs::copy(store, damaged);
    ASSERT_NO_FATAL_FAILURE(Garble(damaged + "/" + victim));
    before = DirImage(damaged);
    const PsRun run = RunPs(dir, damaged, 0, 1);
    ExpectRefused(run, {damaged});
    EXPECT_TRUE(run.output.find("Corruption") != std::string::npos ||
                run.output.find("refusing to touch it") != std::string::npos)
        << run.output;
    EXPECT_EQ(DirChanges(before, DirImage(damaged)), "") << "the damaged store was changed";
  }

  // A store left by kill -9 in every-update mode lives in its write-ahead log; garbage there
  // must be refused, not silently replaced by an older state.
  const std::string crashed = dir.path() + "/crashed";
  {
    const std::string worker = "127.0.0.1:1";
    testing::Serving serving = testing::StartServing(
        {testing::BinDir() + "/parasync-ps", "--ps-hosts", "127.0.0.1:0", "--worker-hosts",
         worker, "--task-index", "0", "--data-dir", crashed, "--durability", "every-update"},
        dir.path() + "/crashed-ps.log");
    ASSERT_TRUE(serving.ready) << serving.why;
    Child& server = serving.child;
    const std::string ps = serving.ready->address;
    Child trainer = Child::Start({testing::BinDir() + "/parasync-worker", "--ps-hosts", ps,
                                  "--worker-hosts", worker, "--task-index", "0", "--data",
                                  testing::DataDir(), "--log-dir", dir.path(), "--epochs", "1",
                                  "--max-steps", "50", "--model", "784-32-10"},
                                 dir.path() + "/crashed-worker.log");
    const auto trained = trainer.Wait(120s);
    ASSERT_TRUE(trained.has_value() && ExitCode(*trained) == 0)
        << testing::ReadFile(dir.path() + "/crashed-worker.log");
    server.Signal(SIGKILL);
    ASSERT_TRUE(server.Wait(20s).has_value());
  }
  std::string wal;
  for (const auto& entry : fs::directory_iterator(crashed)) {
    if (entry.path().extension() == ".log" && entry.file_size() > 0) {
      wal = entry.path().filename().string();
    }
  }
  ASSERT_FALSE(wal.empty()) << "the killed server left no write-ahead log to damage";
  ASSERT_NO_FATAL_FAILURE(Garble(crashed + "/" + wal));
  before = DirImage(crashed);
  const PsRun run = RunPs(dir, crashed, 0, 1);
  ExpectRefused(run, {crashed});
  EXPECT_NE(run.output.find("Corruption"), std::string::npos) << run.output;
  EXPECT_EQ(DirChanges(before, DirImage(crashed)), "") << "the damaged store was changed";
}

TEST(DataDirTest, LauncherRunResumesFromItsDataDirs) {
  if (!testing::DataAvailable()) GTEST_SKIP() << "Fashion-MNIST not installed";
  TempDir dir;
  const std::string data_dir = dir.path() + "/state";
  auto launch = [&](const std::string& log_dir) {
    const std::string out = dir.path() + "/" + log_dir + ".out";
    Child child = Child::Start(
        {testing::BinDir() + "/parasync-launch", "--ps", "2", "--workers", "1", "--mode",
         "async", "--epochs", "1", "--max-steps", "100", "--checkpoint-each-epoch",
         "--data-dir", data_dir, "--log-dir", dir.path() + "/" + log_dir, "--data",
         testing::DataDir()},
        out);
    const auto status = child.Wait(120s);
    EXPECT_TRUE(status.has_value()) << "the launcher did not finish\n" << testing::ReadFile(out);
    return status ? ExitCode(*status) : -1;
  };
  auto epoch0 = [&](const std::string& log_dir) {
    const auto lines = testing::ReadLines(dir.path() + "/" + log_dir + "/eval.jsonl");
    return lines.empty() ? nlohmann::json() : nlohmann::json::parse(lines.front(), nullptr, false);
  };

  ASSERT_EQ(launch("first"), 0) << testing::ReadFile(dir.path() + "/first.out");
  EXPECT_TRUE(fs::is_directory(data_dir + "/ps0"));
  EXPECT_TRUE(fs::is_directory(data_dir + "/ps1"));
  for (const std::string ps : {"ps0", "ps1"}) {
    const std::string log = testing::ReadFile(dir.path() + "/first/" + ps + ".log");
    EXPECT_NE(log.find("checkpoint of version"), std::string::npos) << log;
  }
  const nlohmann::json fresh = epoch0("first");
  ASSERT_TRUE(fresh.is_object());
  // One worker: epoch 0 is evaluated before its first push, on the initial parameters.
  EXPECT_LT(fresh["test_accuracy"].get<double>(), 0.3) << fresh.dump();

  ASSERT_EQ(launch("second"), 0) << testing::ReadFile(dir.path() + "/second.out");
  const std::string ps0 = testing::ReadFile(dir.path() + "/second/ps0.log");
  EXPECT_NE(ps0.find("restored from " + data_dir + "/ps0"), std::string::npos) << ps0;
  const nlohmann::json resumed = epoch0("second");
  ASSERT_TRUE(resumed.is_object());
  EXPECT_GE(resumed["step"].get<int64_t>(), 100) << resumed.dump();
  EXPECT_GE(resumed["test_accuracy"].get<double>(), 0.6)
      << "epoch 0 of the second run did not start from the first run's model: " << resumed.dump();
}

// A store of shard 0 of 1 written by a real server through a client and stopped cleanly
// (SIGTERM), so that it lives in table files: a counter and 48 Ki floats of padding, which the
// store keeps in data blocks of their own after the block of its meta records.
void WriteStoppedStore(const TempDir& dir, const std::string& store) {
  testing::Serving serving = testing::StartServing(
      {testing::BinDir() + "/parasync-ps", "--ps-hosts", "127.0.0.1:0", "--worker-hosts",
       "127.0.0.1:1", "--task-index", "0", "--data-dir", store, "--durability", "every-update"},
      dir.path() + "/store-writer.log");
  ASSERT_TRUE(serving.ready) << serving.why;
  Child& server = serving.child;
  const std::string ps = serving.ready->address;
  {
    const ModelRegistration reg = testing::SmallModel(
        {{"counter", {1}, DType::kFloat32, {InitKind::kZeros, 0.0f}},
         {"padding", {48 * 1024}, DType::kFloat32, {InitKind::kUniform, 1.0f}}},
        kDefaultMaxSliceElements, /*num_shards=*/1, /*seed=*/0, /*learning_rate=*/1.0f);
    PsClientOptions o;
    o.ps_addresses = {ps};
    o.rank = 0;
    o.request_timeout = 30s;
    zmq::context_t ctx;
    auto client = PsClient::Connect(ctx, o);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    const Status registered = (*client)->Register(reg, 20s);
    ASSERT_TRUE(registered.ok()) << registered.ToString() << "\n"
                                 << testing::ReadFile(dir.path() + "/store-writer.log");
    const float minus_one = -1.0f;
    const std::vector<float> zeros(48 * 1024, 0.0f);
    const float* grads[] = {&minus_one, zeros.data()};
    for (int i = 0; i < 5; ++i) ASSERT_TRUE((*client)->Push(grads, 1).ok());
  }
  server.Signal(SIGTERM);
  const auto stopped = server.Wait(20s);
  ASSERT_TRUE(stopped.has_value());
  ASSERT_EQ(ExitCode(*stopped), 0) << testing::ReadFile(dir.path() + "/store-writer.log");
}

TEST(DataDirTest, AByteFlippedInATableDataBlockIsRefusedWithOneLineAndLeftByteIdentical) {
  TempDir dir;
  const std::string store = dir.path() + "/store";
  ASSERT_NO_FATAL_FAILURE(WriteStoppedStore(dir, store));
  std::string table;
  for (const auto& entry : fs::directory_iterator(store)) {
    if (entry.path().extension() == ".sst") table = entry.path().filename().string();
  }
  ASSERT_FALSE(table.empty()) << "the stopped server left no table file";
  // The middle of the table is padding values, in a data block that only a full read sees.
  {
    std::fstream f(store + "/" + table, std::ios::in | std::ios::out | std::ios::binary);
    const auto middle = static_cast<std::streamoff>(fs::file_size(store + "/" + table) / 2);
    f.seekg(middle);
    char c = 0;
    f.get(c);
    f.seekp(middle);
    f.put(static_cast<char>(c ^ 0x04));
    ASSERT_TRUE(f.good());
  }
  const auto before = DirImage(store);
  const PsRun run = RunPs(dir, store, 0, 1);
  ExpectRefused(run, {store, table, "Corruption"});
  EXPECT_EQ(DirChanges(before, DirImage(store)), "") << "the damaged store was changed";
}

// A store of another --mode, shard index or shard count is refused, exit status 2 and one line,
// before anything in it is written: a real parasync-ps, the directory's files (names, sizes,
// contents, modification times, the directory's own) compared before and after.
TEST(DataDirTest, AStoreOfAnotherModeOrShardIsRefusedBeforeAnythingInItIsWritten) {
  TempDir dir;
  const std::string store = dir.path() + "/store";
  ASSERT_NO_FATAL_FAILURE(WriteStoppedStore(dir, store));  // --mode async, shard 0 of 1
  struct Case {
    const char* what;
    int shard;
    int num_shards;
    std::vector<std::string> args;
    std::vector<std::string> named;
  };
  const std::vector<Case> cases = {
      {"another mode", 0, 1, {"--mode", "sync"}, {store, "mode async", "--mode sync"}},
      {"another mode (ssp)", 0, 1, {"--mode", "ssp:2"}, {store, "mode async", "--mode ssp:2"}},
      {"another shard", 1, 2, {}, {store, "shard 0 of 1", "shard 1 of 2"}},
      {"another shard count", 0, 2, {}, {store, "shard 0 of 1", "shard 0 of 2"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const auto before = DirImage(store);
    ExpectRefused(RunPs(dir, store, c.shard, c.num_shards, {}, c.args), c.named);
    EXPECT_EQ(DirChanges(before, DirImage(store)), "") << "the refused store was changed";
  }
  // And it was refused for what it is, not for damage: its own server still takes it.
  const PsRun healthy = RunPs(dir, store, 0, 1);
  EXPECT_NE(healthy.output.find("restored from"), std::string::npos) << healthy.output;
}

// A store that a running server holds is refused with exit status 1 (the server may stop) and
// one line naming the holder, before anything is written: RocksDB's writable open would first
// have moved the running server's info LOG aside and started one of its own.
TEST(DataDirTest, AStoreARunningServerHoldsIsRefusedWithStatusOneAndLeftUntouched) {
  TempDir dir;
  const std::string store = dir.path() + "/store";
  ASSERT_NO_FATAL_FAILURE(WriteStoppedStore(dir, store));
  const std::string log = dir.path() + "/holder.log";
  testing::Serving serving = testing::StartServing(
      {testing::BinDir() + "/parasync-ps", "--ps-hosts", "127.0.0.1:0", "--worker-hosts",
       "127.0.0.1:1", "--task-index", "0", "--data-dir", store},
      log);
  ASSERT_TRUE(serving.ready) << serving.why;
  Child& holder = serving.child;
  const auto before = DirImage(store);
  const PsRun run = RunPs(dir, store, 0, 1);
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_EQ(NonEmptyLines(run.output).size(), 1u) << run.output;
  EXPECT_NE(run.output.find(store + " is in use by process " + std::to_string(holder.pid())),
            std::string::npos)
      << run.output;
  EXPECT_EQ(DirChanges(before, DirImage(store)), "")
      << "the store of the running server was changed";
  holder.Signal(SIGTERM);
  const auto stopped = holder.Wait(20s);
  ASSERT_TRUE(stopped.has_value());
  EXPECT_EQ(ExitCode(*stopped), 0) << testing::ReadFile(log);
}

TEST(DataDirTest, StoreOnAFullDiskIsRefusedWithOneLineAndNoAbort) {
  TempDir dir;
  const std::string store = dir.path() + "/store";
  ASSERT_NO_FATAL_FAILURE(WriteStoppedStore(dir, store));
  const PsRun run = RunPs(dir, store, 0, 1, {"PARASYNC_STORAGE_FAULTS=space_left_bytes=0"});
  // Exit 1, not 2: freeing the disk is enough, so a supervisor's restart may succeed.
  EXPECT_EQ(run.exit_code, 1) << run.output;
  // The fault injection's warning, then the one line of the refusal.
  const auto lines = NonEmptyLines(run.output);
  ASSERT_EQ(lines.size(), 2u) << run.output;
  EXPECT_NE(lines[0].find("FAULT INJECTION"), std::string::npos) << run.output;
  EXPECT_NE(lines[1].find("no space left on device"), std::string::npos) << run.output;
  EXPECT_NE(lines[1].find(store), std::string::npos) << run.output;
  // With space again, the store opens with its data.
  const PsRun healthy = RunPs(dir, store, 0, 1);
  EXPECT_NE(healthy.output.find("restored from"), std::string::npos) << healthy.output;
}

}  // namespace
}  // namespace parasync
