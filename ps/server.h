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
// Single-threaded: Run() owns the socket, the Shard and the Coordinator, and sets its thread to
// flush denormals to zero (common/denormals.h); Stop() may be
// called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <zmq.hpp>

#include "common/mode.h"
#include "common/status.h"
#include "common/transport.h"
#include "ps/checkpoint_store.h"
#include "ps/coordinator.h"
#include "ps/durability.h"
#include "ps/gather_board.h"
#include "ps/parked_pulls.h"
#include "ps/peer_queues.h"
#include "ps/ps_metrics.h"
#include "ps/push_ledger.h"
#include "ps/shard.h"
#include "ps/straggler.h"
#include "ps/update_rule.h"

namespace parasync {

struct ServerOptions {
  std::string endpoint;  // e.g. "tcp://127.0.0.1:5000"
  // Also listened on, e.g. "ipc:///tmp/parasync-ps0.sock" for the workers on this host
  // (empty: none).
  std::string local_endpoint;
  int shard_index = 0;
  int num_shards = 1;
  int num_workers = 1;
  TrainingMode mode;
  int replicas_to_aggregate = 0;  // sync: R; 0 = num_workers
  // CURVE: this server's secret key (Z85); empty: plain text. The context's ZAP handler
  // (common/curve.h) decides who is admitted.
  std::string curve_secret_key;
  std::chrono::milliseconds worker_timeout{10000};
  std::chrono::milliseconds barrier_timeout{300000};
  // Bound on one whole message (all its frames); see MemoryBound.
  int64_t max_message_bytes = int64_t{1} << 30;
  // Bound on the bytes of pull replies handed to ZeroMQ and not yet written out, all peers
  // together (0: 2 x (num_workers + 2) x the shard's values; never less than (num_workers
  // + 1) x the shard's values, a reply for every worker at once). A pull that would pass it, or
  // that comes from a peer with more than two copies of the shard's values unread, is
  // refused (Unavailable) instead of pinning another version of the model.
  int64_t max_unread_reply_bytes = 0;
  int64_t max_model_bytes = 0;  // bound on this shard's values + slots; 0: none
  // Embedding rows this shard holds at most, all tables together (0: no bound); creating
  // one more evicts the least recently touched (ps/embedding_table.h).
  int64_t max_table_rows = 0;
  // Memory for embedding rows (0: only max_table_rows bounds them); rows beyond it are
  // evicted as max_table_rows says.
  int64_t table_memory_bytes = 0;
  // Evicted rows are demoted to the store (a cold tier) rather than forgotten; needs `store`.
  bool table_demote = false;
  // Pushes an embedding id needs before it gets a row (<= 1: at its first).
  int table_admit_after = 0;
  // Embedding rows not updated for longer than this are deleted (0: never): in versions of
  // this shard, or in seconds with table_expire_in_seconds.
  int64_t table_expire_after = 0;
  bool table_expire_in_seconds = false;
  // Threads that check and apply a push of >= 1 MiB over several slices (the loop's own
  // thread included); 1: the loop alone.
  int apply_threads = 1;
  // Shutdown requests are accepted from loopback peers only, unless this is set. (Until the
  // transport authenticates peers, anyone who can reach the port could stop the server.)
  bool allow_remote_shutdown = false;

  // Persistence (all off without a store). The store is not owned and must outlive the server.
  CheckpointStore* store = nullptr;
  // Every applied update is written (WAL synced) before it is acknowledged. In sync mode
  // that is every applied step; gradients waiting for their step are not yet durable: a push
  // answered Ok there says its gradient joined the open step, and the pull of the next step
  // (answered only once the step is durable) is what acknowledges it.
  // When a durable write fails — a failed fsync (EIO) or a full disk (ENOSPC) alike — one
  // rule: no reply says Ok to what the server knows is lost. The push whose handling made
  // the failed write (async: its own update; sync: the step it completed) is answered
  // Unavailable naming the failure, and so is every push after it, a resend of the same seq
  // included (the seq was rolled back with the shard, so it is never "already applied");
  // parked and later pulls of a step past the durable one are refused the same way, pulls
  // of what is durable are still served. Gradients of that step answered Ok before the
  // failure are lost with it; their senders learn it from the next-step pull. Until a
  // restart (fix or free the disk first) the server acknowledges nothing new.
  bool every_update = false;
  // Periodic snapshots: when this much time or this many versions have passed since the
  // last one (0: that trigger is off). In sync mode a versions trigger fires at multiples
  // of it, so every shard snapshots the same step.
  std::chrono::milliseconds checkpoint_every{0};
  int64_t checkpoint_every_versions = 0;

