// Server: the parameter server's request loop. Binds a ZeroMQ ROUTER, decodes each request,
// checks it, lets the Shard apply it and replies — one reply per request, an error reply for
// anything refused (the server keeps serving).
//
// Single-threaded: Run() owns the socket and the Shard; Stop() may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <zmq.hpp>

#include "common/status.h"
#include "common/transport.h"
#include "ps/ps_metrics.h"
#include "ps/shard.h"

namespace parasync {

struct ServerOptions {
  std::string endpoint;  // e.g. "tcp://127.0.0.1:5000"
  int shard_index = 0;
  int num_shards = 1;
  int64_t max_message_bytes = int64_t{1} << 30;
  int64_t max_model_bytes = 0;  // bound on this shard's values + slots; 0: none
  // Shutdown requests are accepted from loopback peers only, unless this is set. (Until the
  // transport authenticates peers, anyone who can reach the port could stop the server.)
  bool allow_remote_shutdown = false;
};

class Server {
 public:
  // Binds the socket. Unavailable if the endpoint cannot be bound. `metrics` must outlive
  // the Server.
  static Result<std::unique_ptr<Server>> Create(zmq::context_t& context,
                                                const ServerOptions& options, PsMetrics* metrics);

  // Serves until Stop() is called, `should_stop()` returns true (checked at least every
  // 100 ms) or an accepted Shutdown request arrives. Returns ok on such a stop, an error only if the
  // socket broke.
  Status Run(const std::function<bool()>& should_stop);

  // Asks Run() to return. Thread-safe.
  void Stop() { stop_.store(true); }

  std::string endpoint() const { return socket_->LastEndpoint(); }
  const Shard& shard() const { return shard_; }

 private:
  Server(std::unique_ptr<Socket> socket, const ServerOptions& options, PsMetrics* metrics);
  // Handles one message and sends its reply. Returns false when it was a Shutdown.
  bool Handle(Inbound& in);
  void Reject(RejectReason reason);
  bool ShouldLogRejection() const;

  std::unique_ptr<Socket> socket_;
  ServerOptions options_;
  PsMetrics* metrics_;
  Shard shard_;
  std::atomic<bool> stop_{false};
  int64_t requests_ = 0;
  int64_t rejected_ = 0;
};

}  // namespace parasync
