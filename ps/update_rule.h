// UpdateRule: how a training mode turns pushes into updates and when a pull may be served —
// the one place a mode's rule lives. The Server checks and decodes a request the same way in
// every mode, then asks its rule: per push, Admit (may this gradient be taken?), Take (apply
// it or keep it for a step) and MaybeCompleteStep; per pull, CanServe (else it is parked),
// Blocker and DescribeWait; between messages, MaybeCompleteStep again.
//
//   async          (async_rule.h) every gradient is applied on arrival; nobody waits.
//   ssp:K          (ssp_rule.h) async, but a pull waits while a live rank is more than K
//                  clocks behind the reader, and a gradient staler than K is dropped.
//   sync           (sync_rule.h) gradients of step t are kept, one per rank, and applied
//                  once as their average when the step is complete; a pull for t+1 waits.
//   sync:delayed   the sync rule with a window of one version (TrainingMode::delay, judged by
//                  Coordinator::ClassifySync): its own file would repeat sync's whole.
//
// The worker-side optimizers have no rule of their own: `aggregate` (w = g) under a sync rule
// sets the step's average, `delta` (w += g) under async or ssp adds a worker's change; both
// are rows of the shard's optimizer table (ps/optimizer.cc), and the registration check
// (common/model_spec.cc) ties each to its modes. What differs is the optimizer, not when a
// push is taken or a pull served.
//
// A new mode: its TrainingMode value, its rule here (a .h and a .cc; deriving from AsyncRule
// if it applies on arrival), a case in MakeUpdateRule and AppliesInSteps, and its tests in
// tests/ps/update_rule_test.cc.
//
// A rule holds the state of its mode (a sync step's timing) and acts on the parts it is
// handed; the accounting common to all modes (Coordinator: liveness and clocks; PushLedger;
// Durability) stays with those parts. Not thread-safe: the server loop owns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/mode.h"
#include "common/status.h"
#include "common/wire.h"
#include "ps/coordinator.h"
#include "ps/durability.h"
#include "ps/ps_metrics.h"
#include "ps/push_ledger.h"
#include "ps/shard.h"

namespace parasync {

// What a rule asks of the server beyond its parts. Called on the server loop's thread.
class RuleHost {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  virtual ~RuleHost() = default;
  // A durable write (or the tables' cold tier) failed: latch it and roll back (Server::
  // OnStoreFailure). `what` names the write.
  virtual void OnStoreFailure(const Status& failure, const std::string& what) = 0;
  // The shard's version or examples moved: publish them.
  virtual void PublishProgress() = 0;
  // A step or a pull waited `seconds` for `rank` alone.
  virtual void RecordStragglerWait(int rank, double seconds, TimePoint now, const char* what) = 0;
};

class UpdateRule {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  // What a rule acts on; none is owned, all outlive the rule.
  struct Parts {
    Shard* shard = nullptr;
    Coordinator* coordinator = nullptr;
    PushLedger* ledger = nullptr;
    Durability* durability = nullptr;
    PsMetrics* metrics = nullptr;
    RuleHost* host = nullptr;
    uint64_t incarnation = 0;  // this server's: a request of another was made for a dead one
  };

  // What becomes of a push's gradient.
  enum class Verdict : uint8_t {
    kTake,       // take it (Take)
    kStale,      // dropped: too old for the rule (counted as stale)
    kDuplicate,  // dropped: its rank already gave one to the step
    kBadVersion,  // refused: computed from a version this shard never had
    kFuture,     // refused: computed for a step not yet begun
  };
  struct Admission {
    Verdict verdict = Verdict::kTake;
    // The version the gradient was computed from (this shard's own for a push made for
    // another incarnation).
    int64_t read_version = 0;
  };

  // A gradient admitted: the push, its gradients (one per slice range, float32) and rows,
  // and how many versions it is behind the shard.
  struct Gradient {
    const Header& req;
    std::span<const float* const> grads;
    RowsRequest rows;
    int64_t staleness = 0;
  };

  virtual ~UpdateRule() = default;

  // --- a push ---
  // A tool (rank -1, outside the cluster's barriers and clocks) may push.
  virtual bool TakesToolPushes() const { return false; }
  // A restarted worker's push of data already applied here is acknowledged without being
  // applied (PushLedger::ReplaysRecordedData). False where a step waits for every rank's
  // contribution.
  virtual bool AcknowledgesRecordedData() const { return true; }
  // Whether the gradient of `req` may be taken now. Changes nothing.
  virtual Admission Admit(const Header& req) const = 0;
  // Takes an admitted gradient: applies it, or keeps it for its step. On failure returns the
  // refusal and sets *reason; a failed durable write has been handed to the host. On success
  // the ledger records the push (or, in a step, holds it pending).
  virtual Status Take(const Gradient& g, RejectReason* reason) = 0;
  // Applies the current step if the rule has one and it is complete. False only when it did
  // and the step could not be made durable (the host rolled the shard back); true otherwise.
  [[nodiscard]] virtual bool MaybeCompleteStep() { return true; }

  // --- a pull ---
  // `req` may be answered now; otherwise it is parked until this turns true.
  virtual bool CanServe(const Header& req) const = 0;
  // The rank a parked pull of `rank` waits for, charged with the wait (-1: nobody alone).
  virtual int Blocker(int /*rank*/) const { return -1; }
  // What a pull of `req` waits for, for the error when it times out.
  virtual std::string DescribeWait(const Header& req) const = 0;

 protected:
  explicit UpdateRule(const Parts& parts) : parts_(parts) {}
  // A push made for another incarnation of this server: computed from a dead process's
  // parameters, so its version means nothing here.
  bool OtherIncarnation(const Header& req) const {
    return req.incarnation != 0 && req.incarnation != parts_.incarnation;
  }
  // The version `req` was computed from, and kBadVersion when this shard never had it.
  Admission CheckReadVersion(const Header& req) const;
  // "0, 2" ("none" for no ranks).
  static std::string RankList(const std::vector<int>& ranks);

  Parts parts_;
};

// The rule of `mode`, acting on `parts`.
std::unique_ptr<UpdateRule> MakeUpdateRule(const TrainingMode& mode, const UpdateRule::Parts& parts);
// `mode` applies updates in steps: it holds a gradient per contributing rank and their
// average between them (the memory bound), and its snapshots fall on step boundaries.
bool AppliesInSteps(const TrainingMode& mode);

}  // namespace parasync
