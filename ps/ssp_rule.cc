#include "ps/ssp_rule.h"

#include <cstdint>

namespace parasync {

UpdateRule::Admission SspRule::Admit(const Header& req) const {
  Admission a = CheckReadVersion(req);
  if (a.verdict == Verdict::kTake && parts_.coordinator->ValidRank(req.rank) &&
      parts_.coordinator->ClockStaleness(req.rank) > bound_) {
    // Only possible across a death and rejoin (reads are gated by the bound): a gradient
    // computed before is older than the bound allows, so it is dropped, not applied.
    a.verdict = Verdict::kStale;
  }
  return a;
}

bool SspRule::CanServe(const Header& req) const {
  return !parts_.coordinator->ValidRank(req.rank) || parts_.coordinator->PullAllowed(req.rank);
}

int SspRule::Blocker(int rank) const {
  const Coordinator& c = *parts_.coordinator;
  if (!c.ValidRank(rank)) return -1;
  int waited_for = -1;
  int64_t slowest_clock = INT64_MAX;
  for (int r : c.SspBlockers(rank)) {
    const int64_t clock = c.workers()[static_cast<size_t>(r)].clock;
    if (clock < slowest_clock) {
      slowest_clock = clock;
      waited_for = r;
    }
  }
  return waited_for;
}

std::string SspRule::DescribeWait(const Header& req) const {
  return "the ssp:" + std::to_string(bound_) + " bound (ranks too far behind: " +
         RankList(parts_.coordinator->SspBlockers(req.rank)) + ")";
}

}  // namespace parasync
