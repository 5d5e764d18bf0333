#include "deploy/launch/launcher.h"

#include "common/address.h"
#include "common/cluster_spec.h"
#include "common/curve.h"
#include "common/file_util.h"
#include "common/metrics.h"
#include "common/mode.h"
#include "common/ports.h"
#include "common/preflight.h"
#include "common/version.h"
#include "deploy/launch/snapshot_server.h"
#include "common/subprocess.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

namespace parasync::launch {

namespace {

constexpr int kMaxProcessesPerRole = 256;

// POSIX shell single-quoting.
std::string ShellQuote(const std::string& word) {
  if (!word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                              "0123456789_-+=./:,@%") == std::string::npos) {
    return word;
  }
  std::string quoted = "'";
  for (char c : word) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  return quoted + "'";
}

// Splits a command line on spaces (no quoting: --ssh-command takes plain words).
std::vector<std::string> SplitWords(const std::string& text) {
  std::vector<std::string> words;
  std::istringstream in(text);
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

int SumSlots(const std::vector<HostSlots>& slots) {
  int n = 0;
  for (const HostSlots& s : slots) n += s.count;
  return n;
}

constexpr size_t kReadChunk = 64 * 1024;
// A "line" longer than this without a newline is forwarded in pieces.
constexpr size_t kMaxLineBytes = 64 * 1024;
constexpr int kMaxDrainReads = 64;

// "[launch 12:03:04.512] ": the launcher's own lines carry the local time of day, to the
// millisecond (summary.json has the full dates).
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

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

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

// One row of eval.jsonl, as far as the launcher reports it.
struct EvalRow {
  double test_accuracy = 0.0;
  std::optional<int64_t> epoch;
  std::optional<double> wall_s;       // the chief's seconds since its start
  std::optional<int64_t> examples;    // the servers' count of examples applied
};

struct EvalRows {
  bool exists = false;
  int rows = 0;                    // non-blank lines read
  bool last_unreadable = false;    // the last of them has no test_accuracy
  std::optional<EvalRow> last;
  std::optional<EvalRow> best;     // the highest test_accuracy, the earliest on a tie
};

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

std::string FormatSeconds(double seconds) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%g", seconds);
  return buffer;
}

}  // namespace

// ---- free functions ---------------------------------------------------------------------

bool IsValidMode(std::string_view mode) {
  // The rule every process applies to its --mode, so a mode they would refuse fails here.
  return TrainingMode::Parse(std::string(mode)).ok();
}

Status ValidateOptions(const LaunchOptions& options) {
  if (options.num_ps < 1 || options.num_ps > kMaxProcessesPerRole) {
    return Status::InvalidArgument("--ps must be between 1 and " +
                                   std::to_string(kMaxProcessesPerRole) + ", got " +
                                   std::to_string(options.num_ps));
  }
  if (options.num_workers < 1 || options.num_workers > kMaxProcessesPerRole) {
    return Status::InvalidArgument("--workers must be between 1 and " +
                                   std::to_string(kMaxProcessesPerRole) + ", got " +
                                   std::to_string(options.num_workers));
  }
  if (options.epochs < 1) {
    return Status::InvalidArgument("--epochs must be at least 1, got " +
                                   std::to_string(options.epochs));
  }
  if (!IsValidMode(options.mode)) {
    return Status::InvalidArgument("--mode must be async, sync or ssp:<staleness>, got '" +
                                   options.mode + "'");
  }
  if (!std::isfinite(options.grace_seconds) || options.grace_seconds < 0) {
    return Status::InvalidArgument("--grace-seconds must be a number >= 0");
  }
  if (options.host.empty() || options.host.find(':') != std::string::npos ||
      !CheckHost(options.host, "--host").ok()) {
    return Status::InvalidArgument("--host must be a host name or IPv4 address (four octets "
                                   "0-255), got '" + options.host + "'");
  }
  if (options.replicas_to_aggregate) {
    // Checked here, before anything starts: every PS would refuse it after the launch.
    int replicas = 0;
    const std::string& text = *options.replicas_to_aggregate;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), replicas);
    if (ec != std::errc() || end != text.data() + text.size() || replicas < 1) {
      return Status::InvalidArgument("--replicas-to-aggregate must be a positive integer, got '" +
                                     text + "'");
    }
    const auto mode = TrainingMode::Parse(options.mode);
    if (mode.ok() && mode->kind != TrainingMode::Kind::kSync) {
      return Status::InvalidArgument("--replicas-to-aggregate applies to --mode sync only, not "
                                     "--mode " + options.mode);
    }
    if (replicas > options.num_workers) {
      return Status::InvalidArgument(
          "--replicas-to-aggregate " + text + " is more than the " +
          std::to_string(options.num_workers) +
          " workers (it may be at most --workers; fewer makes the rest backup workers)");
    }
  }
  for (const auto& [rank, arg] : options.rank_args) {
    if (rank < 0 || rank >= options.num_workers) {
      return Status::InvalidArgument("--rank-arg names worker " + std::to_string(rank) +
                                     " of " + std::to_string(options.num_workers));
    }
  }
  if (!options.ps_placement.empty() && SumSlots(options.ps_placement) != options.num_ps) {
    return Status::InvalidArgument("role counts: " + std::to_string(options.num_ps) +
                                   " ps asked for, but --ps places " +
                                   std::to_string(SumSlots(options.ps_placement)));
  }
  if (!options.worker_placement.empty() &&
      SumSlots(options.worker_placement) != options.num_workers) {
    return Status::InvalidArgument("role counts: --workers " +
                                   std::to_string(options.num_workers) + ", but -H places " +
                                   std::to_string(SumSlots(options.worker_placement)) +
                                   " workers");
  }
  const bool multi_host = !options.ps_placement.empty() || !options.worker_placement.empty();
  if (multi_host) {
    bool local = false, remote = false;
    for (const auto* placement : {&options.ps_placement, &options.worker_placement}) {
      for (const HostSlots& h : *placement) {
        if (h.host.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                     "0123456789.-_") != std::string::npos ||
            h.host.front() == '-' || !CheckHost(h.host, "host").ok()) {
          return Status::InvalidArgument("'" + h.host + "' is not a host name or IPv4 address");
        }
        (IsLocalHost(h.host) ? local : remote) = true;
      }
    }
    if (local && remote) {
      return Status::InvalidArgument(
          "localhost cannot be mixed with other hosts (the others would reach themselves): name "
          "this machine as the others see it");
    }
  }
  if (multi_host && (options.port_base < 1024 ||
                     options.port_base + kMetricsPortOffset + kMaxProcessesPerRole * 2 > 65535)) {
    return Status::InvalidArgument("--port-base must be between 1024 and " +
                                   std::to_string(65535 - kMetricsPortOffset -
                                                  kMaxProcessesPerRole * 2));
  }
  if (multi_host && SplitWords(options.ssh_command).empty()) {
    return Status::InvalidArgument("--ssh-command must not be empty");
  }
  for (const Fault& f : options.faults) {
    const int count = f.ps ? options.num_ps : options.num_workers;
    const std::string name = std::string(f.ps ? "ps" : "worker") + std::to_string(f.index);
    if (f.index < 0 || f.index >= count) {
      return Status::InvalidArgument("--kill names " + name + ", but there are " +
                                     std::to_string(count) + (f.ps ? " ps" : " workers"));
    }
    if (!f.ps && f.index == 0) {
      return Status::InvalidArgument(
          "--kill cannot name worker0: the chief evaluates, and its end ends the run");
    }
    if (multi_host) {
      return Status::InvalidArgument("--kill works on a local cluster only (no -H / --ps "
                                     "host placement)");
    }
  }
  return Status::Ok();
}

