#include "ps/gather_board.h"

#include <algorithm>
#include <string>
#include <utility>

namespace parasync {

namespace {

// What one payload costs beside its bytes (its key, map node and reply bookkeeping), so that
// empty payloads under ever new keys are bounded too.
constexpr int64_t kPayloadOverhead = 512;

int64_t Cost(const zmq::message_t& payload) {
  return static_cast<int64_t>(payload.size()) + kPayloadOverhead;
}

}  // namespace

int64_t GatherBoard::PayloadBytes(const Key& key) {
  int64_t bytes = 0;
  for (const auto& [rank, payload] : key.payloads) bytes += Cost(payload);
  return bytes;
}

size_t GatherBoard::open_rounds() const {
  return static_cast<size_t>(
      std::count_if(keys_.begin(), keys_.end(), [](const auto& kv) { return kv.second.open; }));
}

bool GatherBoard::Ready(const Key& key, const std::function<bool(int)>& expected) const {
  if (!key.open || key.payloads.empty()) return false;
  for (int r = 0; r < options_.num_workers; ++r) {
    // A joiner is not part of the round (it is admitted when the round completes).
    if (expected(r) && !key.payloads.contains(r) && !key.joiners.contains(r)) return false;
  }
  return true;
}

GatherBoard::Reply GatherBoard::ResultFor(const Key& key, zmq::message_t identity,
                                          const Header& request) {
  Reply reply{std::move(identity), request, Status::Ok(), {}, {}, key.admitted};
  reply.request.clock = key.round;
  for (const auto& [rank, payload] : key.payloads) {
    reply.ranks.push_back(rank);
    reply.frames.emplace_back();
    // Shares the payload's buffer (reference counted) rather than copying it.
    reply.frames.back().copy(const_cast<zmq::message_t&>(payload));
  }
  return reply;
}

std::vector<GatherBoard::Reply> GatherBoard::Complete(Key& key, TimePoint now) {
  key.open = false;
  key.completed = now;
  key.admitted.clear();
  for (const auto& [rank, joiner] : key.joiners) key.admitted.push_back(rank);
  std::vector<Reply> out;
  for (auto* parked : {&key.waiting, &key.joiners}) {
    for (auto& [rank, waiter] : *parked) {
      out.push_back(ResultFor(key, std::move(waiter.identity), waiter.request));
    }
    parked->clear();
  }
  return out;
}

void GatherBoard::Forget(std::map<std::string, Key>::iterator it) {
  bytes_ -= PayloadBytes(it->second);
  keys_.erase(it);
}

bool GatherBoard::MakeRoom(int64_t more, const std::string& keep) {
  while (bytes_ + more > options_.max_bytes) {
    auto oldest = keys_.end();
    for (auto it = keys_.begin(); it != keys_.end(); ++it) {
      if (it->second.open || it->first == keep || !it->second.joiners.empty()) continue;
      if (oldest == keys_.end() || it->second.completed < oldest->second.completed) oldest = it;
    }
    if (oldest == keys_.end()) return false;
    Forget(oldest);
  }
  return true;
}

std::vector<GatherBoard::Reply> GatherBoard::Offer(zmq::message_t& identity,
                                                   const Header& request,
                                                   zmq::message_t payload, TimePoint now,
                                                   const std::function<bool(int)>& expected) {
  std::vector<Reply> out;
  auto refuse = [&](Status status) {
    out.push_back({std::move(identity), request, std::move(status), {}, {}, {}});
    return std::move(out);
  };
  const int rank = request.rank;
  const int64_t round = request.clock;
  if (request.key.empty()) return refuse(Status::InvalidArgument("a gather needs a key"));
  if (rank < 0 || rank >= options_.num_workers) {
    return refuse(Status::InvalidArgument("a gather needs a worker rank"));
  }
  if (request.joining) return OfferToJoin(identity, request, now);
  if (round < 1) {
    return refuse(Status::InvalidArgument("gather '" + request.key + "': round " +
                                          std::to_string(round) + " (rounds count from 1)"));
  }
  auto [it, created] = keys_.try_emplace(request.key);
  Key& key = it->second;
  if (created) {  // its first round here (or the first since this server started)
    key.round = round;
    key.open = true;
    key.opened = now;
  } else if (key.round == round && !key.open) {
    out.push_back(ResultFor(key, std::move(identity), request));
    return out;
  } else if (round == key.round + 1 && !key.open) {
    bytes_ -= PayloadBytes(key);
    key.payloads.clear();
    key.admitted.clear();
    key.round = round;
    key.open = true;
    key.opened = now;
  } else if (key.round != round) {
    return refuse(Status::FailedPrecondition(
        "rank " + std::to_string(rank) + " offers round " + std::to_string(round) +
        " of gather '" + request.key + "', which is at round " + std::to_string(key.round) +
        (key.open ? " (open)" : " (complete)") +
        ": every rank must call the same collectives in the same order"));
  }
  if (!key.payloads.contains(rank)) {
    const int64_t cost = Cost(payload);
    if (!MakeRoom(cost, request.key)) {
      if (key.payloads.empty()) keys_.erase(it);
      return refuse(Status::Unavailable(
          "gather '" + request.key + "': " + std::to_string(payload.size()) +
          " more bytes would pass the server's bound on collectives' payloads (" +
          std::to_string(options_.max_bytes) + " bytes, --max-gather-bytes)"));
    }
    bytes_ += cost;
    key.payloads.emplace(rank, std::move(payload));
  }
  // A resend replaces the parked request (its identity may be new after a reconnect).
  key.waiting.insert_or_assign(rank,
                               Reply{std::move(identity), request, Status::Ok(), {}, {}, {}});
  if (Ready(key, expected)) return Complete(key, now);
  return out;
}

std::vector<GatherBoard::Reply> GatherBoard::OfferToJoin(zmq::message_t& identity,
                                                         const Header& request, TimePoint now) {
  auto [it, created] = keys_.try_emplace(request.key);
  Key& key = it->second;
  if (created) key.completed = now;  // no round yet: the first one admits it
  std::vector<Reply> out;
  if (!key.open && std::ranges::count(key.admitted, request.rank) > 0) {
    out.push_back(ResultFor(key, std::move(identity), request));  // its reply was lost
    return out;
  }
  key.joiners.insert_or_assign(request.rank,
                               Reply{std::move(identity), request, Status::Ok(), {}, {}, {}});
  return out;
}

std::vector<GatherBoard::Reply> GatherBoard::Tick(TimePoint now,
                                                  const std::function<bool(int)>& expected) {
  std::vector<Reply> out;
  for (auto it = keys_.begin(); it != keys_.end();) {
    Key& key = it->second;
    if (key.open && now - key.opened > options_.timeout) {
      std::string missing;
      for (int r = 0; r < options_.num_workers; ++r) {
        if (!key.payloads.contains(r)) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      const Status timed_out = Status::TimedOut(
          "gather '" + it->first + "' round " + std::to_string(key.round) + " waited " +
          std::to_string(options_.timeout.count() / 1000) + " s for rank(s) " + missing);
      for (auto& [rank, waiter] : key.waiting) {
        out.push_back({std::move(waiter.identity), waiter.request, timed_out, {}, {}, {}});
      }
      if (key.joiners.empty()) {
        Forget(it++);
        continue;
      }
      // The joiners wait on for the key's next round.
      key.waiting.clear();
      bytes_ -= PayloadBytes(key);
      key.payloads.clear();
      key.open = false;
      key.completed = now;
    }
    if (Ready(key, expected)) {
      for (Reply& r : Complete(key, now)) out.push_back(std::move(r));
    } else if (!key.open && key.joiners.empty() && now - key.completed > kKeepComplete) {
      Forget(it++);
      continue;
    }
    ++it;
  }
  return out;
}

}  // namespace parasync
