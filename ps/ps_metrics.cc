#include "ps/ps_metrics.h"

#include <string>

namespace parasync {

namespace {

// Registers families with the constant labels of this shard.
class MetricBuilder {
 public:
  MetricBuilder(prometheus::Registry& registry, prometheus::Labels labels)
      : registry_(registry), labels_(std::move(labels)) {}

  prometheus::Family<prometheus::Counter>& CounterFamily(const std::string& name,
                                                         const std::string& help) {
    return prometheus::BuildCounter().Name(name).Help(help).Labels(labels_).Register(registry_);
  }
  prometheus::Family<prometheus::Gauge>& GaugeFamily(const std::string& name,
                                                     const std::string& help) {
    return prometheus::BuildGauge().Name(name).Help(help).Labels(labels_).Register(registry_);
  }
  prometheus::Counter* Counter(const std::string& name, const std::string& help) {
    return &CounterFamily(name, help).Add({});
  }
  prometheus::Gauge* Gauge(const std::string& name, const std::string& help) {
    return &GaugeFamily(name, help).Add({});
  }
  prometheus::Histogram* Histogram(const std::string& name, const std::string& help,
                                   const prometheus::Histogram::BucketBoundaries& buckets) {
    return &prometheus::BuildHistogram()
                .Name(name)
                .Help(help)
                .Labels(labels_)
                .Register(registry_)
                .Add({}, buckets);
  }

