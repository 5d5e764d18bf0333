#include "worker/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/auc.h"
#include "worker/chief.h"
#include "worker/compute/dropout_mask.h"
#include "worker/sparse_batch.h"

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

// What one epoch added up to.
struct EpochTotals {
  Clock::time_point start;
  size_t first = 0;  // the example it started at (> 0: resumed)
  double loss_sum = 0;
  int64_t steps = 0, examples = 0;
  struct {
    double pull = 0, compute = 0, push = 0;
    double exchange = 0;  // sync:delayed: the exchanges' whole time, hidden or not
  } seconds;  // in each phase of its steps (pull and push: what the steps waited for)
};

// One RunTraining call: its buffers, where it is, and what it has counted. Used by the
// calling thread alone.
class TrainingRun {
 public:
  TrainingRun(const TrainerOptions& o, const Dataset& train, const Dataset& test,
              PsClient& client, ComputeBackend& backend, WorkerMetrics& metrics,
              const std::function<bool()>& should_stop, std::vector<int64_t> shard)
      : o_(o), train_(train), test_(test), client_(client), backend_(backend),
        metrics_(metrics), should_stop_(should_stop), shard_(std::move(shard)),
        params_(o.model.variables(), backend), grads_(o.model.variables(), backend),
        overlap_(o.mode.kind == TrainingMode::Kind::kSync && o.mode.delay > 0 &&
                 o.model.sparse_tables().empty()),
        exchanged_params_(overlap_ ? std::make_unique<Tensors>(o.model.variables(), backend)
                                   : nullptr),
        pushed_grads_(overlap_ ? std::make_unique<Tensors>(o.model.variables(), backend)
                               : nullptr),
        predicted_params_(overlap_ ? std::make_unique<Tensors>(o.model.variables(), backend)
                                   : nullptr),
        batch_x_(backend.AllocateHost(static_cast<size_t>(o.batch_size) *
                                      static_cast<size_t>(o.model.input_size()) * sizeof(float))),
        batch_y_(backend.AllocateHost(static_cast<size_t>(o.batch_size))),
        eval_log_(o.log_dir.empty() ? "eval.jsonl" : o.log_dir + "/eval.jsonl"),
        start_(Clock::now()) {
    // The servers hold the dense variables as slices and the sparse tables as rows: the
    // client moves the first, the compact table buffers take the rows.
    std::vector<bool> sparse(o.model.variables().size(), false);
    for (const SparseTable& t : o.model.sparse_tables()) sparse[static_cast<size_t>(t.variable)] = true;
    for (size_t v = 0; v < sparse.size() && params_.ok() && grads_.ok(); ++v) {
      if (sparse[v]) continue;
      dense_params_.push_back(params_.ptrs[v]);
      dense_grads_.push_back(grads_.cptrs[v]);
    }
  }

  // Whether every buffer could be allocated.
  bool ok() const {
    return params_.ok() && grads_.ok() && batch_x_ != nullptr && batch_y_ != nullptr &&
           (!overlap_ ||
            (exchanged_params_->ok() && pushed_grads_->ok() && predicted_params_->ok()));
  }
  // The client counts retries and reconnects itself; the metrics follow its counts after
  // every step and on every way out (an error return included), registration's too.
  void SyncClientCounters() { metrics_.FollowClient(client_.resends(), client_.reconnects()); }
  // Trains from where the servers recorded this rank to the last epoch, or until a stop.
  Result<TrainingSummary> Run();