namespace {

// Where each process runs: every PS by index, then every worker. A role without a
// placement of its own goes round-robin over the other role's hosts.
std::vector<std::string> ProcessHosts(const LaunchOptions& options) {
  std::vector<std::string> hosts;
  auto place = [&](const std::vector<HostSlots>& own, const std::vector<HostSlots>& other,
                   int count) {
    if (!own.empty()) {
      for (const HostSlots& s : own) {
        for (int i = 0; i < s.count; ++i) hosts.push_back(s.host);
      }
    } else if (!other.empty()) {
      for (int i = 0; i < count; ++i) hosts.push_back(other[static_cast<size_t>(i) % other.size()].host);
    } else {
      for (int i = 0; i < count; ++i) hosts.push_back(options.host);
    }
  };
  place(options.ps_placement, options.worker_placement, options.num_ps);
  place(options.worker_placement, options.ps_placement, options.num_workers);
  return hosts;
}

}  // namespace

Result<Fault> ParseFault(std::string_view text) {
  const auto bad = [&] {
    return Status::InvalidArgument("--kill takes ps:INDEX@SECONDS or worker:INDEX@SECONDS, "
                                   "optionally +RESTART_SECONDS, not '" + std::string(text) + "'");
  };
  Fault f;
  std::string_view rest = text;
  if (rest.rfind("ps:", 0) == 0) {
    f.ps = true;
    rest.remove_prefix(3);
  } else if (rest.rfind("worker:", 0) == 0) {
    rest.remove_prefix(7);
  } else {
    return bad();
  }
  const size_t at = rest.find('@');
  if (at == std::string_view::npos) return bad();
  const std::string_view index = rest.substr(0, at);
  auto [p, ec] = std::from_chars(index.data(), index.data() + index.size(), f.index);
  if (ec != std::errc() || p != index.data() + index.size() || index.empty()) return bad();
  std::string_view times = rest.substr(at + 1);
  const size_t plus = times.find('+');
  auto seconds = [](std::string_view t, double* out) {
    if (t.empty()) return false;
    const std::string copy(t);
    char* end = nullptr;
    *out = std::strtod(copy.c_str(), &end);
    return end == copy.c_str() + copy.size() && std::isfinite(*out) && *out >= 0;
  };
  if (!seconds(times.substr(0, plus), &f.at_seconds)) return bad();
  if (plus != std::string_view::npos) {
    double restart = 0.0;
    if (!seconds(times.substr(plus + 1), &restart)) return bad();
    f.restart_after = restart;
  }
  return f;
}

Result<std::vector<HostSlots>> ParseHostSlots(std::string_view text, std::string_view flag) {
  std::vector<HostSlots> slots;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item = text.substr(start, comma - start);
    HostSlots s;
    const size_t colon = item.rfind(':');
    s.host = std::string(item.substr(0, colon));
    if (colon != std::string_view::npos) {
      const std::string_view count = item.substr(colon + 1);
      auto [p, ec] = std::from_chars(count.data(), count.data() + count.size(), s.count);
      if (ec != std::errc() || p != count.data() + count.size() || count.empty() ||
          s.count < 1) {
        s.host.clear();
      }
    }
    if (s.host.empty() || s.host.find_first_of(" \t\n") != std::string::npos) {
      return Status::InvalidArgument(std::string(flag) + " takes host:count,host:count,..., not '" +
                                     std::string(text) + "'");
    }
    slots.push_back(std::move(s));
    start = comma + 1;
  }
  return slots;
}

bool IsLocalHost(std::string_view host) {
  return host == "localhost" || host == "127.0.0.1" || host == "::1";
}

std::string ShellJoin(const std::vector<std::string>& argv) {
  std::string command;
  for (const std::string& a : argv) command += (command.empty() ? "" : " ") + ShellQuote(a);
  return command;
}

std::string RemoteCommand(const std::vector<std::string>& argv, double grace_seconds) {
  const std::string command = ShellJoin(argv);
  char grace[32];
  std::snprintf(grace, sizeof(grace), "%.0f", std::ceil(std::max(0.0, grace_seconds)));
  // The process runs in the background with its own stdin; a watcher reads the connection's
  // stdin and sends SIGTERM when it closes (the launcher stopping it, or the connection
  // dying), so a remote process never outlives its launcher. Background jobs of a
  // non-interactive shell read /dev/null, hence the dance with descriptor 3.
  // After the grace period a process that ignored SIGTERM gets SIGKILL there too.
  return "exec 3<&0; " + std::string(kLogPrefixedEnv) + "=1 " + command +
         " </dev/null 3<&- & p=$!; (cat <&3 >/dev/null; kill -TERM $p 2>/dev/null; sleep " +
         grace + "; kill -KILL $p 2>/dev/null) & w=$!; "
         "exec 3<&-; wait $p; s=$?; kill $w 2>/dev/null; exit $s";
}

