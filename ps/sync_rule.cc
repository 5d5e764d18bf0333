#include "ps/sync_rule.h"

#include <chrono>
#include <vector>

namespace parasync {

UpdateRule::Admission SyncRule::Admit(const Header& req) const {
  const int64_t version = parts_.shard->version();
  if (OtherIncarnation(req)) return {Verdict::kStale, version};
  Admission a = CheckReadVersion(req);
  if (a.verdict != Verdict::kTake) return a;
  switch (parts_.coordinator->ClassifySync(req.rank, a.read_version, version)) {
    case Coordinator::Offer::kStale:
      a.verdict = Verdict::kStale;
      break;
    case Coordinator::Offer::kDuplicate:
      // A second gradient for the step from one rank: typically a replacement process of a
      // rank that died after contributing, or a late duplicate of the dead one. It is not
      // aggregated; the sender is told it was dropped and simply waits for the next step.
      a.verdict = Verdict::kDuplicate;
      break;
    case Coordinator::Offer::kFuture:
      a.verdict = Verdict::kFuture;
      break;
    case Coordinator::Offer::kAccept:
      break;
  }
  // A local group's push stands for its members too: one of them already in the step makes
  // it a duplicate as a whole (a member's gradient would count twice).
  for (int32_t r : req.ranks) {
    if (a.verdict == Verdict::kTake && parts_.coordinator->workers()[static_cast<size_t>(r)].contributed) {
      a.verdict = Verdict::kDuplicate;
    }
  }
  return a;
}

Status SyncRule::Take(const Gradient& g, RejectReason* reason) {
  const Header& req = g.req;
  Coordinator& c = *parts_.coordinator;
  PARASYNC_RETURN_IF_ERROR(parts_.shard->Accumulate(req.slices, g.grads, req.batch_examples,
                                                    reason, req.rank, g.rows, req.wire()));
  // The step waited for this rank alone when it was the only one missing: from the
  // gradient before it to this one, the step could have completed but for it. (With
  // backup workers a step completes without waiting for anyone in particular.)
  const bool waited_for_this_rank = c.contributors() > 0 && c.OnlyMissing(req.rank);
  c.Contribute(req.rank);
  // A local group's members (worker/local_group.h): their gradients are in this one, summed,
  // and the step divides by its contributors — so they count as contributors each.
  for (int32_t r : req.ranks) c.Contribute(r);
  parts_.ledger->RecordSeq(req.rank, PushSeq(req.seq));
  parts_.ledger->SetPending(req.rank, req.progress);
  const TimePoint arrived = std::chrono::steady_clock::now();
  if (waited_for_this_rank && c.StepReady()) {
    parts_.host->RecordStragglerWait(
        req.rank, std::chrono::duration<double>(arrived - step_last_arrival_).count(), arrived,
        "the sync step's last gradient");
  }
  step_last_arrival_ = arrived;
  return Status::Ok();
}

bool SyncRule::MaybeCompleteStep() {
  Coordinator& c = *parts_.coordinator;
  Shard& shard = *parts_.shard;
  if (!c.StepReady()) return true;
  // After a rollback the step's gradients may be gone: no step is taken that cannot be kept.
  if (parts_.durability->failure()) return true;
  const int n = c.contributors();
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t before = shard.examples();
  if (Status s = shard.ApplyAccumulated(n); !s.ok()) {
    c.CompleteStep();
    parts_.ledger->SettlePending();
    parts_.host->OnStoreFailure(s, "embedding rows of step " + std::to_string(shard.version()));
    return false;
  }
  c.CompleteStep();
  // The contributors' positions count now that their gradients are applied; with
  // every-update durability they are stored with the step, seqs included.
  const std::vector<int> contributors = parts_.ledger->SettlePending();
  if (parts_.durability->every_update()) {
    // The step's pulls are answered only after it is durable (the server serves its parked
    // pulls after this).
    if (Status s = parts_.durability->SaveUpdate(shard, {}, parts_.ledger->Records(contributors));
        !s.ok()) {
      parts_.host->OnStoreFailure(s, "step " + std::to_string(shard.version()));
      return false;  // rolled back: this step's examples were not applied after all
    }
  }
  parts_.metrics->apply_seconds->Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  parts_.host->PublishProgress();
  parts_.metrics->examples->Increment(static_cast<double>(shard.examples() - before));
  return true;
}

bool SyncRule::CanServe(const Header& req) const {
  // A pull made for an older incarnation of this server waits for a version of a dead
  // process: it is answered at once.
  return req.min_version <= parts_.shard->version() || OtherIncarnation(req);
}

std::string SyncRule::DescribeWait(const Header& /*req*/) const {
  const Coordinator& c = *parts_.coordinator;
  return "the sync barrier of step " + std::to_string(parts_.shard->version()) + " (it has " +
         std::to_string(c.contributors()) + " of " + std::to_string(c.needed()) +
         " gradients; missing ranks: " + RankList(c.MissingFromStep()) + ")";
}

}  // namespace parasync
