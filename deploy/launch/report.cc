#include "deploy/launch/report.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "common/metrics.h"

namespace parasync::launch {
namespace {

// ISO 8601 local time with milliseconds and UTC offset: "2025-03-01T12:03:04.512+01:00".
std::string IsoLocalTime(double unix_seconds) {
  const auto whole = static_cast<std::time_t>(std::floor(unix_seconds));
  const int millis =
      std::clamp(static_cast<int>((unix_seconds - static_cast<double>(whole)) * 1000.0), 0, 999);
  std::tm local {};
  localtime_r(&whole, &local);
  char date[32];
  char zone[8];
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%S", &local);
  std::strftime(zone, sizeof(zone), "%z", &local);  // "+0100"
  std::string offset = zone;
  if (offset.size() == 5) offset.insert(3, ":");
  char text[64];
  std::snprintf(text, sizeof(text), "%s.%03d%s", date, millis, offset.c_str());
  return text;
}

// Reads the rows of `path` after its first `offset` bytes (all of them if the file is now
// shorter: it was replaced).
EvalRows ReadEvalRows(const std::string& path, uintmax_t offset) {
  EvalRows result;
  std::ifstream in(path);
  if (!in) return result;
  result.exists = true;
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (!ec && size >= offset) in.seekg(static_cast<std::streamoff>(offset));
  for (std::string line; std::getline(in, line);) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    ++result.rows;
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    auto field = [&](const char* key) -> const nlohmann::json* {
      if (!record.is_object() || !record.contains(key) || !record[key].is_number()) return nullptr;
      return &record[key];
    };
    const nlohmann::json* accuracy = field("test_accuracy");
    result.last_unreadable = accuracy == nullptr;
    result.last.reset();
    if (accuracy == nullptr) continue;
    EvalRow row;
    row.test_accuracy = accuracy->get<double>();
    if (const nlohmann::json* v = field("epoch")) row.epoch = std::llround(v->get<double>());
    if (const nlohmann::json* v = field("wall_s")) row.wall_s = v->get<double>();
    if (const nlohmann::json* v = field("examples")) row.examples = std::llround(v->get<double>());
    if (!result.best || row.test_accuracy > result.best->test_accuracy) result.best = row;
    result.last = row;
  }
  return result;
}

// The sum of the samples of `metric` in a Prometheus text file, or nullopt when the file
// cannot be read or has none.
std::optional<double> SnapshotSum(const std::string& path, std::string_view metric) {
  std::ifstream in(path);
  std::optional<double> sum;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(metric, 0) != 0) continue;
    size_t rest = metric.size();
    if (rest < line.size() && line[rest] == '{') {
      rest = line.find('}', rest);
      if (rest == std::string::npos) continue;
      ++rest;
    }
    if (rest >= line.size() || line[rest] != ' ') continue;  // another metric's name
    char* end = nullptr;
    const double value = std::strtod(line.c_str() + rest + 1, &end);
    if (end == line.c_str() + rest + 1 || !std::isfinite(value)) continue;
    sum = sum.value_or(0.0) + value;
  }
  return sum;
}

}  // namespace

std::string LauncherPrefix() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const auto millis =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm local {};
  localtime_r(&seconds, &local);
  char buffer[40];
  std::snprintf(buffer, sizeof(buffer), "[launch %02d:%02d:%02d.%03d] ", local.tm_hour,
                local.tm_min, local.tm_sec, static_cast<int>(millis));
  return buffer;
}

std::string SignalName(int signal_number) {
  const char* abbrev = sigabbrev_np(signal_number);
  if (abbrev == nullptr) return "signal " + std::to_string(signal_number);
  return std::string("SIG") + abbrev;
}

std::string DescribeWaitStatus(int wait_status) {
  if (WIFEXITED(wait_status)) return "exit status " + std::to_string(WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) return "killed by " + SignalName(WTERMSIG(wait_status));
  return "wait status " + std::to_string(wait_status);
}

