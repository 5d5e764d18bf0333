#include "ps/ps_metrics.h"

#include <string>

namespace parasync {

PsMetrics::PsMetrics(int shard, int num_workers)
    : registry(std::make_shared<prometheus::Registry>()) {
  const prometheus::Labels labels{{"role", "ps"}, {"shard", std::to_string(shard)}};
  auto& req = prometheus::BuildCounter()
                  .Name("parasync_ps_requests_total")
                  .Help("Requests received, by message type")
                  .Labels(labels)
                  .Register(*registry);
  auto& bytes = prometheus::BuildCounter()
                    .Name("parasync_ps_bytes_total")
                    .Help("Tensor payload bytes by message type and direction")
                    .Labels(labels)
                    .Register(*registry);
  for (int t = 0; t < kNumMsgTypes; ++t) {
    const std::string type(MsgTypeName(static_cast<MsgType>(t)));
    requests[static_cast<size_t>(t)] = &req.Add({{"type", type}});
    bytes_received[static_cast<size_t>(t)] = &bytes.Add({{"type", type}, {"direction", "in"}});
    bytes_sent[static_cast<size_t>(t)] = &bytes.Add({{"type", type}, {"direction", "out"}});
  }
  auto& rej = prometheus::BuildCounter()
                  .Name("parasync_ps_rejected_total")
                  .Help("Requests refused with an error reply, by reason; nothing was changed")
                  .Labels(labels)
                  .Register(*registry);
  for (int r = 1; r < kNumRejectReasons; ++r) {
    rejected[static_cast<size_t>(r)] =
        &rej.Add({{"reason", std::string(RejectReasonName(static_cast<RejectReason>(r)))}});
  }
  auth_accepted = &prometheus::BuildCounter()
                       .Name("parasync_ps_auth_accepted_total")
                       .Help("Connections admitted by the CURVE allow-list (ZAP)")
                       .Labels(labels)
                       .Register(*registry)
                       .Add({});
  auto& refused = prometheus::BuildCounter()
                      .Name("parasync_ps_auth_refused_total")
                      .Help("CURVE connections refused at the ZeroMQ handshake, by reason: "
                            "plain_text_client (no CURVE), bad_key_or_secret (a key pair that "
                            "does not match, or another server key), not_allowed (a key not on "
                            "--curve-allow), other")
                      .Labels(labels)
                      .Register(*registry);
  for (int r = 0; r < kNumCurveRefusals; ++r) {
    auth_refused[static_cast<size_t>(r)] =
        &refused.Add({{"reason", CurveRefusalName(static_cast<CurveRefusal>(r))}});
  }
  apply_seconds = &prometheus::BuildHistogram()
                       .Name("parasync_ps_apply_seconds")
                       .Help("Time to validate and apply one push")
                       .Labels(labels)
                       .Register(*registry)
                       .Add({}, prometheus::Histogram::BucketBoundaries{
                                    1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1});
  version = &prometheus::BuildGauge()
                 .Name("parasync_ps_version")
                 .Help("Versions applied on this shard: pushes (async, ssp) or steps (sync)")
                 .Labels(labels)
                 .Register(*registry)
                 .Add({});
  learning_rate = &prometheus::BuildGauge()
                       .Name("parasync_ps_learning_rate")
                       .Help("Learning rate of the next update: the registered one times its "
                             "schedule (before any staleness scaling); 0 before Register")
                       .Labels(labels)
                       .Register(*registry)
                       .Add({});
  examples = &prometheus::BuildCounter()
                  .Name("parasync_ps_examples_total")
                  .Help("Training examples behind the gradients applied on this shard")
                  .Labels(labels)
                  .Register(*registry)
                  .Add({});
  elements = &prometheus::BuildGauge()
                  .Name("parasync_ps_elements")
                  .Help("Parameter elements held by this shard")
                  .Labels(labels)
                  .Register(*registry)
                  .Add({});
  auto& per_worker_gradients = prometheus::BuildCounter()
                                   .Name("parasync_ps_worker_gradients_total")
                                   .Help("Gradients applied or aggregated, by worker rank")
                                   .Labels(labels)
                                   .Register(*registry);
  auto& per_worker_dropped = prometheus::BuildCounter()
                                 .Name("parasync_ps_dropped_stale_gradients_by_rank_total")
                                 .Help("Gradients dropped as stale (sync: an old step), by rank")
                                 .Labels(labels)
                                 .Register(*registry);
  auto& per_worker_waited = prometheus::BuildCounter()
                                .Name("parasync_ps_barrier_waited_for_seconds_total")
                                .Help("Seconds barriers waited for this rank alone: sync, a step "
                                      "whose last gradient it was, from the one before; ssp, a "
                                      "parked pull it was the slowest blocker of")
                                .Labels(labels)
                                .Register(*registry);
  for (int r = 0; r < num_workers; ++r) {
    worker_gradients.push_back(&per_worker_gradients.Add({{"rank", std::to_string(r)}}));
    worker_dropped.push_back(&per_worker_dropped.Add({{"rank", std::to_string(r)}}));
    waited_for_seconds.push_back(&per_worker_waited.Add({{"rank", std::to_string(r)}}));
  }
  auto& straggler_family = prometheus::BuildGauge()
                               .Name("parasync_ps_straggler")
                               .Help("1 for the rank the barriers waited for longest lately "
                                     "(decayed sum, half-life 60 s), 0 for the others; all 0: none")
                               .Labels(labels)
                               .Register(*registry);
  for (int r = 0; r < num_workers; ++r) {
    straggler.push_back(&straggler_family.Add({{"rank", std::to_string(r)}}));
  }
  straggler_rank = &prometheus::BuildGauge()
                        .Name("parasync_ps_straggler_rank")
                        .Help("Deprecated, removed after 0.1: use parasync_ps_straggler{rank}. "
                              "The straggler's rank as the value; -1: none")
                        .Labels(labels)
                        .Register(*registry)
                        .Add({});
  SetStraggler(-1);
  parked_pulls = &prometheus::BuildGauge()
                      .Name("parasync_ps_parked_pulls")
                      .Help("Pulls waiting now for a sync step or the ssp bound")
                      .Labels(labels)
                      .Register(*registry)
                      .Add({});
  oldest_parked_pull_seconds = &prometheus::BuildGauge()
                                    .Name("parasync_ps_oldest_parked_pull_seconds")
                                    .Help("How long the oldest waiting pull has waited; 0: none")
                                    .Labels(labels)
                                    .Register(*registry)
                                    .Add({});
  store_disk_bytes = &prometheus::BuildGauge()
                          .Name("parasync_ps_store_disk_bytes")
                          .Help("Bytes on disk of the RocksDB checkpoint store (0: no --data-dir)")
                          .Labels(labels)
                          .Register(*registry)
                          .Add({});
  dropped_stale = &prometheus::BuildCounter()
                       .Name("parasync_ps_dropped_stale_gradients_total")
                       .Help("Gradients dropped as stale (sync: computed for an older step)")
                       .Labels(labels)
                       .Register(*registry)
                       .Add({});
  staleness = &prometheus::BuildHistogram()
                   .Name("parasync_ps_staleness")
                   .Help("Versions applied between a gradient's read and its apply")
                   .Labels(labels)
                   .Register(*registry)
                   .Add({}, prometheus::Histogram::BucketBoundaries{0, 1, 2, 4, 8, 16, 32, 64});
  barrier_wait_seconds = &prometheus::BuildHistogram()
                              .Name("parasync_ps_barrier_wait_seconds")
                              .Help("How long parked pulls waited (sync barrier or ssp bound)")
                              .Labels(labels)
                              .Register(*registry)
                              .Add({}, prometheus::Histogram::BucketBoundaries{
                                           1e-4, 1e-3, 1e-2, 0.1, 0.3, 1, 3, 10, 30, 100});
  blocked_pulls = &prometheus::BuildCounter()
                       .Name("parasync_ps_blocked_pulls_total")
                       .Help("Pulls that had to wait for a sync step or the ssp bound")
                       .Labels(labels)
                       .Register(*registry)
                       .Add({});
  workers_declared_dead = &prometheus::BuildCounter()
                               .Name("parasync_ps_workers_declared_dead_total")
                               .Help("Workers declared dead after --worker-timeout of silence")
                               .Labels(labels)
                               .Register(*registry)
                               .Add({});
  live_workers = &prometheus::BuildGauge()
                      .Name("parasync_ps_live_workers")
                      .Help("Workers currently in the barrier / staleness set")
                      .Labels(labels)
                      .Register(*registry)
                      .Add({});
  checkpoint_seconds = &prometheus::BuildHistogram()
                            .Name("parasync_ps_checkpoint_seconds")
                            .Help("Time to write a snapshot or a durable update to RocksDB")
                            .Labels(labels)
                            .Register(*registry)
                            .Add({}, prometheus::Histogram::BucketBoundaries{
                                         1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1, 3, 10});
  last_checkpoint_time = &prometheus::BuildGauge()
                              .Name("parasync_ps_last_checkpoint_timestamp_seconds")
                              .Help("Unix time of the last successful snapshot (0: none yet)")
                              .Labels(labels)
                              .Register(*registry)
                              .Add({});
  checkpoint_failures = &prometheus::BuildCounter()
                             .Name("parasync_ps_checkpoint_failures_total")
                             .Help("Snapshots or durable updates that could not be written")
                             .Labels(labels)
                             .Register(*registry)
                             .Add({});
  store_failed = &prometheus::BuildGauge()
                      .Name("parasync_ps_store_failed")
                      .Help("1 once a durable write failed (--durability every-update): pushes "
                            "are refused until the server is restarted")
                      .Labels(labels)
                      .Register(*registry)
                      .Add({});
  unread_reply_bytes = &prometheus::BuildGauge()
                            .Name("parasync_ps_unread_reply_bytes")
                            .Help("Bytes of pull replies queued for peers and not yet written "
                                  "out (bounded by --max-unread-reply-bytes)")
                            .Labels(labels)
                            .Register(*registry)
                            .Add({});
  memory_bound_bytes = &prometheus::BuildGauge()
                            .Name("parasync_ps_memory_bound_bytes")
                            .Help("The memory bound this server states for its present model "
                                  "and limits, without the part per connected peer")
                            .Labels(labels)
                            .Register(*registry)
                            .Add({});
  memory_bound_per_connection_bytes =
      &prometheus::BuildGauge()
           .Name("parasync_ps_memory_bound_per_connection_bytes")
           .Help("The part of the memory bound each connected peer adds")
           .Labels(labels)
           .Register(*registry)
           .Add({});
  registered = &prometheus::BuildGauge()
                    .Name("parasync_ps_registered")
                    .Help("1 once a model is registered")
                    .Labels(labels)
                    .Register(*registry)
                    .Add({});
}

void PsMetrics::SetStraggler(int rank) {
  for (size_t r = 0; r < straggler.size(); ++r) {
    straggler[r]->Set(static_cast<int>(r) == rank ? 1 : 0);
  }
  straggler_rank->Set(rank);
}

}  // namespace parasync
