#include "worker/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <memory>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "worker/compute/dropout_mask.h"

namespace parasync {

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The model's parameters or gradients as host arrays, one per variable, in one block of
// the backend's host memory (page-locked for a GPU, so its copies run asynchronously).
struct Tensors {
  Tensors(const std::vector<VariableSpec>& vars, ComputeBackend& backend) {
    size_t total = 0;
    for (const VariableSpec& v : vars) total += static_cast<size_t>(v.num_elements());
    block = backend.AllocateHost(total * sizeof(float));
    if (block == nullptr) return;
    float* next = static_cast<float*>(block.get());
    for (const VariableSpec& v : vars) {
      ptrs.push_back(next);
      cptrs.push_back(next);
      next += v.num_elements();
    }
  }
  bool ok() const { return block != nullptr; }
  std::shared_ptr<void> block;
  std::vector<float*> ptrs;
  std::vector<const float*> cptrs;
};

class EvalLog {
 public:
  explicit EvalLog(const std::string& path) : path_(path) {}
  Status Append(const nlohmann::json& row) {
    std::ofstream out(path_, std::ios::app);
    if (!out) return Status::Unavailable("cannot open " + path_);
    out << row.dump() << "\n";
    out.flush();
    if (!out) return Status::Unavailable("cannot write " + path_);
    return Status::Ok();
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The highest "epoch" in the eval log at `path`, -1 when there is none (or no file).
int LastLoggedEpoch(const std::string& path) {
  std::ifstream in(path);
  int last = -1;
  for (std::string line; std::getline(in, line);) {
    const auto row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (row.is_object() && row.contains("epoch") && row["epoch"].is_number_integer()) {
      last = std::max(last, row["epoch"].get<int>());
    }
  }
  return last;
}

// Where training starts: the epoch, the first example of it, and whether the epoch before
// was finished but perhaps not evaluated (a stop between its last push and its evaluation).
struct StartPoint {
  int epoch = 1;
  size_t offset = 0;
  int finished_epoch = 0;  // > 0: the recorded position is the end of this epoch
};

StartPoint ResumeFrom(const DataProgress& recorded, size_t shard_size, int rank) {
  if (recorded.empty()) return {};
  StartPoint start;
  if (recorded.of != static_cast<int64_t>(shard_size)) {
    spdlog::warn("the servers recorded rank {} at epoch {}, example {} of {}, but its data shard "
                 "now holds {} examples (other data or another worker count): going on from "
                 "the start of epoch {}",
                 rank, recorded.epoch, recorded.done, recorded.of, shard_size, recorded.epoch);
    start.epoch = recorded.epoch;
    return start;
  }
  if (recorded.done == recorded.of) {
    start.epoch = recorded.epoch + 1;
    start.finished_epoch = recorded.epoch;
  } else {
    start.epoch = recorded.epoch;
    start.offset = static_cast<size_t>(recorded.done);
  }
  spdlog::info("resuming where the servers recorded rank {}: epoch {}, {} of {} examples done",
               rank, recorded.epoch, recorded.done, recorded.of);
  return start;
}

}  // namespace

Result<TrainingSummary> RunTraining(const TrainerOptions& o, const Dataset& train,
                                    const Dataset& test, PsClient& client,
                                    ComputeBackend& backend, WorkerMetrics& metrics,
                                    const std::function<bool()>& should_stop) {
  const std::vector<VariableSpec>& vars = o.model.variables();
  if (train.dim != o.model.input_size()) {
    return Status::InvalidArgument("the data has " + std::to_string(train.dim) +
                                   " features per example but the model expects " +
                                   std::to_string(o.model.input_size()));
  }
  const bool chief = o.rank == 0;
  std::vector<int64_t> shard = ShardIndices(train.n, o.rank, o.num_workers);
  if (shard.empty()) return Status::InvalidArgument("this worker's data shard is empty");
  const int batch = o.batch_size;
  Tensors params(vars, backend);
  Tensors grads(vars, backend);
  std::shared_ptr<void> batch_x =
      backend.AllocateHost(static_cast<size_t>(batch) * static_cast<size_t>(train.dim) * sizeof(float));
  std::shared_ptr<void> batch_y = backend.AllocateHost(static_cast<size_t>(batch));
  if (!params.ok() || !grads.ok() || batch_x == nullptr || batch_y == nullptr) {
    return Status::Unavailable("out of host memory for the parameter, gradient and batch buffers");
  }
  float* bx = static_cast<float*>(batch_x.get());
  uint8_t* by = static_cast<uint8_t*>(batch_y.get());

  EvalLog eval_log(o.log_dir.empty() ? "eval.jsonl" : o.log_dir + "/eval.jsonl");
  const auto start = Clock::now();
  TrainingSummary summary;

  // The client counts retries and reconnects itself; the metrics follow its counts after
  // every step and on every way out (an error return included), registration's too.
  int64_t counted_resends = 0;
  int64_t counted_reconnects = 0;
  auto follow = [](prometheus::Counter* counter, int64_t now, int64_t& counted) {
    if (now > counted) counter->Increment(static_cast<double>(now - counted));
    counted = now;
  };
  auto sync_client_counters = [&] {
    follow(metrics.retries, client.resends(), counted_resends);
    follow(metrics.reconnects, client.reconnects(), counted_reconnects);
  };
  struct AtExit {
    std::function<void()> run;
    ~AtExit() { run(); }
  } at_exit{[&] {
    sync_client_counters();
    metrics.finished->Set(1);
  }};

  const bool sync = o.mode.kind == TrainingMode::Kind::kSync;
  // Evaluates the current server-side model on the whole test set (chief only). In sync
  // mode it waits for the step the chief last pushed to, so the model evaluated after an
  // epoch is the same in every run with the same seeds (not whichever step had completed).
  auto evaluate = [&](int epoch, double train_loss, double epoch_examples_per_sec) -> Status {
    PARASYNC_RETURN_IF_ERROR(client.Pull(params.ptrs, sync ? PsClient::kNextStep : 0));
    auto stats = client.Stats();
    if (!stats.ok()) return stats.status();
    // Unix time of these statistics, to line the row up with other clocks (Prometheus).
    const double unix_time =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    auto result = backend.Evaluate(params.cptrs, test.x.data(), test.y.data(), test.n);
    if (!result.ok()) return result.status();
    const double acc = result->accuracy();
    const double loss = result->mean_loss();
    // Every push reaches every shard that holds slices, so their counters are the global
    // ones (a shard without slices reports 0): take the largest.
    int64_t global_step = 0, global_examples = 0;
    for (const ShardStats& s : *stats) {
      global_step = std::max(global_step, s.version);
      global_examples = std::max(global_examples, s.examples);
    }
    const double wall = Seconds(start, Clock::now());
    if (metrics.eval_accuracy != nullptr) metrics.eval_accuracy->Set(acc);
    if (metrics.eval_loss != nullptr) metrics.eval_loss->Set(loss);
    summary.final_test_accuracy = acc;
    summary.final_test_loss = loss;
    nlohmann::json row = {{"mode", o.mode.ToString()},
                          {"workers", o.num_workers},
                          {"ps", client.num_shards()},
                          {"epoch", epoch},
                          {"step", global_step},
                          {"examples", global_examples},
                          {"wall_s", wall},
                          {"time", unix_time},
                          {"train_loss", std::isfinite(train_loss) ? nlohmann::json(train_loss)
                                                                   : nlohmann::json(nullptr)},
                          {"test_loss", loss},
                          {"test_accuracy", acc},
                          {"chief_examples_per_sec", epoch_examples_per_sec},
                          {"global_examples_per_sec",
                           wall > 0 ? static_cast<double>(global_examples) / wall : 0.0},
                          {"batch_size", o.batch_size},
                          {"optimizer", std::string(OptimizerKindName(o.optimizer.kind))},
                          // Shortest decimal form of the float (0.001, not 0.0010000000474974513).
                          {"learning_rate", std::stod(fmt::format("{}", o.optimizer.learning_rate))},
                          {"lr_schedule", std::string(LrScheduleName(o.optimizer.schedule))},
                          {"seed", o.seed}};
    PARASYNC_RETURN_IF_ERROR(eval_log.Append(row));
    spdlog::info("eval epoch {}: test accuracy {:.4f}, test loss {:.4f} (global step {}, {} "
                 "examples, {:.1f} s)",
                 epoch, acc, loss, global_step, global_examples, wall);
    return Status::Ok();
  };

  const StartPoint start_at = ResumeFrom(client.recorded_progress(), shard.size(), o.rank);
  // The shuffles are cumulative: the order of epoch e is that of e - 1, shuffled again.
  for (int e = 1; e < start_at.epoch && o.shuffle; ++e) ShuffleForEpoch(&shard, o.seed, o.rank, e);
  // This rank's step count, the steps before a restart included (as this batch size counts
  // them): it seeds the dropout masks, which so go on where they were.
  const auto batches = [&](size_t examples) {
    return static_cast<int64_t>((examples + static_cast<size_t>(batch) - 1) /
                                static_cast<size_t>(batch));
  };
  int64_t rank_step = (start_at.epoch - 1) * batches(shard.size()) + batches(start_at.offset);
  if (chief) {
    const int logged = LastLoggedEpoch(eval_log.path());
    if (client.recorded_progress().empty()) {
      PARASYNC_RETURN_IF_ERROR(evaluate(0, NAN, 0.0));
    } else if (start_at.finished_epoch > logged && start_at.finished_epoch > 0) {
      // The epoch ended before the stop, its evaluation did not.
      PARASYNC_RETURN_IF_ERROR(evaluate(start_at.finished_epoch, NAN, 0.0));
    }
  }
  if (start_at.epoch > o.epochs) {
    spdlog::info("all {} epochs were trained before (the servers' record): nothing left to do",
                 o.epochs);
  }
  bool stop = false;
  bool have_params = false;  // params hold the model for the next step
  auto last_progress_line = Clock::now();
  for (int epoch = start_at.epoch; epoch <= o.epochs && !stop; ++epoch) {
    metrics.epoch->Set(epoch);
    if (o.shuffle) ShuffleForEpoch(&shard, o.seed, o.rank, epoch);
    const auto epoch_start = Clock::now();
    double loss_sum = 0;
    int64_t epoch_steps = 0;
    int64_t epoch_examples = 0;
    double t_pull = 0, t_compute = 0, t_push = 0;
    const size_t epoch_first = epoch == start_at.epoch ? start_at.offset : 0;
    for (size_t first = epoch_first; first < shard.size(); first += static_cast<size_t>(batch)) {
      if (should_stop()) {
        stop = true;
        break;
      }
      if (o.max_seconds > 0 && Seconds(start, Clock::now()) >= o.max_seconds) {
        stop = true;  // the time budget is spent: evaluate what there is, as after an epoch
        break;
      }
      const size_t count = std::min(static_cast<size_t>(batch), shard.size() - first);
      GatherBatch(train, std::span<const int64_t>(shard.data() + first, count), bx, by);
      const auto t0 = Clock::now();
      // Sync: each shard answers once it has applied the step this worker last pushed to.
      // After the first step the parameters came with the last push (PushPull below).
      if (!have_params) {
        PARASYNC_RETURN_IF_ERROR(client.Pull(params.ptrs, sync ? PsClient::kNextStep : 0));
        have_params = true;
      }
      const auto t1 = Clock::now();
      auto loss = backend.ForwardBackward(params.cptrs, bx, by, static_cast<int>(count),
                                          compute::StepSeed(o.seed, o.rank, rank_step),
                                          grads.ptrs);
      if (!loss.ok()) return loss.status();
      if (!std::isfinite(*loss)) {
        // Pushing it would be refused by the servers (or worse, half-applied across shards).
        return Status::Aborted("training diverged: the loss is " + std::to_string(*loss) +
                               " at epoch " + std::to_string(epoch) +
                               "; try a smaller --lr");
      }
      if (o.slowdown > 1.0) {
        std::this_thread::sleep_for(
            std::chrono::duration<double>((o.slowdown - 1.0) * Seconds(t1, Clock::now())));
      }
      if (o.step_delay.count() > 0) std::this_thread::sleep_for(o.step_delay);
      const auto t2 = Clock::now();
      // Where this worker is once the servers count this gradient (stored with it).
      client.set_progress({epoch, static_cast<int64_t>(first + count),
                           static_cast<int64_t>(shard.size())});
      // The gradient out and the next step's parameters in, in one round trip.
      PsClient::PushPullTimes exchange;
      PARASYNC_RETURN_IF_ERROR(client.PushPull(grads.cptrs, static_cast<int64_t>(count),
                                               params.ptrs, sync ? PsClient::kNextStep : 0,
                                               &exchange));
      if (client.last_push_dropped()) {
        ++summary.dropped;
        metrics.dropped->Increment();
      }
      if (client.last_push_staleness() >= 0) {
        const auto staleness = static_cast<double>(client.last_push_staleness());
        metrics.staleness->Observe(staleness);
        if (staleness > metrics.staleness_max->Value()) metrics.staleness_max->Set(staleness);
      }
      sync_client_counters();

      const double pull_s = Seconds(t0, t1) + exchange.pull_seconds;
      const double compute_s = Seconds(t1, t2), push_s = exchange.push_seconds;
      t_pull += pull_s;
      t_compute += compute_s;
      t_push += push_s;
      metrics.pull_seconds->Observe(pull_s);
      metrics.compute_seconds->Observe(compute_s);
      metrics.push_seconds->Observe(push_s);
      metrics.examples->Increment(static_cast<double>(count));
      metrics.steps->Increment();
      metrics.train_loss->Set(*loss);
      loss_sum += *loss;
      ++epoch_steps;
      epoch_examples += static_cast<int64_t>(count);
      ++summary.steps;
      ++rank_step;
      summary.examples += static_cast<int64_t>(count);
      if (o.log_every_seconds > 0 &&
          Seconds(last_progress_line, Clock::now()) >= o.log_every_seconds) {
        last_progress_line = Clock::now();
        const double so_far = Seconds(epoch_start, last_progress_line);
        spdlog::info("epoch {}/{}: {} of {} examples ({:.0f}%), {:.0f} examples/sec, train loss "
                     "{:.4f}",
                     epoch, o.epochs, first + count, shard.size(),
                     100.0 * static_cast<double>(first + count) / static_cast<double>(shard.size()),
                     static_cast<double>(epoch_examples) / so_far,
                     loss_sum / static_cast<double>(epoch_steps));
      }
      if (o.max_steps > 0 && summary.steps >= o.max_steps) {
        stop = true;
        break;
      }
    }
    if (epoch_steps == 0) break;
    const double secs = Seconds(epoch_start, Clock::now());
    const double train_loss = loss_sum / static_cast<double>(epoch_steps);
    const double eps = static_cast<double>(epoch_examples) / secs;
    summary.epochs_done = epoch;
    spdlog::info("epoch {}/{}: {} examples{} in {:.2f} s = {:.0f} examples/sec, train loss {:.4f} "
                 "(per step: pull {:.2f} ms, compute {:.2f} ms, push {:.2f} ms)",
                 epoch, o.epochs, epoch_examples,
                 epoch_first > 0 ? fmt::format(" (resumed at example {})", epoch_first) : "",
                 secs, eps, train_loss,
                 1e3 * t_pull / static_cast<double>(epoch_steps),
                 1e3 * t_compute / static_cast<double>(epoch_steps),
                 1e3 * t_push / static_cast<double>(epoch_steps));
    if (chief && !(stop && should_stop())) {
      PARASYNC_RETURN_IF_ERROR(evaluate(epoch, train_loss, eps));
      if (o.checkpoint_each_epoch) {
        if (Status s = client.Checkpoint(); !s.ok()) {
          spdlog::warn("checkpoint after epoch {} failed: {}", epoch, s.message());
        } else {
          spdlog::info("checkpoint after epoch {} saved on every server", epoch);
        }
      }
    }
  }
  // Done or stopped: let the barriers go on without this rank (briefly, when stopping).
  const auto leave_timeout = should_stop() ? std::chrono::milliseconds(1000)
                                           : std::chrono::milliseconds(10000);
  if (Status s = client.Leave(leave_timeout); !s.ok()) {
    spdlog::warn("leave not acknowledged: {}", s.message());
  }
  return summary;
}

}  // namespace parasync
