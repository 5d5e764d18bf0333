// RequestTracker: the lifecycle of one PsClient exchange's requests — when each was sent and
// to which server incarnation, when it is due to be sent again (backoff, or at once after a
// server restart), which reply answers it (shard and request id), and when the exchange
// times out. It does no I/O and reads no clock: PsClient sends, receives and passes `now`.
//
// Not thread-safe: one thread (PsClient's caller) uses a tracker, for one exchange.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace parasync {

class RequestTracker {
 public:
  using Clock = std::chrono::steady_clock;

  struct Limits {
    // Every request must be answered within `timeout` of Start.
    std::chrono::milliseconds timeout{30000};
    // Requests [0, short_count) must be answered within short_timeout (PushPull's pushes,
    // whose pulls may wait far longer at a barrier).
    size_t short_count = 0;
    std::chrono::milliseconds short_timeout{0};
    // An unanswered request is due again after resend_after, then twice as long, and so on
    // up to resend_max; after a restart at once, and then after resend_after again.
    std::chrono::milliseconds resend_after{1000};
    std::chrono::milliseconds resend_max{10000};
  };

  // Why a request is due to be sent again.
  enum class Resend { kNotDue, kUnanswered, kRestarted };

  // The requests that timed out and the limit they missed.
  struct Overdue {
    std::vector<size_t> silent;  // request indices, ascending
    std::chrono::milliseconds limit;
  };

  // Tracks shards.size() requests; request i goes to shard shards[i].
  RequestTracker(std::vector<int> shards, const Limits& limits);

  size_t size() const { return shards_.size(); }
  int shard(size_t i) const { return shards_[i]; }
  uint64_t id(size_t i) const { return ids_[i]; }

  // Request i carries request id `id` (the same on every resend).
  void SetId(size_t i, uint64_t id) { ids_[i] = id; }
  // Request i was (re)sent at `now`, addressed to server incarnation `incarnation` (0:
  // unknown).
  void Sent(size_t i, uint64_t incarnation, Clock::time_point now);
  // The first sends are done: the timeouts count from `now`.
  void Start(Clock::time_point now);

  // Whether unanswered request i is to be sent again at `now`, given the incarnation its
  // shard announces now (0: unknown). When it is, the next backoff is set: reset after a
  // restart, else doubled up to resend_max. kNotDue for an answered request.
  Resend ResendDue(size_t i, uint64_t announced, Clock::time_point now);
  // True the first time it is called for request i (to warn once per request).
  bool FirstComplaint(size_t i);
  // Whether request i was complained about (its answer then is worth a log line).
  bool complained(size_t i) const { return complained_[i]; }

  // The requests past their limit at `now` (short ones first), or nullopt.
  std::optional<Overdue> CheckOverdue(Clock::time_point now) const;
  // Until the (long) deadline; negative once past it.
  Clock::duration Remaining(Clock::time_point now) const { return deadline_ - now; }
  // Since Start.
  Clock::duration Elapsed(Clock::time_point now) const { return now - start_; }

  // The shards with an unanswered request, each once, in request order.
  std::vector<int> WaitingShards() const;
  // The unanswered request of `shard` with `request_id`, or nullopt (a late reply to an
  // abandoned request).
  std::optional<size_t> Match(int shard, uint64_t request_id) const;
  // Request i was answered at `now`.
  void Answer(size_t i, Clock::time_point now);
  bool answered(size_t i) const { return answered_[i]; }
  size_t pending() const { return pending_; }
  // Each request's answer time (default for unanswered ones).
  const std::vector<Clock::time_point>& answered_at() const { return answered_at_; }

 private:
  std::vector<int> shards_;
  Limits limits_;
  std::vector<uint64_t> ids_;
  std::vector<Clock::time_point> sent_at_;
  std::vector<uint64_t> sent_to_;  // incarnation each request was addressed to
  std::vector<std::chrono::milliseconds> backoff_;
  std::vector<bool> complained_;
  std::vector<bool> answered_;
  std::vector<Clock::time_point> answered_at_;
  size_t pending_;
  Clock::time_point start_;
  Clock::time_point deadline_;
};

}  // namespace parasync
