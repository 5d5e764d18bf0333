// SnapshotServer: keeps a finished cluster's metrics ports answering. After parasync-launch
// --metrics has stopped the processes, it serves each process's final metrics snapshot
// (the <log-dir>/metrics-<name>.prom it wrote at exit) on the port that process used, so a
// Prometheus scraping the run keeps the final values (the last accuracy, the totals) and no
// target goes down, until the user stops the launcher.
//
// Each endpoint is a common/http_server.h HttpServer: GET (or HEAD) /metrics answers 200
// with the text, another path 404, another method 405; idle or slow clients are bounded in
// number and time and cannot keep an answer from anyone else. Its limits are HttpServer's
// defaults, except that the endpoints' connection caps together keep to half the soft
// open-file limit.
// Thread safety: one thread per endpoint serves from Start until destruction; the methods
// here are for one thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/http_server.h"
#include "common/status.h"

namespace parasync::launch {

struct SnapshotEndpoint {
  std::string bind;  // numeric IP address, e.g. "127.0.0.1" or "0.0.0.0"
  int port = 0;      // 0: pick one (see SnapshotServer::ports())
  std::string body;  // Prometheus text format
};

class SnapshotServer {
 public:
  // Binds every endpoint it can (SO_REUSEADDR: the process that had the port may have left
  // connections in TIME_WAIT) and serves it at once; one that cannot be bound is skipped,
  // with the reason in `skipped` (when given). Unavailable naming the first failure when
  // none could be bound; InvalidArgument for an address that is not numeric.
  static Result<std::unique_ptr<SnapshotServer>> Start(
      const std::vector<SnapshotEndpoint>& endpoints, std::vector<std::string>* skipped = nullptr);
  // Stops serving: closes every connection and listening socket.
  ~SnapshotServer() = default;
  SnapshotServer(const SnapshotServer&) = delete;
  SnapshotServer& operator=(const SnapshotServer&) = delete;

  // The bound ports, in the order of the endpoints (0 for one that was skipped).
  std::vector<int> ports() const { return ports_; }

  // Blocks until `wake_fd` becomes readable (nothing is read from it); the endpoints are
  // served meanwhile, and after it returns until the server is destroyed. Returns the number
  // of requests answered since Start, on every endpoint, whatever the answer.
  int64_t ServeUntilReadable(int wake_fd);

 private:
  SnapshotServer() = default;

  std::vector<std::unique_ptr<HttpServer>> servers_;  // the bound endpoints
  std::vector<int> ports_;
};

// Returns the text of a metrics snapshot file, or NotFound when the process wrote none.
Result<std::string> ReadSnapshotFile(const std::string& path);

}  // namespace parasync::launch
