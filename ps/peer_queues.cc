#include "ps/peer_queues.h"

#include <algorithm>
#include <utility>

namespace parasync {

PeerQueues::Taken PeerQueues::Take(Inbound& in) {
  Peer& peer = peers_[std::string(static_cast<const char*>(in.identity.data()),
                                  in.identity.size())];
  Taken taken;
  taken.repeat = peer.read_pass == read_pass_;
  peer.read_pass = read_pass_;
  if (in.header.ok() && in.header->request_id != 0) {
    for (const Queued& q : peer.queue) {
      if (q.in.header.ok() && q.in.header->request_id == in.header->request_id &&
          q.in.header->type == in.header->type) {
        taken.outcome = Outcome::kDuplicate;
        return taken;
      }
    }
  }
  const size_t weight = Weight(in);
  if (peer.queue.size() >= per_peer_ && peer.weight + weight > small_bytes_) {
    taken.outcome = Outcome::kFull;
    return taken;
  }
  peer.queue.push_back({std::move(in), weight});
  peer.weight += weight;
  ++queued_;
  return taken;
}

size_t PeerQueues::Weight(const Inbound& in) const {
  size_t weight = sizeof(Queued) + in.identity.size() + in.peer_address.size();
  for (const zmq::message_t& frame : in.frames) weight += sizeof(frame) + frame.size();
  if (!in.header.ok()) return weight + in.header.status().message().size();
  const Header& h = *in.header;
  // A worker sends these once per restart, and nothing in them is small by rule.
  if (h.registration.has_value() || h.stats.has_value()) return small_bytes_ + 1;
  return weight + h.status.message().size() + h.slices.size() * sizeof(SliceRange) +
         h.rows.size() * sizeof(RowRange);
}

std::optional<Inbound> PeerQueues::Next() {
  if (charge_due_) Charge(std::chrono::duration<double>::zero());
  const double earliest = virtual_time_ - credit_;  // the earliest start a peer may have
  Peer* best = nullptr;
  const std::string* best_id = nullptr;
  double best_start = 0;
  double last_finish = virtual_time_;
  for (auto it = peers_.begin(); it != peers_.end();) {
    Peer& peer = it->second;
    last_finish = std::max(last_finish, peer.finish);
    if (peer.queue.empty()) {
      // Nothing queued and no place kept: it is a new peer again when it next sends.
      if (peer.finish <= earliest) {
        it = peers_.erase(it);
      } else {
        ++it;
      }
      continue;
    }
    const double start = std::max(earliest, peer.finish);
    if (best == nullptr || start < best_start ||
        (start == best_start && peer.served < best->served)) {
      best = &peer;
      best_id = &it->first;
      best_start = start;
    }
    ++it;
  }
  if (best == nullptr) {
    // Idle: every peer has had what it asked for; they all start afresh.
    virtual_time_ = last_finish;
    peers_.clear();
    return std::nullopt;
  }
  Inbound in = std::move(best->queue.front().in);
  best->weight -= best->queue.front().weight;
  best->queue.pop_front();
  --queued_;
  best->served = ++next_calls_;
  virtual_time_ = std::max(virtual_time_, best_start);
  in_service_ = *best_id;
  in_service_start_ = best_start;
  charge_due_ = true;
  return in;
}

void PeerQueues::Charge(std::chrono::duration<double> spent) {
  if (!charge_due_) return;
  charge_due_ = false;
  // At least a nanosecond: a request that took no measurable time still moves its peer on.
  const double cost = std::max(spent.count(), 1e-9);
  // Next erases peers only when they have nothing queued, and Take none: the peer in
  // service is still here.
  Peer& peer = peers_[in_service_];
  peer.finish = in_service_start_ + cost;
}

}  // namespace parasync