 private:
  bool sync() const { return o_.mode.kind == TrainingMode::Kind::kSync; }
  Status Resume();
  // `progress` finite: an evaluation within epoch `epoch`, at that many epochs done.
  Status Evaluate(int epoch, double train_loss, double epoch_examples_per_sec,
                  double progress = NAN);
  // Chief: --eval-every's evaluation after the step that ended at example `done` of the
  // epoch, when one is due (never at the epoch's end, which is evaluated anyway). Its time
  // is left out of the epoch's examples/sec.
  Status MaybeEvaluateWithinEpoch(int epoch, size_t done, EpochTotals& totals);
  Status TrainEpoch(int epoch, EpochTotals& totals);
  Status Step(int epoch, size_t first, size_t count, EpochTotals& totals);
  bool sparse() const { return !o_.model.sparse_tables().empty(); }
  // The rows of `ids` of every sparse table, in (or from) `buffers` (params_ or grads_):
  // row r of the compact buffer is the table's row ids[r]. (A model has one embedding
  // layer, so its tables share the batch's ids.)
  std::vector<RowsOf> RowsIn(const std::vector<uint64_t>& ids, const std::vector<float*>& buffers) const;
  // The step's exchange with the servers after the gradient: PushPull (dense models) or a
  // push with the batch's rows (sparse models, whose next rows depend on the next batch).
  // A sparse model's push also pulls the rows of the next batch of the epoch, which it
  // gathers first (prepared_first_ says which).
  Status PushGradient(size_t first, size_t count, PsClient::PushPullTimes* times);
  // The parameters the gradient is computed at: params_, or with weight prediction while an
  // exchange is in flight (the gradient will be one step old), 2 params_ - the parameters
  // before them, written over those in predicted_params_.
  const std::vector<const float*>& ComputeAt();
  // sync:delayed (dense models): the step's exchange goes to a thread of its own, pushing
  // pushed_grads_ (the gradient just computed, swapped in) and pulling into
  // exchanged_params_, while the caller computes the next gradient from params_ — the
  // parameters before the step now exchanged, one version older than the servers'.
  // `computed_from`: the read point of the parameters the gradient came from.
  void LaunchExchange(size_t count, PsClient::ReadPoint computed_from);
  // Waits for the exchange in flight, if any; its parameters become params_. Returns its
  // outcome. The wait (what compute did not hide) is split as the exchange's own push and
  // pull times into *pull_s and *push_s, or, without them, added to `totals` (the epoch's
  // last exchange, awaited after its last step).
  Status AwaitExchange(EpochTotals& totals, double* pull_s = nullptr, double* push_s = nullptr);
  // The test set's figures; the logits of every example in `logits` (sigmoid models).
  Result<EvalResult> EvaluateTestSet(std::vector<float>* logits);
  void CountPush();
  void CountStep(size_t count, double loss, double pull_s, double compute_s, double push_s,
                 EpochTotals& totals);
  void MaybeLogProgress(int epoch, size_t done, const EpochTotals& totals);
  Status EndEpoch(int epoch, const EpochTotals& totals);

  const TrainerOptions& o_;
  const Dataset& train_;
  const Dataset& test_;
  PsClient& client_;
  ComputeBackend& backend_;
  WorkerMetrics& metrics_;
  const std::function<bool()>& should_stop_;
  std::vector<int64_t> shard_;  // this rank's example indices, in this epoch's order
  Tensors params_;
  Tensors grads_;
  // sync:delayed (null otherwise): the parameters being pulled, the gradient being pushed,
  // and the parameters before params_ (then the prediction); the read point of params_; the
  // exchange in flight (declared after the buffers it uses, so destroyed, and so awaited,
  // before them).
  const bool overlap_;
  std::unique_ptr<Tensors> exchanged_params_;
  std::unique_ptr<Tensors> pushed_grads_;
  std::unique_ptr<Tensors> predicted_params_;
  bool have_previous_ = false;  // predicted_params_ holds the parameters before params_
  PsClient::ReadPoint params_read_at_;  // kept with params_: where they were read
  PsClient::PushPullTimes exchange_times_;
  std::future<Status> exchange_;
  std::vector<float*> dense_params_;       // params_ of the dense variables (the client's)
  std::vector<const float*> dense_grads_;  // grads_ of the dense variables
  SparseBatch batch_rows_;                 // the batch in batch_x_: its distinct ids
  // The first example of the batch already in batch_x_ with its rows pulled (SIZE_MAX: none).
  size_t prepared_first_ = SIZE_MAX;
  std::shared_ptr<void> batch_x_;
  std::shared_ptr<void> batch_y_;
  const std::string eval_log_;  // the path of eval.jsonl
  const Clock::time_point start_;
  TrainingSummary summary_;
  StartPoint start_at_;
  // This rank's step count, the steps before a restart included (as this batch size counts
  // them): it seeds the dropout masks, which so go on where they were.
  int64_t rank_step_ = 0;
  bool stop_ = false;
  bool have_params_ = false;  // params_ hold the model for the next step
  Clock::time_point last_progress_line_;
  Clock::time_point last_evaluation_;  // --eval-every SECONDS counts from here
};