Status EnsureCurveKeys(const std::string& dir, int num_workers) {
  std::error_code ec;
  // `allowed` may also be a file of keys (parasync-entrypoint keys writes one): then the
  // missing clients' public keys are appended to it.
  const bool allowed_file = std::filesystem::is_regular_file(dir + "/allowed", ec);
  if (!allowed_file) std::filesystem::create_directories(dir + "/allowed", ec);
  if (ec) return Status::Unavailable("cannot create " + dir + "/allowed: " + ec.message());
  std::vector<std::string> names = {"ps", "export"};
  for (int i = 0; i < num_workers; ++i) names.push_back("worker" + std::to_string(i));
  for (const std::string& name : names) {
    const std::string base = dir + "/" + name;
    if (!std::filesystem::exists(base + ".key")) {
      PARASYNC_ASSIGN_OR_RETURN(CurveKeyPair pair, GenerateCurveKeyPair());
      PARASYNC_RETURN_IF_ERROR(WriteKeyFiles(base, pair));
    }
    if (name == "ps") continue;
    if (allowed_file) {
      PARASYNC_ASSIGN_OR_RETURN(std::vector<std::string> listed, ReadPublicKeys(dir + "/allowed"));
      PARASYNC_ASSIGN_OR_RETURN(CurveKeyPair pair, ReadKeyPairFile(base + ".key"));
      if (std::find(listed.begin(), listed.end(), pair.public_key) == listed.end()) {
        std::ofstream(dir + "/allowed", std::ios::app) << "public-key = " << pair.public_key << "\n";
      }
      continue;
    }
    const std::string allowed = dir + "/allowed/" + name + ".pub";
    if (!std::filesystem::exists(allowed)) {
      std::filesystem::copy_file(base + ".pub", allowed, ec);
      if (ec) return Status::Unavailable("cannot copy " + base + ".pub: " + ec.message());
    }
  }
  return Status::Ok();
}

Result<std::string> ExecutableDir() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return Status::Internal("cannot read /proc/self/exe: " + ec.message());
  return exe.parent_path().string();
}

std::string MetricsBindFor(const std::string& host) {
  if (host == "localhost") return "127.0.0.1";
  in_addr parsed{};
  if (inet_pton(AF_INET, host.c_str(), &parsed) == 1) return host;
  return "0.0.0.0";
}

std::string DefaultLogDir() {
  const std::time_t now = std::time(nullptr);
  std::tm local {};
  localtime_r(&now, &local);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%Y%m%d-%H%M%S", &local);
  return std::string("runs/") + buffer;
}

Status CheckBinaries(const std::string& bin_dir, bool with_export) {
  std::vector<std::string> missing;
  for (std::string_view name : {kPsBinary, kWorkerBinary, kExportBinary}) {
    if (name == kExportBinary && !with_export) continue;
    const std::string path = bin_dir + "/" + std::string(name);
    struct stat info {};
    if (stat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode) ||
        access(path.c_str(), X_OK) != 0) {
      missing.push_back(path);
    }
  }
  if (missing.empty()) return Status::Ok();
  std::string message = "cannot find executable ";
  for (size_t i = 0; i < missing.size(); ++i) {
    if (i > 0) message += " and ";
    message += missing[i];
  }
  message += " (build them, or point --bin-dir at the directory that holds them)";
  return Status::NotFound(message);
}

Result<LaunchPlan> BuildPlan(const LaunchOptions& options, const std::string& bin_dir,
                             const std::string& log_dir, const std::vector<int>& ports) {
  PARASYNC_RETURN_IF_ERROR(ValidateOptions(options));
  const size_t num_ps = static_cast<size_t>(options.num_ps);
  const size_t num_workers = static_cast<size_t>(options.num_workers);
  const size_t total = num_ps + num_workers;
  if (ports.size() != 2 * total) {
    return Status::InvalidArgument("BuildPlan needs " + std::to_string(2 * total) +
                                   " ports, got " + std::to_string(ports.size()));
  }

  const std::vector<std::string> hosts = ProcessHosts(options);
  auto join_addresses = [&](size_t first, size_t count) {
    std::string joined;
    for (size_t i = 0; i < count; ++i) {
      if (i > 0) joined += ",";
      joined += hosts[first + i] + ":" + std::to_string(ports[first + i]);
    }
    return joined;
  };
  const std::string ps_hosts = join_addresses(0, num_ps);
  const std::string worker_hosts = join_addresses(num_ps, num_workers);
  // What every process will check of its --ps-hosts / --worker-hosts, checked before any
  // starts (two names of one host, "node1" and "NODE1", would get the same ports).
  PARASYNC_RETURN_IF_ERROR(CheckDistinctAddresses(SplitHostList(ps_hosts), "the planned --ps-hosts"));
  PARASYNC_RETURN_IF_ERROR(
      CheckDistinctAddresses(SplitHostList(worker_hosts), "the planned --worker-hosts"));

  LaunchPlan plan;
  plan.log_dir = log_dir;
  plan.host = options.host;
  plan.mode = options.mode;
  plan.metrics_bind = MetricsBindFor(options.host);
  plan.job = options.job;
  if (plan.job.empty()) plan.job = std::filesystem::path(log_dir).filename().string();
  if (plan.job.empty()) plan.job = "parasync";
  for (size_t slot = 0; slot < total; ++slot) {
    const bool is_ps = slot < num_ps;
    ProcessSpec spec;
    spec.role = is_ps ? Role::kPs : Role::kWorker;
    spec.index = static_cast<int>(is_ps ? slot : slot - num_ps);
    spec.name = std::string(is_ps ? "ps" : "worker") + std::to_string(spec.index);
    spec.host = hosts[slot];
    spec.remote = !IsLocalHost(spec.host) && (!options.ps_placement.empty() ||
                                               !options.worker_placement.empty());
    spec.address = spec.host + ":" + std::to_string(ports[slot]);
    spec.metrics_port = ports[total + slot];
    spec.log_path = log_dir + "/" + spec.name + ".log";

    std::vector<std::string>& argv = spec.argv;
    const std::string& dir =
        spec.remote && !options.remote_bin_dir.empty() ? options.remote_bin_dir : bin_dir;
    argv.push_back(dir + "/" + std::string(is_ps ? kPsBinary : kWorkerBinary));
    argv.insert(argv.end(), {"--ps-hosts", ps_hosts, "--worker-hosts", worker_hosts,
                             "--task-index", std::to_string(spec.index), "--mode",
                             options.mode, "--metrics-port",
                             std::to_string(spec.metrics_port), "--metrics-bind",
                             MetricsBindFor(spec.host), "--log-dir", log_dir});
    if (is_ps) {
      if (options.replicas_to_aggregate) {
        argv.insert(argv.end(), {"--replicas-to-aggregate", *options.replicas_to_aggregate});
      }
      if (options.worker_timeout) {
        argv.insert(argv.end(), {"--worker-timeout", *options.worker_timeout});
      }
      if (!options.ps_data_dir.empty()) {
        argv.insert(argv.end(), {"--state-dir", options.ps_data_dir + "/" + spec.name});
      }
      argv.insert(argv.end(), options.ps_args.begin(), options.ps_args.end());
    } else {
      // Its index among the workers on its host: each takes its own GPU where there are
      // several.
      int local_rank = 0;
      for (size_t other = num_ps; other < slot; ++other) local_rank += hosts[other] == spec.host;
      argv.insert(argv.end(), {"--local-rank", std::to_string(local_rank), "--epochs",
                               std::to_string(options.epochs)});
      if (!options.data_dir.empty()) argv.insert(argv.end(), {"--dataset", options.data_dir});
      const std::pair<const char*, const std::optional<std::string>*> training[] = {
          {"--batch-size", &options.batch_size}, {"--lr", &options.lr},
          {"--optimizer", &options.optimizer},   {"--lr-schedule", &options.lr_schedule},
          {"--model", &options.model},
          {"--seed", &options.seed},             {"--max-steps", &options.max_steps},
          {"--wire-dtype", &options.wire_dtype}, {"--log-every", &options.log_every}};
      for (const auto& [flag, value] : training) {
        if (value->has_value()) argv.insert(argv.end(), {flag, **value});
      }
      if (options.checkpoint_each_epoch) argv.push_back("--checkpoint-each-epoch");
      argv.insert(argv.end(), options.worker_args.begin(), options.worker_args.end());
      for (const auto& [rank, arg] : options.rank_args) {
        if (rank == spec.index) argv.push_back(arg);
      }
    }
    if (!options.curve_dir.empty()) {
      const std::string& k = options.curve_dir;
      if (is_ps) {
        argv.insert(argv.end(), {"--curve-key", k + "/ps.key", "--curve-allow", k + "/allowed"});
      } else {
        argv.insert(argv.end(), {"--curve-key", k + "/worker" + std::to_string(spec.index) + ".key",
                                 "--curve-server-key", k + "/ps.pub"});
      }
    }
    spec.spawn_argv = argv;
    if (spec.remote) {
      spec.spawn_argv = SplitWords(options.ssh_command);
      spec.spawn_argv.push_back(spec.host);
      spec.spawn_argv.push_back(RemoteCommand(argv, options.grace_seconds));
    }
    plan.processes.push_back(std::move(spec));
  }
  if (!options.export_path.empty()) {
    ProcessSpec exporter;
    exporter.role = Role::kExport;
    exporter.name = "export";
    exporter.log_path = log_dir + "/export.log";
    exporter.argv = {bin_dir + "/" + std::string(kExportBinary), "--ps-hosts", ps_hosts, "--out",
                     options.export_path};
    if (!options.curve_dir.empty()) {
      exporter.argv.insert(exporter.argv.end(),
                           {"--curve-key", options.curve_dir + "/export.key", "--curve-server-key",
                            options.curve_dir + "/ps.pub"});
    }
    plan.exporter = std::move(exporter);
  }
  return plan;
}

