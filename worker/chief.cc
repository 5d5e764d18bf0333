#include "worker/chief.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

namespace parasync {

namespace {

// "1, 3": ranks for a log line.
std::string RankList(const std::vector<int>& ranks) {
  std::string text;
  for (int rank : ranks) text += (text.empty() ? "" : ", ") + std::to_string(rank);
  return text;
}

nlohmann::json FiniteOrNull(double value) {
  return std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(nullptr);
}

}  // namespace

Status AppendEvalRow(const std::string& path, const EvalRecord& p) {
  nlohmann::json row = {
      {"mode", p.mode},
      {"workers", p.workers},
      {"ps", p.ps},
      {"epoch", p.epoch},
      {"step", p.global_step},
      {"examples", p.global_examples},
      {"wall_s", p.wall},
      {"time", p.unix_time},
      {"train_loss", FiniteOrNull(p.train_loss)},
      {"test_loss", p.test_loss},
      {"test_accuracy", p.test_accuracy},
      {"test_auc", FiniteOrNull(p.test_auc)},
      {"chief_examples_per_sec", p.chief_examples_per_sec},
      {"global_examples_per_sec",
       p.wall > 0 ? static_cast<double>(p.global_examples) / p.wall : 0.0},
      {"batch_size", p.batch_size},
      {"optimizer", p.worker_optimizer.empty()
                        ? std::string(OptimizerKindName(p.optimizer.kind))
                        : p.worker_optimizer},
      // Shortest decimal form of the float (0.001, not 0.0010000000474974513).
      {"learning_rate", p.worker_optimizer.empty()
                            ? nlohmann::json(std::stod(fmt::format("{}", p.optimizer.learning_rate)))
                            : FiniteOrNull(p.worker_learning_rate)},
      {"lr_schedule", p.worker_optimizer.empty()
                          ? std::string(LrScheduleName(p.optimizer.schedule))
                          : std::string("worker")},
      {"seed", p.seed}};
  if (std::isfinite(p.epoch_progress)) {
    row["epoch"] = std::round(p.epoch_progress * 1e4) / 1e4;  // 1.2500, not 1.2500000001
    row["within_epoch"] = true;
  }
  std::ofstream out(path, std::ios::app);
  if (!out) return Status::Unavailable("cannot open " + path);
  out << row.dump() << "\n";
  out.flush();
  if (!out) return Status::Unavailable("cannot write " + path);
  return Status::Ok();
}

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

Status ReadGlobalProgress(PsClient& client, EvalRecord* row) {
  PARASYNC_ASSIGN_OR_RETURN(const std::vector<ShardStats> stats, client.Stats());
  // Unix time of these statistics, to line the row up with other clocks (Prometheus).
  row->unix_time =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  row->global_step = 0;
  row->global_examples = 0;
  for (const ShardStats& s : stats) {
    row->global_step = std::max(row->global_step, s.version);
    row->global_examples = std::max(row->global_examples, s.examples);
  }
  return Status::Ok();
}

Result<std::vector<int>> LiveRanks(PsClient& client, int num_workers) {
  PARASYNC_ASSIGN_OR_RETURN(const std::vector<ShardStats> stats, client.Stats());
  std::vector<int> live;
  for (int rank = 0; rank < num_workers; ++rank) {
    if (std::any_of(stats.begin(), stats.end(), [rank](const ShardStats& s) {
          return static_cast<size_t>(rank) < s.workers.size() &&
                 s.workers[static_cast<size_t>(rank)].live;
        })) {
      live.push_back(rank);
    }
  }
  return live;
}

Status WaitForOtherWorkers(PsClient& client, int num_workers, double seconds,
                           const std::function<bool()>& should_stop) {
  using Clock = std::chrono::steady_clock;
  if (num_workers <= 1) return Status::Ok();
  if (Status s = client.Leave(std::chrono::milliseconds(10000)); !s.ok()) {
    spdlog::warn("leave before the final evaluation not acknowledged: {}", s.message());
  }
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(seconds));
  std::vector<int> training;  // ranks some shard still counts as live
  for (bool logged = false;; logged = true) {
    PARASYNC_ASSIGN_OR_RETURN(training, LiveRanks(client, num_workers));
    std::erase(training, 0);
    if (training.empty()) {
      if (logged) spdlog::info("every worker has finished; the final evaluation follows");
      return Status::Ok();
    }
    if (should_stop()) return Status::Ok();
    if (Clock::now() >= deadline) break;
    if (!logged) {
      spdlog::info("waiting up to {} s for worker(s) {} to finish before the final evaluation",
                   seconds, RankList(training));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  spdlog::warn("worker(s) {} still training after {} s: the final evaluation goes on without "
               "the rest of their work",
               RankList(training), seconds);
  return Status::Ok();
}

}  // namespace parasync
