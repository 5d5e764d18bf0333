#include "common/metrics.h"

#include <exception>
#include <vector>

#include <prometheus/exposer.h>
#include <prometheus/text_serializer.h>

#include "common/address.h"
#include "common/file_util.h"

namespace parasync {

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& bind, int port, std::shared_ptr<prometheus::Registry> registry) {
  if (port < 0 || port > 65535) return Status::InvalidArgument("metrics port out of range");
  // civetweb reads "999.1.1.1" as 231.1.1.1: only a checked address reaches it.
  PARASYNC_ASSIGN_OR_RETURN(std::string ip, ResolveBindHost(bind, "--metrics-bind"));
  if (ip.find(':') != std::string::npos) ip = "[" + ip + "]";
  if (ip == "*") ip = "0.0.0.0";
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  try {
    // civetweb's defaults (2 threads, 30 s read timeout) let two idle connections starve
    // every scrape for 30 s. More threads and a short read timeout bound what idle or slow
    // clients can hold; requests over 16 KiB (civetweb's max_request_size) get 400.
    server->exposer_ = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", ip + ":" + std::to_string(port), "num_threads",
        std::to_string(kMetricsThreads), "request_timeout_ms",
        std::to_string(kMetricsReadTimeoutMs)});
    server->exposer_->RegisterCollectable(registry);
    auto ports = server->exposer_->GetListeningPorts();
    if (ports.empty()) return Status::Unavailable("metrics server is not listening");
    server->port_ = ports.front();
  } catch (const std::exception& e) {
    return Status::Unavailable("cannot serve metrics on " + bind + ":" + std::to_string(port) +
                               ": " + e.what());
  }
  return server;
}

MetricsServer::~MetricsServer() = default;

void MetricsServer::KeepUntilExit(std::unique_ptr<MetricsServer> server) {
  static std::vector<std::unique_ptr<MetricsServer>>* kept =
      new std::vector<std::unique_ptr<MetricsServer>>();  // never destroyed, by design
  kept->push_back(std::move(server));
}

std::string MetricsSnapshotPath(const std::string& dir, const std::string& name) {
  return dir + "/metrics-" + name + ".prom";
}

Status WriteMetricsSnapshot(const prometheus::Registry& registry, const std::string& path) {
  return WriteFileAtomically(path, prometheus::TextSerializer().Serialize(registry.Collect()));
}

}  // namespace parasync