// ---- PortReservation --------------------------------------------------------------------

Result<PortReservation> PortReservation::Reserve(const std::string& host, int count) {
  // Below the ephemeral range and held bound until Release (common/ports.h): no outgoing
  // connection can take one before its process binds it.
  PARASYNC_ASSIGN_OR_RETURN(BoundPorts bound, BindFreePorts(host, count));
  PortReservation reservation;
  reservation.fds_ = std::move(bound.fds);
  reservation.ports_ = std::move(bound.ports);
  return reservation;
}

PortReservation::PortReservation(PortReservation&& other) noexcept
    : fds_(std::move(other.fds_)), ports_(std::move(other.ports_)) {
  other.fds_.clear();
}

PortReservation& PortReservation::operator=(PortReservation&& other) noexcept {
  if (this != &other) {
    Release();
    fds_ = std::move(other.fds_);
    ports_ = std::move(other.ports_);
    other.fds_.clear();
  }
  return *this;
}

PortReservation::~PortReservation() { Release(); }

void PortReservation::Release() {
  for (int fd : fds_) close(fd);
  fds_.clear();
}

// ---- Launcher ---------------------------------------------------------------------------

struct Launcher::Child {
  ProcessSpec spec;
  std::string prefix;  // "[ps0] "
  pid_t pid = -1;
  bool running = false;
  int out_fd = -1;  // read end of the child's stdout+stderr pipe
  int log_fd = -1;
  std::string partial;  // bytes after the last newline
  int wait_status = 0;
  bool sent_term = false;
  bool killed_after_grace = false;
  bool fault_killed = false;  // killed by fault injection: its death is no failure
  bool sent_kill = false;     // the launcher sent it SIGKILL (grace over, --kill, a second ^C)
  int restarts = 0;           // by fault injection
  int in_fd = -1;  // remote: write end of ssh's stdin; closing it stops the process
};

Result<std::unique_ptr<Launcher>> Launcher::Create(const LaunchOptions& given) {
  PARASYNC_RETURN_IF_ERROR(ValidateOptions(given));
  LaunchOptions options = given;
  std::string bin_dir = options.bin_dir;
  if (bin_dir.empty()) {
    PARASYNC_ASSIGN_OR_RETURN(bin_dir, ExecutableDir());
  }
  PARASYNC_RETURN_IF_ERROR(CheckBinaries(bin_dir, !options.export_path.empty()));

  std::error_code ec;
  if (!options.export_path.empty()) {
    // Checked now, not after the training it would otherwise waste.
    const std::filesystem::path path =
        std::filesystem::absolute(options.export_path, ec).lexically_normal();
    if (ec || !path.has_filename() || std::filesystem::is_directory(path)) {
      return Status::InvalidArgument("--export must name a file, got '" + options.export_path +
                                     "'");
    }
    options.export_path = path.string();
  }
  if (!options.curve_dir.empty()) {
    options.curve_dir = std::filesystem::absolute(options.curve_dir, ec).lexically_normal().string();
    if (options.curve_dir.size() > 1 && options.curve_dir.back() == '/') options.curve_dir.pop_back();
  }
  const std::string log_dir_text = options.log_dir.empty() ? DefaultLogDir() : options.log_dir;
  std::filesystem::path log_dir = std::filesystem::absolute(log_dir_text, ec);
  if (ec) return Status::InvalidArgument("--log-dir '" + log_dir_text + "': " + ec.message());
  log_dir = log_dir.lexically_normal();
  std::string log_dir_string = log_dir.string();
  if (log_dir_string.size() > 1 && log_dir_string.back() == '/') log_dir_string.pop_back();

  const int port_count = 2 * (options.num_ps + options.num_workers);
  const bool multi_host = !options.ps_placement.empty() || !options.worker_placement.empty();
  // Multi-host: fixed ports from --port-base, counted per host (a launcher cannot reserve
  // ports on other machines; --check tells whether they are free).
  PARASYNC_ASSIGN_OR_RETURN(PortReservation ports,
                            PortReservation::Reserve(options.host, multi_host ? 0 : port_count));
  std::vector<int> port_list = ports.ports();
  if (multi_host) {
    const std::vector<std::string> hosts = ProcessHosts(options);
    std::map<std::string, int> next;
    port_list.assign(static_cast<size_t>(port_count), 0);
    for (size_t i = 0; i < hosts.size(); ++i) {
      // localhost and 127.0.0.1 are one machine: one port counter.
      const int k = next[IsLocalHost(hosts[i]) ? std::string("localhost") : hosts[i]]++;
      port_list[i] = options.port_base + k;
      port_list[hosts.size() + i] = options.port_base + kMetricsPortOffset + k;
    }
  }
  PARASYNC_ASSIGN_OR_RETURN(LaunchPlan plan,
                            BuildPlan(options, bin_dir, log_dir_string, port_list));
  return std::unique_ptr<Launcher>(new Launcher(options, std::move(plan), std::move(ports)));
}

