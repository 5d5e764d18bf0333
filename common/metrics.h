// Metrics plumbing shared by every process: serving a prometheus-cpp Registry on /metrics
// (with the process_* and parasync_build_info metrics of common/process_metrics.h beside
// it), a liveness signal on /healthz and /readyz, and writing a text snapshot of the registry
// at exit. Which parasync_* metrics exist is decided in one place per process
// (ps/ps_metrics.h, worker/worker_metrics.h).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <prometheus/registry.h>

#include "common/http_server.h"
#include "common/status.h"

namespace parasync {

// When a process's main loop counts as wedged: parasync-ps's request loop turns at least
// every 100 ms even when idle (ps/server.h), so 30 s without a turn is no slow request; a
// worker's loop turns with every request to the servers and every 100 ms while it waits for
// a reply, but between requests it computes a batch or (the chief) evaluates the whole test
// set, which for a large model on a small CPU takes tens of seconds.
inline constexpr std::chrono::seconds kPsLoopStaleAfter{30};
inline constexpr std::chrono::seconds kWorkerLoopStaleAfter{60};

// The liveness of a process's main loop: the loop calls Beat() on every turn, and the metrics
// server's /healthz reads how long ago that was. The metrics server runs on threads of its
// own, so /metrics answering says nothing about the loop; this does. Lock-free: Beat() from
// the loop's thread, SinceLastBeat() from any thread.
class LoopHeartbeat {
 public:
  using Clock = std::chrono::steady_clock;

  void Beat() { last_beat_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed); }

  // How long ago the last Beat() was; nullopt before the first one.
  std::optional<Clock::duration> SinceLastBeat() const {
    const Clock::rep last = last_beat_.load(std::memory_order_relaxed);
    if (last == kNever) return std::nullopt;
    return Clock::now().time_since_epoch() - Clock::duration(last);
  }

 private:
  static constexpr Clock::rep kNever = INT64_MIN;
  std::atomic<Clock::rep> last_beat_{kNever};
};

// What /healthz and /readyz answer, given the loop's heartbeat and its bound:
//   /healthz  200 "ok" while the loop beat within `stale_after`, and also before its first
//             beat (the process is still starting: restoring a store, loading data); 503 and
//             one line naming the age of the last beat otherwise. For liveness probes.
//   /readyz   as /healthz, but 503 before the first beat too. For readiness probes.
// Each returns the HTTP status and the body (one line, ending in a newline).
struct HealthAnswer {
  int status = 200;
  std::string body;
};
HealthAnswer Healthz(const LoopHeartbeat& loop, std::chrono::milliseconds stale_after);
HealthAnswer Readyz(const LoopHeartbeat& loop, std::chrono::milliseconds stale_after);

// What a MetricsServer serves beside the registry.
struct MetricsServerOptions {
  // The main loop's heartbeat for /healthz and /readyz (not owned; must outlive the server).
  // Null: those two paths answer 404.
  const LoopHeartbeat* loop = nullptr;
  std::chrono::milliseconds stale_after{kPsLoopStaleAfter};
  // Bounds on the clients (common/http_server.h): at most 1024 connections, a request head
  // within 16 KiB and 5 s, the answer read within 10 s. Start lowers max_connections to half
  // the process's open-file limit where that is lower: the rest is the store's and the
  // transport's, and an idle connection costs a descriptor.
  HttpServerOptions http = {};
};

// An HTTP server for /metrics, /healthz and /readyz (common/http_server.h). Serves from a
// thread of its own until destroyed; every path is answered from that thread, never by the
// process's loop. Idle or slow clients hold a descriptor each, never the thread.
class MetricsServer {
 public:
  // Serves `registry` and the process metrics (common/process_metrics.h) at
  // http://bind:port/metrics, and with options.loop /healthz and /readyz; port 0 picks a
  // free port (see port()). `bind` is checked and resolved by ResolveBindHost
  // (common/address.h): InvalidArgument for an address it refuses. Returns Unavailable when
  // the address cannot be bound.
  static Result<std::unique_ptr<MetricsServer>> Start(const std::string& bind, int port,
                                                      std::shared_ptr<prometheus::Registry> registry,
                                                      MetricsServerOptions options = {});
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }

  // For the end of main: keeps `server` serving until the process exits instead of stopping
  // it, so /metrics and /healthz answer through the whole shutdown (a final checkpoint
  // included); exit() ends its thread. A scrape racing the exit sees a closed connection.
  // Intentionally never freed.
  static void KeepUntilExit(std::unique_ptr<MetricsServer> server);

  // For a binary's main: Start, then KeepUntilExit; the bound port. On failure the message is
  // the binary's one error line, "cannot serve metrics on --metrics-bind <bind_flag>
  // --metrics-port <port>: <why>", with FailedPrecondition when the port was given (another
  // process has it: the user's to change) and Unavailable when the system picked it (a retry
  // may do).
  static Result<int> ServeUntilExit(const std::string& ip, const std::string& bind_flag, int port,
                                    std::shared_ptr<prometheus::Registry> registry,
                                    MetricsServerOptions options);

 private:
  MetricsServer() = default;
  std::unique_ptr<HttpServer> server_;
  int port_ = 0;
};

// Where a process writes its final metrics: <dir>/metrics-<name>.prom, name "ps0",
// "worker1", ... (parasync-launch serves these files with --metrics).
std::string MetricsSnapshotPath(const std::string& dir, const std::string& name);

// Writes the registry in Prometheus text format to `path` (via a temp file and rename, so a
// reader never sees half a file). Returns Unavailable on an I/O error.
Status WriteMetricsSnapshot(const prometheus::Registry& registry, const std::string& path);

}  // namespace parasync
