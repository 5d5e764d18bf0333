#include "worker/worker_metrics.h"

#include <string>

namespace parasync {

WorkerMetrics::WorkerMetrics(int rank, const std::string& model, int64_t parameters)
    : registry(std::make_shared<prometheus::Registry>()) {
  const prometheus::Labels labels{{"role", "worker"}, {"rank", std::to_string(rank)}};
  examples = &prometheus::BuildCounter()
                  .Name("parasync_worker_examples_total")
                  .Help("Training examples processed; rate() gives examples/sec")
                  .Labels(labels)
                  .Register(*registry)
                  .Add({});
  steps = &prometheus::BuildCounter()
               .Name("parasync_worker_steps_total")
               .Help("Training steps (pull, compute, push) completed")
               .Labels(labels)
               .Register(*registry)
               .Add({});
  dropped = &prometheus::BuildCounter()
                 .Name("parasync_worker_dropped_gradients_total")
                 .Help("Gradients the parameter servers dropped as stale (sync backup workers)")
                 .Labels(labels)
                 .Register(*registry)
                 .Add({});
  retries = &prometheus::BuildCounter()
                 .Name("parasync_worker_request_retries_total")
                 .Help("Requests sent again: no reply in time, or the server restarted")
                 .Labels(labels)
                 .Register(*registry)
                 .Add({});
  reconnects = &prometheus::BuildCounter()
                    .Name("parasync_worker_reconnects_total")
                    .Help("Parameter servers found restarted and registered with again")
                    .Labels(labels)
                    .Register(*registry)
                    .Add({});
  staleness = &prometheus::BuildHistogram()
                   .Name("parasync_worker_staleness")
                   .Help("Versions the servers applied between this worker's read and its "
                         "gradient's acceptance (largest over shards)")
                   .Labels(labels)
                   .Register(*registry)
                   .Add({}, prometheus::Histogram::BucketBoundaries{0, 1, 2, 4, 8, 16, 32, 64});
  staleness_max = &prometheus::BuildGauge()
                       .Name("parasync_worker_staleness_max")
                       .Help("Largest staleness of this worker's accepted pushes so far")
                       .Labels(labels)
                       .Register(*registry)
                       .Add({});
  auto& phases = prometheus::BuildHistogram()
                     .Name("parasync_worker_step_seconds")
                     .Help("Seconds per training step, by phase")
                     .Labels(labels)
                     .Register(*registry);
  const prometheus::Histogram::BucketBoundaries buckets{1e-4, 3e-4, 1e-3, 3e-3, 1e-2,
                                                        3e-2, 0.1,  0.3,  1,    3};
  pull_seconds = &phases.Add({{"phase", "pull"}}, buckets);
  compute_seconds = &phases.Add({{"phase", "compute"}}, buckets);
  push_seconds = &phases.Add({{"phase", "push"}}, buckets);
  train_loss = &prometheus::BuildGauge()
                    .Name("parasync_worker_train_loss")
                    .Help("Mean training loss of the latest step")
                    .Labels(labels)
                    .Register(*registry)
                    .Add({});
  epoch = &prometheus::BuildGauge()
               .Name("parasync_worker_epoch")
               .Help("Current epoch (1-based)")
               .Labels(labels)
               .Register(*registry)
               .Add({});
  finished = &prometheus::BuildGauge()
                  .Name("parasync_worker_finished")
                  .Help("1 once this worker has finished training (the values are final)")
                  .Labels(labels)
                  .Register(*registry)
                  .Add({});
  model_parameters = &prometheus::BuildGauge()
                          .Name("parasync_worker_model_parameters")
                          .Help("Parameters of the model this worker trains (label model: its name)")
                          .Labels(labels)
                          .Register(*registry)
                          .Add({{"model", model}});
  model_parameters->Set(static_cast<double>(parameters));
  if (rank != 0) return;
  eval_accuracy = &prometheus::BuildGauge()
                       .Name("parasync_worker_eval_accuracy")
                       .Help("Test-set accuracy of the latest evaluation (chief only)")
                       .Labels(labels)
                       .Register(*registry)
                       .Add({});
  eval_loss = &prometheus::BuildGauge()
                   .Name("parasync_worker_eval_loss")
                   .Help("Test-set mean loss of the latest evaluation (chief only)")
                   .Labels(labels)
                   .Register(*registry)
                   .Add({});
}

}  // namespace parasync
