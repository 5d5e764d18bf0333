// PeerQueues: the requests a server has taken from its socket and not yet handled, queued per
// peer (the ROUTER's routing id), and the order they are served in.
//
// Why: ZeroMQ's ROUTER takes one message per connection in turn, which is fair per message,
// not per unit of the server's work. A peer that pipelines always has its next message
// ready; an honest worker (one request in flight) is absent while its reply travels and its
// next request comes back, and its step is two requests (push, pull). Served in arrival turn,
// an honest worker beside N flooding sockets got one push applied for every two of each
// flooder's (1/(2N+1) of the pushes, 11 % with N = 4; docs/reliability.md). So the server
// reads everything ready into these queues, a bounded amount per peer (what comes past that
// is refused, cheaply, by the caller), and serves by start-time fair queueing over the
// loop's time: each peer has a virtual finish time, advanced by the time its requests took;
// the next request served is that of the peer with the earliest start, max(virtual time,
// its finish), ties going to the peer served least recently. A peer that has work gets at
// least its equal share of the loop's time; a peer that uses less (an honest worker) is
// served as soon as its request is read.
//
// Credit: a worker is away between its requests (its reply travels, its next request comes
// back), and the others' turns go on meanwhile; starting from the virtual time when it comes
// back, it would lose its place at each request, and get 1/(2N+1) again. So a peer that
// comes back keeps its place for up to `credit` of virtual time: its start is max(virtual
// time - credit, its finish). Longer idle time earns nothing, and no peer gets more than its
// share plus the credit over any stretch.
//
// The bound: `per_peer` requests of any size, and past that more while all the peer has
// queued weighs at most `small_bytes` (Weight: what a request holds here, its frames and its
// decoded header). Depth costs the others nothing (a backlogged peer gets its share of the
// loop's time however many it has queued), only memory: so a client may pipeline many small
// requests (embedding pulls, many small tensors: hundreds of one-slice pulls), and a peer
// holds at most max(per_peer requests, small_bytes) whatever it sends. A request that weighs
// more than `small_bytes` (or a Register, whose model description is not weighed) is taken
// only under the count.
//
// A peer's requests are served in the order they came. A resend (same type and request id)
// of a request still queued is not queued again: the reply to the first answers both.
//
// Not thread-safe: owned by the Server's loop.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <unordered_map>

#include "common/transport.h"

namespace parasync {

class PeerQueues {
 public:
  enum class Outcome {
    kQueued,     // taken: queued behind the peer's earlier requests
    kDuplicate,  // not taken: a resend of a request the peer has queued (drop it)
    kFull,       // not taken: the peer's queue is full, by count and by weight (refuse it)
  };
  struct Taken {
    Outcome outcome = Outcome::kQueued;
    // Its peer had already sent a message since BeginRead: ZeroMQ's fair queue has come
    // round, so every peer with a message ready has given one.
    bool repeat = false;
  };

  // At most `per_peer` (>= 1) requests queued for one peer, or more weighing `small_bytes`
  // at most together (above; 0: the count alone). (The server reads only between requests,
  // so a peer's queued requests and the one in hand are within that together.) `credit`: the
  // place a peer keeps while away, in seconds of loop time (above).
  PeerQueues(size_t per_peer, std::chrono::duration<double> credit, size_t small_bytes = 0)
      : per_peer_(per_peer), small_bytes_(small_bytes), credit_(credit.count()) {}

  // What `in` holds while queued: its frames, its header's lists and its place in the queue;
  // more than `small_bytes` for a header that carries a model description or statistics.
  size_t Weight(const Inbound& in) const;

  // Starts a pass of reads (Take reports repeats from here on).
  void BeginRead() { ++read_pass_; }

  // Queues `in` for its peer (Outcome kQueued: it was moved from); otherwise leaves it to the
  // caller.
  Taken Take(Inbound& in);

  // The next request to serve, removed from its queue; nullopt when none is queued. The loop
  // time it takes goes to Charge before the next call.
  std::optional<Inbound> Next();

  // Charges the peer of the request Next returned last the loop's time on it.
  void Charge(std::chrono::duration<double> spent);

  bool empty() const { return queued_ == 0; }
  size_t queued() const { return queued_; }
  // Peers with requests queued or a place kept (a finish time past the virtual time less
  // the credit).
  size_t peers() const { return peers_.size(); }

 private:
  struct Queued {
    Inbound in;
    size_t weight = 0;
  };
  struct Peer {
    std::deque<Queued> queue;
    size_t weight = 0;          // of its queued requests, together
    double finish = 0;          // virtual time (seconds of loop time) its last request ended
    uint64_t served = 0;        // when it was last served (Next's count); 0: never
    uint64_t read_pass = 0;     // the last pass of reads that took a message of it
  };
  size_t per_peer_;
  size_t small_bytes_;
  double credit_;
  std::unordered_map<std::string, Peer> peers_;
  double virtual_time_ = 0;
  uint64_t read_pass_ = 0;
  uint64_t next_calls_ = 0;
  size_t queued_ = 0;
  // The peer Next served last, its start, and whether Charge is still due.
  std::string in_service_;
  double in_service_start_ = 0;
  bool charge_due_ = false;
};

}  // namespace parasync
