// Launcher: starts a local parasync cluster (parameter servers, then workers) as child
// processes, forwards their output, and stops every one of them when the run ends.
//
// Use: Launcher::Create(options) validates the options, finds the binaries, reserves free
// ports and builds the plan (no process is started); Start() spawns the processes;
// Supervise() forwards output until the chief worker finishes, a process fails or the
// launcher is told to stop, then stops and reaps every child (exporting the model first when
// asked to) and returns the exit code; Summary() tells the user where the results are.
//
// Thread safety: a Launcher is used from one thread. Start() installs process-wide handlers
// for SIGINT, SIGTERM, SIGHUP and SIGCHLD and ignores SIGPIPE, so at most one Launcher may be
// started per process. Only PIDs this Launcher started are ever signalled or waited for.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace parasync::launch {

// Exit codes of parasync-launch.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;       // a process failed or did not stop in time
// Bad flags, missing binaries or data, a port in use, a foreign --state-dir (found before
// anything starts), or a process that exited 2 itself (it refused its flags, data or state).
inline constexpr int kExitUsage = 2;
inline constexpr int kExitInterrupted = 130;  // SIGINT/SIGTERM/SIGHUP to the launcher

inline constexpr std::string_view kPsBinary = "parasync-ps";
inline constexpr std::string_view kWorkerBinary = "parasync-worker";
inline constexpr std::string_view kExportBinary = "parasync-export";

// Set to "1" in the environment of every process the launcher starts (on other hosts too):
// the launcher prefixes their lines with their name, so they need not print it themselves.
inline constexpr std::string_view kLogPrefixedEnv = "PARASYNC_LOG_PREFIXED";

// The run's machine-readable report, beside eval.jsonl in the log directory.
inline constexpr std::string_view kSummaryFile = "summary.json";

// How long parasync-export may run before it is killed and the run counts as failed.
inline constexpr double kExportTimeoutSeconds = 120.0;

// Fault injection (--kill ROLE:INDEX@SECONDS[+RESTART]): kill one process with SIGKILL
// `at_seconds` after the cluster started and, when `restart_after` is set, start it again
// with the same command line that many seconds after the kill (a PS restores its
// --data-dir; a worker registers again).
struct Fault {
  bool ps = false;  // else a worker
  int index = 0;
  double at_seconds = 0.0;
  std::optional<double> restart_after;
};

// Parses "ps:1@20", "worker:2@15.5+3"; InvalidArgument naming the text otherwise.
Result<Fault> ParseFault(std::string_view text);

// Multi-host placement, as horovodrun's -H: "host:count" items.
struct HostSlots {
  std::string host;
  int count = 1;
};

// Parses "h1:2,h2,h3:1" (a host without ":N" gets 1; N >= 1); InvalidArgument naming `flag`.
Result<std::vector<HostSlots>> ParseHostSlots(std::string_view text, std::string_view flag);

// True for hosts the launcher starts processes on directly: localhost, 127.0.0.1, ::1.
// Every other host is reached with LaunchOptions::ssh_command.
bool IsLocalHost(std::string_view host);

// The shell command that runs `argv` on a remote host under ssh: the process gets SIGTERM
// when the launcher closes the connection's stdin (its way to stop a remote process), and
// the command's exit status is the process's. It runs with kLogPrefixedEnv=1.
// The process gets SIGKILL `grace_seconds` after SIGTERM if it is still there.
std::string RemoteCommand(const std::vector<std::string>& argv, double grace_seconds);

// `argv` as one POSIX shell command line (words quoted where needed).
std::string ShellJoin(const std::vector<std::string>& argv);

struct LaunchOptions {
  int num_ps = 2;
  int num_workers = 2;
  std::string mode = "async";  // async | sync | ssp:<int>, passed to every process
  int epochs = 5;
  std::string log_dir;   // empty: ./runs/<YYYYmmdd-HHMMSS>
  std::string data_dir;  // empty: not passed (the worker picks its default)

  // Training flags passed to workers only when set, as "--batch-size N" and so on.
  std::optional<std::string> batch_size;
  std::optional<std::string> lr;
  std::optional<std::string> optimizer;
  std::optional<std::string> lr_schedule;
  std::optional<std::string> model;
  std::optional<std::string> seed;
  std::optional<std::string> max_steps;
  std::optional<std::string> log_every;  // worker --log-every SECONDS
  std::optional<std::string> wire_dtype;
  bool checkpoint_each_epoch = false;  // passed to workers as --checkpoint-each-epoch

