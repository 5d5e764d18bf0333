// SnapshotServer: keeps a finished cluster's metrics ports answering. After parasync-launch
// --metrics has stopped the processes, it serves each process's final metrics snapshot
// (the <log-dir>/metrics-<name>.prom it wrote at exit) on the port that process used, so a
// Prometheus scraping the run keeps the final values (the last accuracy, the totals) and no
// target goes down, until the user stops the launcher.
//
// Deliberately minimal HTTP/1.1: GET /metrics answers 200 with the text, anything else 404,
// every response closes its connection; a client gets 2 s to send its request. One thread,
// one connection at a time (a scrape is one small read). Not thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace parasync::launch {

struct SnapshotEndpoint {
  std::string bind;  // IPv4 address, e.g. "127.0.0.1" or "0.0.0.0"
  int port = 0;      // 0: pick one (see SnapshotServer::ports())
  std::string body;  // Prometheus text format
};

class SnapshotServer {
 public:
  // Binds every endpoint it can (SO_REUSEADDR: the process that had the port may have left
  // connections in TIME_WAIT); one that cannot be bound is skipped, with the reason in
  // `skipped` (when given). Unavailable naming the first failure when none could be bound;
  // InvalidArgument for an address that is not IPv4.
  static Result<std::unique_ptr<SnapshotServer>> Start(const std::vector<SnapshotEndpoint>& endpoints,
                                                       std::vector<std::string>* skipped = nullptr);
  ~SnapshotServer();
  SnapshotServer(const SnapshotServer&) = delete;
  SnapshotServer& operator=(const SnapshotServer&) = delete;

  // The bound ports, in the order of the endpoints (0 for one that was skipped).
  std::vector<int> ports() const;

  // Answers requests until `wake_fd` becomes readable (nothing is read from it). Returns the
  // number of requests answered.
  int64_t ServeUntilReadable(int wake_fd);

 private:
  struct Listener {
    int fd = -1;  // -1: skipped
    int port = 0;
    std::string response;  // the whole HTTP response for GET /metrics
  };
  SnapshotServer() = default;
  void Answer(const Listener& listener);

  std::vector<Listener> listeners_;
};

// Returns the text of a metrics snapshot file, or NotFound when the process wrote none.
Result<std::string> ReadSnapshotFile(const std::string& path);

}  // namespace parasync::launch
