// Trainer: a worker's training loop — pull, forward/backward, push — over its shard of the
// data, and, on the chief (rank 0), evaluation on the whole test set after every epoch,
// appended to <log-dir>/eval.jsonl.
//
// Runs on the calling thread; uses the PsClient and ComputeBackend it is handed (not owned).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "common/mode.h"
#include "common/model_spec.h"
#include "common/status.h"
#include "worker/compute/backend.h"
#include "worker/data/dataset.h"
#include "worker/model/model.h"
#include "worker/ps_client.h"
#include "worker/worker_metrics.h"

namespace parasync {

struct TrainerOptions {
  int rank = 0;
  int num_workers = 1;
  TrainingMode mode;
  bool shuffle = true;    // false: each epoch walks the shard in order
  // Fault injection (a straggler): sleep this long between computing a gradient and
  // pushing it.
  std::chrono::milliseconds step_delay{0};
  // Fault injection (a straggler by a factor): after each gradient, sleep (slowdown - 1)
  // times the time it took to compute, so this worker computes `slowdown` times slower.
  double slowdown = 1.0;
  // sync:delayed: compute the gradient at 2 w[t-1] - w[t-2] (the parameters one step ahead,
  // extrapolated) instead of at w[t-1], the parameters it was read at.
  bool weight_prediction = true;
  // Chief: ask every server for a snapshot after each epoch's evaluation.
  bool checkpoint_each_epoch = false;
  // Chief, > 0: after its last epoch (or step), leave and wait up to this long for every
  // other rank to leave the servers too (done, or declared dead) before the final
  // evaluation, so that it evaluates the model all the workers trained. 0: evaluate at once.
  double wait_for_workers_seconds = 0;
  int epochs = 5;
  int batch_size = 64;
  int64_t max_steps = 0;  // > 0: stop after this many local steps
  // Chief, within each epoch: an evaluation every this many of its steps, or every this many
  // seconds (0: none; each epoch's end is evaluated either way). Its eval.jsonl row has the
  // epochs done as a fraction ("epoch": 1.25, "within_epoch": true).
  int64_t eval_every_steps = 0;
  double eval_every_seconds = 0;
  double max_seconds = 0;  // > 0: stop after this many seconds of training (a time budget)
  uint64_t seed = 42;
  std::string log_dir;    // chief writes eval.jsonl here
  // > 0: a progress line within each epoch at most this often (seconds).
  double log_every_seconds = 0;
  Model model;
  OptimizerSpec optimizer;
};

struct TrainingSummary {
  int epochs_done = 0;
  int64_t steps = 0;
  int64_t examples = 0;
  int64_t dropped = 0;  // gradients the servers dropped as stale (sync backup workers)
  double final_test_accuracy = -1;  // chief only; -1 when not evaluated
  double final_test_loss = -1;
  double final_test_auc = -1;  // chief, sigmoid models only (ROC AUC of the test set)
};

// Trains until `epochs` (or max_steps) are done or `should_stop()` turns true (checked every
// step). Goes on from where the servers recorded this rank to be (client.recorded_progress(),
// Keras BackupAndRestore's semantics): a restarted worker skips the epochs and the examples
// it had trained, in the same shuffled order, and the chief neither evaluates epoch 0 again
// nor an epoch eval.jsonl already holds. Every push tells the servers the position after it. `train` is the whole training set (sharded here by rank, before shuffling); `test`
// is evaluated by the chief and may be empty on other ranks. In sync mode each pull waits
// for the step after the one this worker last pushed to. When done or stopped (not on error)
// the worker sends Leave, so barriers stop counting on it. With wait_for_workers_seconds the
// chief leaves before its final evaluation and waits for the other ranks to leave first
// (polling the servers' statistics), up to that bound.
// A model with a sparse embedding table (Model::sparse_tables()) pulls, each step, the rows of
// the batch's distinct ids into the table's compact buffer and pushes their gradient rows
// (worker/sparse_batch.h), in a pull and then a push; the chief evaluates it batch by batch.
// Returns the first error from the servers or the backend.
Result<TrainingSummary> RunTraining(const TrainerOptions& options, const Dataset& train,
                                    const Dataset& test, PsClient& client,
                                    ComputeBackend& backend, WorkerMetrics& metrics,
                                    const std::function<bool()>& should_stop);

}  // namespace parasync
