// GatherBoard: the collectives of parasync.horovod (allreduce, allgather, broadcast, and the
// objects and optimizer state built on them) as one primitive a server keeps: every live
// rank offers one payload for round r of a named key; once every rank expected has offered,
// each waiting rank is answered with all the payloads, in rank order, and the ranks they came
// from. The reduction itself (sum, average, min, max) happens on the workers, in rank order,
// so every rank computes the same bits.
//
// Rules:
// - A key's rounds go 1, 2, 3... on every rank (the Python side counts them per key). A rank
//   offering the open round joins it; offering it again (a resend) replaces its parked
//   request and keeps its payload's first arrival; offering a round already complete gets the
//   result at once (the resend of a request whose reply was lost, or a rank that was dead
//   while the others finished without it: the ranks list says who took part); offering the
//   next round starts it. Any other round is refused (FailedPrecondition naming both).
// - Who is expected is the server's liveness (ps/coordinator.h): a rank declared dead or
//   departed is not waited for, so a dead worker stops no collective — its peers get the
//   result of those alive.
// - An open round older than the timeout fails its waiters with TimedOut naming the ranks
//   it waited for. A completed round's result is kept until the key's next round starts or
//   kKeepComplete passes, so a lost reply can be fetched again.
// - Memory: payloads held (open and kept rounds) stay within max_bytes; an offer that would
//   pass it, once kept results are dropped, is refused (Unavailable).
// - Joining (parasync.horovod.elastic): a restarted rank offers with `joining` set and no
//   round. It takes no part in rounds and is not waited for; its request is parked until
//   the key's next round completes, which admits it: every reply of that round (the
//   joiner's too) lists it in `admitted`, and the joiner's carries the round it was admitted
//   at, so it counts on from there. A resend after its admission gets the kept result again.
//
// Pure state over frames: the Server sends the replies. Not thread-safe: the loop owns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "common/status.h"
#include "common/wire.h"

namespace parasync {

class GatherBoard {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  static constexpr std::chrono::seconds kKeepComplete{120};

  struct Options {
    int num_workers = 1;
    int64_t max_bytes = int64_t{32} << 20;
    std::chrono::milliseconds timeout{300000};
  };

  // A reply to send: to `identity`, for `request`, with `status`; when ok, `ranks` and one
  // frame per rank (shared copies of the payloads).
  struct Reply {
    zmq::message_t identity;
    Header request;  // for an admitted joiner, its clock is the round it was admitted at
    Status status;
    std::vector<int32_t> ranks;
    std::vector<zmq::message_t> frames;
    std::vector<int32_t> admitted;  // joiners the round admitted (the server counts them live)
  };

  explicit GatherBoard(const Options& options) : options_(options) {}

  // Rank `request.rank` offers `payload` for round `request.clock` of `request.key`.
  // Returns the replies now due: none when it waits (its request is kept), its own when the
  // round was complete already or is refused, everyone's when this offer completes the round
  // (`expected(rank)` says whom to wait for).
  std::vector<Reply> Offer(zmq::message_t& identity, const Header& request,
                           zmq::message_t payload, TimePoint now,
                           const std::function<bool(int)>& expected);

  // Completes the open rounds that no longer wait for anyone expected (a rank died or left),
  // fails those past the timeout, and forgets kept results past kKeepComplete.
  std::vector<Reply> Tick(TimePoint now, const std::function<bool(int)>& expected);

  int64_t bytes() const { return bytes_; }
  size_t open_rounds() const;
  size_t keys() const { return keys_.size(); }

 private:
  struct Key {
    int64_t round = 0;
    bool open = false;
    TimePoint opened{};
    TimePoint completed{};
    std::map<int, zmq::message_t> payloads;  // by rank: the open round's, or the result's
    std::map<int, Reply> waiting;            // by rank: parked requests of the open round
    std::map<int, Reply> joiners;            // by rank: parked joining requests
    std::vector<int32_t> admitted;           // the joiners the last completed round admitted
  };
  // A joining offer: parked until the key's next round completes.
  std::vector<Reply> OfferToJoin(zmq::message_t& identity, const Header& request,
                                 TimePoint now);
  // The round is complete: every waiter gets the payloads.
  std::vector<Reply> Complete(Key& key, TimePoint now);
  // Whether `key`'s open round waits for nobody expected any more.
  bool Ready(const Key& key, const std::function<bool(int)>& expected) const;
  static Reply ResultFor(const Key& key, zmq::message_t identity, const Header& request);
  // Drops kept results (oldest first) until `more` bytes fit; false when they do not.
  bool MakeRoom(int64_t more, const std::string& keep);
  void Forget(std::map<std::string, Key>::iterator it);
  static int64_t PayloadBytes(const Key& key);

  Options options_;
  std::map<std::string, Key> keys_;
  int64_t bytes_ = 0;
};

}  // namespace parasync
