#include "deploy/launch/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <utility>

#include "common/address.h"
#include "common/file_util.h"
#include "common/metrics.h"
#include "common/ready_file.h"
#include "common/subprocess.h"
#include "deploy/launch/preflight.h"
#include "deploy/launch/snapshot_server.h"

namespace parasync::launch {

namespace {

constexpr size_t kReadChunk = 64 * 1024;
// A "line" longer than this without a newline is forwarded in pieces.
constexpr size_t kMaxLineBytes = 64 * 1024;
constexpr int kMaxDrainReads = 64;

// The self-pipe: the signal handler only writes the signal number into it.
int g_signal_pipe[2] = {-1, -1};
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP};

void OnSignal(int signal_number) {
  const int saved_errno = errno;
  const auto byte = static_cast<unsigned char>(signal_number);
  [[maybe_unused]] ssize_t n = write(g_signal_pipe[1], &byte, 1);
  errno = saved_errno;
}

Status InstallSignalHandlers() {
  if (g_signal_pipe[0] < 0 && pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    return Status::Internal(std::string("pipe2: ") + std::strerror(errno));
  }
  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int signal_number : kStopSignals) {
    if (sigaction(signal_number, &action, nullptr) != 0) {
      return Status::Internal(std::string("sigaction: ") + std::strerror(errno));
    }
  }
  action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  if (sigaction(SIGCHLD, &action, nullptr) != 0) {
    return Status::Internal(std::string("sigaction: ") + std::strerror(errno));
  }
  // A closed reader of our stdout must not kill the launcher and orphan the cluster.
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGPIPE, &ignore, nullptr);
  return Status::Ok();
}

}  // namespace

struct Launcher::Child : ProcessRecord {
  std::string prefix;  // "[ps0] "
  int out_fd = -1;     // read end of the child's stdout+stderr pipe
  int log_fd = -1;
  std::string partial;  // bytes after the last newline
  int in_fd = -1;  // remote: write end of ssh's stdin; closing it stops the process
  std::string last_line;  // the last line it printed: why, when it refused to start
  // A single-host server started (or restarted) and not yet serving: the run waits for its
  // ready file until ready_deadline (steady-clock seconds).
  bool awaiting_ready = false;
  double ready_deadline = 0.0;
  bool restarting = false;  // that start is a restart: a port in use is tried again
  int start_tries = 0;      // starts of this restart so far
  double retry_at = 0.0;    // when to try it again (0: no try pending)
  bool ready_unreadable = false;  // its ready file was not one: said once, not read again
};

Result<std::unique_ptr<Launcher>> Launcher::Create(const LaunchOptions& given) {
  PARASYNC_RETURN_IF_ERROR(ValidateOptions(given));
  LaunchOptions options = given;
  std::string bin_dir = options.bin_dir;
  if (bin_dir.empty()) {
    PARASYNC_ASSIGN_OR_RETURN(bin_dir, ExecutableDir());
  }
  PARASYNC_RETURN_IF_ERROR(
      CheckBinaries(bin_dir, !options.export_path.empty(), !options.worker_command.has_value()));
  PARASYNC_ASSIGN_OR_RETURN(const std::string log_dir, ResolvePaths(&options));
  if (options.local_ipc && options.socket_dir.empty()) options.socket_dir = NewSocketDir();
  if (options.worker_command) {
    options.worker_python_path = WorkerPythonPath(bin_dir, std::getenv("PYTHONPATH"));
    options.omp_threads_given = std::getenv("OMP_NUM_THREADS") != nullptr;
  }

  // Multi-host: fixed ports from --port-base. Single host: the servers pick theirs (port 0).
  const std::vector<int> ports =
      IsMultiHost(options) ? PortBasePorts(options) : SingleHostPorts(options);
  PARASYNC_ASSIGN_OR_RETURN(LaunchPlan plan, BuildPlan(options, bin_dir, log_dir, ports));
  return std::unique_ptr<Launcher>(new Launcher(options, std::move(plan), bin_dir));
}

Launcher::Launcher(LaunchOptions options, LaunchPlan plan, std::string bin_dir)
    : options_(std::move(options)), plan_(std::move(plan)), bin_dir_(std::move(bin_dir)) {
  const bool multi_host = IsMultiHost(options_);
  for (const ProcessSpec& spec : plan_.processes) {
    Child child;
    child.spec = spec;
    child.prefix = multi_host ? "[" + spec.host + " " + spec.name + "] " : "[" + spec.name + "] ";
    children_.push_back(std::move(child));
  }
  run_.options = &options_;
  run_.plan = &plan_;
  for (const Child& child : children_) run_.processes.push_back(&child);
}

std::vector<std::string> Launcher::Preflight(double timeout_seconds) {
  if (IsMultiHost(options_)) return ClusterPreflight(options_, plan_, timeout_seconds);
  // The servers are told port 0: nothing of theirs to check but what the user gave. A worker
  // refuses a server port 0 in --ps-hosts, so the workers' checks name placeholder ports
  // (as their own addresses do): --check binds none of them and connects to none.
  std::vector<int> ports = SingleHostPorts(options_);
  for (int i = 0; i < options_.num_ps; ++i) ports[static_cast<size_t>(i)] = 1 + i;
  Result<LaunchPlan> placeholders = BuildPlan(options_, bin_dir_, plan_.log_dir, ports);
  if (!placeholders.ok()) return {placeholders.status().message()};
  LaunchPlan check = plan_;
  for (size_t slot = static_cast<size_t>(options_.num_ps); slot < check.processes.size(); ++slot) {
    check.processes[slot] = placeholders->processes[slot];
  }
  return ClusterPreflight(options_, check, timeout_seconds);
}

