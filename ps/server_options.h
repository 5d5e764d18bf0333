// ServerOptions: what a parameter server is told at start (ps/main.cc fills it from the
// flags), and the per-connection limits it works under. Plain values.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "common/mode.h"
#include "ps/checkpoint_store.h"

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
  // Readers' copies of the shard's values kept for delta pulls (ps/delta_pulls.h; each
  // the shard's values in float32 and about a quarter of that for its cached reply); 0: the
  // workers + 2. A new copy past it evicts the least recently used.
  int64_t max_delta_copies = 0;
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

}  // namespace parasync