bool ExitedZero(int wait_status) { return WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0; }

std::string MetricsUrl(const ProcessRecord& process) {
  return "http://" + process.spec.host + ":" + std::to_string(process.bound_metrics_port) +
         "/metrics";
}

std::string FormatSeconds(double seconds) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%g", seconds);
  return buffer;
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Status WriteClusterJson(const RunRecord& run) {
  const LaunchPlan& plan = *run.plan;
  using nlohmann::json;
  json doc;
  doc["host"] = plan.host;
  doc["mode"] = plan.mode;
  doc["job"] = plan.job;
  doc["log_dir"] = plan.log_dir;
  doc["launcher_pid"] = getpid();
  json ps_hosts = json::array();
  json worker_hosts = json::array();
  json processes = json::array();
  for (const ProcessRecord* record : run.processes) {
    const ProcessRecord& child = *record;
    const bool is_ps = child.spec.role == Role::kPs;
    // A server's entry is the address it bound; a worker's only names it.
    (is_ps ? ps_hosts : worker_hosts)
        .push_back(is_ps && !child.bound_address.empty() ? child.bound_address
                                                         : child.spec.address);
    const bool metrics_known = child.bound_metrics_port > 0;
    processes.push_back({
        {"role", is_ps ? "ps" : "worker"},
        {"index", child.spec.index},
        {"name", child.spec.name},
        {"pid", child.pid > 0 ? json(child.pid) : json(nullptr)},
        {"address", child.bound_address},
        {"metrics_port", metrics_known ? json(child.bound_metrics_port) : json(nullptr)},
        {"host", child.spec.host},
        {"metrics_url", metrics_known ? json(MetricsUrl(child)) : json(nullptr)},
        {"log", child.spec.log_path},
        {"command", child.spec.argv},
    });
    if (!child.spec.env.empty()) {
      // What it was told in its environment besides its flags.
      json env = json::object();
      for (const std::string& entry : child.spec.env) {
        const size_t equals = entry.find('=');
        env[entry.substr(0, equals)] = entry.substr(equals + 1);
      }
      processes.back()["env"] = env;
    }
  }
  doc["cluster"] = {{"ps", ps_hosts}, {"worker", worker_hosts}};
  doc["processes"] = processes;
  if (plan.exporter) doc["export_command"] = plan.exporter->argv;
  // Arguments are user input: replace invalid UTF-8 rather than throw.
  const std::string text = doc.dump(2, ' ', false, json::error_handler_t::replace) + "\n";

  return WriteFileAtomically(plan.log_dir + "/cluster.json", text);
}

Status WritePrometheusTargets(const RunRecord& run) {
  // Prometheus file_sd format: one target group per process, labelled like the metrics the
  // process exports itself (role and shard or rank) plus the run's job.
  using nlohmann::json;
  const LaunchPlan& plan = *run.plan;
  json groups = json::array();
  for (const ProcessRecord* record : run.processes) {
    const ProcessSpec& spec = record->spec;
    if (record->bound_metrics_port <= 0) continue;  // not known (yet)
    const bool is_ps = spec.role == Role::kPs;
    json labels = {{"job", plan.job}, {"role", is_ps ? "ps" : "worker"}};
    labels[is_ps ? "shard" : "rank"] = std::to_string(spec.index);
    groups.push_back(
        {{"targets", {spec.host + ":" + std::to_string(record->bound_metrics_port)}},
         {"labels", labels}});
  }
  return WriteFileAtomically(plan.log_dir + "/prometheus-targets.json",
                             groups.dump(2, ' ', false, json::error_handler_t::replace) + "\n");
}

