#include "deploy/launch/plan.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/address.h"
#include "common/cluster_spec.h"
#include "common/curve.h"

namespace parasync::launch {
namespace {

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

// "NAME=value" as a shell assignment word: NAME='value' where the value needs quoting.
std::string ShellAssignment(const std::string& entry) {
  const size_t equals = entry.find('=');
  return entry.substr(0, equals) + "=" + ShellQuote(entry.substr(equals + 1));
}

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

// What every process of the cluster shares, for PlanProcess.
struct Cluster {
  std::vector<std::string> hosts;  // by slot: every PS, then every worker
  const std::vector<int>* ports = nullptr;  // as BuildPlan takes them
  size_t num_ps = 0;
  std::vector<std::string> ps_addresses;      // host:port of every PS
  std::vector<std::string> worker_addresses;  // host:port of every worker
  std::string ps_hosts;      // --ps-hosts: ps_addresses joined with ','
  std::string worker_hosts;  // --worker-hosts
  std::vector<std::string> ps_sockets;  // with LaunchOptions::local_ipc: every PS's --ipc
  std::string bin_dir;
  std::string log_dir;
  bool ready_files = false;  // a single-host run: every process reports its ports
};

// "host:port" of the `count` processes from slot `first`.
std::vector<std::string> Addresses(const std::vector<std::string>& hosts,
                                   const std::vector<int>& ports, size_t first, size_t count) {
  std::vector<std::string> addresses;
  for (size_t i = 0; i < count; ++i) {
    addresses.push_back(hosts[first + i] + ":" + std::to_string(ports[first + i]));
  }
  return addresses;
}

std::string JoinAddresses(const std::vector<std::string>& addresses) {
  std::string joined;
  for (const std::string& address : addresses) joined += (joined.empty() ? "" : ",") + address;
  return joined;
}

// The settings passed to workers only when given: the flag parasync-worker takes, and the
// variable a --worker-command worker gets instead (parasync-entrypoint's names, where it
// has the setting).
struct TrainingSetting {
  const char* flag;
  const char* variable;
  const std::optional<std::string>* value;
};

std::vector<TrainingSetting> TrainingSettings(const LaunchOptions& options) {
  return {{"--batch-size", "PARASYNC_BATCH_SIZE", &options.batch_size},
          {"--lr", "PARASYNC_LR", &options.lr},
          {"--optimizer", "PARASYNC_OPTIMIZER", &options.optimizer},
          {"--lr-schedule", "PARASYNC_LR_SCHEDULE", &options.lr_schedule},
          {"--model", "PARASYNC_MODEL", &options.model},
          {"--seed", "PARASYNC_SEED", &options.seed},
          {"--max-steps", "PARASYNC_MAX_STEPS", &options.max_steps},
          {"--eval-every", "PARASYNC_EVAL_EVERY", &options.eval_every},
          {"--wire-dtype", "PARASYNC_WIRE_DTYPE", &options.wire_dtype},
          {"--topk-probe", "PARASYNC_TOPK_PROBE", &options.topk_probe},
          {"--delta-pulls", "PARASYNC_DELTA_PULLS", &options.delta_pulls},
          {"--log-every", "PARASYNC_LOG_EVERY", &options.log_every}};
}

// The seconds the chief's final evaluation waits for the other workers' last epochs
// (--wait-for-workers), as "%g"; empty for the other workers, and for every worker with
// stop_workers_with_chief or a zero finish_timeout.
std::string WaitForWorkersSeconds(const LaunchOptions& options, const ProcessSpec& spec) {
  if (spec.index != 0 || options.stop_workers_with_chief || options.finish_timeout <= 0) {
    return "";
  }
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%g", options.finish_timeout);
  return seconds;
}

// Worker `index`'s CURVE key pair in --curve-dir `dir`.
std::string WorkerKeyFile(const std::string& dir, int index) {
  return dir + "/worker" + std::to_string(index) + ".key";
}

void AddPsFlags(const LaunchOptions& options, const Cluster& cluster, const ProcessSpec& spec,
                std::vector<std::string>& argv) {
  if (options.local_ipc) {
    argv.insert(argv.end(), {"--ipc", cluster.ps_sockets[static_cast<size_t>(spec.index)]});
  }
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
}

// With --local-aggregation, the ranks of the workers on `spec`'s host ("0,1"), when it has
// several; else empty.
std::string LocalGroupRanks(const LaunchOptions& options, const Cluster& cluster,
                            const ProcessSpec& spec) {
  if (!options.local_aggregation) return "";
  std::string ranks;
  int count = 0;
  for (size_t slot = cluster.num_ps; slot < cluster.hosts.size(); ++slot) {
    if (cluster.hosts[slot] != spec.host) continue;
    ranks += (count++ > 0 ? "," : "") + std::to_string(slot - cluster.num_ps);
  }
  return count > 1 ? ranks : "";
}

// `local_rank`: the worker's index among the workers on its host (each takes its own GPU
// where there are several).
void AddWorkerFlags(const LaunchOptions& options, const Cluster& cluster, const ProcessSpec& spec,
                    int local_rank, std::vector<std::string>& argv) {
  argv.insert(argv.end(), {"--local-rank", std::to_string(local_rank), "--epochs",
                           std::to_string(options.epochs)});
  for (size_t i = 0; i < cluster.num_ps && options.local_ipc; ++i) {
    if (cluster.hosts[i] != spec.host) continue;
    argv.insert(argv.end(), {"--ps-ipc", std::to_string(i) + "=" + cluster.ps_sockets[i]});
  }
  if (!options.data_dir.empty()) argv.insert(argv.end(), {"--dataset", options.data_dir});
  for (const TrainingSetting& setting : TrainingSettings(options)) {
    if (setting.value->has_value()) argv.insert(argv.end(), {setting.flag, **setting.value});
  }
  if (const std::string wait = WaitForWorkersSeconds(options, spec); !wait.empty()) {
    argv.insert(argv.end(), {"--wait-for-workers", wait});
  }
  if (options.checkpoint_each_epoch) argv.push_back("--checkpoint-each-epoch");
  if (const std::string group = LocalGroupRanks(options, cluster, spec); !group.empty()) {
    argv.insert(argv.end(), {"--local-group", group});
  }
  argv.insert(argv.end(), options.worker_args.begin(), options.worker_args.end());
  for (const auto& [rank, arg] : options.rank_args) {
    if (rank == spec.index) argv.push_back(arg);
  }
}

void AddCurveFlags(const LaunchOptions& options, const ProcessSpec& spec,
                   std::vector<std::string>& argv) {
  if (options.curve_dir.empty()) return;
  const std::string& k = options.curve_dir;
  if (spec.role == Role::kPs) {
    argv.insert(argv.end(), {"--curve-key", k + "/ps.key", "--curve-allow", k + "/allowed"});
  } else {
    argv.insert(argv.end(), {"--curve-key", WorkerKeyFile(k, spec.index), "--curve-server-key",
                             k + "/ps.pub"});
  }
}

// The environment of a --worker-command worker: everything parasync-worker would get as
// flags (AddWorkerFlags, AddCurveFlags), as variables. The one list of them; the names are
// a contract with the Python client and docs/worker-environment.md lists them.
// `bin_dir`: where the binaries are on the worker's host.
std::vector<std::string> WorkerEnvironment(const LaunchOptions& options, const Cluster& cluster,
                                           const ProcessSpec& spec, int local_rank,
                                           const std::string& bin_dir) {
  // TensorFlow's format, as common/cluster_spec.h parses it.
  const nlohmann::ordered_json tf_config = {
      {"cluster", {{"ps", cluster.ps_addresses}, {"worker", cluster.worker_addresses}}},
      {"task", {{"type", "worker"}, {"index", spec.index}}}};
  // torchrun's and Horovod's names for where the worker is: its rank and the world's size,
  // its place among the workers of its host, and its host's among the hosts (in the order
  // they first appear among the workers).
  auto host_of = [](const std::string& address) {
    return address.substr(0, address.rfind(':'));
  };
  const std::string my_host = host_of(cluster.worker_addresses.at(static_cast<size_t>(spec.index)));
  std::vector<std::string> hosts;
  int local_size = 0;
  for (const std::string& address : cluster.worker_addresses) {
    const std::string host = host_of(address);
    if (host == my_host) ++local_size;
    if (std::find(hosts.begin(), hosts.end(), host) == hosts.end()) hosts.push_back(host);
  }
  const auto cross_rank = std::find(hosts.begin(), hosts.end(), my_host) - hosts.begin();
  const std::string world = std::to_string(cluster.worker_addresses.size());
  std::vector<std::string> env = {
      "TF_CONFIG=" + tf_config.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
      "RANK=" + std::to_string(spec.index),
      "WORLD_SIZE=" + world,
      "LOCAL_WORLD_SIZE=" + std::to_string(local_size),
      "HOROVOD_RANK=" + std::to_string(spec.index),
      "HOROVOD_SIZE=" + world,
      "HOROVOD_LOCAL_RANK=" + std::to_string(local_rank),
      "HOROVOD_LOCAL_SIZE=" + std::to_string(local_size),
      "HOROVOD_CROSS_RANK=" + std::to_string(cross_rank),
      "HOROVOD_CROSS_SIZE=" + std::to_string(hosts.size()),
      "PARASYNC_MODE=" + options.mode,
      "PARASYNC_LOG_DIR=" + cluster.log_dir,
      "PARASYNC_METRICS_PORT=" + std::to_string(spec.metrics_port),
      "PARASYNC_METRICS_BIND=" + MetricsBindFor(spec.host),
      "LOCAL_RANK=" + std::to_string(local_rank),
      std::string(kLogPrefixedEnv) + "=1",
      "PARASYNC_EPOCHS=" + std::to_string(options.epochs),
      "PARASYNC_BIN_DIR=" + bin_dir};
  if (!options.worker_python_path.empty()) {
    env.push_back("PYTHONPATH=" + options.worker_python_path);
  }
  // Workers sharing a host would each start a thread per core (OpenMP, and the OpenBLAS
  // that Debian's PyTorch computes with, which torch.set_num_threads does not size): one
  // each, as torchrun does, unless the user chose.
  if (!options.omp_threads_given && local_size > 1) env.push_back("OMP_NUM_THREADS=1");
  if (!spec.ready_path.empty()) env.push_back("PARASYNC_READY_FILE=" + spec.ready_path);
  if (!options.data_dir.empty()) env.push_back("PARASYNC_DATA=" + options.data_dir);
  for (const TrainingSetting& setting : TrainingSettings(options)) {
    if (setting.value->has_value()) {
      env.push_back(std::string(setting.variable) + "=" + **setting.value);
    }
  }
  if (options.checkpoint_each_epoch) env.push_back("PARASYNC_CHECKPOINT_EACH_EPOCH=1");
  if (const std::string group = LocalGroupRanks(options, cluster, spec); !group.empty()) {
    env.push_back("PARASYNC_LOCAL_GROUP=" + group);
  }
  if (const std::string wait = WaitForWorkersSeconds(options, spec); !wait.empty()) {
    env.push_back("PARASYNC_WAIT_FOR_WORKERS=" + wait);
  }
  if (!options.curve_dir.empty()) {
    env.push_back("PARASYNC_CURVE_KEY=" + WorkerKeyFile(options.curve_dir, spec.index));
    env.push_back("PARASYNC_CURVE_SERVER_KEY=" + options.curve_dir + "/ps.pub");
  }
  return env;
}

// A --worker-command worker's argv: /bin/sh execs the command, so the pid the launcher
// signals and reaps becomes the user's program's; --worker-arg and its --rank-arg values
// follow as shell-quoted words.
std::vector<std::string> CommandWorkerArgv(const LaunchOptions& options, const ProcessSpec& spec) {
  std::vector<std::string> extra = options.worker_args;
  for (const auto& [rank, arg] : options.rank_args) {
    if (rank == spec.index) extra.push_back(arg);
  }
  std::string command = "exec " + *options.worker_command;
  if (!extra.empty()) command += " " + ShellJoin(extra);
  return {"/bin/sh", "-c", command};
}

// The command line of our binary for `spec` (a PS, or a worker without --worker-command).
std::vector<std::string> BinaryArgv(const LaunchOptions& options, const Cluster& cluster,
                                    const ProcessSpec& spec, int local_rank,
                                    const std::string& bin_dir) {
  const bool is_ps = spec.role == Role::kPs;
  std::vector<std::string> argv = {bin_dir + "/" + std::string(is_ps ? kPsBinary : kWorkerBinary)};
  argv.insert(argv.end(), {"--ps-hosts", cluster.ps_hosts, "--worker-hosts",
                           cluster.worker_hosts, "--task-index", std::to_string(spec.index),
                           "--mode", options.mode, "--metrics-port",
                           std::to_string(spec.metrics_port), "--metrics-bind",
                           MetricsBindFor(spec.host), "--log-dir", cluster.log_dir});
  if (!spec.ready_path.empty()) argv.insert(argv.end(), {"--ready-file", spec.ready_path});
  if (is_ps) {
    AddPsFlags(options, cluster, spec, argv);
  } else {
    AddWorkerFlags(options, cluster, spec, local_rank, argv);
  }
  AddCurveFlags(options, spec, argv);
  return argv;
}

// The process of `slot` (a PS below cluster.num_ps, else a worker).
ProcessSpec PlanProcess(const LaunchOptions& options, const Cluster& cluster, size_t slot) {
  const std::vector<int>& ports = *cluster.ports;
  const size_t total = cluster.hosts.size();
  const bool is_ps = slot < cluster.num_ps;
  ProcessSpec spec;
  spec.role = is_ps ? Role::kPs : Role::kWorker;
  spec.index = static_cast<int>(is_ps ? slot : slot - cluster.num_ps);
  spec.name = std::string(is_ps ? "ps" : "worker") + std::to_string(spec.index);
  spec.host = cluster.hosts[slot];
  spec.remote = !IsLocalHost(spec.host) && IsMultiHost(options);
  spec.address = spec.host + ":" + std::to_string(ports[slot]);
  spec.metrics_port = ports[total + slot];
  spec.log_path = cluster.log_dir + "/" + spec.name + ".log";
  if (cluster.ready_files) spec.ready_path = cluster.log_dir + "/" + spec.name + ".ready";

  const std::string& dir =
      spec.remote && !options.remote_bin_dir.empty() ? options.remote_bin_dir : cluster.bin_dir;
  // A worker's index among the workers on its host (each takes its own GPU where there
  // are several).
  int local_rank = 0;
  for (size_t other = cluster.num_ps; other < slot; ++other) {
    local_rank += cluster.hosts[other] == spec.host;
  }
  if (!is_ps && options.worker_command) {
    spec.user_command = true;
    spec.argv = CommandWorkerArgv(options, spec);
    spec.env = WorkerEnvironment(options, cluster, spec, local_rank, dir);
  } else {
    spec.argv = BinaryArgv(options, cluster, spec, local_rank, dir);
  }
  spec.spawn_argv = spec.argv;
  if (spec.remote) {
    spec.spawn_argv =
        SshArgv(options, spec.host, RemoteCommand(spec.argv, options.grace_seconds, spec.env));
  }
  return spec;
}

ProcessSpec PlanExporter(const LaunchOptions& options, const Cluster& cluster) {
  ProcessSpec exporter;
  exporter.role = Role::kExport;
  exporter.name = "export";
  exporter.log_path = cluster.log_dir + "/export.log";
  exporter.argv = {cluster.bin_dir + "/" + std::string(kExportBinary), "--ps-hosts",
                   cluster.ps_hosts, "--out", options.export_path};
  if (!options.curve_dir.empty()) {
    exporter.argv.insert(exporter.argv.end(),
                         {"--curve-key", options.curve_dir + "/export.key", "--curve-server-key",
                          options.curve_dir + "/ps.pub"});
  }
  return exporter;
}

}  // namespace

void MarkRestart(const LaunchOptions& options, ProcessSpec& spec, int restart) {
  spec.env.push_back("PARASYNC_RESTART=" + std::to_string(restart));
  if (spec.remote) {
    spec.spawn_argv =
        SshArgv(options, spec.host, RemoteCommand(spec.argv, options.grace_seconds, spec.env));
  }
}

std::string NewSocketDir() {
  std::random_device random;  // /dev/urandom
  char name[17];
  std::snprintf(name, sizeof(name), "%08x%08x", random(), random());
  return std::string("/tmp/parasync-") + name;
}

std::string SocketPath(const std::string& socket_dir, int shard) {
  return socket_dir + "/ps" + std::to_string(shard) + ".sock";
}

std::string ShellJoin(const std::vector<std::string>& argv) {
  std::string command;
  for (const std::string& a : argv) command += (command.empty() ? "" : " ") + ShellQuote(a);
  return command;
}

std::vector<std::string> ChildEnvironment(const std::vector<std::string>& env) {
  const std::string prefixed = std::string(kLogPrefixedEnv) + "=";
  std::vector<std::string> all = env;
  if (std::none_of(env.begin(), env.end(),
                   [&](const std::string& entry) { return entry.starts_with(prefixed); })) {
    all.insert(all.begin(), prefixed + "1");
  }
  return all;
}

std::string RemoteCommand(const std::vector<std::string>& argv, double grace_seconds,
                          const std::vector<std::string>& env) {
  std::string assignments;
  for (const std::string& entry : ChildEnvironment(env)) {
    assignments += ShellAssignment(entry) + " ";
  }
  const std::string command = ShellJoin(argv);
  char grace[32];
  std::snprintf(grace, sizeof(grace), "%.0f", std::ceil(std::max(0.0, grace_seconds)));
  // The process runs in the background with its own stdin; a watcher reads the connection's
  // stdin and sends SIGTERM when it closes (the launcher stopping it, or the connection
  // dying), so a remote process never outlives its launcher. Background jobs of a
  // non-interactive shell read /dev/null, hence the dance with descriptor 3.
  // After the grace period a process that ignored SIGTERM gets SIGKILL there too.
  return "exec 3<&0; " + assignments + command +
         " </dev/null 3<&- & p=$!; (cat <&3 >/dev/null; kill -TERM $p 2>/dev/null; sleep " +
         grace + "; kill -KILL $p 2>/dev/null) & w=$!; "
         "exec 3<&-; wait $p; s=$?; kill $w 2>/dev/null; exit $s";
}

std::string DisplayCommand(const ProcessSpec& spec) {
  std::string command;
  if (!spec.remote) {
    for (const std::string& entry : spec.env) command += ShellAssignment(entry) + " ";
  }
  return command + ShellJoin(spec.spawn_argv);
}

std::string WorkerPythonPath(const std::string& bin_dir, const char* inherited) {
  std::error_code ec;
  // A build tree's package, else an installed one (cmake --install's layout).
  std::string path;
  for (const char* where : {"python", "lib/python3/dist-packages"}) {
    const std::filesystem::path dir = (std::filesystem::path(bin_dir) / ".." / where).lexically_normal();
    if (std::filesystem::is_directory(dir / "parasync", ec)) {
      path = dir.string();
      break;
    }
  }
  if (inherited != nullptr && *inherited != '\0') {
    path += (path.empty() ? "" : ":") + std::string(inherited);
  }
  return path;
}

std::vector<std::string> SshArgv(const LaunchOptions& options, const std::string& host,
                                 std::string command) {
  std::vector<std::string> argv = SshCommandWords(options);
  argv.push_back(host);
  argv.push_back(std::move(command));
  return argv;
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

Status CheckBinaries(const std::string& bin_dir, bool with_export, bool with_worker) {
  std::vector<std::string> missing;
  for (std::string_view name : {kPsBinary, kWorkerBinary, kExportBinary}) {
    if (name == kExportBinary && !with_export) continue;
    if (name == kWorkerBinary && !with_worker) continue;
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
  Cluster cluster;
  cluster.hosts = ProcessHosts(options);
  cluster.ports = &ports;
  cluster.num_ps = num_ps;
  cluster.bin_dir = bin_dir;
  cluster.log_dir = log_dir;
  cluster.ready_files = !IsMultiHost(options);
  cluster.ps_addresses = Addresses(cluster.hosts, ports, 0, num_ps);
  cluster.worker_addresses = Addresses(cluster.hosts, ports, num_ps, num_workers);
  cluster.ps_hosts = JoinAddresses(cluster.ps_addresses);
  cluster.worker_hosts = JoinAddresses(cluster.worker_addresses);
  for (size_t i = 0; i < num_ps && options.local_ipc; ++i) {
    cluster.ps_sockets.push_back(SocketPath(options.socket_dir, static_cast<int>(i)));
  }
  // What every process will check of its --ps-hosts / --worker-hosts, checked before any
  // starts (two names of one host, "node1" and "NODE1", would get the same ports). A server
  // told port 0 binds a free one of its own.
  PARASYNC_RETURN_IF_ERROR(CheckDistinctAddresses(SplitHostList(cluster.ps_hosts),
                                                  "the planned --ps-hosts",
                                                  PortRule::kZeroAllowed));
  PARASYNC_RETURN_IF_ERROR(
      CheckDistinctAddresses(SplitHostList(cluster.worker_hosts), "the planned --worker-hosts"));

  LaunchPlan plan;
  plan.log_dir = log_dir;
  plan.host = options.host;
  plan.mode = options.mode;
  plan.metrics_bind = MetricsBindFor(options.host);
  plan.job = options.job;
  if (plan.job.empty()) plan.job = std::filesystem::path(log_dir).filename().string();
  if (plan.job.empty()) plan.job = "parasync";
  for (size_t slot = 0; slot < total; ++slot) {
    plan.processes.push_back(PlanProcess(options, cluster, slot));
  }
  if (!options.export_path.empty()) plan.exporter = PlanExporter(options, cluster);
  return plan;
}

std::vector<int> SingleHostPorts(const LaunchOptions& options) {
  const size_t num_ps = static_cast<size_t>(std::max(0, options.num_ps));
  const size_t num_workers = static_cast<size_t>(std::max(0, options.num_workers));
  std::vector<int> ports(2 * (num_ps + num_workers), 0);
  for (size_t i = 0; i < num_workers; ++i) ports[num_ps + i] = static_cast<int>(1 + i);
  return ports;
}

std::vector<int> PortBasePorts(const LaunchOptions& options) {
  const std::vector<std::string> hosts = ProcessHosts(options);
  std::map<std::string, int> next;
  std::vector<int> ports(2 * hosts.size(), 0);
  for (size_t i = 0; i < hosts.size(); ++i) {
    // localhost and 127.0.0.1 are one machine: one port counter.
    const int k = next[IsLocalHost(hosts[i]) ? std::string("localhost") : hosts[i]]++;
    ports[i] = options.port_base + k;
    ports[hosts.size() + i] = options.port_base + kMetricsPortOffset + k;
  }
  return ports;
}

Result<std::string> ResolvePaths(LaunchOptions* options) {
  std::error_code ec;
  if (!options->export_path.empty()) {
    const std::filesystem::path path =
        std::filesystem::absolute(options->export_path, ec).lexically_normal();
    if (ec || !path.has_filename() || std::filesystem::is_directory(path)) {
      return Status::InvalidArgument("--export must name a file, got '" + options->export_path +
                                     "'");
    }
    options->export_path = path.string();
  }
  if (options->worker_command && !options->data_dir.empty()) {
    const std::filesystem::path data = std::filesystem::absolute(options->data_dir, ec);
    if (ec) {
      return Status::InvalidArgument("--dataset '" + options->data_dir + "': " + ec.message());
    }
    options->data_dir = data.lexically_normal().string();
  }
  if (!options->curve_dir.empty()) {
    std::string& curve_dir = options->curve_dir;
    curve_dir = std::filesystem::absolute(curve_dir, ec).lexically_normal().string();
    if (curve_dir.size() > 1 && curve_dir.back() == '/') curve_dir.pop_back();
  }
  const std::string log_dir_text = options->log_dir.empty() ? DefaultLogDir() : options->log_dir;
  std::filesystem::path log_dir = std::filesystem::absolute(log_dir_text, ec);
  if (ec) return Status::InvalidArgument("--log-dir '" + log_dir_text + "': " + ec.message());
  std::string log_dir_string = log_dir.lexically_normal().string();
  if (log_dir_string.size() > 1 && log_dir_string.back() == '/') log_dir_string.pop_back();
  return log_dir_string;
}

}  // namespace parasync::launch
