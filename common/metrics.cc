#include "common/metrics.h"

#include <cstdio>
#include <exception>
#include <functional>
#include <vector>

#include <CivetServer.h>
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

void Reply(mg_connection* conn, int status, const char* content_type, const std::string& body) {
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
            "Cache-Control: no-store\r\n\r\n",
            status, mg_get_response_code_text(conn, status), content_type, body.size());
  mg_write(conn, body.data(), body.size());
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

// One path of the server. Called on civetweb's threads, several at once: it only reads.
class MetricsServer::Handler : public CivetHandler {
 public:
  using Answer = std::function<HealthAnswer()>;
  // /metrics: the registry and the process metrics.
  explicit Handler(std::shared_ptr<prometheus::Registry> registry)
      : registry_(std::move(registry)), process_(std::make_unique<ProcessCollector>()) {}
  // /healthz, /readyz.
  explicit Handler(Answer answer) : answer_(std::move(answer)) {}

  bool handleGet(CivetServer*, mg_connection* conn) override {
    if (answer_) {
      const HealthAnswer a = answer_();
      Reply(conn, a.status, "text/plain; charset=utf-8", a.body);
      return true;
    }
    std::vector<prometheus::MetricFamily> families = registry_->Collect();
    for (prometheus::MetricFamily& f : process_->Collect()) families.push_back(std::move(f));
    Reply(conn, 200, "text/plain; version=0.0.4; charset=utf-8",
          prometheus::TextSerializer().Serialize(families));
    return true;
  }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<ProcessCollector> process_;
  Answer answer_;
};

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
  // civetweb reads "999.1.1.1" as 231.1.1.1: only a checked address reaches it.
  PARASYNC_ASSIGN_OR_RETURN(std::string ip, ResolveBindHost(bind, "--metrics-bind"));
  if (ip.find(':') != std::string::npos) ip = "[" + ip + "]";
  if (ip == "*") ip = "0.0.0.0";
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->metrics_handler_ = std::make_unique<Handler>(std::move(registry));
  if (const LoopHeartbeat* loop = options.loop) {
    const auto bound = options.stale_after;
    server->healthz_handler_ = std::make_unique<Handler>([loop, bound] { return Healthz(*loop, bound); });
    server->readyz_handler_ = std::make_unique<Handler>([loop, bound] { return Readyz(*loop, bound); });
  }
  try {
    // civetweb's defaults (2 threads, 30 s read timeout) let two idle connections starve
    // every scrape for 30 s. More threads and a short read timeout bound what idle or slow
    // clients can hold; requests over 16 KiB (civetweb's max_request_size) get 400.
    server->server_ = std::make_unique<CivetServer>(std::vector<std::string>{
        "listening_ports", ip + ":" + std::to_string(port), "num_threads",
        std::to_string(kMetricsThreads), "request_timeout_ms",
        std::to_string(kMetricsReadTimeoutMs)});
    server->server_->addHandler("/metrics", server->metrics_handler_.get());
    if (server->healthz_handler_) {
      server->server_->addHandler("/healthz", server->healthz_handler_.get());
      server->server_->addHandler("/readyz", server->readyz_handler_.get());
    }
    auto ports = server->server_->getListeningPorts();
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