// Evaluates the current server-side model on the whole test set (chief only). In sync mode
// it waits for the step the chief last pushed to, so the model evaluated after an epoch is
// the same in every run with the same seeds (not whichever step had completed).
Status TrainingRun::Evaluate(int epoch, double train_loss, double epoch_examples_per_sec,
                             double progress) {
  std::vector<float> logits;
  auto result = EvaluateTestSet(&logits);
  if (!result.ok()) return result.status();
  EvalRecord p{.mode = o_.mode.ToString(),
               .workers = o_.num_workers,
               .ps = client_.num_shards(),
               .epoch = epoch,
               .train_loss = train_loss,
               .chief_examples_per_sec = epoch_examples_per_sec,
               .batch_size = o_.batch_size,
               .optimizer = o_.optimizer,
               .seed = o_.seed};
  p.epoch_progress = progress;
  PARASYNC_RETURN_IF_ERROR(ReadGlobalProgress(client_, &p));
  p.test_accuracy = result->accuracy();
  p.test_loss = result->mean_loss();
  if (!logits.empty()) {
    p.test_auc = RocAuc(logits, test_.y);  // the logit ranks as the probability does
    summary_.final_test_auc = p.test_auc;
  }
  p.wall = Seconds(start_, Clock::now());
  if (metrics_.eval_accuracy != nullptr) metrics_.eval_accuracy->Set(p.test_accuracy);
  if (metrics_.eval_loss != nullptr) metrics_.eval_loss->Set(p.test_loss);
  summary_.final_test_accuracy = p.test_accuracy;
  summary_.final_test_loss = p.test_loss;
  PARASYNC_RETURN_IF_ERROR(AppendEvalRow(eval_log_, p));
  last_evaluation_ = Clock::now();
  spdlog::info("eval epoch {}: test accuracy {:.4f}, test loss {:.4f}{} (global step {}, {} "
               "examples, {:.1f} s)",
               std::isfinite(progress) ? fmt::format("{:.4f}", progress) : std::to_string(epoch),
               p.test_accuracy, p.test_loss,
               std::isfinite(p.test_auc) ? fmt::format(", test AUC {:.4f}", p.test_auc) : "",
               p.global_step, p.global_examples, p.wall);
  return Status::Ok();
}

std::vector<RowsOf> TrainingRun::RowsIn(const std::vector<uint64_t>& ids,
                                        const std::vector<float*>& buffers) const {
  std::vector<RowsOf> rows;
  const std::vector<SparseTable>& tables = o_.model.sparse_tables();
  for (size_t t = 0; t < tables.size(); ++t) {
    rows.push_back({static_cast<uint32_t>(t), ids, buffers[static_cast<size_t>(tables[t].variable)]});
  }
  return rows;
}

