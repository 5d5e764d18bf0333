// Every metric a worker exports, registered in one place. Names follow Prometheus
// conventions with the parasync_worker_ prefix and constant labels role="worker",
// rank="<r>". prometheus-cpp metrics are thread-safe; built once, then only read, except
// `loop`, which the training thread beats (lock-free). The Observe and Follow methods are
// for one thread, the training loop's.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "common/metrics.h"

namespace parasync {

struct WorkerMetrics {
  // `model` and `parameters` label and set parasync_worker_model_parameters (the model this
  // worker trains, as its description names it, and its parameter count).
  explicit WorkerMetrics(int rank, const std::string& model = "", int64_t parameters = 0);

  std::shared_ptr<prometheus::Registry> registry;
  prometheus::Counter* examples = nullptr;  // rate() of it is examples/sec
  prometheus::Counter* steps = nullptr;
  prometheus::Counter* dropped = nullptr;  // gradients the servers dropped as stale
  prometheus::Counter* retries = nullptr;     // requests sent again
  prometheus::Counter* reconnects = nullptr;  // restarted servers registered with again
  prometheus::Histogram* staleness = nullptr;  // per accepted push, as the servers counted
  prometheus::Gauge* staleness_max = nullptr;  // the largest of them so far
  prometheus::Histogram* pull_seconds = nullptr;     // step seconds, phase="pull"
  prometheus::Histogram* compute_seconds = nullptr;  // phase="compute"
  prometheus::Histogram* push_seconds = nullptr;     // phase="push"
  prometheus::Gauge* train_loss = nullptr;
  prometheus::Gauge* epoch = nullptr;
  prometheus::Gauge* finished = nullptr;  // 1 once training ended: these are the final values
  prometheus::Gauge* model_parameters = nullptr;  // the series of the model (DescribeModel)
  // Chief (rank 0) only; null elsewhere, so a dashboard never averages in zeros.
  prometheus::Gauge* eval_accuracy = nullptr;
  prometheus::Gauge* eval_loss = nullptr;

  // The training thread's heartbeat, served as /healthz and /readyz (common/metrics.h). The
  // PsClient beats it on every request and every 100 ms while a request waits
  // (PsClientOptions::loop).
  LoopHeartbeat loop;

  // A push was answered: `dropped` (a shard dropped it as stale) and its staleness as the
  // servers counted it (-1: none, PsClient::last_push_staleness()).
  void ObservePush(bool dropped_as_stale, int64_t staleness_seen);
  // A step of `count` examples ended with `loss`, after these seconds in each phase.
  void ObserveStep(int64_t count, double loss, double pull_s, double compute_s, double push_s);
  // The client's own counts of resends and reconnects so far: the counters follow them.
  void FollowClient(int64_t client_resends, int64_t client_reconnects);
  // The model, once known after construction: model_parameters becomes the series labelled
  // with `model`, set to `parameters` (the old series is removed).
  void DescribeModel(const std::string& model, int64_t parameters);

 private:
  prometheus::Family<prometheus::Gauge>* model_family_ = nullptr;
  int64_t counted_resends_ = 0;
  int64_t counted_reconnects_ = 0;
};

}  // namespace parasync