RunReport ComputeReport(const RunRecord& run) {
  RunReport report;
  report.eval = ReadEvalRows(run.plan->log_dir + "/eval.jsonl", run.eval_offset);
  const double end = run.end > 0 ? run.end : NowSeconds();
  report.wall_seconds = run.start > 0 ? std::max(0.0, end - run.start) : 0.0;
  // The workers' own counters say what this run trained, including after the chief's last
  // evaluation. They need every worker's final snapshot from one uninterrupted process (a
  // killed worker writes none; a restarted one counts from zero). Otherwise the servers'
  // count at the last evaluation, which includes what a restored model had already seen.
  int64_t counted = 0;
  bool complete = true;
  for (const ProcessRecord* record : run.processes) {
    const ProcessRecord& child = *record;
    if (child.spec.role != Role::kWorker) continue;
    const std::optional<double> value =
        child.restarts > 0 || child.fault_killed
            ? std::nullopt
            : SnapshotSum(MetricsSnapshotPath(run.plan->log_dir, child.spec.name),
                          "parasync_worker_examples_total");
    if (!value.has_value()) {
      complete = false;
      break;
    }
    counted += std::llround(*value);
  }
  if (complete) {
    report.examples = counted;
    report.examples_source = "worker_snapshots";
  } else if (report.eval.last.has_value() && report.eval.last->examples.has_value()) {
    report.examples = report.eval.last->examples;
    report.examples_source = "eval_jsonl";
  }
  if (report.examples.has_value() && report.wall_seconds > 0) {
    report.examples_per_second = static_cast<double>(*report.examples) / report.wall_seconds;
  }
  return report;
}

namespace {

using OrderedJson = nlohmann::ordered_json;  // summary.json's fields in docs/run-summary.md's order

template <typename T>
OrderedJson OptionalJson(const std::optional<T>& value) {
  return value.has_value() ? OrderedJson(*value) : OrderedJson(nullptr);
}

OrderedJson RowJson(const std::optional<EvalRow>& row) {
  if (!row.has_value()) return OrderedJson(nullptr);
  return OrderedJson{{"epoch", OptionalJson(row->epoch)},
                     {"test_accuracy", row->test_accuracy},
                     {"examples", OptionalJson(row->examples)},
                     {"wall_s", OptionalJson(row->wall_s)}};
}

OrderedJson ProcessJson(const ProcessRecord& child, const char* role) {
  using json = OrderedJson;
  const bool started = child.pid > 0;
  const int status = child.wait_status;
  const bool signaled = started && !child.running && WIFSIGNALED(status);
  const int signal_number = signaled ? WTERMSIG(status) : 0;
  return json{
      {"name", child.spec.name},
      {"role", role},
      {"host", child.spec.host},
      {"pid", started ? json(child.pid) : json(nullptr)},
      {"exit_status", started && !child.running && WIFEXITED(status)
                          ? json(WEXITSTATUS(status))
                          : json(nullptr)},
      {"signal", signaled ? json(SignalName(signal_number)) : json(nullptr)},
      {"launcher_signal", child.sent_kill   ? json("SIGKILL")
                          : child.sent_term ? json("SIGTERM")
                                            : json(nullptr)},
      {"killed_by_launcher", (signal_number == SIGKILL && child.sent_kill) ||
                                 (signal_number == SIGTERM && child.sent_term)},
      {"fault_injection", child.fault_killed},
      {"restarts", child.restarts},
      {"log", child.spec.log_path},
  };
}

OrderedJson ConfigJson(const RunRecord& run) {
  using json = OrderedJson;
  const LaunchOptions& options = *run.options;
  return json{
      {"mode", run.plan->mode},
      {"ps", options.num_ps},
      {"workers", options.num_workers},
      {"epochs", options.epochs},
      {"model", OptionalJson(options.model)},
      {"dataset", options.data_dir.empty() ? json(nullptr) : json(options.data_dir)},
      {"host", run.plan->host},
      {"log_dir", run.plan->log_dir},
      {"command_line", options.command_line},
  };
}

}  // namespace

