// The plan of a run: which processes run where, with which command lines (over ssh for
// other hosts), on which ports. BuildPlan is pure; the helpers around it resolve what the
// plan needs from this machine (binaries, paths, CURVE keys). Nothing here starts a process.
// Functions may be called from any thread.
//
// Ports: a multi-host run has fixed ones (--port-base: PortBasePorts). A single-host run
// picks none in advance (SingleHostPorts): every server is told port 0, binds a free one and
// says which in its ready file (common/ready_file.h), and the launcher then plans again with
// the ports the servers bound before it starts the workers.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "deploy/launch/options.h"

namespace parasync::launch {

inline constexpr std::string_view kPsBinary = "parasync-ps";
inline constexpr std::string_view kWorkerBinary = "parasync-worker";
inline constexpr std::string_view kExportBinary = "parasync-export";

// Set to "1" in the environment of every process the launcher starts (on other hosts too):
// the launcher prefixes their lines with their name, so they need not print it themselves.
inline constexpr std::string_view kLogPrefixedEnv = "PARASYNC_LOG_PREFIXED";

// What a process the launcher starts gets on top of the launcher's environment (here, or on
// another host): `env` ("NAME=value", ProcessSpec::env) and kLogPrefixedEnv=1 unless `env`
// sets it.
std::vector<std::string> ChildEnvironment(const std::vector<std::string>& env);

// The shell command that runs `argv` on a remote host under ssh, with ChildEnvironment(env)
// set: the process gets SIGTERM when the launcher closes the connection's stdin (its way to
// stop a remote process), and the command's exit status is the process's. The process gets
// SIGKILL `grace_seconds` after SIGTERM if it is still there.
std::string RemoteCommand(const std::vector<std::string>& argv, double grace_seconds,
                          const std::vector<std::string>& env = {});

// `argv` as one POSIX shell command line (words quoted where needed).
std::string ShellJoin(const std::vector<std::string>& argv);

// The command that runs the shell command `command` on `host` over LaunchOptions::ssh_command:
// its words, then the host, then the command as one word.
std::vector<std::string> SshArgv(const LaunchOptions& options, const std::string& host,
                                 std::string command);

enum class Role {
  kPs,
  kWorker,
  kExport,  // parasync-export, run once after training when --export is given
};

// One process of the cluster, fully resolved.
struct ProcessSpec {
  Role role = Role::kPs;
  int index = 0;
  std::string host;     // where it runs
  bool remote = false;  // started over ssh: `spawn_argv` wraps `argv` (and `env`)
  std::vector<std::string> spawn_argv;  // what the launcher executes (argv when local)
  std::string name;      // "ps0", "worker1": the output prefix and the log file's stem
  // host:port in the cluster spec. A PS's port 0: it binds a free one (its ready file says
  // which). A worker binds nothing: its address only names it.
  std::string address;
  int metrics_port = 0;  // what its --metrics-port (or PARASYNC_METRICS_PORT) says; 0: any
  // <log_dir>/<name>.ready, where it writes the ports it bound (--ready-file, or
  // PARASYNC_READY_FILE for a user_command worker); empty in a multi-host run (fixed ports).
  std::string ready_path;
  // argv[0] is the absolute path of the binary; for a user_command worker, /bin/sh, which
  // execs the user's program (so the pid the launcher signals becomes the program's).
  std::vector<std::string> argv;
  // "NAME=value" set on top of the launcher's environment (ChildEnvironment adds
  // kLogPrefixedEnv): a user_command worker's cluster and settings (docs/worker-environment.md);
  // empty for our binaries, which get flags.
  std::vector<std::string> env;
  bool user_command = false;  // a worker running LaunchOptions::worker_command
  std::string log_path;       // <log_dir>/<name>.log, written by the launcher
};

// `spec` (a worker) started again by fault injection for the `restart`th time (1, 2, ...):
// it gets PARASYNC_RESTART=<restart> on top of its variables (a parasync.horovod script then
// rejoins the running job, parasync.horovod.elastic), over ssh too.
void MarkRestart(const LaunchOptions& options, ProcessSpec& spec, int restart);

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

// Returns OK when <bin_dir>/parasync-ps, <bin_dir>/parasync-worker (unless `with_worker` is
// false: the workers run --worker-command) and, with `with_export`, <bin_dir>/parasync-export
// exist and are executable, else NotFound naming what is missing.
Status CheckBinaries(const std::string& bin_dir, bool with_export = false,
                     bool with_worker = true);

// The PYTHONPATH of a --worker-command worker: <bin_dir>/../python (normalized) when it holds
// the parasync package (a build puts it there), else <bin_dir>/../lib/python3/dist-packages
// when that does (cmake --install's layout), then `inherited` (the launcher's own PYTHONPATH;
// may be null or empty). Reads the filesystem.
std::string WorkerPythonPath(const std::string& bin_dir, const char* inherited);

// A new directory for a run's unix sockets (LaunchOptions::local_ipc): /tmp/parasync-<16 hex
// digits from the system's random source>. No other user can guess the name, so none can
// make that directory first; each server makes it, mode 0700, where it does not exist
// (parasync-ps --ipc), and the last to stop removes it. A path is never reused by another run.
std::string NewSocketDir();

// The unix socket PS `shard` listens on in `socket_dir`: <socket_dir>/ps<shard>.sock, unique
// per shard, so also where several emulated hosts share one file system (tools/netlab).
std::string SocketPath(const std::string& socket_dir, int shard);

// `spec`'s command as one shell command line, as --dry-run prints it: its `env` as NAME=value
// words, then spawn_argv (a remote process's env is inside its ssh command already).
std::string DisplayCommand(const ProcessSpec& spec);

// Builds the command lines (and, with --worker-command, the workers' environments).
// `ports` holds, in order, one service port per PS, one cluster port per worker, then one
// metrics port per PS and one per worker: 2 * (num_ps + num_workers) in all. A PS service
// port or a metrics port may be 0: that process binds a free port. Workers need their
// servers' real ports: a plan whose servers have port 0 can start only its servers (and
// print itself). In a single-host run every process gets --ready-file <log_dir>/<name>.ready
// (a --worker-command worker PARASYNC_READY_FILE). `bin_dir` and `log_dir` are used as given.
// Pure: touches nothing (a single-host --ipc socket is named after this process's pid).
// Returns InvalidArgument if the options are invalid or the port count is wrong.
Result<LaunchPlan> BuildPlan(const LaunchOptions& options, const std::string& bin_dir,
                             const std::string& log_dir, const std::vector<int>& ports);

// Single host: the ports of every process, as BuildPlan takes them, picked by nobody in
// advance: every PS service port and every metrics port 0 (each process binds a free one
// and tells it in its ready file), worker i's cluster port 1 + i (a worker binds nothing:
// its address only names it, and must differ from the others').
std::vector<int> SingleHostPorts(const LaunchOptions& options);

// Multi-host: the ports of every process, as BuildPlan takes them, fixed from --port-base
// and counted per host (the processes on other hosts cannot tell the launcher which ports
// they bound; --check tells whether these are free).
std::vector<int> PortBasePorts(const LaunchOptions& options);

// Makes options->export_path and options->curve_dir absolute (InvalidArgument when --export
// names no file: checked now, not after the training it would otherwise waste), and
// options->data_dir too with --worker-command (PARASYNC_DATA is absolute: the user's program
// may change directory), and returns the absolute log directory (--log-dir or
// DefaultLogDir()), without a trailing '/'.
Result<std::string> ResolvePaths(LaunchOptions* options);

}  // namespace parasync::launch
