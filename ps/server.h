// Server: the parameter server's request loop. Binds a ZeroMQ ROUTER, decodes each request,
// checks it, lets its mode's UpdateRule (ps/update_rule.h: async, sync, sync:delayed or
// ssp:K) take pushes into the Shard and decide when pulls are served, and replies — one reply
// per request, an error reply for anything refused (the server keeps serving).
//
// Pulls that must wait (a sync barrier, the ssp bound) are parked, not blocking the loop,
// and answered as soon as the step completes or the slow ranks catch up — or, after
// barrier_timeout, with an error naming the ranks they waited for. Between messages (and
// at least every 100 ms when idle) silent workers are declared dead, so no barrier waits on
// a dead process. With backup workers, each shard picks its own first R gradients.
//
// Single-threaded: Run() owns the socket, the Shard, the Coordinator and the UpdateRule, and
// sets its thread to flush denormals to zero (common/denormals.h); Stop() may be called from
// any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "common/status.h"
#include "common/transport.h"
#include "ps/checkpoint_store.h"
#include "ps/coordinator.h"
#include "ps/durability.h"
#include "ps/gather_board.h"
#include "ps/memory_bound.h"
#include "ps/parked_pulls.h"
#include "ps/peer_queues.h"
#include "ps/ps_metrics.h"
#include "ps/delta_pulls.h"
#include "ps/pull_replies.h"
#include "ps/push_ledger.h"
#include "ps/request_frames.h"
#include "ps/server_options.h"
#include "ps/shard.h"
#include "ps/straggler.h"
#include "ps/update_rule.h"

namespace parasync {

class Server : private RuleHost {
 public:
  // Binds the socket. Unavailable if the endpoint cannot be bound. `metrics` must outlive
  // the Server.
  static Result<std::unique_ptr<Server>> Create(zmq::context_t& context,
                                                const ServerOptions& options, PsMetrics* metrics);

  // Serves until Stop() is called, `should_stop()` returns true (checked at least every
  // 100 ms) or an accepted Shutdown request arrives. Returns ok on such a stop, an error only
  // if the socket broke.
  Status Run(const std::function<bool()>& should_stop);

  // One turn of Run()'s loop: takes what the socket has ready into the peers' queues
  // (waiting up to `timeout` for a message when none is queued), handles the next request
  // in fair order (ps/peer_queues.h) through the same decoding, checks and handling (replies
  // go out on the socket), then the periodic work (liveness, sync steps, parked pulls).
  // Returns false after an accepted Shutdown, an error only if the socket broke. Run() is a
  // loop of these; the fuzzer (tests/fuzz) calls it directly. Same thread rule as Run().
  Result<bool> ServeOnce(std::chrono::milliseconds timeout);

  // Asks Run() to return. Thread-safe.
  void Stop() { stop_.store(true); }

  // The TCP endpoint bound, with its port ("tcp://127.0.0.1:20123"; not --ipc's).
  const std::string& endpoint() const { return endpoint_; }
  // With options.curve_secret_key: the socket's handshake monitor (Socket::
  // TakeHandshakeMonitor), for a thread that counts refused peers; call before Run().
  std::unique_ptr<zmq::socket_t> TakeHandshakeMonitor() { return socket_->TakeHandshakeMonitor(); }
  // Random per server process; every reply carries it, so clients notice a restart.
  uint64_t incarnation() const { return incarnation_; }

  // Restores a snapshot from the store (before Run). Corruption if it does not fit.
  Status Restore(const ShardSnapshot& snap);
  // Writes a full snapshot now if the store is set, something is registered and the version
  // moved since the last one (`force`: even if not). Returns the store's error.
  Status SaveSnapshot(bool force = false);
  const Shard& shard() const { return shard_; }
  ShardStats Stats() const;

 private:
  using TimePoint = Coordinator::TimePoint;