Result<EvalResult> TrainingRun::EvaluateTestSet(std::vector<float>* logits) {
  if (o_.model.loss() == LossKind::kSigmoidCrossEntropy) {
    logits->resize(static_cast<size_t>(test_.n * o_.model.outputs()));
  }
  float* out = logits->empty() ? nullptr : logits->data();
  const int64_t wait = sync() ? PsClient::kNextStep : 0;
  if (!sparse()) {
    PARASYNC_RETURN_IF_ERROR(client_.Pull(params_.ptrs, wait));
    params_read_at_ = client_.read_point();
    return backend_.Evaluate(params_.cptrs, test_.x.data(), test_.y.data(), test_.n, out);
  }
  // Batch by batch: each batch's rows fit the compact buffers. (Async: other workers go on
  // meanwhile, so later batches may see a newer model.)
  EvalResult total;
  auto* bx = static_cast<float*>(batch_x_.get());
  auto* by = static_cast<uint8_t*>(batch_y_.get());
  std::vector<int64_t> idx;
  for (int64_t start = 0; start < test_.n; start += o_.batch_size) {
    const int64_t n = std::min<int64_t>(o_.batch_size, test_.n - start);
    idx.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) idx[static_cast<size_t>(i)] = start + i;
    const SparseBatch b = GatherSparseBatch(test_, idx, bx, by);
    PARASYNC_RETURN_IF_ERROR(client_.Pull(dense_params_, wait, RowsIn(b.unique_ids, params_.ptrs)));
    auto part = backend_.Evaluate(params_.cptrs, bx, by, n,
                                  out == nullptr ? nullptr : out + start * o_.model.outputs());
    if (!part.ok()) return part.status();
    total.loss_sum += part->loss_sum;
    total.correct += part->correct;
    total.count += part->count;
  }
  return total;
}

// Where to start, from the servers' record of this rank; the evaluation a restart owes.
Status TrainingRun::Resume() {
  start_at_ = ResumeFrom(client_.recorded_progress(), shard_.size(), o_.rank);
  // The shuffles are cumulative: the order of epoch e is that of e - 1, shuffled again.
  for (int e = 1; e < start_at_.epoch && o_.shuffle; ++e) {
    ShuffleForEpoch(&shard_, o_.seed, o_.rank, e);
  }
  const auto batch = static_cast<size_t>(o_.batch_size);
  const auto batches = [&](size_t examples) {
    return static_cast<int64_t>((examples + batch - 1) / batch);
  };
  rank_step_ = (start_at_.epoch - 1) * batches(shard_.size()) + batches(start_at_.offset);
  if (o_.rank == 0) {
    const int logged = LastLoggedEpoch(eval_log_);
    if (client_.recorded_progress().empty()) {
      PARASYNC_RETURN_IF_ERROR(Evaluate(0, NAN, 0.0));
    } else if (start_at_.finished_epoch > logged && start_at_.finished_epoch > 0) {
      // The epoch ended before the stop, its evaluation did not.
      PARASYNC_RETURN_IF_ERROR(Evaluate(start_at_.finished_epoch, NAN, 0.0));
    }
  }
  if (start_at_.epoch > o_.epochs) {
    spdlog::info("all {} epochs were trained before (the servers' record): nothing left to do",
                 o_.epochs);
  }
  return Status::Ok();
}

Result<TrainingSummary> TrainingRun::Run() {
  last_evaluation_ = Clock::now();
  PARASYNC_RETURN_IF_ERROR(Resume());
  last_progress_line_ = Clock::now();
  for (int epoch = start_at_.epoch; epoch <= o_.epochs && !stop_; ++epoch) {
    EpochTotals totals;
    totals.first = epoch == start_at_.epoch ? start_at_.offset : 0;
    Status trained = TrainEpoch(epoch, totals);
    // The epoch's last exchange is awaited whatever happened: nothing else may use the
    // client while it is in flight, and the evaluation reads what it pulled.
    Status exchanged = AwaitExchange(totals);
    PARASYNC_RETURN_IF_ERROR(trained);
    PARASYNC_RETURN_IF_ERROR(exchanged);
    if (totals.steps == 0) break;
    PARASYNC_RETURN_IF_ERROR(EndEpoch(epoch, totals));
  }
  // Done or stopped: let the barriers go on without this rank (briefly, when stopping).
  const auto leave_timeout = should_stop_() ? std::chrono::milliseconds(1000)
                                            : std::chrono::milliseconds(10000);
  if (Status s = client_.Leave(leave_timeout); !s.ok()) {
    spdlog::warn("leave not acknowledged: {}", s.message());
  }
  return summary_;
}