  // Non-empty: every PS i gets "--data-dir <ps_data_dir>/ps<i>" (its checkpoint store).
  std::string ps_data_dir;

  // Non-empty: once the chief has finished with status 0 and the other workers are stopped,
  // run "<bin_dir>/parasync-export --ps-hosts ... --out <export_path>" before stopping the
  // parameter servers. Made absolute by Launcher::Create.
  std::string export_path;

  // Mode settings passed to every PS only when set.
  std::optional<std::string> replicas_to_aggregate;
  std::optional<std::string> worker_timeout;

  std::vector<std::string> ps_args;      // appended verbatim to every PS command line
  std::vector<std::string> worker_args;  // appended verbatim to every worker command line
  // Appended verbatim to one worker's command line each, after worker_args: {rank, arg}.
  std::vector<std::pair<int, std::string>> rank_args;
  // Multi-host: where the processes run (--ps h:n,... and -H h:n,...). Empty: all on
  // `host` with loopback-reserved ports. Given, num_ps/num_workers are their sums, ports are
  // port_base, port_base+1, ... per host (service ports, then metrics ports from
  // port_base + kMetricsPortOffset), and processes on hosts other than localhost are
  // started with `ssh_command HOST REMOTE-COMMAND`, running the binaries of remote_bin_dir.
  std::vector<HostSlots> ps_placement;
  std::vector<HostSlots> worker_placement;
  std::string ssh_command = "ssh -o BatchMode=yes -o ConnectTimeout=10";
  std::string remote_bin_dir;  // empty: bin_dir
  int port_base = 29500;
  // CURVE (authentication + encryption): a directory of keys, DIR/ps.key (the servers'),
  // DIR/worker<i>.key, DIR/export.key and DIR/allowed/ (the clients' public keys).
  // Launcher::Create makes whatever is missing (parasync-keygen's format). Processes on
  // other hosts read the same paths (a shared filesystem, or copies). Empty: plain text.
  std::string curve_dir;
  // Processes to kill (and maybe restart) during the run. A killed process is not a
  // failure of the run; the chief (worker 0) cannot be killed, since its end ends the run.
  std::vector<Fault> faults;

  // The Prometheus `job` label of this run in <log_dir>/prometheus-targets.json; empty: the
  // log directory's name (runs/ssp3 -> "ssp3").
  std::string job;
  // After the run, keep every metrics port answering with the process's final snapshot
  // until SIGINT/SIGTERM/SIGHUP (see ServeFinalMetrics).
  bool serve_metrics = false;

  std::string bin_dir;  // empty: the directory of the running executable
  double grace_seconds = 10.0;
  std::string host = "127.0.0.1";

  // Where forwarded lines and the launcher's own messages go.
  int output_fd = STDOUT_FILENO;
  // How the launcher was invoked (its argv), recorded in summary.json; may be empty.
  std::vector<std::string> command_line;
};

enum class Role {
  kPs,
  kWorker,
  kExport,  // parasync-export, run once after training when --export is given
};

// In multi-host mode, metrics ports start this far above --port-base.
inline constexpr int kMetricsPortOffset = 500;

// One process of the cluster, fully resolved.
struct ProcessSpec {
  Role role = Role::kPs;
  int index = 0;
  std::string host;     // where it runs
  bool remote = false;  // started over ssh: `spawn_argv` wraps `argv`
  std::vector<std::string> spawn_argv;  // what the launcher executes (argv when local)
  std::string name;      // "ps0", "worker1": the output prefix and the log file's stem
  std::string address;   // host:port in the cluster spec
  int metrics_port = 0;
  std::vector<std::string> argv;  // argv[0] is the absolute path of the binary
  std::string log_path;           // <log_dir>/<name>.log, written by the launcher
};

struct LaunchPlan {
  std::string log_dir;  // absolute
  std::string host;
  std::string job;           // Prometheus job label
  std::string metrics_bind;  // what every process's /metrics listens on (--metrics-bind)
  std::string mode;
  std::vector<ProcessSpec> processes;  // every PS (by index), then every worker (by index)
  // The exporter (role kExport, name "export"), when options.export_path is set. It runs
  // after training, so it has no port and is not part of `processes`.
  std::optional<ProcessSpec> exporter;
};

