#include "deploy/launch/preflight_local.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <string_view>

#include "common/preflight.h"
#include "common/subprocess.h"
#include "worker/data/dataset.h"

namespace parasync::launch {
namespace {

namespace fs = std::filesystem;

// How long a parasync-ps --check may take to verify an existing store.
constexpr int kStoreCheckTimeoutMs = 60000;

bool RunsHere(const ProcessSpec& spec) { return !spec.remote; }

// Runs `argv` with stdout and stderr into a pipe; returns what it printed, or why it could
// not run. Kills it after `timeout_ms`.
std::string RunCapture(const std::vector<std::string>& argv, int timeout_ms) {
  SpawnOptions spawn;
  spawn.argv = argv;
  spawn.out = spawn.err = StreamTarget::Pipe();
  Result<Spawned> started = Spawn(spawn);
  if (!started.ok()) return "check problem " + started.status().message();
  const int fd = started->output_fd;
  const pid_t pid = started->pid;
  std::string output;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char buffer[4096];
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n <= 0) break;
    output.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  kill(pid, SIGKILL);  // a no-op for one that has exited (it is still ours until reaped)
  int status = 0;
  waitpid(pid, &status, 0);
  return output;
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

void CheckDataset(const LaunchPlan& plan, std::vector<std::string>* problems) {
  std::set<std::string> checked;
  for (const ProcessSpec& spec : plan.processes) {
    if (spec.role != Role::kWorker || !RunsHere(spec)) continue;
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
    // In a single-host run the launcher picked free ports itself (and holds them); only a
    // --metrics-port the user gave (--ps-arg, --worker-arg, --rank-arg) is checked then.
    const std::string given = LastFlagValue(spec.argv, {"--metrics-port"}, "");
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
      const std::string bind = LastFlagValue(spec.argv, {"--metrics-bind"}, plan.metrics_bind);
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
      // Its other lines are about ports, which the launcher holds for it now.
      if (line.find("--state-dir") != std::string::npos) problems->push_back(line);
    }
  }
}

}  // namespace

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
  const bool multi_host = !options.ps_placement.empty() || !options.worker_placement.empty();
  CheckDataset(plan, &problems);
  CheckPorts(plan, multi_host, &problems);
  CheckStateDirs(options, plan, &problems);
  return problems;
}

}  // namespace parasync::launch