Status TrainingRun::TrainEpoch(int epoch, EpochTotals& totals) {
  metrics_.epoch->Set(epoch);
  if (o_.shuffle) ShuffleForEpoch(&shard_, o_.seed, o_.rank, epoch);
  totals.start = Clock::now();
  const auto batch = static_cast<size_t>(o_.batch_size);
  for (size_t first = totals.first; first < shard_.size(); first += batch) {
    if (should_stop_()) {
      stop_ = true;
      break;
    }
    if (o_.max_seconds > 0 && Seconds(start_, Clock::now()) >= o_.max_seconds) {
      stop_ = true;  // the time budget is spent: evaluate what there is, as after an epoch
      break;
    }
    const size_t count = std::min(batch, shard_.size() - first);
    PARASYNC_RETURN_IF_ERROR(Step(epoch, first, count, totals));
    PARASYNC_RETURN_IF_ERROR(MaybeEvaluateWithinEpoch(epoch, first + count, totals));
    if (o_.max_steps > 0 && summary_.steps >= o_.max_steps) {
      stop_ = true;
      break;
    }
  }
  return Status::Ok();
}

Status TrainingRun::MaybeEvaluateWithinEpoch(int epoch, size_t done, EpochTotals& totals) {
  if (o_.rank != 0 || done >= shard_.size() || should_stop_() ||
      (o_.max_steps > 0 && summary_.steps >= o_.max_steps)) {
    return Status::Ok();  // the evaluation after the last step comes anyway
  }
  const bool by_steps = o_.eval_every_steps > 0 && rank_step_ % o_.eval_every_steps == 0;
  const bool by_time = o_.eval_every_seconds > 0 &&
                       Seconds(last_evaluation_, Clock::now()) >= o_.eval_every_seconds;
  if (!by_steps && !by_time) return Status::Ok();
  const auto t0 = Clock::now();
  // As at an epoch's end: the exchange in flight first (nothing else may use the client
  // meanwhile), and a sparse model's next batch gathered again (the evaluation takes the
  // batch buffers).
  PARASYNC_RETURN_IF_ERROR(AwaitExchange(totals));
  prepared_first_ = SIZE_MAX;
  const double progress = (epoch - 1) + static_cast<double>(done) / static_cast<double>(shard_.size());
  PARASYNC_RETURN_IF_ERROR(Evaluate(epoch, NAN, 0.0, progress));
  totals.start += Clock::now() - t0;
  return Status::Ok();
}