Status Launcher::Start() {
  if (started_) return Status::FailedPrecondition("Launcher::Start called twice");
  started_ = true;

  std::error_code ec;
  std::filesystem::create_directories(plan_.log_dir, ec);
  if (ec) return PathError("cannot create log directory " + plan_.log_dir, ec);
  run_.start = NowSeconds();
  run_.start_unix = UnixSeconds();
  // eval.jsonl is appended to, run after run: this run's rows are those after this offset.
  run_.eval_offset = std::filesystem::file_size(plan_.log_dir + "/eval.jsonl", ec);
  if (ec) run_.eval_offset = 0;
  // An earlier run's summary must not pass for this one's should this launcher be killed.
  std::filesystem::remove(plan_.log_dir + "/" + std::string(kSummaryFile), ec);
  // From here on a failure is this run's end, and summary.json says so.
  if (Status prepared = PrepareFiles(); !prepared.ok()) return Fail(prepared);
  if (Status installed = InstallSignalHandlers(); !installed.ok()) return Fail(installed);

  Message("starting " + std::to_string(options_.num_ps) + " ps and " +
          std::to_string(options_.num_workers) + " workers, mode " + plan_.mode +
          ", logs in " + plan_.log_dir);
  if (Status spawned = SpawnAll(); !spawned.ok()) return Fail(spawned);
  // A single host's workers start once the servers serve (Supervise: StartWorkers).
  if (phase_ == Phase::kRunning) OnAllStarted();
  return Status::Ok();
}

void Launcher::OnAllStarted() {
  started_at_ = NowSeconds();
  fault_states_.assign(options_.faults.size(), FaultState{});
  WriteRunFiles();
  Message("Prometheus targets (job \"" + plan_.job + "\"): " + plan_.log_dir +
          "/prometheus-targets.json; watch the run: tools/watch-run.sh " + plan_.log_dir);
}

void Launcher::WriteRunFiles() {
  if (started_at_ <= 0) return;  // not every process has been started yet
  Status written = WriteClusterJson(run_);
  if (!written.ok()) Message("warning: " + written.ToString());
  written = WritePrometheusTargets(run_);
  if (!written.ok()) Message("warning: " + written.ToString());
}

Status Launcher::Fail(Status status) {
  run_.end_reason = status.message();
  Finish(kExitFailed);
  return status;
}