// Returns true for "async", "sync" and "ssp:<K>", 0 <= K <= 1000000 (TrainingMode::Parse).
bool IsValidMode(std::string_view mode);

// Returns OK when counts, epochs, mode, host and grace period are acceptable; otherwise an
// InvalidArgument status whose message is one line naming the bad flag.
Status ValidateOptions(const LaunchOptions& options);

// Returns the directory holding the running executable (from /proc/self/exe), or an
// Internal status.
Result<std::string> ExecutableDir();

// The address a process's /metrics should listen on for a cluster on `host`: `host` itself
// when it is an IPv4 address, 127.0.0.1 for "localhost", else 0.0.0.0 (a host name: reachable
// by whoever resolves it).
std::string MetricsBindFor(const std::string& host);

// Makes the CURVE keys of LaunchOptions::curve_dir that are missing for `num_workers`
// workers: ps, worker<i>, export, and allowed/ with every client's public key.
Status EnsureCurveKeys(const std::string& dir, int num_workers);

// Returns "runs/<YYYYmmdd-HHMMSS>" for the current local time.
std::string DefaultLogDir();

// Returns OK when <bin_dir>/parasync-ps and <bin_dir>/parasync-worker (and, with
// `with_export`, <bin_dir>/parasync-export) exist and are executable, else NotFound naming
// what is missing.
Status CheckBinaries(const std::string& bin_dir, bool with_export = false);

// Builds the command lines. `ports` holds, in order, one service port per PS, one cluster
// port per worker, then one metrics port per PS and one per worker: 2 * (num_ps +
// num_workers) in all. `bin_dir` and `log_dir` are used as given. Pure: touches nothing.
// Returns InvalidArgument if the options are invalid or the port count is wrong.
Result<LaunchPlan> BuildPlan(const LaunchOptions& options, const std::string& bin_dir,
                             const std::string& log_dir, const std::vector<int>& ports);

// Holds `count` distinct free TCP ports by keeping a socket bound to each (127.0.0.1, or
// `host` when it is an IPv4 literal) until Release() or destruction. Not thread-safe.
class PortReservation {
 public:
  // Returns the reservation, or Unavailable if sockets could not be bound.
  static Result<PortReservation> Reserve(const std::string& host, int count);

  PortReservation(PortReservation&& other) noexcept;
  PortReservation& operator=(PortReservation&& other) noexcept;
  PortReservation(const PortReservation&) = delete;
  PortReservation& operator=(const PortReservation&) = delete;
  ~PortReservation();

  const std::vector<int>& ports() const { return ports_; }
  // Closes the sockets so the processes can bind the ports. Idempotent.
  void Release();

 private:
  PortReservation() = default;
  std::vector<int> fds_;
  std::vector<int> ports_;
};

class Launcher {
 public:
  // Validates `options` (InvalidArgument), resolves the binary directory and checks the
  // binaries (NotFound), reserves ports (Unavailable) and builds the plan. Starts nothing
  // and creates no files.
  static Result<std::unique_ptr<Launcher>> Create(const LaunchOptions& options);

  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;
  // Kills (SIGKILL) and reaps any child still running, e.g. after a failed Start().
  ~Launcher();

  const LaunchPlan& plan() const { return plan_; }

  // Creates the log directory (and the --export file's directory), installs the signal
  // handlers, releases the reserved ports and starts every PS, then every worker, then writes
  // <log_dir>/cluster.json. On error the processes already started are killed and reaped,
  // and the status says what failed (and, when the log directory exists, summary.json says
  // so too). Call once.
  Status Start();

  // Blocks: forwards every child's output line by line (prefixed on output_fd, raw to
  // <log_dir>/<name>.log) until worker 0 exits 0, any process fails, or the launcher gets
  // SIGINT/SIGTERM/SIGHUP; then stops the remaining workers and then the PS processes
  // (SIGTERM, up to grace_seconds, then SIGKILL) and reaps them all. With an export path,
  // when worker 0 exited 0 and nothing failed or interrupted the run, parasync-export runs
  // between the two (output prefixed [export], up to kExportTimeoutSeconds). Then writes
  // <log_dir>/summary.json (a failure to write it is reported, not fatal). Returns kExitOk
  // when every process (the exporter included) exited 0, kExitInterrupted when stopped by a
  // signal, kExitUsage when the first process to fail exited with status 2, else kExitFailed.
  // Precondition: Start() returned OK. Call once.
  int Supervise();

