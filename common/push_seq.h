// PushSeq: the sequence number a worker stamps on a push, the same on every shard, so that a
// resent push is applied at most once: (the sender's incarnation << 32) | a counter from 1;
// 0 means none. Carried as Header::seq (common/wire.h); written by worker/ps_client.cc, read by
// ps/push_ledger.h.
#pragma once

#include <cstdint>

namespace parasync {

class PushSeq {
 public:
  constexpr explicit PushSeq(uint64_t raw) : raw_(raw) {}
  constexpr PushSeq(uint32_t incarnation, uint32_t counter)
      : raw_((uint64_t{incarnation} << 32) | counter) {}

  constexpr uint64_t raw() const { return raw_; }
  // The sending process: a restarted worker starts a new incarnation (and counter).
  constexpr uint32_t incarnation() const { return static_cast<uint32_t>(raw_ >> 32); }
  // The push's number within its incarnation, from 1.
  constexpr uint32_t counter() const { return static_cast<uint32_t>(raw_ & 0xffffffffULL); }
  constexpr bool none() const { return raw_ == 0; }
  // True if this seq was made by the same process as `last` and no later than it.
  constexpr bool CoveredBy(PushSeq last) const {
    return !none() && incarnation() == last.incarnation() && counter() <= last.counter();
  }

 private:
  uint64_t raw_;
};

}  // namespace parasync
