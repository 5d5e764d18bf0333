// PullReplies: a pull reply's frames and the bytes they keep alive. A float32 frame lends
// the slice's values zero-copy (ps/lendable_floats.h: an update meanwhile goes to another
// buffer), a 16-bit one or a rows frame holds an encoded copy; each counts its bytes on its
// peer's counter and the server's total until ZeroMQ frees it. Those counters bound what a
// peer that does not read can pin (Refusal, against ps/memory_bound.h's caps).
//
// Called on the server loop's thread; ZeroMQ's I/O thread frees frames, so the counters are
// atomic and shared (they outlive this object if a frame does).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <zmq.hpp>

#include "common/status.h"
#include "common/wire.h"
#include "ps/delta_pulls.h"
#include "ps/ps_metrics.h"
#include "ps/server_options.h"
#include "ps/shard.h"

namespace parasync {

class PullReplies {
 public:
  using ByteCounter = std::shared_ptr<std::atomic<int64_t>>;

  // `options`, `shard` and `metrics` must outlive it. `released` counts the bytes of every
  // frame freed (the server's trim counter).
  PullReplies(const ServerOptions* options, Shard* shard, PsMetrics* metrics,
              ByteCounter released)
      : options_(options), shard_(shard), metrics_(metrics), released_(std::move(released)) {}

  // The counter of the reply bytes `identity` has not read yet (created at its first pull).
  ByteCounter PeerCounter(const zmq::message_t& identity);
  // Why a reply to `req` may not be sent now — the peer (`peer`: its unread bytes) or the
  // server has too many reply bytes unread — or nullopt when it may.
  std::optional<std::string> Refusal(const Header& req, const std::atomic<int64_t>& peer) const;
  // The frames of the reply to a validated pull `req` with the ids of its row ranges,
  // counted on `peer`: one per slice range, then one per row range (initial values for rows
  // nobody updated). Returns the tables' cold tier's error (no frame kept). Throws
  // std::bad_alloc (every loan returned).
  Result<std::vector<zmq::message_t>> Frames(const Header& req,
                                             const std::vector<std::vector<uint64_t>>& row_ids,
                                             const ByteCounter& peer);
  // The frames of the reply to a checked delta pull (DeltaPulls::Check), counted on `peer`:
  // one per slice, the change `deltas` answers; sets reply->delta_base and
  // delta_generation. Throws std::bad_alloc (every loan returned).
  std::vector<zmq::message_t> DeltaFrames(const Header& req, const ByteCounter& peer,
                                          DeltaPulls& deltas, Header* reply);
  // The bytes a pull reply's rows take.
  int64_t RowReplyBytes(const Header& req) const;

  // Reply bytes handed to ZeroMQ and not yet written out, all peers together.
  int64_t unread() const { return total_->load(std::memory_order_relaxed); }
  // Forgets the peers whose replies are all gone (no frame holds their counter).
  void ForgetIdlePeers();

  // Whether `req` is a resend of the pull `identity` was last answered, with that reply not
  // all written out yet: the reply on its way answers it (a connection keeps its order), so
  // it is not served again. (On a slow link a reply can take longer than the client's resend
  // timer; serving every resend would send each reply twice or more and fill the unread
  // bound until pulls are refused.)
  bool AnsweringAlready(const zmq::message_t& identity, const Header& req) const;
  // Records that `identity` was answered the pull `request_id` (SendPull).
  void Answered(const zmq::message_t& identity, uint64_t request_id);

 private:
  std::vector<zmq::message_t> SliceFrames(const Header& req, const ByteCounter& peer);
  // Appends the frame of `loan`, which it takes over; on a throw, `taken` counts past it if
  // it was given back already.
  // `offset`: where the loan's first element sits in its variable (int8's chunks).
  void AppendSliceFrame(WireFormat dtype, int64_t offset, const Shard::Loan& loan,
                        const ByteCounter& peer, std::vector<zmq::message_t>& frames,
                        size_t& taken);
  Status AppendRowFrames(const Header& req, const std::vector<std::vector<uint64_t>>& row_ids,
                         const ByteCounter& peer, std::vector<zmq::message_t>& frames);

  const ServerOptions* options_;
  Shard* shard_;
  PsMetrics* metrics_;
  ByteCounter released_;
  ByteCounter total_ = std::make_shared<std::atomic<int64_t>>(0);
  std::unordered_map<std::string, ByteCounter> by_peer_;
  std::unordered_map<std::string, uint64_t> last_answered_;  // by peer, as by_peer_
};

}  // namespace parasync
