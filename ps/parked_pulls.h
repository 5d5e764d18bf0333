// ParkedPulls: the pulls a server holds back until they may be served — in sync mode until
// the step they wait for is applied, in ssp:K mode until the slow ranks catch up. The list
// only keeps them and applies the parking rules; the Server decides when one is served or
// failed, and replies.
//
// Rules: a worker waits on one pull per shard at a time, so a newer pull of a rank replaces
// its older (abandoned) one, and a resend of the same request keeps its first arrival time
// (resends must not postpone the barrier timeout forever). Pulls of tools (rank -1) are
// bounded in number.
//
// Not thread-safe: owned by the Server's loop.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <cstdint>
#include <vector>

#include <zmq.hpp>

#include "common/wire.h"

namespace parasync {

struct ParkedPull {
  using TimePoint = std::chrono::steady_clock::time_point;
  zmq::message_t identity;
  Header request;
  TimePoint since;      // first arrival (of the first of its resends)
  int waited_for = -1;  // ssp: the slowest rank that blocked it when it was parked
  std::vector<std::vector<uint64_t>> row_ids;  // its embedding rows' ids, by RowRange
};

class ParkedPulls {
 public:
  using TimePoint = ParkedPull::TimePoint;
  enum class Outcome {
    kNew,      // parked, a new wait
    kResent,   // parked, a resend of a pull that was waiting: it keeps its arrival time
    kRefused,  // not parked: too many tool pulls wait
  };

  // At most `max_tool_pulls` pulls of tools wait at once.
  explicit ParkedPulls(size_t max_tool_pulls) : max_tool_pulls_(max_tool_pulls) {}

  // Parks `request` (from `identity`, arriving `now`). `ranked`: it comes from a worker rank
  // (which may have one pull parked), otherwise from a tool. Takes `identity` and `request`
  // unless it returns kRefused.
  Outcome Park(zmq::message_t& identity, Header& request, TimePoint now, bool ranked,
               int waited_for, std::vector<std::vector<uint64_t>> row_ids = {});

  // Calls `done` on each parked pull in arrival order; those for which it returns true are
  // removed (it may have moved from them). `done` must not park.
  void RemoveIf(const std::function<bool(ParkedPull&)>& done);

  size_t size() const { return pulls_.size(); }
  bool empty() const { return pulls_.empty(); }
  // How long the oldest has waited (0 when none waits).
  double OldestSeconds(TimePoint now) const;

 private:
  size_t max_tool_pulls_;
  std::vector<ParkedPull> pulls_;
};

}  // namespace parasync
