// What parasync-launch is asked to do: LaunchOptions (every flag, parsed), the parsers of
// its structured flags (--kill, --ps/-H placements) and ValidateOptions, the one place that
// decides whether a set of options can be run. Pure functions on values; no I/O, so any
// thread may call them.
#pragma once

#include <unistd.h>

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace parasync::launch {

// In multi-host mode, metrics ports start this far above --port-base.
inline constexpr int kMetricsPortOffset = 500;

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
  std::optional<std::string> eval_every;  // worker --eval-every N|Ns
  std::optional<std::string> log_every;  // worker --log-every SECONDS
  std::optional<std::string> wire_dtype;
  std::optional<std::string> topk_probe;  // worker --topk-probe on|off
  std::optional<std::string> delta_pulls;  // worker --delta-pulls on|off
  bool checkpoint_each_epoch = false;  // passed to workers as --checkpoint-each-epoch
  // Local aggregation (sync modes): the workers of each host with several get --local-group
  // (PARASYNC_LOCAL_GROUP) naming that host's ranks: they exchange each step through the
  // lowest, one push and one pull per host.
  bool local_aggregation = false;

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
  // Set: every worker runs this shell command (the user's own program, e.g. "python3
  // train.py") instead of <bin_dir>/parasync-worker, as /bin/sh -c 'exec COMMAND ARGS', where
  // ARGS are worker_args and its rank_args, shell-quoted. The cluster and the run's settings
  // come in its environment instead of flags (plan.h's ProcessSpec::env). Blank: invalid.
  std::optional<std::string> worker_command;
  // What a --worker-command worker gets as PYTHONPATH: set by Launcher::Create
  // (WorkerPythonPath). Empty: the launcher's own, unchanged.
  std::string worker_python_path;
  // OMP_NUM_THREADS is in the launcher's environment (set by Launcher::Create): the workers
  // inherit it. Unset, a --worker-command worker that shares its host with other workers
  // gets OMP_NUM_THREADS=1, as torchrun gives its processes.
  bool omp_threads_given = false;
  // Multi-host: where the processes run (--ps h:n,... and -H h:n,...). Empty: all on
  // `host`, each server on a free port of its own choosing (port 0, told back in its ready
  // file: plan.h's SingleHostPorts). Given, num_ps/num_workers are their sums, ports are
  // port_base, port_base+1, ... per host (service ports, then metrics ports from
  // port_base + kMetricsPortOffset), and processes on hosts other than localhost are
  // started with `ssh_command HOST REMOTE-COMMAND`, running the binaries of remote_bin_dir.
  std::vector<HostSlots> ps_placement;
  std::vector<HostSlots> worker_placement;
  // Each PS also listens on a unix socket (SocketPath) and the parasync-worker workers
  // on its host reach it there instead of over TCP (--ipc; on by default with --ps
  // colocated).
  bool local_ipc = false;
  // With local_ipc: the directory of the run's sockets on every host (NewSocketDir, chosen
  // once by Launcher::Create; the servers make it, private to their user).
  std::string socket_dir;
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

  // The end of a run. By default the chief, after its last epoch, waits up to
  // finish_timeout seconds for the other workers to finish theirs before its final
  // evaluation (it gets --wait-for-workers finish_timeout), and the launcher lets them exit
  // by themselves; workers still running kWorkerExitSeconds after the chief exited are
  // stopped. stop_workers_with_chief: no wait; the others are stopped as soon as the chief
  // exits, cutting their last epoch.
  double finish_timeout = 300.0;
  bool stop_workers_with_chief = false;

  std::string bin_dir;  // empty: the directory of the running executable
  double grace_seconds = 10.0;
  std::string host = "127.0.0.1";

  // Where forwarded lines and the launcher's own messages go.
  int output_fd = STDOUT_FILENO;
  // How the launcher was invoked (its argv), recorded in summary.json; may be empty.
  std::vector<std::string> command_line;
};

// True when --ps or -H placed processes on hosts (multi-host mode).
bool IsMultiHost(const LaunchOptions& options);

// LaunchOptions::ssh_command split into words (no quoting: --ssh-command takes plain words).
std::vector<std::string> SshCommandWords(const LaunchOptions& options);

// Returns true for "async", "sync" and "ssp:<K>", 0 <= K <= 1000000 (TrainingMode::Parse).
bool IsValidMode(std::string_view mode);

// Returns OK when counts, epochs, mode, host and grace period are acceptable; otherwise an
// InvalidArgument status whose message is one line naming the bad flag.
Status ValidateOptions(const LaunchOptions& options);

}  // namespace parasync::launch