  Server(std::unique_ptr<Socket> socket, const ServerOptions& options, PsMetrics* metrics);
  // Takes what the socket has ready into inbox_ (waiting up to `timeout` for the first):
  // one message of each peer with one ready, in ZeroMQ's fair-queue turn, until a peer comes
  // round again, nothing is ready, or kReadsPerTurn were taken. A message past its peer's
  // queue is refused (RefuseQueueFull); a resend of a queued request is dropped. An error only
  // if the socket broke.
  Status ReadReady(std::chrono::milliseconds timeout);
  // Answers a message its peer's queue had no room for: Unavailable, reason kQueueFull.
  void RefuseQueueFull(Inbound& in);
  // Handles one message; replies unless the request was parked. Returns false when it was
  // an accepted Shutdown.
  bool Handle(Inbound& in);
  // Answers a message whose header did not decode (counted as malformed).
  void ReplyMalformed(Inbound& in);
  // The checks every decoded request passes first (protocol version, rank); counts it and
  // notes the rank alive. An error (and `reason`) refuses the request.
  Status Admit(const Inbound& in, TimePoint now, RejectReason* reason);
  // Sends `reply` to a handled request (counting and logging a refusal), then serves the
  // parked pulls a push or a departure may have released.
  void SendReply(Inbound& in, Header& reply, RejectReason reason, TimePoint now);
  // One handler per message type. Each fills `reply` (status and `reason` on refusal).
  void HandleRegister(const Header& req, const std::vector<zmq::message_t>& in_frames,
                      TimePoint now, Header& reply, RejectReason* reason);
  // Returns true if the pull was answered or parked (no reply left to send).
  bool HandlePull(Inbound& in, TimePoint now, Header& reply, RejectReason* reason);
  void HandleLeave(const Header& req);
  // A collective's offer (ps/gather_board.h); its reply, or everyone's, goes out now or later.
  void HandleGather(Inbound& in, TimePoint now);
  void SendGatherReplies(std::vector<GatherBoard::Reply> replies);
  // Whether the collectives wait for `rank` (live, by the coordinator).
  bool GatherExpects(int rank) const;
  void HandleCheckpoint(const Header& req, Header& reply, RejectReason* reason);
  // Returns false (stop serving) for an accepted Shutdown.
  bool HandleShutdown(const Inbound& in, Header& reply, RejectReason* reason);
  // The first registration: the model is saved (with a store), gauges and the log say so.
  void SaveRegisteredModel(Header& reply, RejectReason* reason);
  void OnFirstRegistration(const Header& req, TimePoint now);
  // Fills `reply` for a push; may complete its rule's step.
  void HandlePush(const Header& req, std::vector<zmq::message_t>& frames, Header& reply,
                  RejectReason* reason);
  // Answers a push its rule did not take (`verdict`): dropped, or refused with *reason.
  // True for kTake.
  bool AnswerRefusedGradient(const Header& req, UpdateRule::Verdict verdict, Header& reply,
                             RejectReason* reason);
  // Counts a gradient taken (applied or accumulated) `t0` after it was admitted.
  void OnGradientTaken(const Header& req, int64_t staleness, TimePoint t0);
  // Reads the requested slices into a reply and sends it — or, when the peer or the server
  // has too many reply bytes unread, sends an error reply instead (kUnreadReplies).
  void SendPull(zmq::message_t& identity, const Header& req,
                const std::vector<std::vector<uint64_t>>& row_ids);
  // SendPull's step: sends the refusal and returns true when the peer (`peer`: its unread
  // bytes) or the server has too many reply bytes unread for this pull (PullReplies::Refusal).
  bool RefuseUnreadPull(zmq::message_t& identity, const Header& req,
                        const std::atomic<int64_t>& peer);
  // Returns memory freed since the last trim to the system, at most every 2 s.
  void MaybeTrimMemory(TimePoint now);
  // Logs the memory bound for the registered model (or, before one, for the largest
  // --max-model-bytes admits) and sets its gauges.
  void PublishMemoryBound();
  // A model is registered (or restored): the memory bound, tables', progress and size gauges.
  void PublishRegistered();
  // Sets the version and learning-rate gauges from the shard.
  void PublishProgress() override;
  // Answers the parked pulls that may now be served.
  void ServeParked(TimePoint now);
  // Fails the parked pulls that waited past the barrier timeout, naming what they waited for.
  void FailExpiredParked(TimePoint now);
  // Liveness and barrier timeouts; called every loop turn. `idle`: the socket had nothing
  // queued this turn, so every heartbeat that arrived has been read.
  void Tick(TimePoint now, bool idle);
  void Reject(RejectReason reason);
  // The barrier waited `seconds` for `rank` alone: counted, and logged when long.
  void RecordStragglerWait(int rank, double seconds, TimePoint now, const char* what) override;
  // Gauges that describe the present: parked pulls, the straggler, the store's size.
  void UpdateGauges(TimePoint now);
  bool ShouldLogRejection() const;

  std::unique_ptr<Socket> socket_;
  std::string endpoint_;  // endpoint()
  ServerOptions options_;
  PsMetrics* metrics_;
  Shard shard_;
  Coordinator coordinator_;
  // Answers a push as dropped (not applied) and counts it for its rank; `stale` also counts
  // it as a stale gradient (a duplicate for the step is not one).
  void DropGradient(const Header& req, Header& reply, bool stale);
  // Every-update durability: a durable write failed. Latches the failure (no push is
  // acknowledged from now on, the store_failed gauge reads 1), rolls the shard back to what
  // the store holds, so memory serves nothing that was not acknowledged, and answers the
  // parked pulls, which wait for a step that cannot come. `what` names the write.
  void OnStoreFailure(const Status& failure, const std::string& what) override;
  // A reply to `req`: its type, request id and rank, this server's version and incarnation.
  Header ReplyTo(const Header& req) const;
  // Sends `p` an error reply `status` (counted as `reason`).
  void FailParked(ParkedPull& p, const Status& status, RejectReason reason);

  ParkedPulls parked_;
  GatherBoard gathers_;
  // Requests read and not yet handled, by peer, and their fair order.
  PeerQueues inbox_;
  // Bytes of replies written out or dropped, and of requests received, since the last trim.
  PullReplies::ByteCounter released_since_trim_ = std::make_shared<std::atomic<int64_t>>(0);
  // Pull replies' frames and their unread bytes, by peer.
  PullReplies replies_;
  DeltaPulls deltas_;  // delta pulls' copies and replies
  TimePoint last_trim_{};
  GradientReader gradients_;  // a push's gradients as float32 arrays
  StragglerTracker straggler_;
  TimePoint gauges_updated_{};
  TimePoint store_size_updated_{};
  TimePoint last_idle_;  // the last turn that found the socket empty
  uint64_t incarnation_ = 0;
  int64_t pushes_handled_ = 0;
  // By rank: the last push seq applied (with every-update durability also durable: a
  // resend of a push whose write failed is refused again, never acknowledged as applied) and
  // where the worker is in its data with the updates applied here.
  PushLedger ledger_;
  // Snapshots, every-update writes, and the failure latch (with no store: nothing).
  Durability durability_;
  // The mode's update rule (ps/update_rule.h), acting on the shard, coordinator, ledger and
  // durability above.
  std::unique_ptr<UpdateRule> rule_;
  std::atomic<bool> stop_{false};
  int64_t requests_ = 0;
  int64_t rejected_ = 0;
  int64_t dropped_stale_ = 0;
  int64_t max_version_staleness_ = 0;
  int64_t max_clock_staleness_ = 0;
  int64_t blocked_pulls_ = 0;
};

}  // namespace parasync