Status Launcher::PrepareFiles() {
  std::error_code ec;
  if (plan_.exporter) {
    // The model often goes next to the logs, e.g. <log_dir>/model.psm.
    const std::string dir = std::filesystem::path(options_.export_path).parent_path().string();
    std::filesystem::create_directories(dir, ec);
    if (ec) return PathError("cannot create " + dir + " for --export", ec);
  }
  for (const Child& child : children_) {
    // A snapshot left by an earlier run in this directory must never pass for this run's
    // (ServeFinalMetrics serves what is there at the end).
    const std::string snapshot = MetricsSnapshotPath(plan_.log_dir, child.spec.name);
    std::filesystem::remove(snapshot, ec);
    std::filesystem::remove(snapshot + ".tmp", ec);
  }
  for (Child& child : children_) {
    child.log_fd = open(child.spec.log_path.c_str(),
                        O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (child.log_fd < 0) {
      return Status::Unavailable("cannot open " + child.spec.log_path + ": " +
                                 std::strerror(errno));
    }
  }
  return Status::Ok();
}

Status Launcher::SpawnAll() {
  // A single host's servers bind ports of their own choosing: the workers wait for them.
  const bool servers_first = !IsMultiHost(options_);
  std::map<std::string, int> ssh_started;
  for (Child& child : children_) {
    if (servers_first && child.spec.role != Role::kPs) continue;
    // sshd refuses connections beyond ~10 unauthenticated at once (MaxStartups 10:30:100):
    // past 8 to one host, leave each some time to authenticate.
    if (child.spec.remote && ++ssh_started[child.spec.host] > 8) usleep(150000);
    Status status = SpawnOne(child);
    if (!status.ok()) {
      KillAllNow();
      for (Child& other : children_) {
        if (!other.running) continue;
        int wait_status = 0;
        while (waitpid(other.pid, &wait_status, 0) < 0 && errno == EINTR) {
        }
        other.running = false;
        other.wait_status = wait_status;
      }
      return status;
    }
    AnnounceStart(child);
  }
  if (servers_first) phase_ = Phase::kStartingServers;
  return Status::Ok();
}

void Launcher::AnnounceStart(Child& child) {
  if (!child.spec.ready_path.empty()) {  // its ports come in its ready file
    Message(child.spec.name + " started as pid " + std::to_string(child.pid));
    return;
  }
  // Fixed ports: what the plan says is what it binds.
  child.bound_address = child.spec.role == Role::kPs ? child.spec.address : "";
  child.bound_metrics_port = child.spec.metrics_port;
  Message(child.spec.name + " pid " + std::to_string(child.pid) + " at " + child.spec.address +
          ", metrics " + MetricsUrl(child));
}

Launcher::~Launcher() {
  if (exporter_ != nullptr && exporter_->running) {
    kill(exporter_->pid, SIGKILL);
    while (waitpid(exporter_->pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    exporter_->running = false;
  }
  if (exporter_ != nullptr) {
    CloseOutput(*exporter_);
    if (exporter_->log_fd >= 0) close(exporter_->log_fd);
    exporter_->log_fd = -1;
  }
  for (Child& child : children_) {
    if (child.running) kill(child.pid, SIGKILL);
  }
  for (Child& child : children_) {
    if (child.running) {
      int wait_status = 0;
      while (waitpid(child.pid, &wait_status, 0) < 0 && errno == EINTR) {
      }
      child.running = false;
    }
    CloseOutput(child);
    if (child.log_fd >= 0) close(child.log_fd);
    child.log_fd = -1;
  }
  if (!options_.socket_dir.empty() && !IsMultiHost(options_)) {
    // The run's own directory (NewSocketDir): what a killed server left in it goes too.
    std::error_code ignored;
    std::filesystem::remove_all(options_.socket_dir, ignored);
  }
}

Status Launcher::SpawnOne(Child& child) {
  const std::vector<std::string>& command =
      child.spec.spawn_argv.empty() ? child.spec.argv : child.spec.spawn_argv;
  if (!child.spec.ready_path.empty()) {
    // An earlier run's (or incarnation's) file must not pass for this one's: our binaries
    // remove it themselves, a --worker-command program may not (the pid tells them apart too).
    std::error_code ec;
    std::filesystem::remove(child.spec.ready_path, ec);
  }
  SpawnOptions spawn;
  spawn.argv = command;
  // Our environment with kLogPrefixedEnv=1 (we prefix the child's lines with its name) and
  // the process's own variables; a restart gets the same. (A remote process's are in its
  // ssh command: ssh passes no environment on.)
  spawn.env_set =
      ChildEnvironment(child.spec.remote ? std::vector<std::string>() : child.spec.env);
  // A remote process's ssh reads a pipe from us: closing it stops the process.
  spawn.in = child.spec.remote ? StreamTarget::Pipe() : StreamTarget::Null();
  spawn.out = StreamTarget::Pipe();
  spawn.err = StreamTarget::Pipe();
  // Not left behind if the launcher itself is killed.
  spawn.parent_death_signal = SIGTERM;
  // ssh dies of a terminal's Ctrl-C; only the launcher may get it, so that the remote
  // process is stopped through its connection, workers first.
  spawn.new_process_group = child.spec.remote;
  spawn.exec_failure_line = "parasync-launch: cannot execute " + command[0];
  Result<Spawned> spawned = Spawn(spawn);
  if (!spawned.ok()) {
    // Worded as before Spawn existed: "fork for ps0: ...".
    const std::string why = spawned.status().message();
    return Status::Internal(why.starts_with("fork: ")
                                ? "fork for " + child.spec.name + ": " + why.substr(6)
                                : why);
  }
  child.in_fd = spawned->stdin_fd;
  child.out_fd = spawned->output_fd;
  fcntl(child.out_fd, F_SETFL, fcntl(child.out_fd, F_GETFL) | O_NONBLOCK);
  child.pid = spawned->pid;
  child.running = true;
  child.last_line.clear();
  if (!child.spec.ready_path.empty()) {
    // Its metrics port is the one its new ready file tells; a server's address stays.
    child.bound_metrics_port = 0;
    child.ready_unreadable = false;
    if (child.spec.role == Role::kPs) {
      child.awaiting_ready = true;
      child.ready_deadline = NowSeconds() + kServerReadySeconds;
    }
  }
  return Status::Ok();
}

Status Launcher::ServeFinalMetrics() {
  std::vector<SnapshotEndpoint> endpoints;
  std::vector<std::string> names;
  for (const Child& child : children_) {
    const std::string path = MetricsSnapshotPath(plan_.log_dir, child.spec.name);
    Result<std::string> text = ReadSnapshotFile(path);
    if (!text.ok()) {
      Message(child.spec.name + " left no final metrics (" + text.status().message() +
              "); its port stays closed");
      continue;
    }
    if (child.bound_metrics_port <= 0) {
      Message(child.spec.name + " never told its metrics port (no ready file); its final "
              "metrics are not served");
      continue;
    }
    endpoints.push_back({plan_.metrics_bind, child.bound_metrics_port, std::move(text).value()});
    names.push_back(child.spec.name);
  }
  if (endpoints.empty()) return Status::Unavailable("no process left a final metrics snapshot");
  std::vector<std::string> skipped;
  PARASYNC_ASSIGN_OR_RETURN(std::unique_ptr<SnapshotServer> server,
                            SnapshotServer::Start(endpoints, &skipped));
  for (const std::string& why : skipped) Message(why);
  std::string where;
  const std::vector<int> bound = server->ports();
  for (size_t i = 0; i < names.size(); ++i) {
    if (bound[i] == 0) continue;
    where += " " + names[i] + " http://" + plan_.host + ":" +
             std::to_string(endpoints[i].port) + "/metrics";
  }
  Message("--metrics: serving the final metrics on the same ports until Ctrl-C:" + where);
  for (;;) {
    // Bytes already in the signal pipe (SIGCHLD of the reaped processes) are not a stop.
    unsigned char signals[64];
    ssize_t n;
    bool stop = false;
    while ((n = read(g_signal_pipe[0], signals, sizeof(signals))) > 0) {
      for (ssize_t i = 0; i < n; ++i) stop |= signals[i] != SIGCHLD;
    }
    if (stop) break;
    server->ServeUntilReadable(g_signal_pipe[0]);
  }
  Message("stopped serving the final metrics");
  return Status::Ok();
}

void Launcher::WriteOut(std::string_view text) {
  if (output_broken_) return;
  const char* data = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t n = write(options_.output_fd, data, left);
    if (n > 0) {
      data += n;
      left -= static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      pollfd writable {options_.output_fd, POLLOUT, 0};
      poll(&writable, 1, 100);
    } else {
      // The reader went away: the log files still get everything.
      output_broken_ = true;
      return;
    }
  }
}

void Launcher::Message(std::string_view text) {
  std::string line = LauncherPrefix();
  line.append(text);
  line.push_back('\n');
  WriteOut(line);
}

void Launcher::EmitLine(Child& child, std::string_view line) {
  child.last_line = line;
  std::string out = child.prefix;
  out.append(line);
  out.push_back('\n');
  WriteOut(out);
  if (child.log_fd >= 0) {
    const char* data = out.data() + child.prefix.size();
    size_t left = out.size() - child.prefix.size();
    while (left > 0) {
      const ssize_t n = write(child.log_fd, data, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      data += n;
      left -= static_cast<size_t>(n);
    }
  }
}

void Launcher::FlushPartial(Child& child) {
  if (child.partial.empty()) return;
  EmitLine(child, child.partial);
  child.partial.clear();
}

void Launcher::CloseOutput(Child& child) {
  if (child.out_fd >= 0) close(child.out_fd);
  child.out_fd = -1;
}

void Launcher::ReadOutput(Child& child, bool drain) {
  char buffer[kReadChunk];
  for (int reads = 0; child.out_fd >= 0 && reads < (drain ? kMaxDrainReads : 1); ++reads) {
    const ssize_t n = read(child.out_fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) {
      --reads;
      continue;
    }
    if (n < 0 && errno == EAGAIN) return;
    if (n <= 0) {  // EOF or a read error: this child has nothing more for us
      FlushPartial(child);
      CloseOutput(child);
      return;
    }
    child.partial.append(buffer, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t newline = child.partial.find('\n'); newline != std::string::npos;
         newline = child.partial.find('\n', start)) {
      std::string_view line(child.partial.data() + start, newline - start);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      EmitLine(child, line);
      start = newline + 1;
    }
    child.partial.erase(0, start);
    while (child.partial.size() >= kMaxLineBytes) {
      EmitLine(child, std::string_view(child.partial).substr(0, kMaxLineBytes));
      child.partial.erase(0, kMaxLineBytes);
    }
  }
}

void Launcher::ReapExited() {
  for (Child& child : children_) {
    int wait_status = 0;
    if (!TryReap(child, &wait_status)) continue;
    // A worker that ended before its ready file was read: what it bound is still worth
    // knowing (its final metrics are served there).
    if (child.spec.role == Role::kWorker && !child.spec.ready_path.empty() &&
        child.bound_metrics_port == 0 && !child.ready_unreadable && ReadReady(child)) {
      WriteRunFiles();
    }
    OnExit(child, wait_status);
  }
  int wait_status = 0;
  if (exporter_ != nullptr && TryReap(*exporter_, &wait_status)) OnExportExit(wait_status);
}

bool Launcher::TryReap(Child& child, int* wait_status_out) {
  if (!child.running) return false;
  int wait_status = 0;
  const pid_t reaped = waitpid(child.pid, &wait_status, WNOHANG);
  if (reaped == 0 || (reaped < 0 && errno == EINTR)) return false;
  if (reaped < 0) {
    // Only possible if someone else reaped our child; count it as a failure.
    Message(child.spec.name + " (pid " + std::to_string(child.pid) +
            ") vanished: " + std::strerror(errno));
    wait_status = 0xff00;  // exit status 255
  }
  // Everything the process wrote is in the pipe now: forward it before reporting.
  ReadOutput(child, /*drain=*/true);
  FlushPartial(child);
  CloseOutput(child);
  if (child.log_fd >= 0) close(child.log_fd);
  child.log_fd = -1;
  if (child.in_fd >= 0) close(child.in_fd);
  child.in_fd = -1;
  child.running = false;
  *wait_status_out = wait_status;
  return true;
}

void Launcher::AfterWorkersStopped() {
  if (!plan_.exporter) {
    BeginStopping(Phase::kStoppingPs);
    return;
  }
  const std::string& path = options_.export_path;
  const std::string skip = ReasonNotToExport();
  if (!skip.empty()) {
    run_.export_outcome = "no model exported to " + path + ": " + skip;
    if (failure_.empty() && !interrupted_) failure_ = run_.export_outcome;
    Message(run_.export_outcome);
    BeginStopping(Phase::kStoppingPs);
    return;
  }
  exporter_ = std::make_unique<Child>();
  run_.exporter = exporter_.get();
  exporter_->spec = *plan_.exporter;
  exporter_->prefix = "[" + exporter_->spec.name + "] ";
  // Without its log file the output is still forwarded.
  exporter_->log_fd = open(exporter_->spec.log_path.c_str(),
                           O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  Message("exporting the model to " + path + " before stopping the parameter servers");
  const Status spawned = SpawnOne(*exporter_);
  if (!spawned.ok()) {
    failure_ = "export failed: " + spawned.message();
    run_.export_outcome = "no model exported to " + path + ": " + spawned.message();
    Message(failure_);
    BeginStopping(Phase::kStoppingPs);
    return;
  }
  phase_ = Phase::kExporting;
  group_killed_ = false;
  stop_deadline_ = NowSeconds() + kExportTimeoutSeconds;
}

std::string Launcher::ReasonNotToExport() const {
  if (interrupted_) return "the run was interrupted";
  if (!failure_.empty()) return "the run failed";
  if (!chief_succeeded_) return "the chief did not finish";
  for (const Child& child : children_) {
    if (child.spec.role == Role::kPs && !child.running) {
      return child.spec.name + " had already exited";
    }
  }
  return "";
}

void Launcher::OnExportExit(int wait_status) {
  exporter_->wait_status = wait_status;
  const std::string& path = options_.export_path;
  if (ExitedZero(wait_status)) {
    run_.export_outcome = "model exported to " + path;
    Message(run_.export_outcome);
    return;
  }
  const std::string how =
      exporter_->killed_after_grace
          ? "did not finish within " + FormatSeconds(kExportTimeoutSeconds) +
                " s and was killed with SIGKILL"
          : "failed with " + DescribeWaitStatus(wait_status) +
                (exporter_->sent_term ? " after SIGTERM" : "");
  const std::string failure = std::string(kExportBinary) + " (pid " +
                              std::to_string(exporter_->pid) + ") " + how + "; log: " +
                              exporter_->spec.log_path;
  if (failure_.empty()) failure_ = failure;
  run_.export_outcome = "no model exported to " + path + ": " + failure;
  Message(failure);
}

void Launcher::OnExit(Child& child, int wait_status) {
  child.running = false;
  child.wait_status = wait_status;
  const bool before_serving = child.awaiting_ready;
  child.awaiting_ready = false;
  const bool clean = ExitedZero(wait_status);
  const std::string who = child.spec.name + " (pid " + std::to_string(child.pid) + ")";
  const bool is_chief = child.spec.role == Role::kWorker && child.spec.index == 0;
  if (clean && is_chief) chief_succeeded_ = true;

  if (child.fault_killed && phase_ == Phase::kRunning) {
    Message(who + " ended by fault injection (" + DescribeWaitStatus(wait_status) + ")");
    return;
  }
  if (before_serving && child.restarting && RetryIfPortInUse(child, wait_status)) return;
  if (phase_ == Phase::kRunning || phase_ == Phase::kStartingServers) {
    if (clean && is_chief) {
      OnChiefFinished(who);
    } else if (clean && !before_serving) {
      Message(who + (child.spec.role == Role::kWorker
                         ? " finished with exit status 0"
                         : " exited with status 0 before the chief finished"));
    } else {
      // A process that refused its flags, data or state fails the run the same way; so
      // does a server that ends before it serves.
      failure_is_bad_usage_ = WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == kExitUsage;
      failure_ = who + (clean ? " exited with status 0 before it served"
                              : " failed with " + DescribeWaitStatus(wait_status) +
                                    (is_chief ? "" : " before the chief finished")) +
                 "; log: " + child.spec.log_path;
      Message(failure_);
      BeginStopping(Phase::kStoppingWorkers);
    }
    return;
  }
  if (phase_ == Phase::kFinishingWorkers && clean) {
    Message(who + " finished with exit status 0");
    return;
  }
  if (child.killed_after_grace) {
    Message(who + " did not stop within " + FormatSeconds(options_.grace_seconds) +
            " s of SIGTERM and was killed with SIGKILL; log: " + child.spec.log_path);
  } else if (!clean && !interrupted_) {
    Message(who + " ended with " + DescribeWaitStatus(wait_status) +
            (child.sent_term ? " after SIGTERM" : "") + "; log: " + child.spec.log_path);
  }
}

void Launcher::OnChiefFinished(const std::string& who) {
  const std::string running = RunningWorkers();
  if (running.empty()) {
    Message("chief " + who + " finished; every worker has finished");
    StopRemainingWorkers("all");
  } else if (options_.stop_workers_with_chief) {
    Message("chief " + who + " finished; stopping the others");
    StopRemainingWorkers("stopped_with_chief");
  } else {
    Message("chief " + who + " finished; waiting up to " + FormatSeconds(kWorkerExitSeconds) +
            " s for " + running + " to exit");
    phase_ = Phase::kFinishingWorkers;
    group_killed_ = false;
    stop_deadline_ = NowSeconds() + kWorkerExitSeconds;
  }
}

std::string Launcher::RunningWorkers() const {
  std::string names;
  for (const Child& child : children_) {
    if (!child.running || child.spec.role != Role::kWorker) continue;
    names += (names.empty() ? "" : ", ") + child.spec.name;
  }
  return names;
}

void Launcher::StopRemainingWorkers(const char* outcome) {
  run_.workers_stopped.clear();
  for (const Child& child : children_) {
    if (child.running && child.spec.role == Role::kWorker) {
      run_.workers_stopped.push_back(child.spec.name);
    }
  }
  run_.workers_finished = run_.workers_stopped.empty() ? "all" : outcome;
  BeginStopping(Phase::kStoppingWorkers);
}

bool Launcher::GroupRunning(Role role) const {
  for (const Child& child : children_) {
    if (child.running && child.spec.role == role) return true;
  }
  return false;
}

void Launcher::SignalGroup(Role role, int signal_number) {
  for (Child& child : children_) {
    if (!child.running || child.spec.role != role) continue;
    if (child.spec.remote && signal_number == SIGTERM) {
      // A remote process is asked to stop by closing its connection's stdin: its wrapper
      // sends it SIGTERM there (RemoteCommand), and ssh exits when it has.
      if (child.in_fd >= 0) close(child.in_fd);
      child.in_fd = -1;
    } else {
      kill(child.pid, signal_number);
    }
    if (signal_number == SIGTERM) child.sent_term = true;
    if (signal_number == SIGKILL) child.sent_kill = true;
  }
}

void Launcher::KillAllNow() {
  if (exporter_ != nullptr && exporter_->running) {
    kill(exporter_->pid, SIGKILL);
    exporter_->sent_kill = true;
  }
  SignalGroup(Role::kWorker, SIGKILL);
  SignalGroup(Role::kPs, SIGKILL);
}

void Launcher::BeginStopping(Phase phase) {
  phase_ = phase;
  group_killed_ = false;
  stop_deadline_ = NowSeconds() + options_.grace_seconds;
  SignalGroup(phase == Phase::kStoppingWorkers ? Role::kWorker : Role::kPs, SIGTERM);
}

int Launcher::Supervise() {
  while (phase_ != Phase::kDone) {
    PollOnce();
    ReapExited();
    CollectReadyFiles();
    AdvanceStopping();
  }
  const int exit_code = ComputeExitCode();
  Finish(exit_code);
  return exit_code;
}

void Launcher::PollOnce() {
  std::vector<pollfd> poll_fds;
  std::vector<Child*> owners;
  poll_fds.push_back({g_signal_pipe[0], POLLIN, 0});
  for (Child& child : children_) {
    if (child.out_fd < 0) continue;
    poll_fds.push_back({child.out_fd, POLLIN, 0});
    owners.push_back(&child);
  }
  if (exporter_ != nullptr && exporter_->out_fd >= 0) {
    poll_fds.push_back({exporter_->out_fd, POLLIN, 0});
    owners.push_back(exporter_.get());
  }
  // The signal pipe wakes us for every exit; the timeout only serves the deadlines and the
  // ready files (no event says one has been written).
  double wait = std::min({InjectFaults(), RetryRestarts(), ReadyPollSeconds()});
  if (phase_ != Phase::kRunning && phase_ != Phase::kStartingServers) {
    wait = std::min(wait, group_killed_ ? 0.1 : stop_deadline_ - NowSeconds());
  }
  const int timeout_ms = static_cast<int>(std::clamp(std::ceil(wait * 1000.0), 0.0, 1000.0));
  const int ready = poll(poll_fds.data(), poll_fds.size(), timeout_ms);
  if (ready < 0 && errno != EINTR) {
    Message(std::string("poll failed: ") + std::strerror(errno) + "; killing all processes");
    if (failure_.empty()) failure_ = "poll failed";
    KillAllNow();
    group_killed_ = true;
  }
  if (ready > 0 && (poll_fds[0].revents & POLLIN) != 0) HandleSignals();
  for (size_t i = 1; ready > 0 && i < poll_fds.size(); ++i) {
    if ((poll_fds[i].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
      ReadOutput(*owners[i - 1], /*drain=*/false);
    }
  }
}

void Launcher::HandleSignals() {
  unsigned char signals[64];
  ssize_t n;
  while ((n = read(g_signal_pipe[0], signals, sizeof(signals))) > 0) {
    for (ssize_t i = 0; i < n; ++i) {
      const int signal_number = signals[i];
      if (signal_number == SIGCHLD) continue;
      if (interrupted_) {
        Message("got " + SignalName(signal_number) + " again; killing all processes");
        KillAllNow();
        group_killed_ = true;
        continue;
      }
      interrupted_ = true;
      run_.end_reason = "got " + SignalName(signal_number);
      Message("got " + SignalName(signal_number) +
              "; stopping all processes (send it again to kill them at once)");
      if (phase_ == Phase::kStartingServers || phase_ == Phase::kRunning ||
          phase_ == Phase::kFinishingWorkers) {
        BeginStopping(Phase::kStoppingWorkers);
      }
      if (phase_ == Phase::kExporting) {
        // An interrupted export gets the grace period, like every other process.
        kill(exporter_->pid, SIGTERM);
        exporter_->sent_term = true;
        stop_deadline_ = std::min(stop_deadline_, NowSeconds() + options_.grace_seconds);
      }
    }
  }
}

// Let the workers finish (after the chief), stop them, export (when asked), then stop the
// PS; each group gets the grace period (the exporter kExportTimeoutSeconds), then SIGKILL.
void Launcher::AdvanceStopping() {
  for (bool advanced = true; advanced;) {
    advanced = false;
    if (phase_ == Phase::kStartingServers || phase_ == Phase::kRunning ||
        phase_ == Phase::kDone) {
      break;
    }
    if (phase_ == Phase::kFinishingWorkers) {
      if (!GroupRunning(Role::kWorker)) {
        StopRemainingWorkers("all");
        advanced = true;
      } else if (NowSeconds() >= stop_deadline_) {
        Message(RunningWorkers() + " still running " + FormatSeconds(kWorkerExitSeconds) +
                " s after the chief exited (--finish-timeout " +
                FormatSeconds(options_.finish_timeout) +
                " s): stopping it before the end of its last epoch");
        StopRemainingWorkers("timed_out");
        advanced = true;
      }
      continue;
    }
    if (phase_ == Phase::kExporting) {
      if (!exporter_->running) {
        BeginStopping(Phase::kStoppingPs);
        advanced = true;
      } else if (!group_killed_ && NowSeconds() >= stop_deadline_) {
        exporter_->killed_after_grace = true;
        exporter_->sent_kill = true;
        kill(exporter_->pid, SIGKILL);
        group_killed_ = true;
      }
      continue;
    }
    const Role role = phase_ == Phase::kStoppingWorkers ? Role::kWorker : Role::kPs;
    if (!GroupRunning(role)) {
      if (phase_ == Phase::kStoppingWorkers) {
        AfterWorkersStopped();
      } else {
        phase_ = Phase::kDone;
      }
      advanced = true;
    } else if (!group_killed_ && NowSeconds() >= stop_deadline_) {
      for (Child& child : children_) {
        if (child.running && child.spec.role == role) child.killed_after_grace = true;
      }
      SignalGroup(role, SIGKILL);
      group_killed_ = true;
    }
  }
}

int Launcher::ComputeExitCode() {
  std::string statuses;
  std::string unclean;
  for (const Child& child : children_) {
    if (!statuses.empty()) statuses += ", ";
    if (child.pid < 0) {  // the run ended before its servers served
      statuses += child.spec.name + " not started";
      continue;
    }
    if (child.fault_killed) {  // killed by --kill and not restarted: as asked
      statuses += child.spec.name + " killed by fault injection";
      continue;
    }
    const bool clean = ExitedZero(child.wait_status);
    if (!clean) unclean += (unclean.empty() ? "" : ", ") + child.spec.name;
    statuses += child.spec.name + " " +
                (clean ? std::string("exit 0") : DescribeWaitStatus(child.wait_status));
    if (child.killed_after_grace) statuses += " after the grace period";
  }
  if (exporter_ != nullptr) {
    const bool clean = ExitedZero(exporter_->wait_status);
    if (!clean) unclean += (unclean.empty() ? "" : ", ") + exporter_->spec.name;
    statuses += ", " + exporter_->spec.name + " " +
                (clean ? std::string("exit 0") : DescribeWaitStatus(exporter_->wait_status));
  }
  Message("exit status: " + statuses);
  if (interrupted_) {
    Message("stopped by a signal; every process has been stopped");
    return kExitInterrupted;
  }
  if (!failure_.empty()) {
    run_.end_reason = failure_;
    Message("run failed: " + failure_);
    return failure_is_bad_usage_ ? kExitUsage : kExitFailed;
  }
  if (!unclean.empty()) {
    run_.end_reason = unclean + " did not exit with status 0";
    Message("run failed: " + run_.end_reason);
    return kExitFailed;
  }
  bool faults = false;
  for (const Child& child : children_) faults |= child.fault_killed;
  Message(faults ? "run succeeded: every process not killed by fault injection exited with "
                   "status 0"
                 : "run succeeded: every process exited with status 0");
  return kExitOk;
}

double Launcher::InjectFaults() {
  double next = 1e9;
  if (phase_ != Phase::kRunning) return next;
  const double now = NowSeconds() - started_at_;
  for (size_t i = 0; i < options_.faults.size(); ++i) {
    const Fault& f = options_.faults[i];
    FaultState& state = fault_states_[i];
    const size_t slot = static_cast<size_t>(f.ps ? f.index : options_.num_ps + f.index);
    Child& child = children_[slot];
    if (!state.killed) {
      if (now < f.at_seconds) {
        next = std::min(next, f.at_seconds - now);
        continue;
      }
      state.killed = true;
      state.killed_at = now;
      if (!child.running) {
        Message("fault injection: " + child.spec.name + " had already exited; nothing to kill"
                + (f.restart_after ? " or restart" : ""));
        state.restarted = true;  // it ended by itself: never start it again
        continue;
      }
      child.fault_killed = true;
      child.sent_kill = true;
      kill(child.pid, SIGKILL);
      Message("fault injection: killed " + child.spec.name + " (pid " +
              std::to_string(child.pid) + ") with SIGKILL at " + FormatSeconds(now) + " s" +
              (f.restart_after ? "; restarting it in " + FormatSeconds(*f.restart_after) + " s"
                               : ""));
    }
    if (!f.restart_after || state.restarted) continue;
    const double restart_at = state.killed_at + *f.restart_after;
    if (now < restart_at || child.running) {
      // Not yet, or not yet reaped (the next loop turn reaps it).
      next = std::min(next, child.running ? 0.05 : restart_at - now);
      continue;
    }
    state.restarted = true;
    if (!RestartAfterFault(child)) return next;
  }
  return next;
}

bool Launcher::RestartAfterFault(Child& child) {
  // The command line of the plan as it stands: a single host's server comes back on the
  // address it bound first (its port is fixed from then on; its metrics port may change).
  child.spec = plan_.processes[static_cast<size_t>(&child - children_.data())];
  child.restarting = child.spec.role == Role::kPs && !child.spec.ready_path.empty();
  if (child.spec.role == Role::kWorker) MarkRestart(options_, child.spec, child.restarts + 1);
  child.start_tries = 0;
  if (!StartAgain(child)) return false;
  ++child.restarts;
  Message("fault injection: restarted " + child.spec.name + " as pid " +
          std::to_string(child.pid));
  WriteRunFiles();
  return true;
}

bool Launcher::StartAgain(Child& child) {
  child.log_fd = open(child.spec.log_path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  child.fault_killed = false;
  child.sent_term = false;
  child.sent_kill = false;
  child.partial.clear();
  ++child.start_tries;
  if (Status status = SpawnOne(child); !status.ok()) {
    failure_ = "fault injection: could not restart " + child.spec.name + ": " + status.message();
    Message(failure_);
    BeginStopping(Phase::kStoppingWorkers);
    return false;
  }
  return true;
}

bool Launcher::RetryIfPortInUse(Child& child, int wait_status) {
  const bool in_use = WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == kExitUsage &&
                      child.last_line.find("in use") != std::string::npos;
  if (!in_use || phase_ != Phase::kRunning) return false;
  const std::string where = child.spec.name + " on " + child.bound_address;
  if (child.start_tries < kRestartTries) {
    child.retry_at = NowSeconds() + kRestartRetrySeconds;
    Message("fault injection: " + where + " refused to start (" + child.last_line +
            "); trying again in " + FormatSeconds(kRestartRetrySeconds) + " s");
    return true;
  }
  failure_ = "fault injection: could not restart " + where + ": its port was still in use after " +
             std::to_string(child.start_tries) + " tries; log: " + child.spec.log_path;
  Message(failure_);
  BeginStopping(Phase::kStoppingWorkers);
  return true;
}

double Launcher::RetryRestarts() {
  double next = 1e9;
  const double now = NowSeconds();
  for (Child& child : children_) {
    if (child.retry_at <= 0 || child.running) continue;
    if (phase_ != Phase::kRunning) {  // the run is ending: no more tries
      child.retry_at = 0;
      continue;
    }
    if (now < child.retry_at) {
      next = std::min(next, child.retry_at - now);
      continue;
    }
    child.retry_at = 0;
    if (!StartAgain(child)) return next;
    Message("fault injection: restarted " + child.spec.name + " as pid " +
            std::to_string(child.pid) + " (try " + std::to_string(child.start_tries) + ")");
    WriteRunFiles();
  }
  return next;
}

// ---- ready files: the ports a single host's processes bound ------------------------------

double Launcher::ReadyPollSeconds() const {
  double wait = 1e9;
  for (const Child& child : children_) {
    if (!child.running || child.spec.ready_path.empty()) continue;
    if (child.awaiting_ready) return kServerReadyPollSeconds;  // the run waits for it
    if (child.bound_metrics_port == 0 && !child.ready_unreadable) wait = kReadyPollSeconds;
  }
  return wait;
}

bool Launcher::Live() const {
  return phase_ == Phase::kStartingServers || phase_ == Phase::kRunning;
}

void Launcher::CollectReadyFiles() {
  const double now = NowSeconds();
  if (now < next_ready_read_) return;  // output wakes the loop often: not every time
  next_ready_read_ = now + kServerReadyPollSeconds;
  bool changed = false;
  for (Child& child : children_) {
    if (!child.running || child.spec.ready_path.empty() || child.ready_unreadable) continue;
    if (!child.awaiting_ready && child.bound_metrics_port != 0) continue;
    if (ReadReady(child)) {
      changed = true;
    } else if (child.awaiting_ready && now >= child.ready_deadline && Live()) {
      // As a server that exits at start: the run fails, and ends.
      failure_ = child.spec.name + " (pid " + std::to_string(child.pid) + ") did not serve " +
                 "within " + FormatSeconds(kServerReadySeconds) + " s (no ready file " +
                 child.spec.ready_path + "); log: " + child.spec.log_path;
      child.awaiting_ready = false;
      Message(failure_);
      BeginStopping(Phase::kStoppingWorkers);
      return;
    }
  }
  if (phase_ == Phase::kStartingServers) {
    for (const Child& child : children_) {
      if (child.spec.role == Role::kPs && child.bound_address.empty()) return;
    }
    StartWorkers();
  } else if (changed) {
    WriteRunFiles();
  }
}

bool Launcher::ReadReady(Child& child) {
  Result<ReadyInfo> ready = ReadReadyFile(child.spec.ready_path);
  if (!ready.ok() && ready.status().code() == StatusCode::kNotFound) return false;  // not yet
  if (ready.ok() && ready->pid != child.pid) return false;  // an earlier process's
  std::string problem = ready.status().message();
  int port = 0;
  if (ready.ok() && child.spec.role == Role::kPs) {
    Result<HostPort> bound =
        ParseHostPort(ready->address, child.spec.ready_path + " address", PortRule::kNonZero);
    problem = bound.status().message();
    if (bound.ok()) port = bound->port;
  }
  if (problem.empty() && ready->metrics_port <= 0) {
    problem = child.spec.ready_path + " names no metrics port";
  }
  if (!problem.empty()) {
    child.ready_unreadable = true;
    if (!child.awaiting_ready || !Live()) {
      Message("warning: " + child.spec.name + "'s ready file: " + problem);
      return false;
    }
    // A server whose address is not known cannot be reached: the run fails.
    failure_ = child.spec.name + " (pid " + std::to_string(child.pid) + "): " + problem;
    child.awaiting_ready = false;
    Message(failure_);
    BeginStopping(Phase::kStoppingWorkers);
    return false;
  }
  // The cluster spec names hosts as given (--host): the address keeps the name.
  if (port > 0) child.bound_address = child.spec.host + ":" + std::to_string(port);
  child.bound_metrics_port = ready->metrics_port;
  child.awaiting_ready = false;
  child.restarting = false;
  Message(child.spec.name + " pid " + std::to_string(child.pid) +
          (port > 0 ? " at " + child.bound_address : std::string()) + ", metrics " +
          MetricsUrl(child));
  return true;
}

void Launcher::StartWorkers() {
  // Planned again with the ports the servers bound: the workers, the exporter and a restart
  // of a server get them.
  std::vector<int> ports = SingleHostPorts(options_);
  for (size_t i = 0; i < children_.size(); ++i) {
    if (children_[i].spec.role != Role::kPs) continue;
    Result<HostPort> bound = ParseHostPort(children_[i].bound_address, "", PortRule::kNonZero);
    ports[i] = bound.ok() ? bound->port : 0;  // always ok: ReadReady made it
  }
  Result<LaunchPlan> bound = BuildPlan(options_, bin_dir_, plan_.log_dir, ports);
  phase_ = Phase::kRunning;
  if (!bound.ok()) {
    failure_ = "cannot plan the workers: " + bound.status().message();
    Message(failure_);
    BeginStopping(Phase::kStoppingWorkers);
    return;
  }
  plan_ = std::move(bound).value();
  for (size_t i = 0; i < children_.size(); ++i) {
    Child& child = children_[i];
    if (child.spec.role != Role::kWorker) continue;
    child.spec = plan_.processes[i];
    if (Status spawned = SpawnOne(child); !spawned.ok()) {
      failure_ = spawned.message();
      Message(failure_);
      BeginStopping(Phase::kStoppingWorkers);
      return;
    }
    AnnounceStart(child);
  }
  OnAllStarted();
}

// ---- the end of the run: summary.json and the final lines (report.h) --------------------

void Launcher::Finish(int exit_code) {
  run_.exit_code = exit_code;
  run_.end = NowSeconds();
  run_.end_unix = UnixSeconds();
  report_ = ComputeReport(run_);
  if (Status written = WriteSummaryJson(run_, *report_); !written.ok()) {
    Message("warning: " + written.ToString());
  }
}

std::string Launcher::Summary() const {
  return SummaryText(run_, report_.has_value() ? *report_ : ComputeReport(run_));
}
}  // namespace parasync::launch
