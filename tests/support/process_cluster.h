// A cluster of real parasync-ps and parasync-worker processes on loopback, started by the test
// itself so that it can stop, kill, restart and inspect any of them. The servers bind port 0
// and report the ports they got (--ready-file), so clusters of any number of tests run side
// by side. Test-only code, header-only: the test binaries that use it link the PS client
// (worker/ps_client.h).
#pragma once

#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <zmq.hpp>

#include "tests/support/process_util.h"
#include "worker/ps_client.h"

namespace parasync::testing {

// The servers start in the constructor, ps<i> with its output in <dir>/ps<i>.log, and the
// constructor returns once each serves (a test failure names one that did not within 60 s);
// workers start when the test says. Every process is SIGKILLed when the cluster dies
// (tests/support Child). Used from one thread at a time.
class ProcessCluster {
 public:
  // What servers get besides their hosts, task index, --mode and `ps_args`.
  enum Extras {
    kNoExtras = 0,
    kPsDataDirs = 1,      // each its own --data-dir <dir>/data/ps<i> (DataDir(i))
    kPsLogDir = 2,        // --log-dir <dir>
  };

  // `num_workers` worker hosts are named to the servers; `mode` goes to servers and workers
  // as --mode (none when empty); `ps_args` come last on every server's command line.
  ProcessCluster(int num_ps, int num_workers, std::string mode, std::vector<std::string> ps_args,
                 std::string dir, int extras = kNoExtras)
      : mode_(std::move(mode)),
        ps_args_(std::move(ps_args)),
        dir_(std::move(dir)),
        data_dirs_((extras & kPsDataDirs) != 0),
        log_dir_((extras & kPsLogDir) != 0) {
    // Port 0: each server binds a free port and says which in its ready file.
    ps_.assign(static_cast<size_t>(num_ps), "127.0.0.1:0");
    // Workers bind none of these: their addresses only count and name them.
    for (int i = 0; i < num_workers; ++i) workers_.push_back("127.0.0.1:" + std::to_string(1 + i));
    metrics_ports_.assign(static_cast<size_t>(num_ps), 0);
    ps_children_.resize(static_cast<size_t>(num_ps));
    worker_children_.resize(static_cast<size_t>(num_workers));
    for (int i = 0; i < num_ps; ++i) Spawn(i, "ps" + std::to_string(i));
    for (int i = 0; i < num_ps; ++i) AwaitServing(i);
  }

  // Restarts server i on its address and data directory, its output in <dir>/<log>.log (ps<i>
  // when empty), and waits until it serves (as the constructor) or exits. Its /metrics may
  // move to another port: metrics_port(i) tells.
  void StartPs(int i, std::string log = "") {
    Spawn(i, log.empty() ? "ps" + std::to_string(i) : log);
    AwaitServing(i);
  }

  // SIGKILL: no final snapshot, no goodbye. Returns once the process is gone (a test failure
  // if it is not within 10 s).
  void KillPs(int i) {
    Child& server = ps(i);
    server.Signal(SIGKILL);
    const auto status = server.Wait(std::chrono::seconds(10));
    ASSERT_TRUE(status.has_value()) << "ps" << i << " survived SIGKILL";
    ASSERT_EQ(ExitCode(*status), 128 + SIGKILL);
  }

  // SIGKILL to worker `rank` (started by StartWorker); returns once it is gone (a test
  // failure if it is not within 10 s). WaitWorkers then reports it 128 + SIGKILL.
  void KillWorker(int rank) {
    Child& worker = *worker_children_.at(static_cast<size_t>(rank));
    worker.Signal(SIGKILL);
    ASSERT_TRUE(worker.Wait(std::chrono::seconds(10)).has_value())
        << "worker" << rank << " survived SIGKILL";
  }

