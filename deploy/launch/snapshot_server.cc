#include "deploy/launch/snapshot_server.h"

#include <poll.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <sstream>

namespace parasync::launch {

namespace {

// Connections per endpoint: HttpServer's default, or less so that all the endpoints together
// keep to half the launcher's soft open-file limit. Out of descriptors, an endpoint frees one
// only by closing one of its own idle connections, so idle clients of one endpoint must not be
// able to take every descriptor from the others.
size_t ConnectionsPerEndpoint(size_t endpoints) {
  const size_t wanted = HttpServerOptions{}.max_connections;
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return wanted;
  const size_t share = static_cast<size_t>(limit.rlim_cur) / 2 / std::max<size_t>(endpoints, 1);
  return std::clamp<size_t>(share, 16, wanted);
}

}  // namespace

Result<std::unique_ptr<SnapshotServer>> SnapshotServer::Start(
    const std::vector<SnapshotEndpoint>& endpoints, std::vector<std::string>* skipped) {
  std::unique_ptr<SnapshotServer> server(new SnapshotServer());
  std::string first_failure;
  HttpServerOptions options;
  options.max_connections = ConnectionsPerEndpoint(endpoints.size());
  for (const SnapshotEndpoint& e : endpoints) {
    HttpAnswer metrics{200, "text/plain; version=0.0.4; charset=utf-8", e.body};
    Result<std::unique_ptr<HttpServer>> endpoint =
        HttpServer::Start(e.bind, e.port, {{"/metrics", [metrics] { return metrics; }}}, options);
    if (!endpoint.ok()) {
      if (endpoint.status().code() == StatusCode::kInvalidArgument) return endpoint.status();
      const std::string failure = "cannot serve the final metrics on " + e.bind + ":" +
                                  std::to_string(e.port) + ": " + endpoint.status().message();
      if (first_failure.empty()) first_failure = failure;
      if (skipped != nullptr) skipped->push_back(failure);
      server->ports_.push_back(0);
      continue;
    }
    server->ports_.push_back((*endpoint)->port());
    server->servers_.push_back(std::move(endpoint).value());
  }
  if (server->servers_.empty()) {
    return Status::Unavailable(first_failure.empty() ? "no endpoint to serve" : first_failure);
  }
  return server;
}

int64_t SnapshotServer::ServeUntilReadable(int wake_fd) {
  pollfd wake{wake_fd, POLLIN, 0};
  while (poll(&wake, 1, -1) < 0 && errno == EINTR) {
  }
  int64_t answered = 0;
  for (const auto& s : servers_) answered += s->answered();
  return answered;
}

Result<std::string> ReadSnapshotFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("no metrics snapshot at " + path);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) return Status::Unavailable("cannot read " + path);
  return text.str();
}

}  // namespace parasync::launch
