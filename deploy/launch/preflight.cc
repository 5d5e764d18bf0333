#include "deploy/launch/preflight.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>

#include "common/preflight.h"
#include "common/subprocess.h"
#include "common/version.h"
#include "deploy/launch/report.h"
#include "worker/data/dataset.h"

namespace parasync::launch {
namespace {

namespace fs = std::filesystem;

using Clock = std::chrono::steady_clock;

// How long a parasync-ps --check may take to verify an existing store.
constexpr int kStoreCheckTimeoutMs = 60000;

bool RunsHere(const ProcessSpec& spec) { return !spec.remote; }

int MillisecondsUntil(Clock::time_point deadline) {
  const auto left = std::chrono::duration<double, std::milli>(deadline - Clock::now()).count();
  return static_cast<int>(std::ceil(left));
}

// A child whose stdout and stderr we collect.
struct Probe {
  const ProcessSpec* spec = nullptr;
  pid_t pid = -1;
  int fd = -1;  // the read end of its output pipe, until it is closed
  std::string output;
  // A --worker-command worker's probe (a shell test over ssh, not our --check): the
  // problem its non-zero exit means.
  std::string command_problem;
};

// Starts `argv` with stdin from /dev/null and stdout and stderr into one pipe.
Result<Probe> StartProbe(std::vector<std::string> argv) {
  SpawnOptions spawn;
  spawn.argv = std::move(argv);
  spawn.out = spawn.err = StreamTarget::Pipe();
  PARASYNC_ASSIGN_OR_RETURN(Spawned started, Spawn(spawn));
  Probe probe;
  probe.pid = started.pid;
  probe.fd = started.output_fd;
  return probe;
}

// Collects every probe's output, all probes at once, until each has closed it or `deadline`
// passes.
void CollectOutput(std::vector<Probe>& probes, Clock::time_point deadline) {
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<Probe*> owners;
    for (Probe& p : probes) {
      if (p.fd < 0) continue;
      fds.push_back({p.fd, POLLIN, 0});
      owners.push_back(&p);
    }
    if (fds.empty() || Clock::now() >= deadline) break;
    if (poll(fds.data(), fds.size(), std::max(1, MillisecondsUntil(deadline))) < 0 &&
        errno != EINTR) {
      break;
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      char buffer[4096];
      const ssize_t n = read(owners[i]->fd, buffer, sizeof(buffer));
      if (n > 0) {
        owners[i]->output.append(buffer, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        close(owners[i]->fd);
        owners[i]->fd = -1;
      }
    }
  }
}

// Runs `argv`; returns what it printed, or why it could not run. Kills it after `timeout_ms`.
std::string RunCapture(const std::vector<std::string>& argv, int timeout_ms) {
  Result<Probe> started = StartProbe(argv);
  if (!started.ok()) return "check problem " + started.status().message();
  std::vector<Probe> probes = {std::move(started).value()};
  CollectOutput(probes, Clock::now() + std::chrono::milliseconds(timeout_ms));
  Probe& probe = probes.front();
  if (probe.fd >= 0) close(probe.fd);
  kill(probe.pid, SIGKILL);  // a no-op for one that has exited (it is still ours until reaped)
  int status = 0;
  waitpid(probe.pid, &status, 0);
  return probe.output;
}

// The lines of `output` that start with `prefix`, without it.
std::vector<std::string> LinesAfter(const std::string& output, std::string_view prefix) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < output.size()) {
    size_t end = output.find('\n', start);
    if (end == std::string::npos) end = output.size();
    const std::string_view line(output.data() + start, end - start);
    if (line.starts_with(prefix)) lines.emplace_back(line.substr(prefix.size()));
    start = end + 1;
  }
  return lines;
}

// A --worker-command worker reads its data its own way: only a --dataset given must be a
// directory. Empty when it is (or none was given).
std::string CommandDataProblem(const LaunchOptions& options) {
  std::error_code ec;
  if (options.data_dir.empty() || fs::is_directory(options.data_dir, ec)) return "";
  return "--dataset " + options.data_dir + " is not a directory";
}

void CheckDataset(const LaunchOptions& options, const LaunchPlan& plan,
                  std::vector<std::string>* problems) {
  std::set<std::string> checked;
  for (const ProcessSpec& spec : plan.processes) {
    if (spec.role != Role::kWorker || !RunsHere(spec)) continue;
    if (spec.user_command) {
      if (!checked.insert(options.data_dir).second) continue;
      if (std::string p = CommandDataProblem(options); !p.empty()) problems->push_back(p);
      continue;
    }
    const std::string dir = LastFlagValue(spec.argv, {"--dataset", "--data"}, kDefaultDataDir);
    if (!checked.insert(dir).second) continue;
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
      problems->push_back("--dataset " + dir + " is not a directory" +
                          (dir == kDefaultDataDir ? " (the default: install Debian's "
                                                    "dataset-fashion-mnist, or give --dataset)"
                                                  : ""));
      continue;
    }
    if (Status s = CheckDataFilesExist(dir); !s.ok()) problems->push_back(s.message());
  }
}

