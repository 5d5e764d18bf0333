// Every metric a worker exports, registered in one place. Names follow Prometheus
// conventions with the parasync_worker_ prefix and constant labels role="worker",
// rank="<r>". prometheus-cpp metrics are thread-safe; built once, then only read, except
// `loop`, which the training thread beats (lock-free).
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
  prometheus::Gauge* finished = nullptr;
  prometheus::Gauge* model_parameters = nullptr;  // 1 once training ended: these are the final values
  // Chief (rank 0) only; null elsewhere, so a dashboard never averages in zeros.
  prometheus::Gauge* eval_accuracy = nullptr;
  prometheus::Gauge* eval_loss = nullptr;

  // The training thread's heartbeat, served as /healthz and /readyz (common/metrics.h). The
  // PsClient beats it on every request and every 100 ms while a request waits
  // (PsClientOptions::loop).
  LoopHeartbeat loop;
};

}  // namespace parasync
