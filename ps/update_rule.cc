#include "ps/update_rule.h"

#include "ps/async_rule.h"
#include "ps/ssp_rule.h"
#include "ps/sync_rule.h"

namespace parasync {

UpdateRule::Admission UpdateRule::CheckReadVersion(const Header& req) const {
  const int64_t version = parts_.shard->version();
  Admission a;
  a.read_version = OtherIncarnation(req) ? version : req.version;
  if (a.read_version < 0 || a.read_version > version) a.verdict = Verdict::kBadVersion;
  return a;
}

std::string UpdateRule::RankList(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s.empty() ? "none" : s;
}

std::unique_ptr<UpdateRule> MakeUpdateRule(const TrainingMode& mode,
                                           const UpdateRule::Parts& parts) {
  switch (mode.kind) {
    case TrainingMode::Kind::kAsync:
      return std::make_unique<AsyncRule>(parts);
    case TrainingMode::Kind::kSsp:
      return std::make_unique<SspRule>(parts, mode.staleness);
    case TrainingMode::Kind::kSync:
      return std::make_unique<SyncRule>(parts);  // sync:delayed too (Coordinator's window)
  }
  return std::make_unique<AsyncRule>(parts);
}

bool AppliesInSteps(const TrainingMode& mode) { return mode.kind == TrainingMode::Kind::kSync; }

}  // namespace parasync