Launcher::Launcher(LaunchOptions options, LaunchPlan plan, PortReservation ports)
    : options_(std::move(options)), plan_(std::move(plan)), ports_(std::move(ports)) {
  const bool multi_host = !options_.ps_placement.empty() || !options_.worker_placement.empty();
  for (const ProcessSpec& spec : plan_.processes) {
    Child child;
    child.spec = spec;
    child.prefix = multi_host ? "[" + spec.host + " " + spec.name + "] " : "[" + spec.name + "] ";
    children_.push_back(std::move(child));
  }
}

std::vector<std::string> Launcher::Preflight(double timeout_seconds) {
  // The processes' --check binds their own ports: the launcher's reservation must not hold them.
  ports_.Release();
  struct Probe {
    const ProcessSpec* spec;
    pid_t pid = -1;
    int fd = -1;
    std::string output;
    int wait_status = 0;
    bool reaped = false;
  };
  std::vector<Probe> probes;
  std::vector<std::string> problems;
  std::map<std::string, int> ssh_started;
  for (const Child& child : children_) {
    if (child.spec.remote && ++ssh_started[child.spec.host] > 8) usleep(150000);
    std::vector<std::string> argv = child.spec.argv;
    argv.push_back("--check");
    std::vector<std::string> command = argv;
    if (child.spec.remote) {
      command = SplitWords(options_.ssh_command);
      command.push_back(child.spec.host);
      command.push_back(ShellJoin(argv));
    }
    SpawnOptions spawn;
    spawn.argv = command;
    spawn.out = spawn.err = StreamTarget::Pipe();
    Result<Spawned> started = Spawn(spawn);
    if (!started.ok()) {
      problems.push_back(started.status().message());
      break;
    }
    Probe probe;
    probe.spec = &child.spec;
    probe.pid = started->pid;
    probe.fd = started->output_fd;
    probes.push_back(std::move(probe));
  }
  // Collect every answer, all probes at once, until the deadline.
  const double deadline = NowSeconds() + timeout_seconds;
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<Probe*> owners;
    for (Probe& p : probes) {
      if (p.fd < 0) continue;
      fds.push_back({p.fd, POLLIN, 0});
      owners.push_back(&p);
    }
    if (fds.empty() || NowSeconds() >= deadline) break;
    const int left_ms = static_cast<int>(std::ceil((deadline - NowSeconds()) * 1000.0));
    if (poll(fds.data(), fds.size(), std::max(1, left_ms)) < 0 && errno != EINTR) break;
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
  const std::string mine = BuildVersion();
  std::set<std::string> unreachable;
  for (Probe& p : probes) {
    const ProcessSpec& spec = *p.spec;
    const std::string where = spec.name + " on " + spec.host;
    if (p.fd >= 0) {
      close(p.fd);
      p.fd = -1;
    }
    int wait_status = 0;
    // Its output has ended; the process itself may take a moment more to exit.
    pid_t reaped = waitpid(p.pid, &wait_status, WNOHANG);
    while (reaped == 0 && NowSeconds() < deadline) {
      usleep(5000);
      reaped = waitpid(p.pid, &wait_status, WNOHANG);
    }
    if (reaped == 0) {
      kill(p.pid, SIGKILL);
      while (waitpid(p.pid, &wait_status, 0) < 0 && errno == EINTR) {
      }
      problems.push_back(where + ": no answer within " + FormatSeconds(timeout_seconds) + " s");
      continue;
    }
    std::string version;
    std::vector<std::string> lines;
    std::istringstream in(p.output);
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
      continue;
    }
    if (version.empty()) {
      problems.push_back(where + ": " + spec.argv[0] + " --check gave no answer: " + last);
    } else if (version != mine) {
      problems.push_back(where + ": " + std::filesystem::path(spec.argv[0]).filename().string() +
                         " is " + version + ", but parasync-launch is " + mine +
                         ": deploy the same build everywhere");
    }
  }
  return problems;
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
}

