// Metrics plumbing shared by every process: serving a prometheus-cpp Registry on /metrics
// and writing a text snapshot of it at exit. Which metrics exist is decided in one place per
// process (ps/ps_metrics.h, worker/worker_metrics.h).
#pragma once

#include <memory>
#include <string>

#include <prometheus/registry.h>

#include "common/status.h"

namespace prometheus {
class Exposer;
}

namespace parasync {

// The metrics HTTP server's worker threads and its read timeout: idle or slow clients can
// hold a thread for at most this long, and only as many as there are threads.
inline constexpr int kMetricsThreads = 8;
inline constexpr int kMetricsReadTimeoutMs = 2000;


// An HTTP server for /metrics. Serves from its own threads until destroyed.
class MetricsServer {
 public:
  // Serves `registry` at http://bind:port/metrics; port 0 picks a free port (see port()).
  // `bind` is checked and resolved by ResolveBindHost (common/address.h): InvalidArgument
  // for an address it refuses. Returns Unavailable when the address cannot be bound.
  static Result<std::unique_ptr<MetricsServer>> Start(const std::string& bind, int port,
                                                      std::shared_ptr<prometheus::Registry> registry);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }

  // For the end of main: keeps `server` serving until the process exits instead of stopping
  // it. Stopping civetweb takes up to 2 s (its listener polls in 2 s quanta), which every
  // SIGTERM would otherwise wait for; exit() ends its threads at once. A scrape racing the
  // exit sees a closed connection. Intentionally never freed.
  static void KeepUntilExit(std::unique_ptr<MetricsServer> server);

 private:
  MetricsServer() = default;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

// Where a process writes its final metrics: <dir>/metrics-<name>.prom, name "ps0",
// "worker1", ... (parasync-launch serves these files with --metrics).
std::string MetricsSnapshotPath(const std::string& dir, const std::string& name);

// Writes the registry in Prometheus text format to `path` (via a temp file and rename, so a
// reader never sees half a file). Returns Unavailable on an I/O error.
Status WriteMetricsSnapshot(const prometheus::Registry& registry, const std::string& path);

}  // namespace parasync