  // Stragglers: a barrier wait pinned on one rank that is longer than this is logged
  // (rate-limited per rank); <= 0: never logged. Always counted in the metrics.
  double straggler_log_seconds = 1.0;

  // Bound on the payloads of collectives (ps/gather_board.h) the server holds at once.
  int64_t max_gather_bytes = int64_t{32} << 20;

  // Fault injection for tests: the reply to every Nth push is not sent after the push was
  // applied (what a connection cut between apply and acknowledgement looks like). 0: off.
  int64_t drop_push_reply_every = 0;
};

// Messages ZeroMQ may queue from one connection before it stops reading it (ZMQ_RCVHWM).
inline constexpr int kServerReceiveQueue = 1;
// Requests the server takes from one connection into its own queue (ps/peer_queues.h), to
// serve its peers fairly; one more is refused (Unavailable, reason queue_full) unless it is
// small enough for kServerPeerQueueBytes. A worker has a push and a pull in flight per shard
// at most (resends of a queued request are not queued again), and a Register after a
// restart: 3 leaves it never refused.
inline constexpr int kServerPeerQueue = 3;
// Past kServerPeerQueue, a connection's queue takes small requests while all it holds
// weighs at most this (PeerQueues::Weight): room for a client that pipelines small requests,
// as a small-op benchmark or a worker with many small tensors or embedding pulls may: 271
// one-slice pulls (965 bytes each there), 127 pushes of a 1 KiB slice. Never more than
// kServerPeerQueue messages of --max-message-bytes, so the memory bound is unchanged.
inline constexpr int64_t kServerPeerQueueBytes = int64_t{256} << 10;
// The place a peer keeps in the fair order while it is away between requests, in seconds of
// the loop's time (PeerQueues' credit).
inline constexpr std::chrono::milliseconds kServerPeerCredit{10};

// The memory a server can take, stated before anything is registered and again, with the
// model's figures, once it is: `fixed` bytes plus `per_connection` bytes for each connected
// peer. It holds whatever a peer sends or fails to read (ps/server.cc, MemoryBound).
struct MemoryBound {
  int64_t fixed = 0;
  int64_t per_connection = 0;
  // The terms, for the log and --help.
  int64_t base = 0;       // code, libraries, threads, metrics, RocksDB's caches
  int64_t model = 0;      // values, spare, slots, sync buffers, snapshot copies
  int64_t unread = 0;     // pull replies not yet written out
  int64_t tables = 0;     // embedding rows at --max-table-rows, and a snapshot's copy of them
  int64_t gather = 0;     // collectives' payloads held, and their replies not yet written out
  std::string Describe() const;
};
// For a shard holding `elements` floats with `slots` optimizer slots per element. Before
// registration, pass the elements --max-model-bytes admits.
// `row_bytes`: the bytes one embedding row takes here (EmbeddingTables::BytesPerRow of the
// widest table; 0 without tables).
MemoryBound ComputeMemoryBound(const ServerOptions& options, int64_t elements, int slots,
                               int64_t row_bytes = 0);
// The unread-reply cap in force (options.max_unread_reply_bytes, or its default).
int64_t UnreadReplyCap(const ServerOptions& options, int64_t elements);

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
  // Fills `reply` for a push; may complete a sync step.
  void HandlePush(const Header& req, std::vector<zmq::message_t>& frames, Header& reply,
                  RejectReason* reason);
  // HandlePush's steps. The fields of a push that make sense (ranges, frames, batch size,
  // data position).
  Status CheckPush(const Header& req, const std::vector<zmq::message_t>& in_frames,
                   RejectReason* reason) const;
  // Answers a push its rule did not take (`verdict`): dropped, or refused with *reason.
  // True for kTake.
  bool AnswerRefusedGradient(const Header& req, UpdateRule::Verdict verdict, Header& reply,
                             RejectReason* reason);
  // The push's gradients as float32 arrays, the slices' returned and its row ranges' in
  // *row_grads: its frames, or (16-bit dtypes) widened_, or copies in `realigned` for frames
  // that are not aligned. Precondition: CheckPush and ReadPushRowIds ok (frame sizes).
  std::vector<const float*> GradientsOf(const Header& req,
                                        const std::vector<zmq::message_t>& in_frames,
                                        std::vector<std::vector<float>>& realigned,
                                        std::vector<const float*>* row_grads);
  // A push's row ranges: their ids (ReadPushRowIds, before the push is admitted) and
  // gradients (GradientsOf, after).
  struct PushRows {
    std::vector<std::vector<uint64_t>> ids;
    std::vector<const float*> grads;
    RowsRequest request(const Header& req) const { return {req.rows, ids, grads}; }
  };
  // The ids of a push's row ranges, checked with their values frames' lengths
  // (Shard::ValidateRows); on failure sets *reason.
  Status ReadPushRowIds(const Header& req, const std::vector<zmq::message_t>& in_frames,
                        std::vector<std::vector<uint64_t>>* ids, RejectReason* reason) const;
  // Counts a gradient taken (applied or accumulated) `t0` after it was admitted.
  void OnGradientTaken(const Header& req, int64_t staleness, TimePoint t0);
  // Reads the requested slices into a reply and sends it — or, when the peer or the server
  // has too many reply bytes unread, sends an error reply instead (kUnreadReplies).
  void SendPull(zmq::message_t& identity, const Header& req,
                const std::vector<std::vector<uint64_t>>& row_ids);
  // Reply bytes handed to ZeroMQ and not yet written out (or dropped with their peer): each
  // reply frame holds its peer's counter and the total until ZeroMQ frees it, on its I/O
  // thread (the counters are shared, so they outlive the Server if need be).
  using ByteCounter = std::shared_ptr<std::atomic<int64_t>>;
  ByteCounter UnreadCounterOf(const zmq::message_t& identity);
  // SendPull's steps. Sends the refusal and returns true when the peer (`peer`: its unread
  // bytes) or the server has too many reply bytes unread for this pull.
  bool RefuseUnreadPull(zmq::message_t& identity, const Header& req,
                        const std::atomic<int64_t>& peer);
  // Publishes the embedding tables' figures (rows held, created, evicted, bytes).
  void PublishTableGauges();
  // The reply's frames, each holding its loan (or its encoded copy) and its bytes on the
  // unread counters until ZeroMQ frees it. Throws std::bad_alloc (every loan returned).
  std::vector<zmq::message_t> PullFrames(const Header& req, const ByteCounter& peer);
  // Appends one frame per row range of `req`: its rows (initial values for rows nobody
  // updated), in the reply's dtype, counted as unread like an encoded slice frame. Returns
  // the tables' cold tier's error.
  Status AppendRowFrames(const Header& req, const std::vector<std::vector<uint64_t>>& row_ids,
                         const ByteCounter& peer, std::vector<zmq::message_t>& frames);
  // The bytes a pull reply's rows take.
  int64_t RowReplyBytes(const Header& req) const;
  // Appends the frame of `loan`, which it takes over; on a throw, `taken` counts past it if
  // it was given back already.
  void AppendPullFrame(DType dtype, const Shard::Loan& loan, const ByteCounter& peer,
                       std::vector<zmq::message_t>& frames, size_t& taken);
  // Returns memory freed since the last trim to the system, at most every 2 s.
  void MaybeTrimMemory(TimePoint now);
  // Logs the memory bound for the registered model (or, before one, for the largest
  // --max-model-bytes admits) and sets its gauges.
  void PublishMemoryBound();
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
  ByteCounter unread_total_ = std::make_shared<std::atomic<int64_t>>(0);
  std::unordered_map<std::string, ByteCounter> unread_by_peer_;
  // Bytes of replies written out or dropped, and of requests received, since the last trim.
  ByteCounter released_since_trim_ = std::make_shared<std::atomic<int64_t>>(0);
  TimePoint last_trim_{};
  // A push in a 16-bit wire dtype, widened to float32 (at most the shard's elements; kept
  // between pushes so its pages are not faulted in again each time).
  std::vector<float> widened_;
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