Status TrainingRun::Step(int epoch, size_t first, size_t count, EpochTotals& totals) {
  auto* bx = static_cast<float*>(batch_x_.get());
  auto* by = static_cast<uint8_t*>(batch_y_.get());
  const std::span<const int64_t> idx(shard_.data() + first, count);
  // A sparse model's batch and its rows may have come with the last push (PushGradient).
  const bool prepared = sparse() && prepared_first_ == first;
  prepared_first_ = SIZE_MAX;
  if (!prepared && sparse()) {
    batch_rows_ = GatherSparseBatch(train_, idx, bx, by);
  } else if (!sparse()) {
    GatherBatch(train_, idx, bx, by);
  }
  const auto t0 = Clock::now();
  // Sync: each shard answers once it has applied the step this worker last pushed to.
  // After the first step the parameters came with the last push (PushPull).
  if (sparse() && !prepared) {
    PARASYNC_RETURN_IF_ERROR(client_.Pull(dense_params_, sync() ? PsClient::kNextStep : 0,
                                          RowsIn(batch_rows_.unique_ids, params_.ptrs)));
  } else if (!sparse() && !have_params_) {
    PARASYNC_RETURN_IF_ERROR(client_.Pull(params_.ptrs, sync() ? PsClient::kNextStep : 0));
    params_read_at_ = client_.read_point();
    have_params_ = true;
  }
  const auto t1 = Clock::now();
  auto loss = backend_.ForwardBackward(ComputeAt(), bx, by, static_cast<int>(count),
                                       compute::StepSeed(o_.seed, o_.rank, rank_step_),
                                       grads_.ptrs);
  if (!loss.ok()) return loss.status();
  if (!std::isfinite(*loss)) {
    // Pushing it would be refused by the servers (or worse, half-applied across shards).
    return Status::Aborted("training diverged: the loss is " + std::to_string(*loss) +
                           " at epoch " + std::to_string(epoch) + "; try a smaller --lr");
  }
  if (o_.slowdown > 1.0) {
    std::this_thread::sleep_for(
        std::chrono::duration<double>((o_.slowdown - 1.0) * Seconds(t1, Clock::now())));
  }
  if (o_.step_delay.count() > 0) std::this_thread::sleep_for(o_.step_delay);
  const auto t2 = Clock::now();
  if (overlap_) {
    // The step before's exchange ends (its parameters are the next gradient's), this one's
    // starts, and the step goes on to the next gradient without waiting for it.
    PsClient::ReadPoint computed_from = params_read_at_;
    double pull_s = 0, push_s = 0;
    PARASYNC_RETURN_IF_ERROR(AwaitExchange(totals, &pull_s, &push_s));
    client_.set_progress({epoch, static_cast<int64_t>(first + count),
                          static_cast<int64_t>(shard_.size())});
    LaunchExchange(count, std::move(computed_from));
    CountStep(count, *loss, Seconds(t0, t1) + pull_s, Seconds(t1, t2), push_s, totals);
    MaybeLogProgress(epoch, first + count, totals);
    return Status::Ok();
  }
  // Where this worker is once the servers count this gradient (stored with it).
  client_.set_progress({epoch, static_cast<int64_t>(first + count),
                        static_cast<int64_t>(shard_.size())});
  PsClient::PushPullTimes exchange;
  PARASYNC_RETURN_IF_ERROR(PushGradient(first, count, &exchange));
  CountPush();
  SyncClientCounters();
  CountStep(count, *loss, Seconds(t0, t1) + exchange.pull_seconds, Seconds(t1, t2),
            exchange.push_seconds, totals);
  MaybeLogProgress(epoch, first + count, totals);
  return Status::Ok();
}

Status TrainingRun::PushGradient(size_t first, size_t count, PsClient::PushPullTimes* times) {
  const int64_t wait = sync() ? PsClient::kNextStep : 0;
  if (!sparse()) {
    // The gradient out and the next step's parameters in, in one round trip.
    return client_.PushPull(grads_.cptrs, static_cast<int64_t>(count), params_.ptrs, wait,
                            times);
  }
  // Out of batch_rows_, which the next batch takes below.
  const std::vector<uint64_t> ids = std::move(batch_rows_.unique_ids);
  const std::vector<RowsOf> pushed = RowsIn(ids, grads_.ptrs);
  const size_t next = first + count;
  if (next >= shard_.size()) {
    // The epoch's last batch: the next one is in another order (or there is none).
    const auto t0 = Clock::now();
    PARASYNC_RETURN_IF_ERROR(client_.Push(dense_grads_, static_cast<int64_t>(count),
                                          PsClient::kLastRead, pushed));
    times->push_seconds = Seconds(t0, Clock::now());
    times->pull_seconds = 0;
    return Status::Ok();
  }
  // The next batch is known: its rows come back with this push, in one round trip, as a
  // dense model's parameters do. The compute is done, so the batch buffers are free.
  const size_t n = std::min(static_cast<size_t>(o_.batch_size), shard_.size() - next);
  batch_rows_ = GatherSparseBatch(train_, std::span<const int64_t>(shard_.data() + next, n),
                                  static_cast<float*>(batch_x_.get()),
                                  static_cast<uint8_t*>(batch_y_.get()));
  PARASYNC_RETURN_IF_ERROR(client_.PushPull(dense_grads_, static_cast<int64_t>(count),
                                            dense_params_, wait, times, pushed,
                                            RowsIn(batch_rows_.unique_ids, params_.ptrs)));
  prepared_first_ = next;
  return Status::Ok();
}

