// DeltaPulls: a server-side optimizer's parameters pulled in int8 or top-k, as changes to a
// copy the reader holds (docs/compression.md, "Parameters as changes: delta pulls").
//
// Parameters cannot be quantized to int8 on their own (a weight's low bits would be lost
// every pull), but the change from what a reader already holds can: the server keeps the
// reader's copy, sends (parameters - copy) in the format asked for (the reader's push format:
// int8, or top-k), and both sides add what was sent to their copy (common/float_codec.h:
// EncodeDeltaRange, AddRange), so the copies stay equal bit for bit and what was not sent
// stays in the difference for the next pull — error feedback on the pull side. In int8 a
// reader's copy then stays within about 1/127 of one pull's change of the parameters
// (bfloat16 pulls are off by 2^-9 of the parameter itself), at a quarter of float32's bytes.
//
// Copies are kept by generation, not by reader: a pull names the generation it holds, and
// readers at the same generation share one copy and one reply. In a sync step every worker
// holds the same generation and pulls the same version, so the change is encoded once
// (the reply is cached, keyed by the generation it starts from, its format and the shard's
// version) and each worker gets the same bytes; a resent pull gets the same reply again. A
// pull naming a generation this server does not hold (its first, a restarted server, an
// evicted copy) is answered as a change from zeros, always in int8 (top-k of the parameters
// themselves would send a few of them): about 7 bits, refined by the next pulls. At most
// `capacity` copies are kept (ServerOptions::max_delta_copies: by default the workers + 2);
// a new one evicts the least recently used. Memory: capacity x the shard's values x (4 +
// about 1) bytes (the copy and its cached reply).
//
// Only pulls of every slice of the shard whole, without embedding rows, and only where the
// servers apply the optimizer (a worker-side aggregate is already pulled as quantized, with
// the shard's residual). Not durable: a restarted server starts with none. Called on the
// server loop's thread only.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "common/status.h"
#include "common/wire.h"
#include "ps/ps_metrics.h"
#include "ps/reject_reason.h"
#include "ps/shard.h"

namespace parasync {

class DeltaPulls {
 public:
  // `shard` and `metrics` must outlive it.
  DeltaPulls(Shard* shard, PsMetrics* metrics) : shard_(shard), metrics_(metrics) {}
  // Where this process's generations start (the server's random incarnation: another
  // process's never match, so a restarted server answers its first pulls from zeros).
  void set_first_generation(uint64_t g) { next_generation_ = g | 1; }

  // Whether a pull with delta_pull may be answered so: int8 or top-k, every slice of the shard whole
  // and in order, no rows, a server-side optimizer. InvalidArgument (or FailedPrecondition for
  // the optimizer) and *reason otherwise. Precondition: the shard is registered.
  Status Check(const Header& req, RejectReason* reason) const;

  // The reply to a checked delta pull: the change's bytes (each slice's WireBytes in its
  // format, in order), the generation it applies to (0: zeros) and the one the reader holds
  // after it. `values`: the shard's current values, slice by slice (loans).
  struct Change {
    const std::vector<uint8_t>* bytes = nullptr;  // valid until the next call
    WireFormat format = DType::kInt8;  // the request's; int8 from zeros
    uint64_t base = 0;
    uint64_t generation = 0;
  };
  Change Answer(const Header& req, const std::vector<const float*>& values);

  // Forgets every copy (the shard's values were replaced: a restore or a rollback).
  void Forget();

  // At least 2: the copy pulled from and the new one.
  void set_capacity(size_t copies) { capacity_ = copies < 2 ? 2 : copies; }
  size_t copies() const { return copies_.size(); }

 private:
  struct Copy {
    uint64_t generation = 0;
    std::vector<float> values;  // the shard's elements, its slices in order
    uint64_t used = 0;          // tick of its last use
  };
  // The reply last encoded from one generation (0: zeros) in one format.
  struct Cached {
    uint64_t from = 0;
    WireFormat format = DType::kInt8;
    int64_t version = -1;  // the shard's, when it was encoded
    uint64_t to = 0;
    std::vector<uint8_t> bytes;
  };
  Copy* Find(uint64_t generation);
  Cached* CachedFrom(uint64_t from, WireFormat format);
  // A slot for a new copy: a fresh one, or the least recently used (and its cache) evicted,
  // never `keep`.
  Copy& NewCopy(const Copy* keep);
  size_t ReplyBytes(WireFormat format) const;

  Shard* shard_;
  PsMetrics* metrics_;
  uint64_t next_generation_ = 1;
  uint64_t tick_ = 0;
  size_t capacity_ = 4;
  std::vector<Copy> copies_;
  std::vector<Cached> cached_;
};

}  // namespace parasync
