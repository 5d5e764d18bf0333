// parasync-load: N simulated workers against real parameter servers for T seconds, then the
// books are balanced: every push a worker saw acknowledged must have been applied exactly
// once (each shard's version, the count of pushes it applied, equals the sum of accepted
// acknowledgements), and the servers' resident memory must have stayed below a bound.
//
// Each simulated worker is a thread with its own PsClient (its own rank), pulling and
// pushing as fast as the servers answer. A client has at most one request outstanding per
// shard: that is the flow control (a credit of one), so a slow server makes workers wait
// instead of queueing without end; the sockets' high-water marks bound the rest.
//
// Without --ps-hosts it starts --ps parasync-ps processes itself on loopback (next to this
// binary), samples their VmRSS every 100 ms, and stops them at the end.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "common/process.h"
#include "common/ports.h"
#include "tools/benchmarks/bench_util.h"
#include "worker/ps_client.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace parasync;
constexpr const char* kProgram = "parasync-load";

using parasync::bench::Spawn;

// VmRSS of `pid` in KiB, or -1.
int64_t RssKib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

struct Tally {
  std::atomic<int64_t> acked{0};     // pushes acknowledged as applied
  std::atomic<int64_t> dropped{0};   // acknowledged as dropped (stale): not applied
  std::atomic<int64_t> pulls{0};
  std::mutex mu;
  std::map<std::string, int64_t> errors;  // by message
  void Error(const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    ++errors[s.ToString()];
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"parasync-load: N simulated workers pull and push against parameter servers "
               "for T seconds; then checks that every acknowledged push was applied exactly "
               "once and reports throughput, errors and the servers' peak memory."};
  app.footer("Example:\n  parasync-load --workers 64 --seconds 60 --ps 2 --max-rss-mib 512\n"
             "Exit status: 0 when the books balance (and memory stayed under --max-rss-mib), "
             "1 otherwise, 2 for bad flags.");
  int workers = 64;
  double seconds = 60;
  int num_ps = 2;
  std::string ps_hosts;
  int64_t elements = 100000;
  std::string mode = "async";
  int64_t max_rss_mib = 0;
  std::string log_dir = "/tmp/parasync-load";
  double pause_s = 0;
  app.add_option("--workers", workers, "Simulated workers (threads, one client each)")
      ->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--seconds", seconds, "How long they push")->check(CLI::Range(0.1, 86400.0))
      ->capture_default_str();
  app.add_option("--ps", num_ps, "Servers to start on loopback (without --ps-hosts)")
      ->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--ps-hosts", ps_hosts, "Servers already running (their --worker-hosts must "
                 "count at least --workers); memory is then not sampled");
  app.add_option("--elements", elements, "Model size in float32 elements (one variable)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 28))->capture_default_str();
  app.add_option("--mode", mode, "async or ssp:K (the servers' mode)")->capture_default_str();
  app.add_option("--max-rss-mib", max_rss_mib,
                 "Fail when a started server's resident memory exceeds this (0: report only)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--log-dir", log_dir, "Where started servers log")->capture_default_str();
  app.add_option("--pause-ps", pause_s,
                 "Overload: freeze server 0 (SIGSTOP) for this many seconds a third of the way "
                 "in; the workers must wait, not pile up requests, and lose nothing")
      ->check(CLI::Range(0.0, 3600.0));
  CLI11_PARSE(app, argc, argv);
  // Every simulated worker would log each resend: keep the summary readable.
  spdlog::set_level(spdlog::level::err);

  // The servers: started here, or given.
  std::vector<std::string> addresses;
  std::vector<pid_t> pids;
  std::filesystem::create_directories(log_dir);
  const bool spawn = ps_hosts.empty();
  if (spawn) {
    const std::string bin = std::filesystem::read_symlink("/proc/self/exe").parent_path().string();
    for (int port : PickFreeLoopbackPorts(num_ps)) {
      addresses.push_back("127.0.0.1:" + std::to_string(port));
    }
    std::string joined, worker_hosts;
    for (const auto& a : addresses) joined += (joined.empty() ? "" : ",") + a;
    for (int r = 0; r < workers; ++r) {
      worker_hosts += (r ? "," : "") + std::string("127.0.0.1:") + std::to_string(40000 + r);
    }
    for (int i = 0; i < num_ps; ++i) {
      pids.push_back(Spawn({bin + "/parasync-ps", "--ps-hosts", joined, "--worker-hosts",
                            worker_hosts, "--task-index", std::to_string(i), "--mode", mode,
                            "--log-level", "warn", "--worker-timeout", "60"},
                           log_dir + "/ps" + std::to_string(i) + ".log"));
    }
  } else {
    std::stringstream in(ps_hosts);
    for (std::string a; std::getline(in, a, ',');) addresses.push_back(a);
  }
  auto stop_servers = [&] {
    for (pid_t pid : pids) kill(pid, SIGTERM);
    for (pid_t pid : pids) waitpid(pid, nullptr, 0);
  };

  ModelRegistration reg;
  reg.variables = {{"w", {elements}, DType::kFloat32, {InitKind::kZeros, 0.0f}}};
  reg.optimizer.kind = OptimizerKind::kSgd;
  reg.optimizer.learning_rate = 1e-6f;
  reg.num_shards = static_cast<int32_t>(addresses.size());
  reg.max_slice_elements = std::max<int64_t>(1, elements / (4 * num_ps));
  reg.mode = mode;

  zmq::context_t context(1);
  Tally tally;
  std::atomic<bool> go{false};
  std::atomic<int> ready{0};
  std::atomic<int> failed_setup{0};
  Clock::time_point deadline;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < workers; ++rank) {
    threads.emplace_back([&, rank] {
      PsClientOptions o;
      o.ps_addresses = addresses;
      o.rank = rank;
      o.request_timeout = std::chrono::seconds(60);
      auto client = PsClient::Connect(context, o);
      if (!client.ok() || !(*client)->Register(reg, std::chrono::seconds(60)).ok()) {
        ++failed_setup;
        ++ready;
        return;
      }
      std::vector<float> params(static_cast<size_t>(elements));
      std::vector<float> grad(static_cast<size_t>(elements), 1.0f);
      float* p[] = {params.data()};
      const float* g[] = {grad.data()};
      ++ready;
      while (!go.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      while (Clock::now() < deadline) {
        if (Status s = (*client)->Pull(p); !s.ok()) {
          tally.Error(s);
          continue;
        }
        ++tally.pulls;
        Status s = (*client)->Push(g, 1);
        if (!s.ok()) {
          tally.Error(s);
        } else if ((*client)->last_push_dropped()) {
          ++tally.dropped;
        } else {
          ++tally.acked;
        }
      }
      (void)(*client)->Leave(std::chrono::seconds(5));
    });
  }
  while (ready.load() < workers) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (failed_setup.load() > 0) {
    std::fprintf(stderr, "%s: %d worker(s) could not register (logs in %s)\n", kProgram,
                 failed_setup.load(), log_dir.c_str());
  }
  std::fprintf(stderr, "%s: %d workers pushing %lld-element gradients to %zu server(s) for %.0f s\n",
               kProgram, workers, static_cast<long long>(elements), addresses.size(), seconds);
  const auto start = Clock::now();
  deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  go.store(true);
  std::vector<int64_t> peak_kib(pids.size(), 0);
  int64_t last_report = 0;
  const double pause_at = seconds / 3;
  bool paused = false, resumed = pause_s <= 0 || pids.empty();
  int64_t acked_at_pause = 0, acked_during_pause = 0;
  while (Clock::now() < deadline) {
    const double now = std::chrono::duration<double>(Clock::now() - start).count();
    if (!resumed && !paused && now >= pause_at) {
      kill(pids[0], SIGSTOP);
      paused = true;
      acked_at_pause = tally.acked.load();
      std::fprintf(stderr, "%s: %.0f s: server 0 frozen for %.0f s\n", kProgram, now, pause_s);
    }
    if (paused && !resumed && now >= pause_at + pause_s) {
      acked_during_pause = tally.acked.load() - acked_at_pause;
      kill(pids[0], SIGCONT);
      resumed = true;
      std::fprintf(stderr, "%s: %.0f s: server 0 resumed; %lld pushes were acknowledged while "
                   "it was frozen\n", kProgram, now, static_cast<long long>(acked_during_pause));
    }
    for (size_t i = 0; i < pids.size(); ++i) peak_kib[i] = std::max(peak_kib[i], RssKib(pids[i]));
    const auto elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    if (static_cast<int64_t>(elapsed / 10) > last_report) {
      last_report = static_cast<int64_t>(elapsed / 10);
      std::fprintf(stderr, "%s: %.0f s: %lld pushes acknowledged\n", kProgram, elapsed,
                   static_cast<long long>(tally.acked.load()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (paused && !resumed) kill(pids[0], SIGCONT);
  for (auto& t : threads) t.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();

  // The books: each shard applied every acknowledged push once.
  PsClientOptions o;
  o.ps_addresses = addresses;
  o.rank = -1;
  auto auditor = PsClient::Connect(context, o);
  int rc = 0;
  std::vector<int64_t> versions;
  if (!auditor.ok()) {
    std::fprintf(stderr, "%s: cannot reach the servers to audit\n", kProgram);
    rc = 1;
  } else {
    auto stats = (*auditor)->Stats();
    if (!stats.ok()) {
      std::fprintf(stderr, "%s: stats failed: %s\n", kProgram, stats.status().ToString().c_str());
      rc = 1;
    } else {
      for (const ShardStats& s : *stats) versions.push_back(s.version);
    }
  }
  for (size_t i = 0; i < pids.size(); ++i) peak_kib[i] = std::max(peak_kib[i], RssKib(pids[i]));
  stop_servers();

  const int64_t acked = tally.acked.load();
  int64_t errors = 0;
  for (const auto& [message, count] : tally.errors) errors += count;
  std::printf("workers %d, servers %zu, elements %lld, %.1f s\n", workers, addresses.size(),
              static_cast<long long>(elements), elapsed);
  std::printf("pushes acknowledged %lld (%.0f/s), dropped as stale %lld, pulls %lld, errors %lld\n",
              static_cast<long long>(acked), static_cast<double>(acked) / elapsed,
              static_cast<long long>(tally.dropped.load()),
              static_cast<long long>(tally.pulls.load()), static_cast<long long>(errors));
  for (const auto& [message, count] : tally.errors) {
    std::printf("  error x%lld: %s\n", static_cast<long long>(count), message.c_str());
  }
  for (size_t i = 0; i < versions.size(); ++i) {
    const bool balanced = versions[i] == acked;
    std::printf("shard %zu: applied %lld pushes %s\n", i, static_cast<long long>(versions[i]),
                balanced ? "= acknowledged (exactly once)" : "!= acknowledged");
    if (!balanced) rc = 1;
  }
  for (size_t i = 0; i < peak_kib.size(); ++i) {
    const int64_t mib = peak_kib[i] / 1024;
    const bool within = max_rss_mib == 0 || mib <= max_rss_mib;
    std::printf("shard %zu: peak resident memory %lld MiB%s\n", i, static_cast<long long>(mib),
                max_rss_mib == 0 ? "" : (within ? " (within the bound)" : " (OVER the bound)"));
    if (!within) rc = 1;
  }
  if (paused) {
    // A push reaches every shard: with one frozen, none can complete; the workers waited.
    std::printf("server 0 frozen %.0f s: %lld pushes acknowledged meanwhile (at most one in "
                "flight per worker: the workers waited instead of queueing)\n", pause_s,
                static_cast<long long>(acked_during_pause));
    if (acked_during_pause > static_cast<int64_t>(workers)) rc = 1;
  }
  if (errors > 0 || failed_setup.load() > 0) rc = 1;
  std::printf("%s\n", rc == 0 ? "books balance" : "FAILED");
  return rc;
}
