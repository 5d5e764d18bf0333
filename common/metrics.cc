#include "common/metrics.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <map>
#include <vector>

#include <prometheus/text_serializer.h>

#include "common/address.h"
#include "common/file_util.h"
#include "common/process_metrics.h"

namespace parasync {

namespace {

std::string Seconds(LoopHeartbeat::Clock::duration d) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", std::chrono::duration<double>(d).count());
  return buf;
}

// nullopt while the loop beat within the bound (or never); else the 503 answer.
std::optional<HealthAnswer> Stale(const LoopHeartbeat& loop, std::chrono::milliseconds stale_after) {
  const auto since = loop.SinceLastBeat();
  if (!since || *since <= stale_after) return std::nullopt;
  return HealthAnswer{503, "unhealthy: the main loop last turned " + Seconds(*since) +
                               " s ago (bound " + Seconds(stale_after) + " s)\n"};
}

HttpAnswer Health(const HealthAnswer& a) {
  return {a.status, "text/plain; charset=utf-8", a.body};
}

// /metrics: the registry and the process metrics, serialized at each scrape.
HttpAnswer Scrape(prometheus::Registry& registry, ProcessCollector& process) {
  try {
    std::vector<prometheus::MetricFamily> families = registry.Collect();
    for (prometheus::MetricFamily& f : process.Collect()) families.push_back(std::move(f));
    return {200, "text/plain; version=0.0.4; charset=utf-8",
            prometheus::TextSerializer().Serialize(families)};
  } catch (const std::exception& e) {
    return {500, "text/plain; charset=utf-8",
            std::string("cannot collect metrics: ") + e.what() + "\n"};
  }
}

// Half the soft open-file limit, or `wanted` where that is lower (and at least 16).
size_t ConnectionCap(size_t wanted) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return wanted;
  return std::min(wanted, std::max<size_t>(16, static_cast<size_t>(limit.rlim_cur / 2)));
}

}  // namespace

HealthAnswer Healthz(const LoopHeartbeat& loop, std::chrono::milliseconds stale_after) {
  if (auto stale = Stale(loop, stale_after)) return *stale;
  return {200, "ok\n"};
}

HealthAnswer Readyz(const LoopHeartbeat& loop, std::chrono::milliseconds stale_after) {
  if (!loop.SinceLastBeat()) return {503, "not ready: the main loop has not started yet\n"};
  if (auto stale = Stale(loop, stale_after)) return *stale;
  return {200, "ok\n"};
}

Result<int> MetricsServer::ServeUntilExit(const std::string& ip, const std::string& bind_flag,
                                          int port,
                                          std::shared_ptr<prometheus::Registry> registry,
                                          MetricsServerOptions options) {
  auto server = Start(ip, port, std::move(registry), options);
  if (!server.ok()) {
    const std::string line = "cannot serve metrics on --metrics-bind " + bind_flag +
                             " --metrics-port " + std::to_string(port) + ": " +
                             server.status().message();
    return port != 0 ? Status::FailedPrecondition(line) : Status::Unavailable(line);
  }
  const int bound = (*server)->port();
  KeepUntilExit(std::move(server).value());
  return bound;
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& bind, int port, std::shared_ptr<prometheus::Registry> registry,
    MetricsServerOptions options) {
  if (port < 0 || port > 65535) return Status::InvalidArgument("metrics port out of range");
  PARASYNC_ASSIGN_OR_RETURN(std::string ip, ResolveBindHost(bind, "--metrics-bind"));
  if (ip == "*") ip = "0.0.0.0";
  std::map<std::string, HttpHandler> routes;
  // Shared by copies of the handler; only the server's thread calls it.
  auto process = std::make_shared<ProcessCollector>();
  routes["/metrics"] = [registry = std::move(registry), process] {
    return Scrape(*registry, *process);
  };
  if (const LoopHeartbeat* loop = options.loop) {
    const auto bound = options.stale_after;
    routes["/healthz"] = [loop, bound] { return Health(Healthz(*loop, bound)); };
    routes["/readyz"] = [loop, bound] { return Health(Readyz(*loop, bound)); };
  }
  HttpServerOptions http = options.http;
  http.max_connections = ConnectionCap(http.max_connections);
  auto served = HttpServer::Start(ip, port, std::move(routes), http);
  if (!served.ok()) return served.status();
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->port_ = (*served)->port();
  server->server_ = std::move(served).value();
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