Status WriteSummaryJson(const RunRecord& run, const RunReport& report) {
  using json = OrderedJson;
  json processes = json::array();
  for (const ProcessRecord* child : run.processes) {
    processes.push_back(ProcessJson(*child, child->spec.role == Role::kPs ? "ps" : "worker"));
  }
  if (run.exporter != nullptr) processes.push_back(ProcessJson(*run.exporter, "export"));

  json doc;
  doc["outcome"] = run.exit_code == kExitOk            ? "succeeded"
                   : run.exit_code == kExitInterrupted ? "interrupted"
                                                       : "failed";
  doc["exit_code"] = run.exit_code;
  doc["reason"] = run.end_reason.empty() ? json(nullptr) : json(run.end_reason);
  doc["config"] = ConfigJson(run);
  doc["start_time"] = IsoLocalTime(run.start_unix);
  doc["end_time"] = IsoLocalTime(run.end_unix);
  doc["wall_seconds"] = std::round(report.wall_seconds * 1000.0) / 1000.0;
  doc["examples"] = OptionalJson(report.examples);
  doc["examples_source"] =
      report.examples_source.empty() ? json(nullptr) : json(report.examples_source);
  doc["examples_per_second"] =
      report.examples_per_second.has_value()
          ? json(std::round(*report.examples_per_second * 10.0) / 10.0)
          : json(nullptr);
  doc["eval_rows"] = report.eval.rows;
  doc["final"] = RowJson(report.eval.last);
  doc["best"] = RowJson(report.eval.best);
  doc["workers_finished"] =
      run.workers_finished.empty() ? json(nullptr) : json(run.workers_finished);
  doc["workers_stopped"] = run.workers_stopped;
  if (run.plan->exporter) {
    doc["export"] = {
        {"path", run.options->export_path},
        {"exported", run.exporter != nullptr && !run.exporter->running &&
                         ExitedZero(run.exporter->wait_status)},
        {"outcome", run.export_outcome.empty() ? json(nullptr) : json(run.export_outcome)},
    };
  }
  doc["processes"] = processes;
  // Arguments are user input: replace invalid UTF-8 rather than throw.
  return WriteFileAtomically(run.plan->log_dir + "/" + std::string(kSummaryFile),
                             doc.dump(2, ' ', false, json::error_handler_t::replace) + "\n");
}

