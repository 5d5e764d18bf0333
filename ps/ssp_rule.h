// SspRule: the ssp:K mode's update rule (ps/update_rule.h) — bounded staleness. Gradients
// are applied on arrival as in AsyncRule, but a rank at clock c may pull only when every
// live rank has reached c - K (Coordinator::PullAllowed), and a gradient whose clock
// staleness is past K — possible only across a death and rejoin, since reads are gated — is
// dropped: no gradient is applied staler than the bound. A waiting pull is charged to the
// slowest rank that holds it. Tools may not push (they have no clock).
//
// Not thread-safe: the server loop owns it.
#pragma once

#include <cstdint>
#include <string>

#include "ps/async_rule.h"

namespace parasync {

class SspRule : public AsyncRule {
 public:
  // `bound`: K, the clocks a reader may run ahead of the slowest live rank.
  SspRule(const Parts& parts, int64_t bound) : AsyncRule(parts), bound_(bound) {}

  bool TakesToolPushes() const override { return false; }
  Admission Admit(const Header& req) const override;
  bool CanServe(const Header& req) const override;
  // The slowest live rank keeping `rank` from reading (-1: none).
  int Blocker(int rank) const override;
  std::string DescribeWait(const Header& req) const override;

 private:
  int64_t bound_;
};

}  // namespace parasync
