// The supervisor of a run, Launcher: starts a parasync cluster (parameter servers, then
// workers) as child processes, forwards their output, and stops every one of them when the
// run ends.
//
// Use: Launcher::Create(options) validates the options, finds the binaries and builds the
// plan (no process is started); Start() spawns the processes (on a single host the servers,
// whose ports are their own pick: the workers follow once the servers have said which, in
// their ready files); Supervise() forwards output until the chief worker finishes, a process
// fails or the launcher is told to stop, then stops and reaps every child (exporting the
// model first when asked to) and returns the exit code; Summary() tells the user where the
// results are.
//
// Thread safety: a Launcher is used from one thread. Start() installs process-wide handlers
// for SIGINT, SIGTERM, SIGHUP and SIGCHLD and ignores SIGPIPE, so at most one Launcher may be
// started per process. Only PIDs this Launcher started are ever signalled or waited for.
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "deploy/launch/options.h"
#include "deploy/launch/plan.h"
#include "deploy/launch/report.h"

namespace parasync::launch {

// How long parasync-export may run before it is killed and the run counts as failed.
inline constexpr double kExportTimeoutSeconds = 120.0;
// Once the chief has exited (after waiting up to --finish-timeout for the others), how long
// the workers still running get to exit by themselves before they are stopped: a worker
// the chief saw finish is only writing its metrics snapshot; one still running after this
// is one the chief stopped waiting for.
inline constexpr double kWorkerExitSeconds = 5.0;
// How long a single host's server, started or restarted, may take to serve (it writes its
// ready file once it does, after restoring its --state-dir): then the run fails. Workers
// wait for servers up to their own --connect-timeout, 60 s by default.
inline constexpr double kServerReadySeconds = 120.0;
// A server restarted on its address finds the port taken (exit status 2, "in use"): it is
// started again this many times in all, this long apart, before the run fails.
inline constexpr int kRestartTries = 10;
inline constexpr double kRestartRetrySeconds = 0.5;
// How often the ready files of the servers being waited for, and of the workers whose
// metrics port is not known yet, are read.
inline constexpr double kServerReadyPollSeconds = 0.02;
inline constexpr double kReadyPollSeconds = 0.2;

class Launcher {
 public:
  // Validates `options` (InvalidArgument), resolves the binary directory and checks the
  // binaries (NotFound) and builds the plan. Starts nothing and creates no files.
  static Result<std::unique_ptr<Launcher>> Create(const LaunchOptions& options);

  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;
  // Kills (SIGKILL) and reaps any child still running, e.g. after a failed Start().
  ~Launcher();

  const LaunchPlan& plan() const { return plan_; }

  // Creates the log directory (and the --export file's directory), installs the signal
  // handlers and starts every PS, then (multi-host: at once; single host: from Supervise(),
  // once every PS has written its ready file) every worker, then writes <log_dir>/cluster.json
  // and prometheus-targets.json (and again as ports become known). On error the processes
  // already started are killed and reaped, and the status says what failed (and, when the
  // log directory exists, summary.json says so too). Call once.
  Status Start();

  // Blocks: forwards every child's output line by line (prefixed on output_fd, raw to
  // <log_dir>/<name>.log) until worker 0 exits 0, any process fails, or the launcher gets
  // SIGINT/SIGTERM/SIGHUP. On a single host it first waits for the servers' ready files
  // (kServerReadySeconds each; a server that exits or does not serve by then fails the run,
  // as one that fails later does), then starts the workers. After worker 0 exited 0 the
  // other workers get kWorkerExitSeconds to exit by themselves (none with
  // stop_workers_with_chief). Then stops the remaining workers and then the PS processes
  // (SIGTERM, up to grace_seconds, then SIGKILL) and reaps them all. With an export path,
  // when worker 0 exited 0 and nothing failed or interrupted the run, parasync-export runs
  // between the two (output prefixed [export], up to kExportTimeoutSeconds). Then writes
  // <log_dir>/summary.json (a failure to write it is reported, not fatal). Returns kExitOk
  // when every process (the exporter included) exited 0, kExitInterrupted when stopped by a
  // signal, kExitUsage when the first process to fail exited with status 2, else kExitFailed.
  // Precondition: Start() returned OK. Call once.
  int Supervise();

  // After Supervise(): serves each process's final metrics snapshot
  // (<log_dir>/metrics-<name>.prom) on the port the process bound, until the launcher gets
  // SIGINT, SIGTERM or SIGHUP, so Prometheus keeps the final values and no target goes down.
  // A process that wrote no snapshot (killed), or never told its port, is not served.
  // Returns Unavailable when no port could be served. Precondition: Supervise() returned.
  Status ServeFinalMetrics();

  // Preflight (parasync-launch --check): runs every planned process's command with --check
  // (over ssh for remote hosts, at most `timeout_seconds` each) and returns one line per
  // problem: a host that cannot be reached, a port in use or an address not on its host,
  // missing data, or a binary whose version, protocol or schema differs from this
  // launcher's. Empty: all clear. Call instead of Start(). (ClusterPreflight; on a single host
  // the servers' own ports are port 0, nothing to check.)
  std::vector<std::string> Preflight(double timeout_seconds = 30.0);

  // Returns the end-of-run text: the final test accuracy from the rows this run appended to
  // <log_dir>/eval.jsonl (or that there are none), the run's wall time and examples/sec,
  // the exported model file (or why there is none) when one was asked for, and the files
  // and endpoints the run left (only those that exist). Precondition: Supervise() returned.
  std::string Summary() const;

