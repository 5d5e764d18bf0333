// What the chief (rank 0) does beside training, shared by parasync-worker's trainer and the
// C client library (worker/client/c_api.h): the rows of <log-dir>/eval.jsonl, which
// tools/compare and parasync-launch read, and the wait for the other workers before the
// final evaluation. Functions of their arguments; thread-safe where their PsClient is not
// used by another thread.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>

#include "common/model_spec.h"
#include "common/status.h"
#include "worker/ps_client.h"

namespace parasync {

// One evaluation, as a row of eval.jsonl holds it (docs/run-summary.md names the fields).
struct EvalRecord {
  std::string mode;
  int workers = 0;
  int ps = 0;
  int epoch = 0;
  // Finite: an evaluation within an epoch, at this many epochs done (epoch - 1 + the
  // fraction of epoch `epoch` done), written as "epoch" with "within_epoch": true.
  double epoch_progress = NAN;
  int64_t global_step = 0;      // the servers' version (the largest over the shards)
  int64_t global_examples = 0;  // examples the servers applied (the largest over the shards)
  double wall = 0;              // seconds since training started
  double unix_time = 0;         // when the servers' statistics were read
  double train_loss = NAN;      // NaN: none (written as null)
  double test_loss = 0;
  double test_accuracy = 0;
  double test_auc = NAN;        // sigmoid models only; NaN: none (null)
  double chief_examples_per_sec = 0;
  int batch_size = 0;
  OptimizerSpec optimizer;
  uint64_t seed = 0;
  // A worker-side optimizer (parasync.horovod's): its name and current rate replace the
  // servers' in the row ("optimizer", "learning_rate"; "lr_schedule" then "worker").
  std::string worker_optimizer = {};
  double worker_learning_rate = NAN;
};

// Appends `row` to the file at `path` as one JSON line; Unavailable if it cannot be written.
Status AppendEvalRow(const std::string& path, const EvalRecord& row);

// The highest whole "epoch" in the eval log at `path` (rows within an epoch do not count),
// -1 when there is none (or no file).
int LastLoggedEpoch(const std::string& path);

// Fills row->global_step, global_examples and unix_time from every shard's statistics
// (every push reaches every shard that holds slices, so their counters are the global ones;
// a shard without slices reports 0: the largest is taken). The servers' error otherwise.
Status ReadGlobalProgress(PsClient& client, EvalRecord* row);

// The ranks of `num_workers` some shard still counts as live (training: neither left nor
// declared dead), in order, from every shard's statistics; the servers' error otherwise.
Result<std::vector<int>> LiveRanks(PsClient& client, int num_workers);

// The chief after its last epoch: leaves first, so that no sync step or ssp bound waits for
// it, then polls every shard's statistics until none counts another rank of `num_workers`
// as live, up to `seconds` (or until `should_stop()`), logging who it waits for. A worker
// leaves once its last push is acknowledged, so the model evaluated next holds every
// gradient of the workers that left; a rank declared dead counts as gone. Returns the
// servers' error if the statistics cannot be read; a wait that runs out is logged, not an
// error.
Status WaitForOtherWorkers(PsClient& client, int num_workers, double seconds,
                           const std::function<bool()>& should_stop);

}  // namespace parasync