void CheckPorts(const LaunchPlan& plan, bool multi_host, std::vector<std::string>* problems) {
  std::map<int, std::string> metrics_users;  // port -> the first process given it
  for (const ProcessSpec& spec : plan.processes) {
    if (!RunsHere(spec)) continue;
    // In a single-host run every process is told port 0 (it binds a free one); only a
    // --metrics-port the user gave (--ps-arg, --worker-arg, --rank-arg) is checked then.
    // A --worker-command worker gets its planned port in PARASYNC_METRICS_PORT, no flag.
    const std::string given = spec.user_command
                                  ? std::to_string(spec.metrics_port)
                                  : LastFlagValue(spec.argv, {"--metrics-port"}, "");
    const int metrics_port = given.empty() ? 0 : std::atoi(given.c_str());
    const bool user_metrics_port = metrics_port != 0 && metrics_port != spec.metrics_port;
    if (user_metrics_port) {
      const auto [it, fresh] = metrics_users.emplace(metrics_port, spec.name);
      if (!fresh) {
        problems->push_back("--metrics-port " + given + " is given to both " + it->second +
                            " and " + spec.name + " on this host");
        continue;
      }
    }
    if (user_metrics_port || (multi_host && metrics_port != 0)) {
      const std::string bind =
          LastFlagValue(spec.argv, {"--metrics-bind"}, MetricsBindFor(spec.host));
      if (std::string p = BindProblem(bind, metrics_port); !p.empty()) {
        problems->push_back(spec.name + " --metrics-port " + given + ": " + p);
      }
    }
    if (multi_host) {
      const size_t colon = spec.address.rfind(':');
      if (colon == std::string::npos) continue;
      const std::string port = spec.address.substr(colon + 1);
      if (std::string p = BindProblem(spec.address.substr(0, colon), std::atoi(port.c_str()));
          !p.empty()) {
        problems->push_back(spec.name + " (--port-base): " + p);
      }
    }
  }
}

void CheckStateDirs(const LaunchOptions& options, const LaunchPlan& plan,
                    std::vector<std::string>* problems) {
  if (!options.ps_data_dir.empty()) {
    // Stores of more shards than this run has: a run of another --ps.
    std::error_code ec;
    int found = 0;
    for (int k = options.num_ps; k < options.num_ps + 64; ++k) {
      if (fs::exists(options.ps_data_dir + "/ps" + std::to_string(k) + "/CURRENT", ec)) ++found;
    }
    if (found > 0) {
      problems->push_back("--state-dir " + options.ps_data_dir + " holds the stores of " +
                          std::to_string(options.num_ps + found) +
                          " parameter servers, this run has --ps " +
                          std::to_string(options.num_ps));
      return;
    }
  }
  for (const ProcessSpec& spec : plan.processes) {
    if (spec.role != Role::kPs || !RunsHere(spec)) continue;
    const std::string dir = LastFlagValue(spec.argv, {"--state-dir", "--data-dir"}, "");
    std::error_code ec;
    if (dir.empty() || !fs::exists(dir, ec)) continue;
    if (!fs::is_directory(dir, ec)) {
      problems->push_back("--state-dir " + dir + " is not a directory");
      continue;
    }
    if (fs::is_empty(dir, ec)) continue;
    // Whether it holds a store, this shard's, of this --mode: only parasync-ps can say (its
    // CheckpointStore refuses a foreign directory naming a file it found).
    std::vector<std::string> argv = spec.argv;
    argv.push_back("--check");
    const std::string output = RunCapture(argv, kStoreCheckTimeoutMs);
    for (const std::string& line : LinesAfter(output, kCheckProblemPrefix)) {
      // Its other lines are about ports, which CheckPorts judges.
      if (line.find("--state-dir") != std::string::npos) problems->push_back(line);
    }
  }
}