const std::vector<const float*>& TrainingRun::ComputeAt() {
  if (!overlap_ || !o_.weight_prediction || !exchange_.valid() || !have_previous_) {
    return params_.cptrs;
  }
  // Each step moves the parameters about as far as the one before (Adam's steps most of
  // all): the step in flight is predicted to repeat the last one.
  for (size_t v = 0; v < params_.ptrs.size(); ++v) {
    const float* now = params_.cptrs[v];
    float* p = predicted_params_->ptrs[v];
    const int64_t n = o_.model.variables()[v].num_elements();
    for (int64_t i = 0; i < n; ++i) p[i] = 2.0f * now[i] - p[i];
  }
  return predicted_params_->cptrs;
}

void TrainingRun::LaunchExchange(size_t count, PsClient::ReadPoint computed_from) {
  // The gradient goes out from pushed_grads_; the next one is computed into the other set.
  std::swap(grads_, *pushed_grads_);
  exchange_ = std::async(std::launch::async, [this, count, from = std::move(computed_from)] {
    return client_.PushPull(pushed_grads_->cptrs, static_cast<int64_t>(count),
                            exchanged_params_->ptrs, PsClient::kNextStep, &exchange_times_,
                            {}, {}, &from);
  });
}

Status TrainingRun::AwaitExchange(EpochTotals& totals, double* pull_s, double* push_s) {
  if (!exchange_.valid()) return Status::Ok();
  const auto t0 = Clock::now();
  const Status s = exchange_.get();
  const double waited = Seconds(t0, Clock::now());
  if (!s.ok()) return s;
  // params_ <- what the exchange pulled; predicted_params_ <- the parameters before them;
  // the pull after the next push goes to the buffer the prediction used.
  std::swap(params_, *exchanged_params_);
  std::swap(*exchanged_params_, *predicted_params_);
  have_previous_ = true;
  params_read_at_ = client_.read_point();
  CountPush();
  SyncClientCounters();
  const PsClient::PushPullTimes& x = exchange_times_;
  const double whole = x.push_seconds + x.pull_seconds;
  const double pull = whole > 0 ? waited * x.pull_seconds / whole : 0;
  totals.seconds.exchange += whole;
  if (pull_s != nullptr && push_s != nullptr) {
    *pull_s = pull;
    *push_s = waited - pull;
  } else {
    totals.seconds.pull += pull;
    totals.seconds.push += waited - pull;
  }
  return Status::Ok();
}

void TrainingRun::CountPush() {
  if (client_.last_push_dropped()) ++summary_.dropped;
  metrics_.ObservePush(client_.last_push_dropped(), client_.last_push_staleness());
}

void TrainingRun::CountStep(size_t count, double loss, double pull_s, double compute_s,
                            double push_s, EpochTotals& totals) {
  totals.seconds.pull += pull_s;
  totals.seconds.compute += compute_s;
  totals.seconds.push += push_s;
  metrics_.ObserveStep(static_cast<int64_t>(count), loss, pull_s, compute_s, push_s);
  totals.loss_sum += loss;
  ++totals.steps;
  totals.examples += static_cast<int64_t>(count);
  ++summary_.steps;
  ++rank_step_;
  summary_.examples += static_cast<int64_t>(count);
}

