// Every metric a parameter server exports, registered in one place. Names follow Prometheus
// conventions with the parasync_ps_ prefix and constant labels role="ps", shard="<i>".
// prometheus-cpp metrics are thread-safe; this struct is built once and then only read,
// except `loop`, which the request loop beats (lock-free).
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "common/curve.h"
#include "common/metrics.h"
#include "common/wire.h"
#include "ps/embedding_table.h"
#include "ps/shard.h"

namespace parasync {

struct PsMetrics {
  PsMetrics(int shard, int num_workers);

  std::shared_ptr<prometheus::Registry> registry;
  std::array<prometheus::Counter*, kNumMsgTypes> requests{};        // by type
  std::array<prometheus::Counter*, kNumMsgTypes> bytes_received{};  // by type
  std::array<prometheus::Counter*, kNumMsgTypes> bytes_sent{};      // by type
  std::array<prometheus::Counter*, kNumRejectReasons> rejected{};   // by reason
  prometheus::Histogram* apply_seconds = nullptr;
  prometheus::Gauge* version = nullptr;
  prometheus::Gauge* learning_rate = nullptr;
  prometheus::Counter* examples = nullptr;
  prometheus::Gauge* elements = nullptr;
  prometheus::Gauge* registered = nullptr;
  prometheus::Counter* dropped_stale = nullptr;
  std::vector<prometheus::Counter*> worker_gradients;  // by rank
  std::vector<prometheus::Counter*> worker_dropped;    // by rank
  std::vector<prometheus::Counter*> waited_for_seconds;  // by rank: barrier waits pinned on it
  // The straggler as a labelled series: parasync_ps_straggler{rank="r"} is 1 for the rank
  // the barriers waited for longest lately and 0 for every other (all 0: none). The old
  // parasync_ps_straggler_rank (the rank as its value, -1: none) is kept for this release
  // only, deprecated. Set both with SetStraggler.
  std::vector<prometheus::Gauge*> straggler;  // by rank
  prometheus::Gauge* straggler_rank = nullptr;
  void SetStraggler(int rank);
  prometheus::Gauge* parked_pulls = nullptr;
  prometheus::Gauge* oldest_parked_pull_seconds = nullptr;
  prometheus::Gauge* store_disk_bytes = nullptr;
  prometheus::Histogram* staleness = nullptr;          // versions between read and apply
  prometheus::Histogram* barrier_wait_seconds = nullptr;
  prometheus::Counter* blocked_pulls = nullptr;
  prometheus::Counter* resent_pulls_in_flight = nullptr;  // PullReplies::AnsweringAlready
  // Delta pulls (ps/delta_pulls.h): answered as a change to the reader's copy, the same
  // reply again (another reader at the same generation, or a resend), from zeros (no copy
  // of the reader's generation here); copies held and evicted.
  prometheus::Counter* delta_pulls_changed = nullptr;
  prometheus::Counter* delta_pulls_reused = nullptr;
  prometheus::Counter* delta_pulls_from_zeros = nullptr;
  prometheus::Counter* delta_copies_evicted = nullptr;
  prometheus::Gauge* delta_copies = nullptr;
  prometheus::Counter* workers_declared_dead = nullptr;
  prometheus::Gauge* live_workers = nullptr;
  prometheus::Histogram* checkpoint_seconds = nullptr;
  prometheus::Gauge* last_checkpoint_time = nullptr;  // unix seconds of the last snapshot
  prometheus::Counter* checkpoint_failures = nullptr;
  // 1 once a durable write failed with --durability every-update: the shard acknowledges
  // no more pushes until restarted.
  prometheus::Gauge* store_failed = nullptr;
  // Bytes of pull replies handed to ZeroMQ and not yet written out (or dropped), all peers.
  prometheus::Gauge* unread_reply_bytes = nullptr;
  // The stated memory bound for the present model (ps/memory_bound.h): fixed part,
  // and the part for each connected peer.
  prometheus::Gauge* memory_bound_bytes = nullptr;
  prometheus::Gauge* memory_bound_per_connection_bytes = nullptr;
  // CURVE connections the ZAP handler admitted, and every refused one by reason (indexed by
  // CurveRefusal: refused in the handshake, or by the ZAP handler).
  prometheus::Counter* auth_accepted = nullptr;
  std::array<prometheus::Counter*, kNumCurveRefusals> auth_refused{};

  // Embedding tables, one series each by label table="<name>", added at registration
  // (AddTables). Counters follow the tables' own counts (PublishTables).
  struct TableMetrics {
    prometheus::Counter* rows_pulled = nullptr;
    prometheus::Counter* rows_pushed = nullptr;
    prometheus::Counter* rows_created = nullptr;
    prometheus::Counter* rows_evicted = nullptr;
    prometheus::Gauge* rows_held = nullptr;
    prometheus::Gauge* bytes = nullptr;
    prometheus::Gauge* rows_cold = nullptr;
    prometheus::Counter* rows_promoted = nullptr;
    prometheus::Counter* cold_reads = nullptr;
    prometheus::Counter* cold_read_seconds = nullptr;
    prometheus::Counter* rows_refused = nullptr;
    prometheus::Counter* rows_expired = nullptr;
    EmbeddingTables::TableStats counted;  // what the counters were last advanced to
  };
  std::vector<TableMetrics> tables;  // by table index
  // Their families, registered with the rest (AddTables adds a series to each).
  struct TableFamilies {
    prometheus::Family<prometheus::Counter>* pulled = nullptr;
    prometheus::Family<prometheus::Counter>* pushed = nullptr;
    prometheus::Family<prometheus::Counter>* created = nullptr;
    prometheus::Family<prometheus::Counter>* evicted = nullptr;
    prometheus::Family<prometheus::Gauge>* held = nullptr;
    prometheus::Family<prometheus::Gauge>* bytes = nullptr;
    prometheus::Family<prometheus::Gauge>* cold = nullptr;
    prometheus::Family<prometheus::Counter>* promoted = nullptr;
    prometheus::Family<prometheus::Counter>* cold_reads = nullptr;
    prometheus::Family<prometheus::Counter>* cold_read_seconds = nullptr;
    prometheus::Family<prometheus::Counter>* refused = nullptr;
    prometheus::Family<prometheus::Counter>* expired = nullptr;
  } table_families;
  prometheus::Gauge* table_capacity_rows = nullptr;
  // Adds the series of `names` (once; later calls with the same tables do nothing).
  void AddTables(const std::vector<std::string>& names);
  // Sets the series of table t from its statistics (the counts only ever grow).
  void PublishTable(size_t t, const EmbeddingTables::TableStats& stats);
  // Every table of `t`: their series added the first time, each set from its statistics,
  // and the capacity (`max_table_rows` where the tables hold no bound of their own).
  void PublishTables(const EmbeddingTables& t, int64_t max_table_rows);

  // The request loop's heartbeat, served as /healthz and /readyz (common/metrics.h).
  LoopHeartbeat loop;
};

}  // namespace parasync