  // SIGTERM to every server; returns their exit codes (-1 for one that did not stop in time).
  std::vector<int> StopPs() {
    for (auto& server : ps_children_) server->Signal(SIGTERM);
    std::vector<int> codes;
    for (auto& server : ps_children_) {
      const auto status = server->Wait(std::chrono::seconds(20));
      codes.push_back(status ? ExitCode(*status) : -1);
    }
    return codes;
  }

  // Starts (or restarts) worker `rank` with the common training flags plus `args`, its output
  // in <dir>/worker<rank>.log.
  void StartWorker(int rank, const std::vector<std::string>& args) {
    std::vector<std::string> argv = {BinDir() + "/parasync-worker", "--ps-hosts", JoinHosts(ps_),
                                     "--worker-hosts", JoinHosts(workers_), "--task-index",
                                     std::to_string(rank)};
    if (!mode_.empty()) argv.insert(argv.end(), {"--mode", mode_});
    argv.insert(argv.end(), {"--data", ::parasync::testing::DataDir(), "--log-dir", dir_,
                             "--heartbeat-interval", "0.2"});
    argv.insert(argv.end(), args.begin(), args.end());
    worker_children_[static_cast<size_t>(rank)].reset();  // reaps a previous incarnation
    worker_children_[static_cast<size_t>(rank)] =
        std::make_unique<Child>(Child::Start(argv, Log("worker" + std::to_string(rank))));
  }

  Child& ps(int i) { return *ps_children_[static_cast<size_t>(i)]; }
  const Child& ps(int i) const { return *ps_children_[static_cast<size_t>(i)]; }
  Child& worker(int rank) { return *worker_children_[static_cast<size_t>(rank)]; }

  // Every process is killed by its Child; a test that failed first gets every log printed
  // (Dump), since the directory they are in goes with the test.
  ~ProcessCluster() {
    if (::testing::Test::HasFailure()) {
      std::cout << "--- the cluster's logs, as the failed test left them\n" << Dump() << std::flush;
    }
  }
  ProcessCluster(const ProcessCluster&) = delete;
  ProcessCluster& operator=(const ProcessCluster&) = delete;

  // Waits for every worker to exit; returns their exit codes (-1 on timeout).
  std::vector<int> WaitWorkers(std::chrono::seconds timeout) {
    std::vector<int> codes;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (auto& w : worker_children_) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      const auto status = w->Wait(std::max(left, std::chrono::milliseconds(0)));
      codes.push_back(status ? ExitCode(*status) : -1);
    }
    return codes;
  }

  // Waits for every worker to exit while the run moves on (WaitWhileProgressing): the sum of
  // the shards' versions must change at least once every `stall`, and `deadline` bounds the
  // whole wait. Returns their exit codes, -1 for each one still running when it gave up; then
  // `why` says why, with the versions.
  std::vector<int> WaitWorkers(std::chrono::seconds stall,
                               std::chrono::steady_clock::time_point deadline, std::string& why) {
    std::vector<std::optional<int>> status(worker_children_.size());
    auto all_exited = [&] {
      bool all = true;
      for (size_t r = 0; r < worker_children_.size(); ++r) {
        if (!status[r]) status[r] = worker_children_[r]->Wait(std::chrono::milliseconds(0));
        all = all && status[r].has_value();
      }
      return all;
    };
    zmq::context_t ctx;
    std::unique_ptr<PsClient> watcher = Client(ctx);
    auto versions = [&]() -> std::optional<int64_t> {
      if (watcher == nullptr) return std::nullopt;
      auto stats = watcher->Stats();
      if (!stats.ok()) return std::nullopt;
      int64_t sum = 0;
      for (const ShardStats& shard : *stats) sum += shard.version;
      return sum;
    };
    why = WaitWhileProgressing(all_exited, versions, stall, deadline);
    if (!why.empty()) why = "workers still running: " + why + " (the sum of the shards' versions)";
    std::vector<int> codes;
    for (const auto& s : status) codes.push_back(s ? ExitCode(*s) : -1);
    return codes;
  }

