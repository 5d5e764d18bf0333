// SyncRule: the sync and sync:delayed modes' update rule (ps/update_rule.h) — TF's
// SyncReplicasOptimizer. Step t takes gradients computed from version t (sync:delayed: from
// t - 1 too), at most one per rank; a gradient for an older step, or one computed for another
// incarnation of this server, is dropped. Once R gradients arrived, or every live rank gave
// one, the step is applied as their average (summed in rank order, so a rerun is bit for bit
// the same), made durable with every-update durability, and only then are the pulls of step
// t+1 served; a pull made for another incarnation is served at once (the version it waits
// for belonged to a dead process).
//
// Not thread-safe: the server loop owns it.
#pragma once

#include <string>

#include "ps/update_rule.h"

namespace parasync {

class SyncRule : public UpdateRule {
 public:
  explicit SyncRule(const Parts& parts) : UpdateRule(parts) {}

  // A step waits for the rank's contribution, replayed data or not.
  bool AcknowledgesRecordedData() const override { return false; }
  Admission Admit(const Header& req) const override;
  // Adds the gradient to the open step (Shard::Accumulate); its seq is recorded and its data
  // position held pending until the step is applied.
  Status Take(const Gradient& g, RejectReason* reason) override;
  bool MaybeCompleteStep() override;
  bool CanServe(const Header& req) const override;
  std::string DescribeWait(const Header& req) const override;

 private:
  TimePoint step_last_arrival_{};  // when the open step's latest gradient arrived
};

}  // namespace parasync