 private:
  struct Child;
  // kStartingServers: a single host's servers are started, the workers not yet (they need
  // the servers' ports). kFinishingWorkers: the chief exited 0; the other workers may still
  // exit by themselves.
  enum class Phase {
    kStartingServers,
    kRunning,
    kFinishingWorkers,
    kStoppingWorkers,
    kExporting,
    kStoppingPs,
    kDone
  };

  Launcher(LaunchOptions options, LaunchPlan plan, std::string bin_dir);

  // Start(), in steps: the files the run writes (log files, the --export directory; stale
  // metrics snapshots removed), then every process (a single host's servers only). Fail()
  // ends the run with `status`.
  Status PrepareFiles();
  Status SpawnAll();
  Status Fail(Status status);
  // Starts `child` as its spec says (its stale ready file removed first).
  Status SpawnOne(Child& child);
  // The line about a started process: its pid and, with fixed ports, where it listens
  // (recorded as bound).
  void AnnounceStart(Child& child);
  // Every process has been started: writes cluster.json and prometheus-targets.json, and
  // the fault injection's clock starts.
  void OnAllStarted();
  // Writes cluster.json and prometheus-targets.json again (once every process has been
  // started); a failure is a warning.
  void WriteRunFiles();
  // The ready files (single host): reads those not read yet, of the servers waited for (one
  // that does not serve within kServerReadySeconds fails the run) and of the workers; once
  // every server serves, StartWorkers().
  void CollectReadyFiles();
  // Reads `child`'s ready file: true, with its ports recorded, when this process wrote it.
  // One that is not a ready file fails the run for a server waited for, else is a warning.
  bool ReadReady(Child& child);
  // Seconds until the ready files should be read again (large when none is awaited).
  double ReadyPollSeconds() const;
  // Starting or running: a server that does not serve fails the run (later, the run is
  // ending anyway).
  bool Live() const;
  // Plans again with the ports the servers bound and starts every worker.
  void StartWorkers();
  // Supervise(), one turn: waits for output, a signal or a deadline and handles them.
  void PollOnce();
  void HandleSignals();
  // Moves the stopping phases along: workers, export, parameter servers, each in its time.
  void AdvanceStopping();
  void ReadOutput(Child& child, bool drain);
  void EmitLine(Child& child, std::string_view line);
  void FlushPartial(Child& child);
  void CloseOutput(Child& child);
  void ReapExited();
  // Returns true, with the wait status, when `child` was running and has now exited; its
  // remaining output is forwarded first.
  bool TryReap(Child& child, int* wait_status);
  void OnExit(Child& child, int wait_status);
  void BeginStopping(Phase phase);
  // The chief exited 0: waits for the other workers (kFinishingWorkers) or, with
  // stop_workers_with_chief or when none is left, stops them at once.
  void OnChiefFinished(const std::string& who);
  // Stops the workers still running and records them in run_.workers_stopped, with
  // `outcome` ("stopped_with_chief" or "timed_out") as run_.workers_finished; "all" when
  // none is running.
  void StopRemainingWorkers(const char* outcome);
  // The workers still running, by name: "worker1, worker3" (empty: none).
  std::string RunningWorkers() const;
  // After the workers are stopped: starts the exporter when it should run (else goes on to
  // stopping the PS processes).
  void AfterWorkersStopped();
  // Why the exporter must not run, or empty when it may.
  std::string ReasonNotToExport() const;
  void OnExportExit(int wait_status);
  void SignalGroup(Role role, int signal_number);
  void KillAllNow();
  bool GroupRunning(Role role) const;
  void Message(std::string_view text);
  void WriteOut(std::string_view text);
  int ComputeExitCode();
  // Records the end of the run, computes report_ and writes summary.json.
  void Finish(int exit_code);
  // Kills or restarts what options_.faults asks for by now; returns the seconds until the
  // next such action (or a large number when none is left).
  double InjectFaults();
  // Starts the process a fault killed again, with the plan's command line (a single host's
  // server on the address it bound first); false (the run then stops) when it cannot.
  bool RestartAfterFault(Child& child);
  // One start of a restart (the first, or another after a port in use).
  bool StartAgain(Child& child);
  // A restarted server that exited 2 saying its port is in use: true when that is handled
  // here, by a try kRestartRetrySeconds later, or, after kRestartTries, the run's failure.
  bool RetryIfPortInUse(Child& child, int wait_status);
  // Starts the restarts whose retry is due; returns the seconds until the next one.
  double RetryRestarts();

  LaunchOptions options_;
  // On a single host, planned again once the servers serve (StartWorkers): then it holds
  // their real addresses, and a restart's command line.
  LaunchPlan plan_;
  std::string bin_dir_;
  std::vector<Child> children_;      // one per plan_.processes entry; never resized
  std::unique_ptr<Child> exporter_;  // set once the exporter has been started
  RunRecord run_;                    // what report.h reads: points into the members above
  std::optional<RunReport> report_;  // set by Finish()
  Phase phase_ = Phase::kRunning;
  bool started_ = false;
  bool interrupted_ = false;
  bool output_broken_ = false;  // output_fd closed by the reader: keep only the log files
  std::string failure_;         // the first failure, as told to the user
  bool failure_is_bad_usage_ = false;  // it was a process's exit status 2: so is the run's
  double stop_deadline_ = 0.0;  // seconds on the steady clock
  bool group_killed_ = false;   // SIGKILL already sent to the group being stopped
  bool chief_succeeded_ = false;
  double started_at_ = 0.0;     // steady-clock seconds when every process had been started
                                // (0 until then)
  double next_ready_read_ = 0.0;  // steady-clock seconds: CollectReadyFiles' next reading
  struct FaultState {
    bool killed = false;
    bool restarted = false;
    double killed_at = 0.0;
  };
  std::vector<FaultState> fault_states_;  // one per options_.faults entry
};

}  // namespace parasync::launch
