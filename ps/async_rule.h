// AsyncRule: the async mode's update rule (ps/update_rule.h). Every gradient is applied on
// arrival — written first with every-update durability, since nothing is acknowledged before
// it is durable — and every pull is served at once. Tools may push. SspRule is this rule
// with a bound on how far a reader may run ahead.
//
// Not thread-safe: the server loop owns it.
#pragma once

#include <string>

#include "ps/update_rule.h"

namespace parasync {

class AsyncRule : public UpdateRule {
 public:
  explicit AsyncRule(const Parts& parts) : UpdateRule(parts) {}

  bool TakesToolPushes() const override { return true; }
  Admission Admit(const Header& req) const override { return CheckReadVersion(req); }
  // Applies the gradient now (staleness-aware optimizers at 1 / staleness of the learning
  // rate), durable first with every-update durability; then the ledger records the push.
  Status Take(const Gradient& g, RejectReason* reason) override;
  bool CanServe(const Header& /*req*/) const override { return true; }
  std::string DescribeWait(const Header& /*req*/) const override {
    return "nothing (async pulls do not wait)";
  }
};

}  // namespace parasync
