// What parasync-launch tells about a run: the wording its own lines share (their prefix,
// how an exit or a signal is named), and the run's artifacts in the log directory:
// cluster.json and prometheus-targets.json once the processes are started, summary.json and
// the end-of-run text when they have all been reaped. The supervisor records the run in a
// RunRecord; the functions here only read it (and eval.jsonl and the processes' final
// metrics snapshots), and write only the files they name. Not thread-safe with a supervisor
// that is changing the record.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "deploy/launch/options.h"
#include "deploy/launch/plan.h"

namespace parasync::launch {

// Exit codes of parasync-launch.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;       // a process failed or did not stop in time
// Bad flags, missing binaries or data, a port in use, a foreign --state-dir (found before
// anything starts), or a process that exited 2 itself (it refused its flags, data or state).
inline constexpr int kExitUsage = 2;
inline constexpr int kExitInterrupted = 130;  // SIGINT/SIGTERM/SIGHUP to the launcher

// The run's machine-readable report, beside eval.jsonl in the log directory.
inline constexpr std::string_view kSummaryFile = "summary.json";

// "[launch 12:03:04.512] ": the launcher's own lines carry the local time of day, to the
// millisecond (summary.json has the full dates).
std::string LauncherPrefix();
// "SIGTERM", or "signal N" for a number without a name.
std::string SignalName(int signal_number);
// "exit status N", "killed by SIGKILL", or "wait status N".
std::string DescribeWaitStatus(int wait_status);
bool ExitedZero(int wait_status);
// `seconds` as printf's %g.
std::string FormatSeconds(double seconds);
// Steady-clock seconds (the clock of RunRecord::start and end), and wall-clock Unix seconds.
double NowSeconds();
double UnixSeconds();

// What the supervisor knows of one process it started (or was to start).
struct ProcessRecord {
  ProcessSpec spec;
  pid_t pid = -1;  // -1: never started
  bool running = false;
  int wait_status = 0;  // once reaped
  bool sent_term = false;
  bool killed_after_grace = false;
  bool fault_killed = false;  // killed by fault injection: its death is no failure
  bool sent_kill = false;     // the launcher sent it SIGKILL (grace over, --kill, a second ^C)
  int restarts = 0;           // by fault injection
  // What it listens on, once known: from its ready file (spec.ready_path) in a single-host
  // run, from the plan's fixed ports otherwise. A PS's host:port ("" until known, and for a
  // worker, which binds none) and its /metrics port (0 until known, or never, for a
  // --worker-command program that writes no ready file). A restart keeps a PS's address; its
  // metrics port may change.
  std::string bound_address;
  int bound_metrics_port = 0;
};

// The run as the supervisor records it, for the artifacts. The pointers are the
// supervisor's and outlive the record.
struct RunRecord {
  const LaunchOptions* options = nullptr;
  const LaunchPlan* plan = nullptr;
  std::vector<const ProcessRecord*> processes;  // one per plan->processes entry, in order
  const ProcessRecord* exporter = nullptr;      // set once the exporter has been started
  // From Start() to the last process reaped; 0 until then.
  double start = 0.0;  // steady-clock seconds
  double end = 0.0;
  double start_unix = 0.0;  // wall-clock (Unix) seconds
  double end_unix = 0.0;
  uintmax_t eval_offset = 0;   // size of eval.jsonl before the run: later rows are its own
  int exit_code = -1;          // set when the run has ended
  std::string end_reason;      // why the run failed, as the supervisor told it
  std::string export_outcome;  // where the model is, or why it is not there
  // How the workers ended once the chief had finished: "all" (every worker not ended by
  // --kill finished by itself), "stopped_with_chief" (--stop-workers-with-chief stopped
  // some) or "timed_out" (some were still training after --finish-timeout and were
  // stopped); empty when the run ended otherwise (failed or interrupted before that).
  std::string workers_finished;
  std::vector<std::string> workers_stopped;  // the workers stopped then, by name
};

// "http://HOST:PORT/metrics" of the metrics port `process` bound.
std::string MetricsUrl(const ProcessRecord& process);

// One row of eval.jsonl, as far as the launcher reports it.
struct EvalRow {
  double test_accuracy = 0.0;
  std::optional<int64_t> epoch;
  std::optional<double> wall_s;     // the chief's seconds since its start
  std::optional<int64_t> examples;  // the servers' count of examples applied
};

struct EvalRows {
  bool exists = false;
  int rows = 0;                  // non-blank lines read
  bool last_unreadable = false;  // the last of them has no test_accuracy
  std::optional<EvalRow> last;
  std::optional<EvalRow> best;  // the highest test_accuracy, the earliest on a tie
};

// The figures of a run, as summary.json and the end-of-run text give them.
struct RunReport {
  EvalRows eval;  // this run's rows of eval.jsonl
  double wall_seconds = 0.0;
  std::optional<int64_t> examples;
  std::string examples_source;  // "worker_snapshots" or "eval_jsonl"
  std::optional<double> examples_per_second;
};

// Reads this run's rows of eval.jsonl and the workers' final metrics snapshots. A run not
// ended yet counts its wall time up to now.
RunReport ComputeReport(const RunRecord& run);

// Writes <log_dir>/cluster.json (fields: docs/run-summary.md): the cluster spec, every
// process's pid, the address and metrics port it bound (null while not known), log and
// command line, and the exporter's command. Written whole (a rename), again whenever one of
// them changes. Unavailable when it cannot be written.
Status WriteClusterJson(const RunRecord& run);

// Writes <log_dir>/prometheus-targets.json (Prometheus file_sd: one group per process whose
// metrics port is known; Prometheus re-reads the file, so it is written again as more are).
Status WritePrometheusTargets(const RunRecord& run);

// Writes <log_dir>/summary.json (fields: docs/run-summary.md).
Status WriteSummaryJson(const RunRecord& run, const RunReport& report);

// The end-of-run text: the final test accuracy from this run's rows of eval.jsonl (or that
// there are none), the wall time and examples/sec, the workers stopped before the end of
// their last epoch (if any), the exported model (or why there is none) when one was asked
// for, and the files and endpoints the run left (only those that exist). Lines end in '\n',
// each with LauncherPrefix().
std::string SummaryText(const RunRecord& run, const RunReport& report);

}  // namespace parasync::launch