  // A rank -1 client (a tool: reads, takes no part in barriers), or nullptr with a failure.
  std::unique_ptr<PsClient> Client(zmq::context_t& ctx) const {
    PsClientOptions o;
    o.ps_addresses = ps_;
    o.rank = -1;
    o.request_timeout = std::chrono::seconds(10);
    auto c = PsClient::Connect(ctx, o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }

  // Shard statistics; all shards agree on the counters the tests read from shard 0.
  static std::vector<ShardStats> Stats(PsClient& client) {
    auto s = client.Stats();
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? *s : std::vector<ShardStats>{};
  }

  // The servers' addresses ("127.0.0.1:port"), in task order.
  const std::vector<std::string>& addresses() const { return ps_; }
  // The port of server i's /metrics (each serves one, on a free port).
  int metrics_port(int i) const { return metrics_ports_[static_cast<size_t>(i)]; }
  std::string DataDir(int i) const { return dir_ + "/data/ps" + std::to_string(i); }
  std::string Log(const std::string& name) const { return dir_ + "/" + name + ".log"; }
  // What server i has written to ps<i>.log.
  std::string PsLog(int i) const { return ReadFile(Log("ps" + std::to_string(i))); }
  std::string EvalLog() const { return dir_ + "/eval.jsonl"; }
  // Every server's and worker's log, each under a "--- name" line: for failure messages.
  std::string Dump() const {
    std::string out;
    for (const auto& name : ps_logs_) out += "--- " + name + "\n" + ReadFile(Log(name));
    for (size_t i = 0; i < worker_children_.size(); ++i) {
      const std::string name = "worker" + std::to_string(i);
      out += "--- " + name + "\n" + ReadFile(Log(name));
    }
    return out;
  }

 private:
  // Starts server i with its output in <dir>/<log>.log: on port 0 the first time, later on the
  // address it got then.
  void Spawn(int i, const std::string& log) {
    std::vector<std::string> argv = {BinDir() + "/parasync-ps", "--ps-hosts", JoinHosts(ps_),
                                     "--worker-hosts", JoinHosts(workers_), "--task-index",
                                     std::to_string(i), "--ready-file", ReadyFile(i)};
    if (!mode_.empty()) argv.insert(argv.end(), {"--mode", mode_});
    if (data_dirs_) argv.insert(argv.end(), {"--data-dir", DataDir(i)});
    if (log_dir_) argv.insert(argv.end(), {"--log-dir", dir_});
    argv.insert(argv.end(), ps_args_.begin(), ps_args_.end());
    ps_children_[static_cast<size_t>(i)].reset();  // reaps a previous incarnation
    ps_children_[static_cast<size_t>(i)] = std::make_unique<Child>(Child::Start(argv, Log(log)));
    ps_logs_.push_back(log);
  }

  // Waits for server i's ready file and takes its ports from it. A server that exits first is
  // left for the test to examine; one that neither serves nor exits in 60 s is a failure.
  void AwaitServing(int i) {
    std::string why;
    auto ready = WaitReady(ps(i), ReadyFile(i), std::chrono::seconds(60), &why);
    if (!ready) {
      EXPECT_TRUE(ps(i).Wait(std::chrono::milliseconds(0)).has_value())
          << "ps" << i << " is not serving: " << why;
      return;
    }
    ps_[static_cast<size_t>(i)] = ready->address;
    metrics_ports_[static_cast<size_t>(i)] = ready->metrics_port;
  }

  std::string ReadyFile(int i) const { return dir_ + "/ps" + std::to_string(i) + ".ready"; }

  std::string mode_;
  std::vector<std::string> ps_args_;
  std::string dir_;
  bool data_dirs_;
  bool log_dir_;
  std::vector<std::string> ps_;
  std::vector<std::string> workers_;
  std::vector<int> metrics_ports_;  // 0 until known
  std::vector<std::unique_ptr<Child>> ps_children_;
  std::vector<std::unique_ptr<Child>> worker_children_;
  std::vector<std::string> ps_logs_;
};

}  // namespace parasync::testing