Status Launcher::Start() {
  if (started_) return Status::FailedPrecondition("Launcher::Start called twice");
  started_ = true;

  std::error_code ec;
  std::filesystem::create_directories(plan_.log_dir, ec);
  if (ec) return Status::Unavailable("cannot create log directory " + plan_.log_dir + ": " +
                                     ec.message());
  run_start_ = NowSeconds();
  run_start_unix_ = UnixSeconds();
  // eval.jsonl is appended to, run after run: this run's rows are those after this offset.
  eval_offset_ = std::filesystem::file_size(plan_.log_dir + "/eval.jsonl", ec);
  if (ec) eval_offset_ = 0;
  // An earlier run's summary must not pass for this one's should this launcher be killed.
  std::filesystem::remove(plan_.log_dir + "/" + std::string(kSummaryFile), ec);
  // From here on a failure is this run's end, and summary.json says so.
  auto failed = [this](Status status) {
    end_reason_ = status.message();
    Finish(kExitFailed);
    return status;
  };
  if (plan_.exporter) {
    // The model often goes next to the logs, e.g. <log_dir>/model.psm.
    const std::string dir = std::filesystem::path(options_.export_path).parent_path().string();
    std::filesystem::create_directories(dir, ec);
    if (ec) {
      return failed(Status::Unavailable("cannot create " + dir + " for --export: " +
                                        ec.message()));
    }
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
      return failed(Status::Unavailable("cannot open " + child.spec.log_path + ": " +
                                        std::strerror(errno)));
    }
  }
  if (Status installed = InstallSignalHandlers(); !installed.ok()) return failed(installed);

  Message("starting " + std::to_string(options_.num_ps) + " ps and " +
          std::to_string(options_.num_workers) + " workers, mode " + plan_.mode +
          ", logs in " + plan_.log_dir);
  ports_.Release();
  std::map<std::string, int> ssh_started;
  for (Child& child : children_) {
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
      return failed(status);
    }
    Message(child.spec.name + " pid " + std::to_string(child.pid) + " at " +
            child.spec.address + ", metrics http://" + child.spec.host + ":" +
            std::to_string(child.spec.metrics_port) + "/metrics");
  }
  Status written = WriteClusterJson();
  if (!written.ok()) Message("warning: " + written.ToString());
  written = WritePrometheusTargets();
  if (!written.ok()) Message("warning: " + written.ToString());
  Message("Prometheus targets (job \"" + plan_.job + "\"): " + plan_.log_dir +
          "/prometheus-targets.json; watch the run: tools/watch-run.sh " + plan_.log_dir);
  started_at_ = NowSeconds();
  fault_states_.assign(options_.faults.size(), FaultState{});
  return Status::Ok();
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
    child.log_fd = open(child.spec.log_path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    child.fault_killed = false;
    child.sent_term = false;
    child.sent_kill = false;
    child.partial.clear();
    if (Status status = SpawnOne(child); !status.ok()) {
      failure_ = "fault injection: could not restart " + child.spec.name + ": " + status.message();
      Message(failure_);
      BeginStopping(Phase::kStoppingWorkers);
      return next;
    }
    ++child.restarts;
    Message("fault injection: restarted " + child.spec.name + " as pid " +
            std::to_string(child.pid));
    if (Status written = WriteClusterJson(); !written.ok()) {
      Message("warning: " + written.ToString());
    }
  }
  return next;
}

Status Launcher::SpawnOne(Child& child) {
  const std::vector<std::string>& command =
      child.spec.spawn_argv.empty() ? child.spec.argv : child.spec.spawn_argv;
  SpawnOptions spawn;
  spawn.argv = command;
  // Our environment with kLogPrefixedEnv=1: we prefix the child's lines with its name.
  spawn.env_set = {std::string(kLogPrefixedEnv) + "=1"};
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
  return Status::Ok();
}

Status Launcher::WriteClusterJson() const {
  using nlohmann::json;
  json doc;
  doc["host"] = plan_.host;
  doc["mode"] = plan_.mode;
  doc["job"] = plan_.job;
  doc["log_dir"] = plan_.log_dir;
  doc["launcher_pid"] = getpid();
  json ps_hosts = json::array();
  json worker_hosts = json::array();
  json processes = json::array();
  for (const Child& child : children_) {
    const bool is_ps = child.spec.role == Role::kPs;
    (is_ps ? ps_hosts : worker_hosts).push_back(child.spec.address);
    processes.push_back({
        {"role", is_ps ? "ps" : "worker"},
        {"index", child.spec.index},
        {"name", child.spec.name},
        {"pid", child.pid},
        {"address", child.spec.address},
        {"metrics_port", child.spec.metrics_port},
        {"host", child.spec.host},
        {"metrics_url", "http://" + child.spec.host + ":" +
                            std::to_string(child.spec.metrics_port) + "/metrics"},
        {"log", child.spec.log_path},
        {"command", child.spec.argv},
    });
  }
  doc["cluster"] = {{"ps", ps_hosts}, {"worker", worker_hosts}};
  doc["processes"] = processes;
  if (plan_.exporter) doc["export_command"] = plan_.exporter->argv;
  // Arguments are user input: replace invalid UTF-8 rather than throw.
  const std::string text = doc.dump(2, ' ', false, json::error_handler_t::replace) + "\n";

  return WriteFileAtomically(plan_.log_dir + "/cluster.json", text);
}

