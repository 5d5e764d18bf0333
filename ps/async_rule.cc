#include "ps/async_rule.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace parasync {

Status AsyncRule::Take(const Gradient& g, RejectReason* reason) {
  const Header& req = g.req;
  Shard& shard = *parts_.shard;
  float lr_scale = 1.0f;
  if (shard.registration() && shard.registration()->optimizer.staleness_aware) {
    lr_scale = 1.0f / static_cast<float>(std::max<int64_t>(1, g.staleness));
  }
  Status status = shard.Apply(req.slices, g.grads, req.batch_examples, reason, lr_scale, g.rows);
  if (!status.ok() && *reason == RejectReason::kStoreFailed) {
    // The tables' cold tier failed mid-update: like a failed durable write.
    parts_.host->OnStoreFailure(status,
                                "embedding rows of a push of rank " + std::to_string(req.rank));
    status = Status::Unavailable(*parts_.durability->failure());
  }
  if (!status.ok()) return status;
  const bool ranked = parts_.coordinator->ValidRank(req.rank);
  if (parts_.durability->every_update()) {
    std::vector<RankRecord> record;
    if (ranked && (req.seq != 0 || !req.progress.empty())) {
      record.push_back(parts_.ledger->RecordAfter(req.rank, req.seq, req.progress));
    }
    if (Status s = parts_.durability->SaveUpdate(shard, req.slices, std::move(record)); !s.ok()) {
      // Not durable, so not acknowledged (and rolled back): the seq is not recorded.
      parts_.host->OnStoreFailure(s, "push of rank " + std::to_string(req.rank));
      *reason = RejectReason::kStoreFailed;
      return Status::Unavailable(*parts_.durability->failure());
    }
  }
  if (ranked) {
    parts_.ledger->RecordSeq(req.rank, PushSeq(req.seq));
    parts_.ledger->RecordProgress(req.rank, req.progress);
  }
  parts_.host->PublishProgress();
  if (req.batch_examples > 0) {
    parts_.metrics->examples->Increment(static_cast<double>(req.batch_examples));
  }
  return Status::Ok();
}

}  // namespace parasync