  // After Supervise(): serves each process's final metrics snapshot
  // (<log_dir>/metrics-<name>.prom) on the port the process used, until the launcher gets
  // SIGINT, SIGTERM or SIGHUP, so Prometheus keeps the final values and no target goes down.
  // A process that wrote no snapshot (killed) leaves its port closed. Returns Unavailable
  // when no port could be served. Precondition: Supervise() returned.
  Status ServeFinalMetrics();

  // Preflight (parasync-launch --check): runs every planned process's command with --check
  // (over ssh for remote hosts, at most `timeout_seconds` each) and returns one line per
  // problem: a host that cannot be reached, a port in use or an address not on its host,
  // missing data, or a binary whose version, protocol or schema differs from this
  // launcher's. Empty: all clear. Call instead of Start().
  std::vector<std::string> Preflight(double timeout_seconds = 30.0);

  // Returns the end-of-run text: the final test accuracy from the rows this run appended to
  // <log_dir>/eval.jsonl (or that there are none), the run's wall time and examples/sec,
  // the exported model file (or why there is none) when one was asked for, and the files
  // and endpoints the run left (only those that exist). Precondition: Supervise() returned.
  std::string Summary() const;

 private:
  struct Child;
  struct Report;
  enum class Phase { kRunning, kStoppingWorkers, kExporting, kStoppingPs, kDone };

  Launcher(LaunchOptions options, LaunchPlan plan, PortReservation ports);

  Status SpawnOne(Child& child);
  Status WriteClusterJson() const;
  Status WritePrometheusTargets() const;
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
  // After the workers are stopped: starts the exporter when it should run (else goes on to
  // stopping the PS processes).
  void AfterWorkersStopped();
  void OnExportExit(int wait_status);
  void SignalGroup(Role role, int signal_number);
  void KillAllNow();
  bool GroupRunning(Role role) const;
  void Message(std::string_view text);
  void WriteOut(std::string_view text);
  int ComputeExitCode();
  // Records the end of the run, computes report_ and writes summary.json.
  void Finish(int exit_code);
  Report ComputeReport() const;
  Status WriteSummaryJson() const;
  // Kills or restarts what options_.faults asks for by now; returns the seconds until the
  // next such action (or a large number when none is left).
  double InjectFaults();

  LaunchOptions options_;
  LaunchPlan plan_;
  PortReservation ports_;
  std::vector<Child> children_;
  std::unique_ptr<Child> exporter_;  // set once the exporter has been started
  Phase phase_ = Phase::kRunning;
  bool started_ = false;
  bool interrupted_ = false;
  bool output_broken_ = false;  // output_fd closed by the reader: keep only the log files
  std::string failure_;         // the first failure, as told to the user
  bool failure_is_bad_usage_ = false;  // it was a process's exit status 2: so is the run's
  double stop_deadline_ = 0.0;  // seconds on the steady clock
  bool group_killed_ = false;   // SIGKILL already sent to the group being stopped
  bool chief_succeeded_ = false;
  std::string export_outcome_;  // for Summary(): where the model is, or why it is not there
  double started_at_ = 0.0;     // steady-clock seconds when every process had been started
  // The run as summary.json tells it: from Start() to the last process reaped.
  double run_start_ = 0.0;           // steady-clock seconds
  double run_end_ = 0.0;
  double run_start_unix_ = 0.0;      // wall-clock (Unix) seconds
  double run_end_unix_ = 0.0;
  uintmax_t eval_offset_ = 0;        // size of eval.jsonl before the run: later rows are its own
  int exit_code_ = -1;               // set by Finish()
  std::string end_reason_;           // why the run failed, as ComputeExitCode told it
  std::unique_ptr<Report> report_;   // set by Finish()
  struct FaultState {
    bool killed = false;
    bool restarted = false;
    double killed_at = 0.0;
  };
  std::vector<FaultState> fault_states_;  // one per options_.faults entry
};

}  // namespace parasync::launch