// Adds to `problems` what the --check of `probe` (its output closed or the deadline passed)
// says is wrong: each problem line it printed, no answer, a version other than ours, or, over
// ssh, its host unreachable (named once per host, in `unreachable`).
void JudgeProbe(Probe& probe, Clock::time_point deadline, double timeout_seconds,
                std::set<std::string>& unreachable, std::vector<std::string>& problems) {
  const ProcessSpec& spec = *probe.spec;
  const std::string where = spec.name + " on " + spec.host;
  if (probe.fd >= 0) {
    close(probe.fd);
    probe.fd = -1;
  }
  // Its output has ended; the process itself may take a moment more to exit.
  std::optional<int> exited =
      WaitForExit(probe.pid, std::chrono::milliseconds(std::max(0, MillisecondsUntil(deadline))));
  if (!exited.has_value()) {
    kill(probe.pid, SIGKILL);
    int wait_status = 0;
    while (waitpid(probe.pid, &wait_status, 0) < 0 && errno == EINTR) {
    }
    problems.push_back(where + ": no answer within " + FormatSeconds(timeout_seconds) + " s");
    return;
  }
  const int wait_status = *exited;
  std::string version;
  std::vector<std::string> lines;
  std::istringstream in(probe.output);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(kCheckVersionPrefix, 0) == 0) {
      version = line.substr(std::strlen(kCheckVersionPrefix));
    } else if (line.rfind(kCheckProblemPrefix, 0) == 0) {
      std::string problem = line.substr(std::strlen(kCheckProblemPrefix));
      // "ps0: ..." or "ps0 metrics: ...": `where` names the process already.
      if (problem.rfind(spec.name + ": ", 0) == 0) problem.erase(0, spec.name.size() + 2);
      if (problem.rfind(spec.name + " ", 0) == 0) problem.erase(0, spec.name.size() + 1);
      problems.push_back(where + ": " + problem);
    } else if (!line.empty()) {
      lines.push_back(line);
    }
  }
  const std::string last = lines.empty() ? DescribeWaitStatus(wait_status) : lines.back();
  if (spec.remote && WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 255) {
    if (unreachable.insert(spec.host).second) {
      problems.push_back("host " + spec.host + " is unreachable: " + last);
    }
    return;
  }
  if (spec.user_command) {  // no binary of ours: no version to compare
    if (!ExitedZero(wait_status)) problems.push_back(where + ": " + probe.command_problem);
    return;
  }
  const std::string mine = BuildVersion();
  if (version.empty()) {
    problems.push_back(where + ": " + spec.argv[0] + " --check gave no answer: " + last);
  } else if (version != mine) {
    problems.push_back(where + ": " + std::filesystem::path(spec.argv[0]).filename().string() +
                       " is " + version + ", but parasync-launch is " + mine +
                       ": deploy the same build everywhere");
  }
}

// A --worker-command worker on this host, for --check. Not run (it has no --check): what
// parasync-worker --check checks that applies to any program, its --dataset directory
// (when given) and its metrics port.
void CheckCommandWorkerHere(const LaunchOptions& options, const ProcessSpec& spec,
                            std::vector<std::string>& problems) {
  const std::string where = spec.name + " on " + spec.host;
  if (std::string p = CommandDataProblem(options); !p.empty()) problems.push_back(where + ": " + p);
  if (spec.metrics_port == 0) return;  // any free port (a single-host run)
  if (std::string p = BindProblem(MetricsBindFor(spec.host), spec.metrics_port); !p.empty()) {
    problems.push_back(where + " metrics: " + p);
  }
}

// Starts the --check probe of `spec`: its binary with --check, or, for a --worker-command
// worker on another host, a shell test over ssh of the host and its --dataset directory.
Result<Probe> StartCheckProbe(const LaunchOptions& options, const ProcessSpec& spec) {
  if (spec.user_command) {
    const std::string test = options.data_dir.empty()
                                 ? std::string("true")
                                 : ShellJoin({"test", "-d", options.data_dir});
    PARASYNC_ASSIGN_OR_RETURN(Probe probe, StartProbe(SshArgv(options, spec.host, test)));
    probe.command_problem = "--dataset " + options.data_dir + " is not a directory there";
    return probe;
  }
  std::vector<std::string> argv = spec.argv;
  argv.push_back("--check");
  return StartProbe(spec.remote ? SshArgv(options, spec.host, ShellJoin(argv)) : argv);
}

}  // namespace

std::vector<std::string> ClusterPreflight(const LaunchOptions& options, const LaunchPlan& plan,
                                          double timeout_seconds) {
  std::vector<Probe> probes;
  std::vector<std::string> problems;
  std::map<std::string, int> ssh_started;
  for (const ProcessSpec& spec : plan.processes) {
    if (spec.user_command && !spec.remote) {
      CheckCommandWorkerHere(options, spec, problems);
      continue;
    }
    // As Launcher::Start: sshd refuses more than ~10 unauthenticated connections at once.
    if (spec.remote && ++ssh_started[spec.host] > 8) usleep(150000);
    Result<Probe> probe = StartCheckProbe(options, spec);
    if (!probe.ok()) {
      problems.push_back(probe.status().message());
      break;
    }
    probe->spec = &spec;
    probes.push_back(std::move(probe).value());
  }
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(timeout_seconds));
  CollectOutput(probes, deadline);
  std::set<std::string> unreachable;
  for (Probe& probe : probes) JudgeProbe(probe, deadline, timeout_seconds, unreachable, problems);
  return problems;
}

std::string LastFlagValue(const std::vector<std::string>& argv,
                          const std::vector<std::string>& names, const std::string& fallback) {
  std::string value = fallback;
  for (size_t i = 1; i < argv.size(); ++i) {
    for (const std::string& name : names) {
      if (argv[i] == name && i + 1 < argv.size()) {
        value = argv[i + 1];
      } else if (argv[i].starts_with(name + "=")) {
        value = argv[i].substr(name.size() + 1);
      }
    }
  }
  return value;
}

std::vector<std::string> LocalPreflight(const LaunchOptions& options, const LaunchPlan& plan) {
  std::vector<std::string> problems;
  CheckDataset(options, plan, &problems);
  CheckPorts(plan, IsMultiHost(options), &problems);
  CheckStateDirs(options, plan, &problems);
  return problems;
}

}  // namespace parasync::launch