namespace {

bool Exists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

// "run wall time 12.3 s, 60000 examples, 4878 examples/sec".
std::string RunLine(const RunReport& report) {
  char text[160];
  std::snprintf(text, sizeof(text), "run wall time %.1f s", report.wall_seconds);
  std::string run = text;
  if (report.examples_per_second.has_value()) {
    std::snprintf(text, sizeof(text), ", %lld examples, %.0f examples/sec",
                  static_cast<long long>(*report.examples), *report.examples_per_second);
    run += text;
  }
  return run;
}

// The final accuracy (or why there is none) and the run line.
void AppendAccuracy(std::ostream& out, const std::string& prefix, const std::string& eval_path,
                    const RunReport& report) {
  const std::string run = RunLine(report);
  const EvalRows& eval = report.eval;
  if (!eval.exists) {
    out << prefix << "no " << eval_path << " (the chief writes it after each evaluation)\n";
    out << prefix << run << "\n";
    return;
  }
  if (eval.rows == 0) {
    out << prefix << "no evaluation from this run in " << eval_path
        << " (the chief writes a row after each evaluation)\n";
    out << prefix << run << "\n";
    return;
  }
  if (!eval.last.has_value()) {
    out << prefix << "the last line of " << eval_path << " has no test_accuracy\n";
    out << prefix << run << "\n";
    return;
  }
  char text[160];
  const EvalRow& last = *eval.last;
  std::snprintf(text, sizeof(text), "final test accuracy %.4f", last.test_accuracy);
  out << prefix << text;
  if (last.epoch.has_value()) out << " after epoch " << *last.epoch;
  if (last.wall_s.has_value()) {
    std::snprintf(text, sizeof(text), " (%.1f s)", *last.wall_s);
    out << text;
  }
  if (eval.best.has_value() && eval.best->test_accuracy > last.test_accuracy) {
    std::snprintf(text, sizeof(text), ", best %.4f", eval.best->test_accuracy);
    out << text;
    if (eval.best->epoch.has_value()) out << " after epoch " << *eval.best->epoch;
  }
  out << "; " << run << "\n";
}

// When workers were stopped before the end of their last epoch: which, and why.
void AppendWorkersStopped(std::ostream& out, const std::string& prefix, const RunRecord& run) {
  if (run.workers_stopped.empty()) return;
  std::string names;
  for (const std::string& name : run.workers_stopped) names += (names.empty() ? "" : ", ") + name;
  out << prefix << "stopped before the end of their last epoch: " << names
      << (run.workers_finished == "timed_out"
              ? " (still training after --finish-timeout " +
                    FormatSeconds(run.options->finish_timeout) + " s)"
              : " (--stop-workers-with-chief)")
      << "; the final evaluation misses the rest of their work\n";
}

void AppendExport(std::ostream& out, const std::string& prefix, const RunRecord& run) {
  if (!run.plan->exporter) return;
  const std::string& path = run.options->export_path;
  if (run.exporter != nullptr && ExitedZero(run.exporter->wait_status)) {
    out << prefix << "model: " << path
        << " (evaluate it: parasync-worker --eval-only --model-file " << path << ")\n";
  } else {
    out << prefix
        << (run.export_outcome.empty() ? "no model exported to " + path : run.export_outcome)
        << "\n";
  }
}

// The logs, the files the run left (only what is there: a run that failed early has no
// evaluation log, maybe no more) and the metrics endpoints.
void AppendFiles(std::ostream& out, const std::string& prefix, const std::string& eval_path,
                 bool eval_exists, const RunRecord& run) {
  const LaunchPlan& plan = *run.plan;
  out << prefix << "logs:";
  for (const ProcessRecord* child : run.processes) out << " " << child->spec.log_path;
  if (run.exporter != nullptr) out << " " << run.exporter->spec.log_path;
  out << "\n";
  if (eval_exists) out << prefix << "evaluation log: " << eval_path << "\n";
  const std::string summary_path = plan.log_dir + "/" + std::string(kSummaryFile);
  if (Exists(summary_path)) {
    out << prefix << "run summary: " << summary_path << " (fields: docs/run-summary.md)\n";
  }
  if (Exists(plan.log_dir + "/cluster.json")) {
    out << prefix << "cluster description: " << plan.log_dir << "/cluster.json\n";
  }
  std::string endpoints;
  for (const ProcessRecord* child : run.processes) {
    if (child->bound_metrics_port > 0) {
      endpoints += " " + child->spec.name + " " + MetricsUrl(*child);
    }
  }
  if (!endpoints.empty()) {
    out << prefix << "metrics endpoints (live during the run):" << endpoints << "\n";
  }
  out << prefix << "each process writes its final metrics to " << plan.log_dir
      << "/metrics-<role><index>.prom at exit (e.g. metrics-ps0.prom, metrics-worker0.prom)\n";
  if (Exists(plan.log_dir + "/prometheus-targets.json")) {
    out << prefix << "Prometheus targets (job \"" << plan.job << "\"): " << plan.log_dir
        << "/prometheus-targets.json\n";
  }
}

}  // namespace

std::string SummaryText(const RunRecord& run, const RunReport& report) {
  const std::string prefix = LauncherPrefix();
  const std::string eval_path = run.plan->log_dir + "/eval.jsonl";
  std::ostringstream out;
  AppendAccuracy(out, prefix, eval_path, report);
  AppendWorkersStopped(out, prefix, run);
  AppendExport(out, prefix, run);
  AppendFiles(out, prefix, eval_path, report.eval.exists, run);
  return out.str();
}
}  // namespace parasync::launch
