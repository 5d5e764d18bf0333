// Heartbeater: tells every parameter server, from a thread of its own, that this worker is
// alive — also while the training thread computes or waits at a barrier — and notices when
// a server stops answering.
//
// Owns its thread and its own ZeroMQ sockets (sockets are not shared between threads). The
// destructor stops the thread. Public methods are thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "common/curve.h"
#include "common/status.h"

namespace parasync {

class Heartbeater {
 public:
  // Starts heartbeating `rank` to every address every `interval`. `context` must outlive
  // the Heartbeater. Unavailable if a socket cannot be created.
  // With `curve`, the heartbeats go over CURVE as the client's requests do. `joining`: the
  // first beats already say so (SetJoining).
  static Result<std::unique_ptr<Heartbeater>> Start(zmq::context_t& context,
                                                    const std::vector<std::string>& ps_addresses,
                                                    int rank, std::chrono::milliseconds interval,
                                                    std::optional<CurveClientKeys> curve = {},
                                                    bool joining = false);
  ~Heartbeater();
  Heartbeater(const Heartbeater&) = delete;
  Heartbeater& operator=(const Heartbeater&) = delete;

  // A restarted worker not yet admitted back (PsClient::SetJoining): its heartbeats say so,
  // and do not make the servers count the rank live.
  void SetJoining(bool joining) { joining_.store(joining); }

  // The longest time any server has gone without answering a heartbeat (measured from the
  // start for a server that never answered).
  std::chrono::milliseconds LongestSilence() const;

  // The incarnation shard `shard` announced in its latest heartbeat reply (0: none yet). A
  // change means the server restarted.
  uint64_t Incarnation(int shard) const { return incarnation_[static_cast<size_t>(shard)].load(); }

 private:
  Heartbeater() = default;
  void Loop(std::vector<std::string> addresses, int rank, std::chrono::milliseconds interval);

  zmq::context_t* context_ = nullptr;
  std::optional<CurveClientKeys> curve_;
  std::thread thread_;
  std::atomic<bool> stop_{false};  // the thread checks it at least every 50 ms
  std::atomic<bool> joining_{false};
  // Last answer per shard, as steady_clock ticks; written by the thread, read by anyone.
  std::unique_ptr<std::atomic<int64_t>[]> last_answer_;
  std::unique_ptr<std::atomic<uint64_t>[]> incarnation_;
  size_t num_shards_ = 0;
};

}  // namespace parasync
