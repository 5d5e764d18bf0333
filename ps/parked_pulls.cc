#include "ps/parked_pulls.h"

#include <algorithm>
#include <utility>

namespace parasync {

ParkedPulls::Outcome ParkedPulls::Park(zmq::message_t& identity, Header& request,
                                       TimePoint now, bool ranked, int waited_for,
                                       std::vector<std::vector<uint64_t>> row_ids) {
  TimePoint since = now;
  if (ranked) {
    for (const ParkedPull& p : pulls_) {
      if (p.request.rank == request.rank && p.request.request_id == request.request_id) {
        since = p.since;
      }
    }
    std::erase_if(pulls_, [&](const ParkedPull& p) { return p.request.rank == request.rank; });
  } else if (pulls_.size() >= max_tool_pulls_) {
    return Outcome::kRefused;
  }
  pulls_.push_back(
      {std::move(identity), std::move(request), since, waited_for, std::move(row_ids)});
  return since == now ? Outcome::kNew : Outcome::kResent;
}

void ParkedPulls::RemoveIf(const std::function<bool(ParkedPull&)>& done) {
  if (pulls_.empty()) return;
  std::vector<ParkedPull> still;
  still.reserve(pulls_.size());
  for (ParkedPull& p : pulls_) {
    if (!done(p)) still.push_back(std::move(p));
  }
  pulls_ = std::move(still);
}

double ParkedPulls::OldestSeconds(TimePoint now) const {
  double oldest = 0;
  for (const ParkedPull& p : pulls_) {
    oldest = std::max(oldest, std::chrono::duration<double>(now - p.since).count());
  }
  return oldest;
}

}  // namespace parasync