// Within an epoch, a progress line at most every log_every_seconds; `done` examples of it.
void TrainingRun::MaybeLogProgress(int epoch, size_t done, const EpochTotals& totals) {
  if (o_.log_every_seconds <= 0 ||
      Seconds(last_progress_line_, Clock::now()) < o_.log_every_seconds) {
    return;
  }
  last_progress_line_ = Clock::now();
  const double so_far = Seconds(totals.start, last_progress_line_);
  spdlog::info("epoch {}/{}: {} of {} examples ({:.0f}%), {:.0f} examples/sec, train loss "
               "{:.4f}",
               epoch, o_.epochs, done, shard_.size(),
               100.0 * static_cast<double>(done) / static_cast<double>(shard_.size()),
               static_cast<double>(totals.examples) / so_far,
               totals.loss_sum / static_cast<double>(totals.steps));
}

// The epoch's line; on the chief (unless stopped by a signal) its evaluation and checkpoint.
Status TrainingRun::EndEpoch(int epoch, const EpochTotals& totals) {
  const double secs = Seconds(totals.start, Clock::now());
  const auto steps = static_cast<double>(totals.steps);
  const double train_loss = totals.loss_sum / steps;
  const double eps = static_cast<double>(totals.examples) / secs;
  summary_.epochs_done = epoch;
  spdlog::info("epoch {}/{}: {} examples{} in {:.2f} s = {:.0f} examples/sec, train loss {:.4f} "
               "(per step: pull {:.2f} ms, compute {:.2f} ms, push {:.2f} ms{})",
               epoch, o_.epochs, totals.examples,
               totals.first > 0 ? fmt::format(" (resumed at example {})", totals.first) : "",
               secs, eps, train_loss, 1e3 * totals.seconds.pull / steps,
               1e3 * totals.seconds.compute / steps, 1e3 * totals.seconds.push / steps,
               overlap_ ? fmt::format("; the exchange took {:.2f} ms, the rest of it overlapped "
                                      "the next gradient",
                                      1e3 * totals.seconds.exchange / steps)
                        : "");
  if (o_.rank != 0 || (stop_ && should_stop_())) return Status::Ok();
  if ((epoch == o_.epochs || stop_) && o_.wait_for_workers_seconds > 0) {
    PARASYNC_RETURN_IF_ERROR(
        WaitForOtherWorkers(client_, o_.num_workers, o_.wait_for_workers_seconds, should_stop_));
    if (should_stop_()) return Status::Ok();  // stopped while waiting: no evaluation
  }
  PARASYNC_RETURN_IF_ERROR(Evaluate(epoch, train_loss, eps));
  if (o_.checkpoint_each_epoch) {
    if (Status s = client_.Checkpoint(); !s.ok()) {
      spdlog::warn("checkpoint after epoch {} failed: {}", epoch, s.message());
    } else {
      spdlog::info("checkpoint after epoch {} saved on every server", epoch);
    }
  }
  return Status::Ok();
}

}  // namespace

Result<TrainingSummary> RunTraining(const TrainerOptions& o, const Dataset& train,
                                    const Dataset& test, PsClient& client,
                                    ComputeBackend& backend, WorkerMetrics& metrics,
                                    const std::function<bool()>& should_stop) {
  if (train.id_columns + train.dim != o.model.input_size() ||
      train.id_columns != o.model.id_columns()) {
    return Status::InvalidArgument("the data has " + std::to_string(train.id_columns) +
                                   " id columns and " + std::to_string(train.dim) +
                                   " features per example but the model expects " +
                                   std::to_string(o.model.id_columns()) + " and " +
                                   std::to_string(o.model.input_size() - o.model.id_columns()));
  }
  std::vector<int64_t> shard = ShardIndices(train.n, o.rank, o.num_workers);
  if (shard.empty()) return Status::InvalidArgument("this worker's data shard is empty");
  TrainingRun run(o, train, test, client, backend, metrics, should_stop, std::move(shard));
  if (!run.ok()) {
    return Status::Unavailable("out of host memory for the parameter, gradient and batch buffers");
  }
  // On every way out from here, an error return included.
  struct AtExit {
    TrainingRun& run;
    WorkerMetrics& metrics;
    ~AtExit() {
      run.SyncClientCounters();
      metrics.finished->Set(1);
    }
  } at_exit{run, metrics};
  return run.Run();
}

}  // namespace parasync