Status Launcher::WritePrometheusTargets() const {
  // Prometheus file_sd format: one target group per process, labelled like the metrics the
  // process exports itself (role and shard or rank) plus the run's job.
  using nlohmann::json;
  json groups = json::array();
  for (const Child& child : children_) {
    const bool is_ps = child.spec.role == Role::kPs;
    json labels = {{"job", plan_.job}, {"role", is_ps ? "ps" : "worker"}};
    labels[is_ps ? "shard" : "rank"] = std::to_string(child.spec.index);
    groups.push_back(
        {{"targets", {child.spec.host + ":" + std::to_string(child.spec.metrics_port)}},
         {"labels", labels}});
  }
  return WriteFileAtomically(plan_.log_dir + "/prometheus-targets.json",
                             groups.dump(2, ' ', false, json::error_handler_t::replace) + "\n");
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
    endpoints.push_back({plan_.metrics_bind, child.spec.metrics_port, std::move(text).value()});
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
    if (TryReap(child, &wait_status)) OnExit(child, wait_status);
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
  std::string skip;
  if (interrupted_) {
    skip = "the run was interrupted";
  } else if (!failure_.empty()) {
    skip = "the run failed";
  } else if (!chief_succeeded_) {
    skip = "the chief did not finish";
  }
  for (const Child& child : children_) {
    if (skip.empty() && child.spec.role == Role::kPs && !child.running) {
      skip = child.spec.name + " had already exited";
    }
  }
  if (!skip.empty()) {
    export_outcome_ = "no model exported to " + path + ": " + skip;
    if (failure_.empty() && !interrupted_) failure_ = export_outcome_;
    Message(export_outcome_);
    BeginStopping(Phase::kStoppingPs);
    return;
  }
  exporter_ = std::make_unique<Child>();
  exporter_->spec = *plan_.exporter;
  exporter_->prefix = "[" + exporter_->spec.name + "] ";
  // Without its log file the output is still forwarded.
  exporter_->log_fd = open(exporter_->spec.log_path.c_str(),
                           O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  Message("exporting the model to " + path + " before stopping the parameter servers");
  const Status spawned = SpawnOne(*exporter_);
  if (!spawned.ok()) {
    failure_ = "export failed: " + spawned.message();
    export_outcome_ = "no model exported to " + path + ": " + spawned.message();
    Message(failure_);
    BeginStopping(Phase::kStoppingPs);
    return;
  }
  phase_ = Phase::kExporting;
  group_killed_ = false;
  stop_deadline_ = NowSeconds() + kExportTimeoutSeconds;
}

void Launcher::OnExportExit(int wait_status) {
  exporter_->wait_status = wait_status;
  const std::string& path = options_.export_path;
  if (ExitedZero(wait_status)) {
    export_outcome_ = "model exported to " + path;
    Message(export_outcome_);
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
  export_outcome_ = "no model exported to " + path + ": " + failure;
  Message(failure);
}

void Launcher::OnExit(Child& child, int wait_status) {
  child.running = false;
  child.wait_status = wait_status;
  const bool clean = ExitedZero(wait_status);
  const std::string who = child.spec.name + " (pid " + std::to_string(child.pid) + ")";
  const bool is_chief = child.spec.role == Role::kWorker && child.spec.index == 0;
  if (clean && is_chief) chief_succeeded_ = true;

  if (child.fault_killed && phase_ == Phase::kRunning) {
    Message(who + " ended by fault injection (" + DescribeWaitStatus(wait_status) + ")");
    return;
  }
  if (phase_ == Phase::kRunning) {
    if (clean && is_chief) {
      Message("chief " + who + " finished; stopping the others");
      BeginStopping(Phase::kStoppingWorkers);
    } else if (clean) {
      Message(who + (child.spec.role == Role::kWorker
                         ? " finished early with exit status 0"
                         : " exited with status 0 before the chief finished"));
    } else {
      // A process that refused its flags, data or state fails the run the same way.
      failure_is_bad_usage_ = WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == kExitUsage;
      failure_ = who + " failed with " + DescribeWaitStatus(wait_status) +
                 (is_chief ? "" : " before the chief finished") + "; log: " +
                 child.spec.log_path;
      Message(failure_);
      BeginStopping(Phase::kStoppingWorkers);
    }
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
    // The signal pipe wakes us for every exit; the timeout only serves the deadlines.
    int timeout_ms = static_cast<int>(std::clamp(std::ceil(InjectFaults() * 1000.0), 0.0, 1000.0));
    if (phase_ != Phase::kRunning) {
      const double left = stop_deadline_ - NowSeconds();
      timeout_ms = group_killed_ ? 100
                                 : static_cast<int>(std::clamp(std::ceil(left * 1000.0),
                                                               0.0, 1000.0));
    }
    const int ready = poll(poll_fds.data(), poll_fds.size(), timeout_ms);
    if (ready < 0 && errno != EINTR) {
      Message(std::string("poll failed: ") + std::strerror(errno) + "; killing all processes");
      if (failure_.empty()) failure_ = "poll failed";
      KillAllNow();
      group_killed_ = true;
    }

    if (ready > 0 && (poll_fds[0].revents & POLLIN) != 0) {
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
          end_reason_ = "got " + SignalName(signal_number);
          Message("got " + SignalName(signal_number) +
                  "; stopping all processes (send it again to kill them at once)");
          if (phase_ == Phase::kRunning) BeginStopping(Phase::kStoppingWorkers);
          if (phase_ == Phase::kExporting) {
            // An interrupted export gets the grace period, like every other process.
            kill(exporter_->pid, SIGTERM);
            exporter_->sent_term = true;
            stop_deadline_ = std::min(stop_deadline_, NowSeconds() + options_.grace_seconds);
          }
        }
      }
    }
    for (size_t i = 1; ready > 0 && i < poll_fds.size(); ++i) {
      if ((poll_fds[i].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
        ReadOutput(*owners[i - 1], /*drain=*/false);
      }
    }
    ReapExited();

    // Stop workers, export (when asked), then stop the PS; each group gets the grace period
    // (the exporter kExportTimeoutSeconds), then SIGKILL.
    for (bool advanced = true; advanced;) {
      advanced = false;
      if (phase_ == Phase::kRunning || phase_ == Phase::kDone) break;
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
  const int exit_code = ComputeExitCode();
  Finish(exit_code);
  return exit_code;
}

int Launcher::ComputeExitCode() {
  std::string statuses;
  std::string unclean;
  for (const Child& child : children_) {
    if (!statuses.empty()) statuses += ", ";
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
    end_reason_ = failure_;
    Message("run failed: " + failure_);
    return failure_is_bad_usage_ ? kExitUsage : kExitFailed;
  }
  if (!unclean.empty()) {
    end_reason_ = unclean + " did not exit with status 0";
    Message("run failed: " + end_reason_);
    return kExitFailed;
  }
  bool faults = false;
  for (const Child& child : children_) faults |= child.fault_killed;
  Message(faults ? "run succeeded: every process not killed by fault injection exited with "
                   "status 0"
                 : "run succeeded: every process exited with status 0");
  return kExitOk;
}

// ---- the end of the run: summary.json and the final lines -------------------------------

struct Launcher::Report {
  EvalRows eval;          // this run's rows of eval.jsonl
  double wall_seconds = 0.0;
  std::optional<int64_t> examples;
  std::string examples_source;  // "worker_snapshots" or "eval_jsonl"
  std::optional<double> examples_per_second;
};

void Launcher::Finish(int exit_code) {
  exit_code_ = exit_code;
  run_end_ = NowSeconds();
  run_end_unix_ = UnixSeconds();
  report_ = std::make_unique<Report>(ComputeReport());
  if (Status written = WriteSummaryJson(); !written.ok()) {
    Message("warning: " + written.ToString());
  }
}

Launcher::Report Launcher::ComputeReport() const {
  Report report;
  report.eval = ReadEvalRows(plan_.log_dir + "/eval.jsonl", eval_offset_);
  const double end = run_end_ > 0 ? run_end_ : NowSeconds();
  report.wall_seconds = run_start_ > 0 ? std::max(0.0, end - run_start_) : 0.0;
  // The workers' own counters say what this run trained, including after the chief's last
  // evaluation. They need every worker's final snapshot from one uninterrupted process (a
  // killed worker writes none; a restarted one counts from zero). Otherwise the servers'
  // count at the last evaluation, which includes what a restored model had already seen.
  int64_t counted = 0;
  bool complete = true;
  for (const Child& child : children_) {
    if (child.spec.role != Role::kWorker) continue;
    const std::optional<double> value =
        child.restarts > 0 || child.fault_killed
            ? std::nullopt
            : SnapshotSum(MetricsSnapshotPath(plan_.log_dir, child.spec.name),
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

Status Launcher::WriteSummaryJson() const {
  using json = nlohmann::ordered_json;  // the fields in the order docs/run-summary.md has them
  const Report& report = *report_;
  const auto optional = [](const auto& value) {
    return value.has_value() ? json(*value) : json(nullptr);
  };
  const auto row_json = [&](const std::optional<EvalRow>& row) {
    if (!row.has_value()) return json(nullptr);
    return json{{"epoch", optional(row->epoch)},
                {"test_accuracy", row->test_accuracy},
                {"examples", optional(row->examples)},
                {"wall_s", optional(row->wall_s)}};
  };
  const auto process_json = [&](const Child& child, const char* role) {
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
  };

  json processes = json::array();
  for (const Child& child : children_) {
    processes.push_back(process_json(child, child.spec.role == Role::kPs ? "ps" : "worker"));
  }
  if (exporter_ != nullptr) processes.push_back(process_json(*exporter_, "export"));

  json doc;
  doc["outcome"] = exit_code_ == kExitOk            ? "succeeded"
                   : exit_code_ == kExitInterrupted ? "interrupted"
                                                    : "failed";
  doc["exit_code"] = exit_code_;
  doc["reason"] = end_reason_.empty() ? json(nullptr) : json(end_reason_);
  doc["config"] = {
      {"mode", plan_.mode},
      {"ps", options_.num_ps},
      {"workers", options_.num_workers},
      {"epochs", options_.epochs},
      {"model", optional(options_.model)},
      {"dataset", options_.data_dir.empty() ? json(nullptr) : json(options_.data_dir)},
      {"host", plan_.host},
      {"log_dir", plan_.log_dir},
      {"command_line", options_.command_line},
  };
  doc["start_time"] = IsoLocalTime(run_start_unix_);
  doc["end_time"] = IsoLocalTime(run_end_unix_);
  doc["wall_seconds"] = std::round(report.wall_seconds * 1000.0) / 1000.0;
  doc["examples"] = optional(report.examples);
  doc["examples_source"] =
      report.examples_source.empty() ? json(nullptr) : json(report.examples_source);
  doc["examples_per_second"] =
      report.examples_per_second.has_value()
          ? json(std::round(*report.examples_per_second * 10.0) / 10.0)
          : json(nullptr);
  doc["eval_rows"] = report.eval.rows;
  doc["final"] = row_json(report.eval.last);
  doc["best"] = row_json(report.eval.best);
  if (plan_.exporter) {
    doc["export"] = {
        {"path", options_.export_path},
        {"exported", exporter_ != nullptr && !exporter_->running &&
                         ExitedZero(exporter_->wait_status)},
        {"outcome", export_outcome_.empty() ? json(nullptr) : json(export_outcome_)},
    };
  }
  doc["processes"] = processes;
  // Arguments are user input: replace invalid UTF-8 rather than throw.
  return WriteFileAtomically(plan_.log_dir + "/" + std::string(kSummaryFile),
                             doc.dump(2, ' ', false, json::error_handler_t::replace) + "\n");
}

std::string Launcher::Summary() const {
  Report computed;
  if (report_ == nullptr) computed = ComputeReport();
  const Report& report = report_ != nullptr ? *report_ : computed;
  const std::string prefix = LauncherPrefix();
  std::ostringstream out;
  const std::string eval_path = plan_.log_dir + "/eval.jsonl";
  const auto exists = [](const std::string& path) {
    std::error_code ec;
    return std::filesystem::exists(path, ec);
  };

  char text[160];
  std::snprintf(text, sizeof(text), "run wall time %.1f s", report.wall_seconds);
  std::string run = text;
  if (report.examples_per_second.has_value()) {
    std::snprintf(text, sizeof(text), ", %lld examples, %.0f examples/sec",
                  static_cast<long long>(*report.examples), *report.examples_per_second);
    run += text;
  }
  const EvalRows& eval = report.eval;
  if (!eval.exists) {
    out << prefix << "no " << eval_path << " (the chief writes it after each evaluation)\n";
    out << prefix << run << "\n";
  } else if (eval.rows == 0) {
    out << prefix << "no evaluation from this run in " << eval_path
        << " (the chief writes a row after each evaluation)\n";
    out << prefix << run << "\n";
  } else if (!eval.last.has_value()) {
    out << prefix << "the last line of " << eval_path << " has no test_accuracy\n";
    out << prefix << run << "\n";
  } else {
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

  if (plan_.exporter) {
    if (exporter_ != nullptr && ExitedZero(exporter_->wait_status)) {
      out << prefix << "model: " << options_.export_path
          << " (evaluate it: parasync-worker --eval-only --model-file " << options_.export_path
          << ")\n";
    } else {
      out << prefix
          << (export_outcome_.empty() ? "no model exported to " + options_.export_path
                                      : export_outcome_)
          << "\n";
    }
  }
  out << prefix << "logs:";
  for (const Child& child : children_) out << " " << child.spec.log_path;
  if (exporter_ != nullptr) out << " " << exporter_->spec.log_path;
  out << "\n";
  // Only what is there: a run that failed early has no evaluation log, maybe no more.
  if (eval.exists) out << prefix << "evaluation log: " << eval_path << "\n";
  const std::string summary_path = plan_.log_dir + "/" + std::string(kSummaryFile);
  if (exists(summary_path)) {
    out << prefix << "run summary: " << summary_path << " (fields: docs/run-summary.md)\n";
  }
  if (exists(plan_.log_dir + "/cluster.json")) {
    out << prefix << "cluster description: " << plan_.log_dir << "/cluster.json\n";
  }
  out << prefix << "metrics endpoints (live during the run):";
  for (const Child& child : children_) {
    out << " " << child.spec.name << " http://" << child.spec.host << ":"
        << child.spec.metrics_port << "/metrics";
  }
  out << "\n";
  out << prefix << "each process writes its final metrics to " << plan_.log_dir
      << "/metrics-<role><index>.prom at exit (e.g. metrics-ps0.prom, metrics-worker0.prom)\n";
  if (exists(plan_.log_dir + "/prometheus-targets.json")) {
    out << prefix << "Prometheus targets (job \"" << plan_.job << "\"): " << plan_.log_dir
        << "/prometheus-targets.json\n";
  }
  return out.str();
}

}  // namespace parasync::launch