 private:
  prometheus::Registry& registry_;
  prometheus::Labels labels_;
};

// The families are registered in this order (the exposition lists each type's families in
// the order they were registered).

void AddRequestMetrics(PsMetrics& m, MetricBuilder& b) {
  auto& req = b.CounterFamily("parasync_ps_requests_total", "Requests received, by message type");
  auto& bytes = b.CounterFamily("parasync_ps_bytes_total",
                                "Tensor payload bytes by message type and direction");
  for (int t = 0; t < kNumMsgTypes; ++t) {
    const std::string type(MsgTypeName(static_cast<MsgType>(t)));
    m.requests[static_cast<size_t>(t)] = &req.Add({{"type", type}});
    m.bytes_received[static_cast<size_t>(t)] = &bytes.Add({{"type", type}, {"direction", "in"}});
    m.bytes_sent[static_cast<size_t>(t)] = &bytes.Add({{"type", type}, {"direction", "out"}});
  }
  auto& rej = b.CounterFamily("parasync_ps_rejected_total",
                              "Requests refused with an error reply, by reason; nothing was changed");
  for (int r = 1; r < kNumRejectReasons; ++r) {
    m.rejected[static_cast<size_t>(r)] =
        &rej.Add({{"reason", std::string(RejectReasonName(static_cast<RejectReason>(r)))}});
  }
}

void AddAuthMetrics(PsMetrics& m, MetricBuilder& b) {
  m.auth_accepted = b.Counter("parasync_ps_auth_accepted_total",
                              "Connections admitted by the CURVE allow-list (ZAP)");
  auto& refused = b.CounterFamily(
      "parasync_ps_auth_refused_total",
      "CURVE connections refused at the ZeroMQ handshake, by reason: "
      "plain_text_client (no CURVE), bad_key_or_secret (a key pair that "
      "does not match, or another server key), not_allowed (a key not on "
      "--curve-allow), other");
  for (int r = 0; r < kNumCurveRefusals; ++r) {
    m.auth_refused[static_cast<size_t>(r)] =
        &refused.Add({{"reason", CurveRefusalName(static_cast<CurveRefusal>(r))}});
  }
}

void AddProgressMetrics(PsMetrics& m, MetricBuilder& b) {
  m.apply_seconds = b.Histogram("parasync_ps_apply_seconds", "Time to validate and apply one push",
                                prometheus::Histogram::BucketBoundaries{
                                    1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1});
  m.version = b.Gauge("parasync_ps_version",
                      "Versions applied on this shard: pushes (async, ssp) or steps (sync)");
  m.learning_rate = b.Gauge("parasync_ps_learning_rate",
                            "Learning rate of the next update: the registered one times its "
                            "schedule (before any staleness scaling); 0 before Register");
  m.examples = b.Counter("parasync_ps_examples_total",
                         "Training examples behind the gradients applied on this shard");
  m.elements = b.Gauge("parasync_ps_elements", "Parameter elements held by this shard");
}

void AddWorkerMetrics(PsMetrics& m, MetricBuilder& b, int num_workers) {
  auto& gradients = b.CounterFamily("parasync_ps_worker_gradients_total",
                                    "Gradients applied or aggregated, by worker rank");
  auto& dropped = b.CounterFamily("parasync_ps_dropped_stale_gradients_by_rank_total",
                                  "Gradients dropped as stale (sync: an old step), by rank");
  auto& waited = b.CounterFamily("parasync_ps_barrier_waited_for_seconds_total",
                                 "Seconds barriers waited for this rank alone: sync, a step "
                                 "whose last gradient it was, from the one before; ssp, a "
                                 "parked pull it was the slowest blocker of");
  for (int r = 0; r < num_workers; ++r) {
    m.worker_gradients.push_back(&gradients.Add({{"rank", std::to_string(r)}}));
    m.worker_dropped.push_back(&dropped.Add({{"rank", std::to_string(r)}}));
    m.waited_for_seconds.push_back(&waited.Add({{"rank", std::to_string(r)}}));
  }
  auto& straggler = b.GaugeFamily("parasync_ps_straggler",
                                  "1 for the rank the barriers waited for longest lately "
                                  "(decayed sum, half-life 60 s), 0 for the others; all 0: none");
  for (int r = 0; r < num_workers; ++r) {
    m.straggler.push_back(&straggler.Add({{"rank", std::to_string(r)}}));
  }
  m.straggler_rank = b.Gauge("parasync_ps_straggler_rank",
                             "Deprecated, removed after 0.1: use parasync_ps_straggler{rank}. "
                             "The straggler's rank as the value; -1: none");
  m.SetStraggler(-1);
}

void AddWaitMetrics(PsMetrics& m, MetricBuilder& b) {
  m.parked_pulls =
      b.Gauge("parasync_ps_parked_pulls", "Pulls waiting now for a sync step or the ssp bound");
  m.oldest_parked_pull_seconds = b.Gauge("parasync_ps_oldest_parked_pull_seconds",
                                         "How long the oldest waiting pull has waited; 0: none");
  m.store_disk_bytes = b.Gauge("parasync_ps_store_disk_bytes",
                               "Bytes on disk of the RocksDB checkpoint store (0: no --data-dir)");
  m.dropped_stale = b.Counter("parasync_ps_dropped_stale_gradients_total",
                              "Gradients dropped as stale (sync: computed for an older step)");
  m.staleness = b.Histogram("parasync_ps_staleness",
                            "Versions applied between a gradient's read and its apply",
                            prometheus::Histogram::BucketBoundaries{0, 1, 2, 4, 8, 16, 32, 64});
  m.barrier_wait_seconds = b.Histogram(
      "parasync_ps_barrier_wait_seconds",
      "How long parked pulls waited (sync barrier or ssp bound)",
      prometheus::Histogram::BucketBoundaries{1e-4, 1e-3, 1e-2, 0.1, 0.3, 1, 3, 10, 30, 100});
  m.resent_pulls_in_flight = b.Counter(
      "parasync_ps_resent_pulls_in_flight_total",
      "Resent pulls not served again: the reply to the first was still being written out "
      "(a link slower than the client's resend timer)");
  m.delta_pulls_changed = b.Counter(
      "parasync_ps_delta_pulls_total",
      "delta pulls answered with the change from a copy the reader holds (encoded anew)");
  m.delta_pulls_reused = b.Counter(
      "parasync_ps_delta_pulls_reused_total",
      "delta pulls answered with a reply already encoded for the same copy and version "
      "(another worker of the sync step, or a resend)");
  m.delta_pulls_from_zeros = b.Counter(
      "parasync_ps_delta_pulls_from_zeros_total",
      "delta pulls answered from zeros: this server held no copy of the reader's "
      "generation (a first pull, a restart, an evicted copy)");
  m.delta_copies_evicted = b.Counter(
      "parasync_ps_delta_copies_evicted_total",
      "Readers' parameter copies dropped for a newer one (--max-delta-copies)");
  m.delta_copies = b.Gauge("parasync_ps_delta_copies",
                           "Readers' parameter copies held for delta pulls");
  m.blocked_pulls = b.Counter("parasync_ps_blocked_pulls_total",
                              "Pulls that had to wait for a sync step or the ssp bound");
  m.workers_declared_dead = b.Counter("parasync_ps_workers_declared_dead_total",
                                      "Workers declared dead after --worker-timeout of silence");
  m.live_workers =
      b.Gauge("parasync_ps_live_workers", "Workers currently in the barrier / staleness set");
}

void AddStoreMetrics(PsMetrics& m, MetricBuilder& b) {
  m.checkpoint_seconds = b.Histogram(
      "parasync_ps_checkpoint_seconds", "Time to write a snapshot or a durable update to RocksDB",
      prometheus::Histogram::BucketBoundaries{1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1, 3, 10});
  m.last_checkpoint_time = b.Gauge("parasync_ps_last_checkpoint_timestamp_seconds",
                                   "Unix time of the last successful snapshot (0: none yet)");
  m.checkpoint_failures = b.Counter("parasync_ps_checkpoint_failures_total",
                                    "Snapshots or durable updates that could not be written");
  m.store_failed = b.Gauge("parasync_ps_store_failed",
                           "1 once a durable write failed (--durability every-update): pushes "
                           "are refused until the server is restarted");
}

void AddMemoryMetrics(PsMetrics& m, MetricBuilder& b) {
  m.unread_reply_bytes = b.Gauge("parasync_ps_unread_reply_bytes",
                                 "Bytes of pull replies queued for peers and not yet written "
                                 "out (bounded by --max-unread-reply-bytes)");
  m.memory_bound_bytes = b.Gauge("parasync_ps_memory_bound_bytes",
                                 "The memory bound this server states for its present model "
                                 "and limits, without the part per connected peer");
  m.memory_bound_per_connection_bytes =
      b.Gauge("parasync_ps_memory_bound_per_connection_bytes",
              "The part of the memory bound each connected peer adds");
  m.registered = b.Gauge("parasync_ps_registered", "1 once a model is registered");
}

void AddTableMetrics(PsMetrics& m, MetricBuilder& b) {
  auto& f = m.table_families;
  f.pulled = &b.CounterFamily("parasync_ps_table_rows_pulled_total",
                              "Embedding rows read by pulls, by table");
  f.pushed = &b.CounterFamily("parasync_ps_table_rows_pushed_total",
                              "Embedding gradient rows taken from pushes, by table");
  f.created = &b.CounterFamily("parasync_ps_table_rows_created_total",
                               "Embedding rows created on first update (again after an "
                               "eviction), by table");
  f.evicted = &b.CounterFamily("parasync_ps_table_rows_evicted_total",
                               "Embedding rows evicted from memory (least recently touched) to "
                               "stay within --max-table-rows and --table-memory: demoted to the "
                               "store, or forgotten (--table-evict), by table");
  f.held = &b.GaugeFamily("parasync_ps_table_rows", "Embedding rows held in memory now, by table");
  f.cold = &b.GaugeFamily("parasync_ps_table_cold_rows",
                          "Embedding rows only in the store now (demoted, --table-evict "
                          "demote), by table");
  f.promoted = &b.CounterFamily("parasync_ps_table_rows_promoted_total",
                                "Demoted embedding rows brought back into memory by a push, by "
                                "table");
  f.cold_reads = &b.CounterFamily("parasync_ps_table_cold_reads_total",
                                  "Embedding rows read from the store (pulls of demoted rows, "
                                  "and every push of a row not in memory), by table");
  f.cold_read_seconds = &b.CounterFamily("parasync_ps_table_cold_read_seconds_total",
                                         "Seconds those reads took, by table (divided by the "
                                         "reads: the mean cold-read latency)");
  f.refused = &b.CounterFamily("parasync_ps_table_rows_refused_total",
                               "Gradient rows dropped because their id has not been pushed "
                               "--table-admit-after times yet, by table");
  f.expired = &b.CounterFamily("parasync_ps_table_rows_expired_total",
                               "Embedding rows deleted because nothing updated them for "
                               "--table-expire-after, in memory or in the store, by table");
  f.bytes = &b.GaugeFamily("parasync_ps_table_bytes",
                           "Memory the embedding rows held take (values, slots, bookkeeping), "
                           "by table");
  m.table_capacity_rows = b.Gauge("parasync_ps_table_capacity_rows",
                                  "Embedding rows this shard holds at most, all tables "
                                  "together in memory (--max-table-rows, or what --table-memory "
                                  "allows; 0: no bound)");
}

}  // namespace

void PsMetrics::AddTables(const std::vector<std::string>& names) {
  if (!tables.empty() || table_families.pulled == nullptr) return;
  for (const std::string& name : names) {
    const prometheus::Labels l{{"table", name}};
    const TableFamilies& f = table_families;
    TableMetrics m;
    m.rows_pulled = &f.pulled->Add(l);
    m.rows_pushed = &f.pushed->Add(l);
    m.rows_created = &f.created->Add(l);
    m.rows_evicted = &f.evicted->Add(l);
    m.rows_held = &f.held->Add(l);
    m.bytes = &f.bytes->Add(l);
    m.rows_cold = &f.cold->Add(l);
    m.rows_promoted = &f.promoted->Add(l);
    m.cold_reads = &f.cold_reads->Add(l);
    m.cold_read_seconds = &f.cold_read_seconds->Add(l);
    m.rows_refused = &f.refused->Add(l);
    m.rows_expired = &f.expired->Add(l);
    tables.push_back(m);
  }
}

namespace {
// Advances `c` by what `now` adds to `before` (a restore starts the tables' counts again from
// 0: then nothing is added until they pass the old count).
template <typename T>
void Advance(prometheus::Counter* c, T now, T& before) {
  if (now > before) c->Increment(static_cast<double>(now - before));
  before = now;
}
}  // namespace

void PsMetrics::PublishTable(size_t t, const EmbeddingTables::TableStats& st) {
  if (t >= tables.size()) return;
  TableMetrics& m = tables[t];
  Advance(m.rows_created, st.rows_created, m.counted.rows_created);
  Advance(m.rows_evicted, st.rows_evicted, m.counted.rows_evicted);
  Advance(m.rows_promoted, st.rows_promoted, m.counted.rows_promoted);
  Advance(m.cold_reads, st.cold_reads, m.counted.cold_reads);
  Advance(m.cold_read_seconds, st.cold_read_seconds, m.counted.cold_read_seconds);
  Advance(m.rows_refused, st.rows_refused, m.counted.rows_refused);
  Advance(m.rows_expired, st.rows_expired, m.counted.rows_expired);
  m.rows_held->Set(static_cast<double>(st.rows_held));
  m.bytes->Set(static_cast<double>(st.bytes));
  m.rows_cold->Set(static_cast<double>(st.rows_cold));
}

void PsMetrics::PublishTables(const EmbeddingTables& t, int64_t max_table_rows) {
  if (tables.empty() && t.num_tables() > 0) {
    std::vector<std::string> names;
    for (int i = 0; i < t.num_tables(); ++i) names.push_back(t.table(static_cast<uint32_t>(i)).name);
    AddTables(names);
  }
  for (int i = 0; i < t.num_tables(); ++i) {
    PublishTable(static_cast<size_t>(i), t.stats(static_cast<uint32_t>(i)));
  }
  table_capacity_rows->Set(static_cast<double>(
      t.num_tables() == 0 || t.capacity() >= EmbeddingTables::kMaxRowsHeld ? max_table_rows
                                                                          : t.capacity()));
}

PsMetrics::PsMetrics(int shard, int num_workers)
    : registry(std::make_shared<prometheus::Registry>()) {
  MetricBuilder b(*registry, {{"role", "ps"}, {"shard", std::to_string(shard)}});
  AddRequestMetrics(*this, b);
  AddAuthMetrics(*this, b);
  AddProgressMetrics(*this, b);
  AddWorkerMetrics(*this, b, num_workers);
  AddWaitMetrics(*this, b);
  AddStoreMetrics(*this, b);
  AddMemoryMetrics(*this, b);
  AddTableMetrics(*this, b);
}

void PsMetrics::SetStraggler(int rank) {
  for (size_t r = 0; r < straggler.size(); ++r) {
    straggler[r]->Set(static_cast<int>(r) == rank ? 1 : 0);
  }
  straggler_rank->Set(rank);
}

}  // namespace parasync
