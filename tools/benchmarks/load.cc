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
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "common/cli.h"
#include "common/process.h"
#include "common/ready_file.h"
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

// The command line.
struct Options {
  int workers = 64;
  double seconds = 60;
  int num_ps = 2;
  std::string ps_hosts;
  int64_t elements = 100000;
  std::string mode = "async";
  int64_t max_rss_mib = 0;
  std::string log_dir = "/tmp/parasync-load";
  double pause_s = 0;
};

void AddFlags(CLI::App& app, Options& o) {
  app.footer("Example:\n  parasync-load --workers 64 --seconds 60 --ps 2 --max-rss-mib 512\n"
             "Exit status: 0 when the books balance (and memory stayed under --max-rss-mib), "
             "1 otherwise, 2 for bad flags.");
  app.add_option("--workers", o.workers, "Simulated workers (threads, one client each)")
      ->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--seconds", o.seconds, "How long they push")->check(CLI::Range(0.1, 86400.0))
      ->capture_default_str();
  app.add_option("--ps", o.num_ps, "Servers to start on loopback (without --ps-hosts)")
      ->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--ps-hosts", o.ps_hosts, "Servers already running (their --worker-hosts must "
                 "count at least --workers); memory is then not sampled");
  app.add_option("--elements", o.elements, "Model size in float32 elements (one variable)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 28))->capture_default_str();
  app.add_option("--mode", o.mode, "async or ssp:K (the servers' mode)")->capture_default_str();
  app.add_option("--max-rss-mib", o.max_rss_mib,
                 "Fail when a started server's resident memory exceeds this (0: report only)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--log-dir", o.log_dir, "Where started servers log")->capture_default_str();
  app.add_option("--pause-ps", o.pause_s,
                 "Overload: freeze server 0 (SIGSTOP) for this many seconds a third of the way "
                 "in; the workers must wait, not pile up requests, and lose nothing")
      ->check(CLI::Range(0.0, 3600.0));
}

// The servers under load: started here (`pids` their processes) or given (`pids` empty).
struct Servers {
  std::vector<std::string> addresses;
  std::vector<pid_t> pids;
};

// Without --ps-hosts, starts --ps parasync-ps processes (next to this binary) on free loopback
// ports (port 0: each says which in its ready file), logging into --log-dir, and waits until
// they serve; with it, names the servers given. Exits the process, naming why, when a server
// does not start.
Servers StartServers(const Options& o) {
  Servers servers;
  std::filesystem::create_directories(o.log_dir);
  if (!o.ps_hosts.empty()) {
    std::stringstream in(o.ps_hosts);
    for (std::string a; std::getline(in, a, ',');) servers.addresses.push_back(a);
    return servers;
  }
  const std::string bin = std::filesystem::read_symlink("/proc/self/exe").parent_path().string();
  std::string any_ports, worker_hosts;
  for (int i = 0; i < o.num_ps; ++i) any_ports += (i ? "," : "") + std::string("127.0.0.1:0");
  for (int r = 0; r < o.workers; ++r) {
    worker_hosts += (r ? "," : "") + std::string("127.0.0.1:") + std::to_string(40000 + r);
  }
  auto ready_file = [&](int i) { return o.log_dir + "/ps" + std::to_string(i) + ".ready"; };
  for (int i = 0; i < o.num_ps; ++i) {
    servers.pids.push_back(Spawn({bin + "/parasync-ps", "--ps-hosts", any_ports,
                                  "--worker-hosts", worker_hosts, "--task-index",
                                  std::to_string(i), "--mode", o.mode, "--log-level", "warn",
                                  "--worker-timeout", "60", "--ready-file", ready_file(i)},
                                 o.log_dir + "/ps" + std::to_string(i) + ".log"));
  }
  for (int i = 0; i < o.num_ps; ++i) {
    auto ready = WaitForReadyFile(ready_file(i), servers.pids[static_cast<size_t>(i)],
                                  std::chrono::seconds(60));
    if (!ready.ok()) {
      std::fprintf(stderr, "parasync-load: server %d did not start: %s (its log: %s/ps%d.log)\n",
                   i, ready.status().message().c_str(), o.log_dir.c_str(), i);
      for (pid_t pid : servers.pids) kill(pid, SIGKILL);
      std::exit(1);
    }
    servers.addresses.push_back(ready->address);
  }
  return servers;
}

// Stops the servers started here (SIGTERM) and waits for them.
void StopServers(const Servers& servers) {
  for (pid_t pid : servers.pids) kill(pid, SIGTERM);
  for (pid_t pid : servers.pids) waitpid(pid, nullptr, 0);
}

// Each started server's resident memory now, kept in `peak_kib` where higher.
void SamplePeaks(const Servers& servers, std::vector<int64_t>& peak_kib) {
  for (size_t i = 0; i < servers.pids.size(); ++i) {
    peak_kib[i] = std::max(peak_kib[i], RssKib(servers.pids[i]));
  }
}

// One float32 variable of --elements, SGD, in --mode, sliced so each server holds 4 slices.
ModelRegistration LoadModel(const Options& o, size_t shards) {
  ModelRegistration reg;
  reg.variables = {{"w", {o.elements}, DType::kFloat32, {InitKind::kZeros, 0.0f}}};
  reg.optimizer.kind = OptimizerKind::kSgd;
  reg.optimizer.learning_rate = 1e-6f;
  reg.num_shards = static_cast<int32_t>(shards);
  reg.max_slice_elements = std::max<int64_t>(1, o.elements / (4 * o.num_ps));
  reg.mode = o.mode;
  return reg;
}

// What the simulated workers share: their context, their counts, and the start: each says
// when it is ready (registered, or failed to), then waits for `go`; `deadline` is set before.
struct Swarm {
  zmq::context_t context{1};
  Tally tally;
  std::atomic<bool> go{false};
  std::atomic<int> ready{0};
  std::atomic<int> failed_setup{0};
  Clock::time_point deadline;
};

// One simulated worker of rank `rank`: registers `reg`, then pulls and pushes as fast as the
// servers answer until the deadline, counting into the swarm's tally, then leaves.
void SimulatedWorker(Swarm& swarm, const std::vector<std::string>& addresses,
                     const ModelRegistration& reg, int64_t elements, int rank) {
  PsClientOptions o;
  o.ps_addresses = addresses;
  o.rank = rank;
  o.request_timeout = std::chrono::seconds(60);
  auto client = PsClient::Connect(swarm.context, o);
  if (!client.ok() || !(*client)->Register(reg, std::chrono::seconds(60)).ok()) {
    ++swarm.failed_setup;
    ++swarm.ready;
    return;
  }
  std::vector<float> params(static_cast<size_t>(elements));
  std::vector<float> grad(static_cast<size_t>(elements), 1.0f);
  float* p[] = {params.data()};
  const float* g[] = {grad.data()};
  ++swarm.ready;
  while (!swarm.go.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  Tally& tally = swarm.tally;
  while (Clock::now() < swarm.deadline) {
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
}

// --pause-ps: server 0 frozen (SIGSTOP) a third of the way in for pause_s seconds, and the
// pushes acknowledged meanwhile.
class Freeze {
 public:
  Freeze(const Options& o, const Servers& servers)
      : pid_(servers.pids.empty() ? -1 : servers.pids[0]),
        at_(o.seconds / 3),
        seconds_(o.pause_s),
        resumed_(o.pause_s <= 0 || servers.pids.empty()) {}

  // Freezes or resumes server 0 when `now` (seconds since the start) calls for it.
  void Step(double now, const Tally& tally) {
    if (!resumed_ && !paused_ && now >= at_) {
      kill(pid_, SIGSTOP);
      paused_ = true;
      acked_at_pause_ = tally.acked.load();
      std::fprintf(stderr, "%s: %.0f s: server 0 frozen for %.0f s\n", kProgram, now, seconds_);
    }
    if (paused_ && !resumed_ && now >= at_ + seconds_) {
      acked_during_ = tally.acked.load() - acked_at_pause_;
      kill(pid_, SIGCONT);
      resumed_ = true;
      std::fprintf(stderr, "%s: %.0f s: server 0 resumed; %lld pushes were acknowledged while "
                   "it was frozen\n", kProgram, now, static_cast<long long>(acked_during_));
    }
  }
  // Resumes server 0 if the run ended while it was frozen.
  void End() {
    if (paused_ && !resumed_) kill(pid_, SIGCONT);
  }
  bool paused() const { return paused_; }
  int64_t acked_during() const { return acked_during_; }

 private:
  pid_t pid_;
  double at_, seconds_;
  bool paused_ = false, resumed_;
  int64_t acked_at_pause_ = 0, acked_during_ = 0;
};

// Until the deadline, every 100 ms: server 0 frozen or resumed, the servers' memory sampled
// into `peak_kib`, and a progress line every 10 s.
void WatchRun(Swarm& swarm, const Servers& servers, Clock::time_point start, Freeze& freeze,
              std::vector<int64_t>& peak_kib) {
  int64_t last_report = 0;
  while (Clock::now() < swarm.deadline) {
    freeze.Step(std::chrono::duration<double>(Clock::now() - start).count(), swarm.tally);
    SamplePeaks(servers, peak_kib);
    const auto elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    if (static_cast<int64_t>(elapsed / 10) > last_report) {
      last_report = static_cast<int64_t>(elapsed / 10);
      std::fprintf(stderr, "%s: %.0f s: %lld pushes acknowledged\n", kProgram, elapsed,
                   static_cast<long long>(swarm.tally.acked.load()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  freeze.End();
}

// Each shard's version (the count of pushes it applied), asked of the servers; nullopt,
// said on stderr, when they cannot be asked.
std::optional<std::vector<int64_t>> ShardVersions(zmq::context_t& context,
                                                  const std::vector<std::string>& addresses) {
  PsClientOptions o;
  o.ps_addresses = addresses;
  o.rank = -1;
  auto auditor = PsClient::Connect(context, o);
  if (!auditor.ok()) {
    std::fprintf(stderr, "%s: cannot reach the servers to audit\n", kProgram);
    return std::nullopt;
  }
  auto stats = (*auditor)->Stats();
  if (!stats.ok()) {
    std::fprintf(stderr, "%s: stats failed: %s\n", kProgram, stats.status().ToString().c_str());
    return std::nullopt;
  }
  std::vector<int64_t> versions;
  for (const ShardStats& s : *stats) versions.push_back(s.version);
  return versions;
}

// What a run ended with, for the report.
struct Outcome {
  double elapsed = 0;
  std::vector<int64_t> versions;  // per shard; empty when the audit failed
  bool audited = false;
  std::vector<int64_t> peak_kib;  // per started server
};

// The books on stdout: throughput and errors, then per shard pushes applied against
// acknowledged and peak memory against --max-rss-mib, and the freeze; the exit status (0 when
// everything balances).
int Report(const Options& o, const Servers& servers, const Swarm& swarm, const Freeze& freeze,
           const Outcome& out) {
  int rc = out.audited ? 0 : 1;
  const Tally& tally = swarm.tally;
  const int64_t acked = tally.acked.load();
  int64_t errors = 0;
  for (const auto& [message, count] : tally.errors) errors += count;
  std::printf("workers %d, servers %zu, elements %lld, %.1f s\n", o.workers,
              servers.addresses.size(), static_cast<long long>(o.elements), out.elapsed);
  std::printf("pushes acknowledged %lld (%.0f/s), dropped as stale %lld, pulls %lld, errors %lld\n",
              static_cast<long long>(acked), static_cast<double>(acked) / out.elapsed,
              static_cast<long long>(tally.dropped.load()),
              static_cast<long long>(tally.pulls.load()), static_cast<long long>(errors));
  for (const auto& [message, count] : tally.errors) {
    std::printf("  error x%lld: %s\n", static_cast<long long>(count), message.c_str());
  }
  for (size_t i = 0; i < out.versions.size(); ++i) {
    const bool balanced = out.versions[i] == acked;
    std::printf("shard %zu: applied %lld pushes %s\n", i, static_cast<long long>(out.versions[i]),
                balanced ? "= acknowledged (exactly once)" : "!= acknowledged");
    if (!balanced) rc = 1;
  }
  for (size_t i = 0; i < out.peak_kib.size(); ++i) {
    const int64_t mib = out.peak_kib[i] / 1024;
    const bool within = o.max_rss_mib == 0 || mib <= o.max_rss_mib;
    std::printf("shard %zu: peak resident memory %lld MiB%s\n", i, static_cast<long long>(mib),
                o.max_rss_mib == 0 ? "" : (within ? " (within the bound)" : " (OVER the bound)"));
    if (!within) rc = 1;
  }
  if (freeze.paused()) {
    // A push reaches every shard: with one frozen, none can complete; the workers waited.
    std::printf("server 0 frozen %.0f s: %lld pushes acknowledged meanwhile (at most one in "
                "flight per worker: the workers waited instead of queueing)\n", o.pause_s,
                static_cast<long long>(freeze.acked_during()));
    if (freeze.acked_during() > static_cast<int64_t>(o.workers)) rc = 1;
  }
  if (errors > 0 || swarm.failed_setup.load() > 0) rc = 1;
  std::printf("%s\n", rc == 0 ? "books balance" : "FAILED");
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"parasync-load: N simulated workers pull and push against parameter servers "
               "for T seconds; then checks that every acknowledged push was applied exactly "
               "once and reports throughput, errors and the servers' peak memory."};
  Options o;
  AddFlags(app, o);
  // A bad flag: one line and status 2, as the footer says (CLI11_PARSE exits 105 or 106).
  app.name(kProgram);
  if (auto done = ParseCommandLine(app, argc, argv)) return *done;
  // Every simulated worker would log each resend: keep the summary readable.
  spdlog::set_level(spdlog::level::err);

  const Servers servers = StartServers(o);
  const ModelRegistration reg = LoadModel(o, servers.addresses.size());
  Swarm swarm;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < o.workers; ++rank) {
    threads.emplace_back(SimulatedWorker, std::ref(swarm), std::cref(servers.addresses),
                         std::cref(reg), o.elements, rank);
  }
  while (swarm.ready.load() < o.workers) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (swarm.failed_setup.load() > 0) {
    std::fprintf(stderr, "%s: %d worker(s) could not register (logs in %s)\n", kProgram,
                 swarm.failed_setup.load(), o.log_dir.c_str());
  }
  std::fprintf(stderr,
               "%s: %d workers pushing %lld-element gradients to %zu server(s) for %.0f s\n",
               kProgram, o.workers, static_cast<long long>(o.elements), servers.addresses.size(),
               o.seconds);
  const auto start = Clock::now();
  swarm.deadline =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.seconds));
  swarm.go.store(true);
  Outcome out;
  out.peak_kib.assign(servers.pids.size(), 0);
  Freeze freeze(o, servers);
  WatchRun(swarm, servers, start, freeze, out.peak_kib);
  for (auto& t : threads) t.join();
  out.elapsed = std::chrono::duration<double>(Clock::now() - start).count();

  // The books: each shard applied every acknowledged push once.
  auto versions = ShardVersions(swarm.context, servers.addresses);
  out.audited = versions.has_value();
  if (versions) out.versions = std::move(*versions);
  SamplePeaks(servers, out.peak_kib);
  StopServers(servers);
  return Report(o, servers, swarm, freeze, out);
}
