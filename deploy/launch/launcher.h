// Launcher: starts a local parasync cluster (parameter servers, then workers) as child
// processes, forwards their output, and stops every one of them when the run ends.
//
// Use: Launcher::Create(options) validates the options, finds the binaries, reserves free
// ports and builds the plan (no process is started); Start() spawns the processes;
// Supervise() forwards output until the chief worker finishes, a process fails or the
// launcher is told to stop, then stops and reaps every child and returns the exit code;
// Summary() tells the user where the results are.
//
// Thread safety: a Launcher is used from one thread. Start() installs process-wide handlers
// for SIGINT, SIGTERM, SIGHUP and SIGCHLD and ignores SIGPIPE, so at most one Launcher may be
// started per process. Only PIDs this Launcher started are ever signalled or waited for.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace parasync::launch {

// Exit codes of parasync-launch.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;       // a process failed or did not stop in time
inline constexpr int kExitUsage = 2;        // bad flags, missing binaries
inline constexpr int kExitInterrupted = 130;  // SIGINT/SIGTERM/SIGHUP to the launcher

inline constexpr std::string_view kPsBinary = "parasync-ps";
inline constexpr std::string_view kWorkerBinary = "parasync-worker";

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
  std::optional<std::string> model;
  std::optional<std::string> seed;
  std::optional<std::string> max_steps;

  // Mode settings passed to every PS only when set.
  std::optional<std::string> replicas_to_aggregate;
  std::optional<std::string> worker_timeout;

  std::vector<std::string> ps_args;      // appended verbatim to every PS command line
  std::vector<std::string> worker_args;  // appended verbatim to every worker command line

  std::string bin_dir;  // empty: the directory of the running executable
  double grace_seconds = 10.0;
  std::string host = "127.0.0.1";

  // Where forwarded lines and the launcher's own messages go.
  int output_fd = STDOUT_FILENO;
};

enum class Role { kPs, kWorker };

// One process of the cluster, fully resolved.
struct ProcessSpec {
  Role role = Role::kPs;
  int index = 0;
  std::string name;      // "ps0", "worker1": the output prefix and the log file's stem
  std::string address;   // host:port in the cluster spec
  int metrics_port = 0;
  std::vector<std::string> argv;  // argv[0] is the absolute path of the binary
  std::string log_path;           // <log_dir>/<name>.log, written by the launcher
};

struct LaunchPlan {
  std::string log_dir;  // absolute
  std::string host;
  std::string mode;
  std::vector<ProcessSpec> processes;  // every PS (by index), then every worker (by index)
};

// Returns true for "async", "sync" and "ssp:<non-negative integer>".
bool IsValidMode(std::string_view mode);

// Returns OK when counts, epochs, mode, host and grace period are acceptable; otherwise an
// InvalidArgument status whose message is one line naming the bad flag.
Status ValidateOptions(const LaunchOptions& options);

// Returns the directory holding the running executable (from /proc/self/exe), or an
// Internal status.
Result<std::string> ExecutableDir();

// Returns "runs/<YYYYmmdd-HHMMSS>" for the current local time.
std::string DefaultLogDir();

// Returns OK when <bin_dir>/parasync-ps and <bin_dir>/parasync-worker exist and are
// executable, else NotFound naming what is missing.
Status CheckBinaries(const std::string& bin_dir);

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

  // Creates the log directory, installs the signal handlers, releases the reserved ports
  // and starts every PS, then every worker, then writes <log_dir>/cluster.json. On error
  // the processes already started are killed and reaped, and the status says what failed.
  // Call once.
  Status Start();

  // Blocks: forwards every child's output line by line (prefixed on output_fd, raw to
  // <log_dir>/<name>.log) until worker 0 exits 0, any process fails, or the launcher gets
  // SIGINT/SIGTERM/SIGHUP; then stops the remaining workers and then the PS processes
  // (SIGTERM, up to grace_seconds, then SIGKILL) and reaps them all. Returns kExitOk when
  // every process exited 0, kExitInterrupted when stopped by a signal, else kExitFailed.
  // Precondition: Start() returned OK. Call once.
  int Supervise();

  // Returns the end-of-run text: the final test accuracy from <log_dir>/eval.jsonl (or
  // that it is missing), the log files, the metrics endpoints and the .prom files.
  std::string Summary() const;

 private:
  struct Child;
  enum class Phase { kRunning, kStoppingWorkers, kStoppingPs, kDone };

  Launcher(LaunchOptions options, LaunchPlan plan, PortReservation ports);

  Status SpawnOne(Child& child);
  Status WriteClusterJson() const;
  void ReadOutput(Child& child, bool drain);
  void EmitLine(Child& child, std::string_view line);
  void FlushPartial(Child& child);
  void CloseOutput(Child& child);
  void ReapExited();
  void OnExit(Child& child, int wait_status);
  void BeginStopping(Phase phase);
  void SignalGroup(Role role, int signal_number);
  void KillAllNow();
  bool GroupRunning(Role role) const;
  void Message(std::string_view text);
  void WriteOut(std::string_view text);
  int ComputeExitCode();

  LaunchOptions options_;
  LaunchPlan plan_;
  PortReservation ports_;
  std::vector<Child> children_;
  Phase phase_ = Phase::kRunning;
  bool started_ = false;
  bool interrupted_ = false;
  bool output_broken_ = false;  // output_fd closed by the reader: keep only the log files
  std::string failure_;         // the first failure, as told to the user
  double stop_deadline_ = 0.0;  // seconds on the steady clock
  bool group_killed_ = false;   // SIGKILL already sent to the group being stopped
};

}  // namespace parasync::launch
