#include "worker/worker_metrics.h"

#include <string>

namespace parasync {

namespace {

// A new counter or gauge family in `registry`, and its series with `labels` (and `series`).
prometheus::Counter* AddCounter(prometheus::Registry& registry, const std::string& name,
                                const std::string& help, const prometheus::Labels& labels) {
  return &prometheus::BuildCounter().Name(name).Help(help).Labels(labels).Register(registry).Add(
      {});
}

prometheus::Gauge* AddGauge(prometheus::Registry& registry, const std::string& name,
                            const std::string& help, const prometheus::Labels& labels,
                            const prometheus::Labels& series = {}) {
  return &prometheus::BuildGauge().Name(name).Help(help).Labels(labels).Register(registry).Add(
      series);
}

}  // namespace

WorkerMetrics::WorkerMetrics(int rank, const std::string& model, int64_t parameters)
    : registry(std::make_shared<prometheus::Registry>()) {
  const prometheus::Labels labels{{"role", "worker"}, {"rank", std::to_string(rank)}};
  prometheus::Registry& r = *registry;
  examples = AddCounter(r, "parasync_worker_examples_total",
                        "Training examples processed; rate() gives examples/sec", labels);
  steps = AddCounter(r, "parasync_worker_steps_total",
                     "Training steps (pull, compute, push) completed", labels);
  dropped = AddCounter(r, "parasync_worker_dropped_gradients_total",
                       "Gradients the parameter servers dropped as stale (sync backup workers)",
                       labels);
  retries = AddCounter(r, "parasync_worker_request_retries_total",
                       "Requests sent again: no reply in time, or the server restarted", labels);
  reconnects = AddCounter(r, "parasync_worker_reconnects_total",
                          "Parameter servers found restarted and registered with again", labels);
  staleness = &prometheus::BuildHistogram()
                   .Name("parasync_worker_staleness")
                   .Help("Versions the servers applied between this worker's read and its "
                         "gradient's acceptance (largest over shards)")
                   .Labels(labels)
                   .Register(r)
                   .Add({}, prometheus::Histogram::BucketBoundaries{0, 1, 2, 4, 8, 16, 32, 64});
  staleness_max = AddGauge(r, "parasync_worker_staleness_max",
                           "Largest staleness of this worker's accepted pushes so far", labels);
  auto& phases = prometheus::BuildHistogram()
                     .Name("parasync_worker_step_seconds")
                     .Help("Seconds per training step, by phase")
                     .Labels(labels)
                     .Register(r);
  const prometheus::Histogram::BucketBoundaries buckets{1e-4, 3e-4, 1e-3, 3e-3, 1e-2,
                                                        3e-2, 0.1,  0.3,  1,    3};
  pull_seconds = &phases.Add({{"phase", "pull"}}, buckets);
  compute_seconds = &phases.Add({{"phase", "compute"}}, buckets);
  push_seconds = &phases.Add({{"phase", "push"}}, buckets);
  train_loss = AddGauge(r, "parasync_worker_train_loss", "Mean training loss of the latest step",
                        labels);
  epoch = AddGauge(r, "parasync_worker_epoch", "Current epoch (1-based)", labels);
  finished = AddGauge(r, "parasync_worker_finished",
                      "1 once this worker has finished training (the values are final)", labels);
  model_family_ = &prometheus::BuildGauge()
                       .Name("parasync_worker_model_parameters")
                       .Help("Parameters of the model this worker trains (label model: its name)")
                       .Labels(labels)
                       .Register(r);
  model_parameters = &model_family_->Add({{"model", model}});
  model_parameters->Set(static_cast<double>(parameters));
  if (rank != 0) return;
  eval_accuracy = AddGauge(r, "parasync_worker_eval_accuracy",
                           "Test-set accuracy of the latest evaluation (chief only)", labels);
  eval_loss = AddGauge(r, "parasync_worker_eval_loss",
                       "Test-set mean loss of the latest evaluation (chief only)", labels);
}

void WorkerMetrics::ObservePush(bool dropped_as_stale, int64_t staleness_seen) {
  if (dropped_as_stale) dropped->Increment();
  if (staleness_seen < 0) return;
  const auto value = static_cast<double>(staleness_seen);
  staleness->Observe(value);
  if (value > staleness_max->Value()) staleness_max->Set(value);
}

void WorkerMetrics::ObserveStep(int64_t count, double loss, double pull_s, double compute_s,
                                double push_s) {
  pull_seconds->Observe(pull_s);
  compute_seconds->Observe(compute_s);
  push_seconds->Observe(push_s);
  examples->Increment(static_cast<double>(count));
  steps->Increment();
  train_loss->Set(loss);
}

void WorkerMetrics::DescribeModel(const std::string& model, int64_t parameters) {
  model_family_->Remove(model_parameters);
  model_parameters = &model_family_->Add({{"model", model}});
  model_parameters->Set(static_cast<double>(parameters));
}

void WorkerMetrics::FollowClient(int64_t client_resends, int64_t client_reconnects) {
  const auto follow = [](prometheus::Counter* counter, int64_t now, int64_t& counted) {
    if (now > counted) counter->Increment(static_cast<double>(now - counted));
    counted = now;
  };
  follow(retries, client_resends, counted_resends_);
  follow(reconnects, client_reconnects, counted_reconnects_);
}

}  // namespace parasync
