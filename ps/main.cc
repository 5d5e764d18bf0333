// parasync-ps: one parameter-server shard. See --help.
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/address.h"
#include "common/cli.h"
#include "common/cluster_spec.h"
#include "common/curve.h"
#include "common/metrics.h"
#include "common/mode.h"
#include "common/preflight.h"
#include "common/process.h"
#include "common/ready_file.h"
#include "common/version.h"
#include "common/transport.h"
#include "ps/checkpoint_store.h"
#include "ps/ps_metrics.h"
#include "ps/server.h"
#include "ps/storage_faults.h"

namespace {

using namespace parasync;

constexpr const char* kProgram = "parasync-ps";

int Fail(const std::string& line, int code = parasync::kExitRetryable) {
  return parasync::PrintErrorLine(kProgram, line, code);
}

// Counts one refused CURVE peer and logs it (rate-limited: RefusalLogSuppressedBefore).
// Called from the ZAP handler's thread and the refusal watcher's.
void CountRefusal(parasync::PsMetrics* metrics, std::atomic<uint64_t>* refusals,
                  parasync::CurveRefusal reason, const std::string& peer,
                  const std::string& detail) {
  using parasync::CurveRefusal;
  metrics->auth_refused[static_cast<size_t>(reason)]->Increment();
  const uint64_t n = ++*refusals;
  const auto suppressed = parasync::RefusalLogSuppressedBefore(n);
  if (!suppressed) return;
  const char* why = "";
  switch (reason) {
    case CurveRefusal::kPlainTextClient:
      why = "the client does not speak CURVE (no --curve-key)";
      break;
    case CurveRefusal::kBadKeyOrSecret:
      why = "the client's secret key does not match its public key, or it used another "
            "server public key (--curve-server-key)";
      break;
    case CurveRefusal::kNotAllowed:
      why = "its public key is not in --curve-allow";
      break;
    case CurveRefusal::kOther:
      why = "the CURVE handshake failed";
      break;
  }
  spdlog::warn("CURVE connection refused ({}) from {}: {}{}{}",
               parasync::CurveRefusalName(reason),
               peer.empty() ? std::string("an unknown peer") : peer, why,
               detail.empty() ? std::string() : " (" + detail + ")",
               *suppressed > 0 ? " [" + std::to_string(*suppressed) +
                                     " refusals not logged since the last line; all counted in "
                                     "parasync_ps_auth_refused_total]"
                               : std::string());
}

// Every flag of parasync-ps, as parsed (see AddFlags for what each means), grouped as --help
// lists them; a field named otherwise than its flag names it.
struct PsFlags {
  // AddTrainingFlags
  ClusterFlags cluster;  // --ps-hosts, --worker-hosts, --task-index
  std::string mode = "async";
  int replicas_to_aggregate = 0;
  double worker_timeout_s = 10;  // --worker-timeout
  double barrier_timeout_s = 300;  // --barrier-timeout
  double straggler_log_s = 1.0;  // --straggler-log-seconds
  // AddServingFlags
  std::string bind;
  std::string ipc;  // --ipc: a unix socket to listen on as well
  std::string ready_file;  // --ready-file: the ports bound, once serving (common/ready_file.h)
  std::string metrics_bind = "127.0.0.1";
  int metrics_port = 0;
  std::string log_dir;
  std::string log_level = "info";
  int64_t max_message_bytes = int64_t{1} << 30;
  int64_t max_gather_bytes = int64_t{32} << 20;
  int64_t max_model_bytes = 0;
  int64_t max_delta_copies = 0;
  int64_t max_table_rows = -1;  // -1: 4M rows, or no row bound with --table-memory
  int64_t table_memory = 0;
  std::string table_evict;  // "" : demote with --state-dir, else forget
  int table_admit_after = 0;
  std::string table_expire_after;  // "": never; N versions, or N with s, m, h or d
  int64_t max_unread_reply_bytes = 0;
  int apply_threads = 2;
  // AddStateFlags
  std::string state_dir;  // --state-dir (--data-dir)
  std::string durability = "periodic";
  double checkpoint_every_s = 30;  // --checkpoint-every
  int64_t checkpoint_every_versions = 0;
  // AddAccessFlags
  bool allow_remote_shutdown = false;
  int64_t drop_push_reply_every = 0;  // --fault-drop-push-reply-every
  std::string curve_key_file;  // --curve-key
  std::string curve_allow;
  bool check = false;
};

void DescribeProgram(CLI::App& app) {
  SetUpCommandLine(
      app,
      {.name = kProgram,
       .purpose = "a parameter-server shard. Holds its share of the model's variables, applies "
                  "the optimizer to pushed gradients and serves pulls over ZeroMQ.",
       .details =
           "The cluster comes from --ps-hosts, --worker-hosts and --task-index, or from "
           "TF_CONFIG ({\"cluster\":{\"ps\":[...],\"worker\":[...]},\"task\":{\"type\":"
           "\"ps\",\"index\":0}}); flags win.\n\n"
           "Memory: the server states a bound at start, and again with the model's figures once "
           "one registers (log line \"memory bound\", gauges parasync_ps_memory_bound_*): about "
           "96 MiB + the model (values, a spare copy, optimizer slots; sync: a gradient per "
           "worker; with --state-dir: a snapshot's copies) + --max-unread-reply-bytes + one "
           "--max-message-bytes + 2 x --max-gather-bytes + --max-delta-copies x 9/7 of the "
           "shard's values (a server-side optimizer's), plus (4 + 1) x --max-message-bytes + 1 MiB per connected peer. "
           "It holds whatever a peer sends or leaves unread — a pull past the unread-reply bound "
           "and a message past --max-message-bytes are refused — with one gap: libzmq holds a "
           "message of many frames whole before it can be refused (docs/reliability.md).",
       .exit_status = "Status 2 also for a port in use (--bind / --ps-hosts, --metrics-port), "
                      "a --state-dir that holds something else or a store of another shard, "
                      "shard count or --mode (refused before anything in it is written), and a "
                      "--state-dir or --log-dir that cannot be created (permission, read-only, "
                      "a file on the way, /proc); 1 for a --state-dir locked by another process "
                      "or a full or failing disk. "
                      "SIGINT and SIGTERM stop the server after a final snapshot, status 0.",
       .examples = "parasync-ps --ps-hosts 127.0.0.1:5000,127.0.0.1:5001 --worker-hosts "
                   "127.0.0.1:6000 --task-index 0\n"
                   "parasync-ps --ps-hosts 127.0.0.1:5000 --worker-hosts 127.0.0.1:6000,127.0.0.1:6001 "
                   "\\\n      --task-index 0 --mode sync --state-dir /var/lib/parasync/ps0"});
}

// The cluster, the mode and its timeouts. The order of the Add*Flags calls is the order of --help.
void AddTrainingFlags(CLI::App& app, PsFlags& f) {
  app.add_option("--ps-hosts", f.cluster.ps_hosts,
                 "Comma-separated host:port of every PS shard (IP addresses or host names, "
                 "ports 1-65535, each address once)");
  app.add_option("--worker-hosts", f.cluster.worker_hosts,
                 "Comma-separated host:port of every worker (as --ps-hosts)");
  app.add_option("--task-index", f.cluster.task_index, "This shard's index in --ps-hosts")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--mode", f.mode,
                 "async (apply each gradient on arrival), sync (average R gradients per step, "
                 "then apply), sync:delayed (sync over gradients one step old: the workers "
                 "compute the next gradient while a step is exchanged) or ssp:K (async, but no "
                 "worker more than K steps ahead of the slowest live one)");
  app.add_option("--replicas-to-aggregate", f.replicas_to_aggregate,
                 "sync: gradients per step (default 0 = the number of workers); fewer than the "
                 "workers makes the rest backup workers whose late gradients are dropped")
      ->check(CLI::NonNegativeNumber);
  AddSecondsOption(app, "--worker-timeout", f.worker_timeout_s,
                   "Seconds of silence after which a worker is declared dead and leaves the "
                   "barrier / staleness set (workers heartbeat meanwhile)",
                   0.1, 86400.0);
  AddSecondsOption(app, "--barrier-timeout", f.barrier_timeout_s,
                   "Seconds a pull may wait for a sync step or the ssp bound before it fails "
                   "with an error naming the ranks it waited for",
                   0.1, 86400.0);
  AddSecondsOption(app, "--straggler-log-seconds", f.straggler_log_s,
                   "Log the rank a barrier waited for when one wait on it alone exceeds this "
                   "(at most every 10 s per rank; 0: never). Always exported as "
                   "parasync_ps_barrier_waited_for_seconds_total{rank} and "
                   "parasync_ps_straggler{rank}",
                   0.0, 86400.0);
}

// Where it listens, what it logs, and the bounds on what it holds.
void AddServingFlags(CLI::App& app, PsFlags& f) {
  app.add_option("--bind", f.bind,
                 "Address to bind, host:port (default: this task's address in the cluster; "
                 "use 0.0.0.0:PORT to listen on all interfaces; a host name must resolve). "
                 "Port 0, here or in this task's --ps-hosts entry, binds a free port below the "
                 "kernel's ephemeral range: the log line \"serving\" and --ready-file say which");
  app.add_option("--ready-file", f.ready_file,
                 "Once serving, write a JSON object here (written whole, through a rename): "
                 "{\"role\", \"task_index\", \"pid\", \"address\" (host:port bound), "
                 "\"metrics_port\"}. Removed at start if an earlier run left one. How whoever "
                 "starts servers on port 0 learns their ports")
      ->type_name("PATH");
  app.add_option("--ipc", f.ipc,
                 "Listen on this unix socket too (an absolute path, e.g. "
                 "$XDG_RUNTIME_DIR/parasync/ps0.sock), for the workers on this host: theirs is "
                 "--ps-ipc SHARD=PATH, and their requests then skip TCP (parasync-launch --ps "
                 "colocated sets both). Its directory must be this user's and writable by no "
                 "one else (made, mode 0700, if missing); the socket is made 0600")
      ->type_name("PATH");
  // The last of repeated metrics flags wins, so a user's --ps-arg/--worker-arg overrides
  // the launcher's.
  app.add_option("--metrics-port", f.metrics_port,
                 "Port of /metrics; 0 picks a free one, logs it and writes it to --ready-file")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
      ->check(CLI::Range(0, 65535));
  app.add_option("--metrics-bind", f.metrics_bind,
                 "Address the metrics server listens on: an IP address (checked: four octets "
                 "0-255), * or a host name that resolves")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--log-dir", f.log_dir, "Directory for the metrics snapshot written at exit");
  app.add_option("--log-level", f.log_level, "debug, info, warn or error");
  app.add_option("--max-message-bytes", f.max_message_bytes,
                 "Largest message accepted, all its frames together; bigger ones are refused")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-gather-bytes", f.max_gather_bytes,
                 "Most bytes the collectives of parasync.horovod (allreduce, allgather, "
                 "broadcast) may hold on this server at once, all ranks' payloads together; "
                 "a collective past it is refused")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-unread-reply-bytes", f.max_unread_reply_bytes,
                 "Most bytes of pull replies that peers have not read yet, all together; a "
                 "pull past it, or from a peer with twice the shard's values unread, is "
                 "refused (0 = 2 x (workers + 2) x the shard's values; at least (workers + 1) x "
                 "them)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-model-bytes", f.max_model_bytes,
                 "Most memory a registered model may take on this shard (values, one spare "
                 "copy of them for zero-copy pull replies, and the optimizer slots); 0 = 80% "
                 "of physical memory")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-delta-copies", f.max_delta_copies,
                 "Most readers' copies of this shard's parameters kept for delta pulls "
                 "(workers pushing int8 or top-k to a server-side optimizer pull the change "
                 "from their copy); a new one past it evicts the least recently used, whose "
                 "reader's next pull starts from zeros. Each takes the shard's values once "
                 "and about 2/7 of them for its cached reply (0 = workers + 2; at least 2)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-table-rows", f.max_table_rows,
                 "Most embedding-table rows this server holds in memory, all tables together; "
                 "one more evicts the least recently touched row with its optimizer state "
                 "(see --table-evict). Each row takes its floats and slots plus ~80 bytes; "
                 "the memory bound counts them. 0 = no bound [default: 4194304, none with "
                 "--table-memory]")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--table-memory", f.table_memory,
                 "Memory for embedding-table rows (e.g. 2GiB, 512MiB), all tables together, "
                 "each row counted at the widest table's size; rows beyond it are evicted "
                 "(see --table-evict). 0 = only --max-table-rows bounds them")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--table-evict", f.table_evict,
                 "What an evicted row becomes: demote = written to the store (--state-dir) "
                 "with its optimizer state, and read back when its id comes again (a cold "
                 "tier: nothing learned is lost); forget = dropped, its id starts again from "
                 "its initial value [default: demote with --state-dir, else forget]")
      ->check(CLI::IsMember({"demote", "forget"}));
  app.add_option("--table-admit-after", f.table_admit_after,
                 "Pushes an embedding id needs before it gets a row (counted approximately in "
                 "8 MiB); until then its pulls read the initial value and its gradients are "
                 "dropped and counted. 0 or 1 = every id at its first push")
      ->check(CLI::Range(0, 65535));
  app.add_option("--table-expire-after", f.table_expire_after,
                 "Delete embedding rows nothing updated for this long, in memory and in the "
                 "store (feature churn): N = N versions of this server (its pushes in async, "
                 "its steps in sync), or a time: 90s, 30m, 12h, 7d. A deleted row's id starts "
                 "again from its initial value [default: never]");
  app.add_option("--apply-threads", f.apply_threads,
                 "Threads that check and apply a pushed gradient of 1 MiB or more spread over "
                 "several slices, this server's loop included (1: the loop alone)")
      ->check(CLI::Range(1, 64));
}

// The store and its durability.
void AddStateFlags(CLI::App& app, PsFlags& f) {
  app.add_option("--state-dir", f.state_dir,
                 "Keep this shard's state in a RocksDB store here and restore it at start "
                 "(empty: memory only). A directory holding anything else is refused, never "
                 "overwritten, and so is a store of another shard or --mode (old name: "
                 "--data-dir)")
      ->type_name("DIR");
  AddHiddenAlias(app, "--data-dir", f.state_dir);
  app.add_option("--durability", f.durability,
                 "periodic: snapshots every --checkpoint-every seconds / versions (a crash loses "
                 "at most that much); every-update: each applied update is on disk (WAL synced) "
                 "before it is acknowledged");
  AddSecondsOption(app, "--checkpoint-every", f.checkpoint_every_s,
                   "periodic: seconds between snapshots (0: off)", 0.0, 86400.0);
  app.add_option("--checkpoint-every-versions", f.checkpoint_every_versions,
                 "periodic: versions between snapshots (0: off); in sync mode snapshots fall on "
                 "multiples of it, so all shards hold the same step")
      ->check(CLI::NonNegativeNumber);
}

// Who may stop it or connect to it, fault injection and the preflight.
void AddAccessFlags(CLI::App& app, PsFlags& f) {
  app.add_flag("--allow-remote-shutdown", f.allow_remote_shutdown,
               "Accept Shutdown messages from any peer. Default: from loopback TCP peers (any "
               "user of this machine: use CURVE on a shared host, docs/security.md) and, over "
               "--ipc, from this server's user or root only");
  app.add_option("--fault-drop-push-reply-every", f.drop_push_reply_every,
                 "Testing only: do not reply to every Nth applied push (as if the connection "
                 "broke between apply and acknowledgement)")
      ->check(CLI::NonNegativeNumber)
      ->group("Fault injection");
  app.add_option("--curve-key", f.curve_key_file,
                 "CURVE: this server's key pair file (parasync-keygen); with it every "
                 "connection is encrypted and only --curve-allow keys are admitted (every "
                 "refused one is logged and counted in parasync_ps_auth_refused_total{reason})")
      ->group("Security");
  app.add_option("--curve-allow", f.curve_allow,
                 "CURVE: the public keys admitted, a directory of .pub files or a file of keys "
                 "(the workers' and parasync-export's)")
      ->group("Security");
  app.add_flag("--check", f.check,
               "Preflight: validate the flags, try binding this shard's address and metrics port "
               "and print `check version ...` and one `check problem ...` line per problem, then "
               "exit (0: fine); parasync-launch --check runs it on every host");
}

void AddFlags(CLI::App& app, PsFlags& f) {
  DescribeProgram(app);
  AddTrainingFlags(app, f);
  AddServingFlags(app, f);
  AddStateFlags(app, f);
  AddAccessFlags(app, f);
}

// What the flags resolve to, once checked.
struct PsConfig {
  ClusterSpec spec;
  std::string endpoint;    // the server socket's bind endpoint
  std::string local_endpoint;  // --ipc's, or empty
  std::string metrics_ip;  // --metrics-bind, resolved
  TrainingMode mode;
  int num_workers = 0;
  std::string address;  // host:port this shard binds (--bind or its --ps-hosts entry)
  std::optional<CurveKeyPair> curve_key;
  std::vector<std::string> curve_allowed;
  int64_t table_expire_after = 0;  // --table-expire-after: 0 never, else versions or seconds
  bool table_expire_in_seconds = false;
};

// --table-expire-after: N versions, or N seconds, minutes, hours or days ("90s", "7d").
// Sets `after` (versions or seconds) and `in_seconds`; false for anything else.
bool ParseExpiry(const std::string& text, int64_t* after, bool* in_seconds) {
  static const std::regex kExpiry(R"(([0-9]{1,12})([smhd]?))");
  std::smatch m;
  if (!std::regex_match(text, m, kExpiry)) return false;
  const int64_t n = std::stoll(m[1].str());
  const std::string unit = m[2].str();
  const int64_t scale = unit == "d" ? 86400 : unit == "h" ? 3600 : unit == "m" ? 60 : 1;
  if (n <= 0) return false;
  *after = n * scale;
  *in_seconds = !unit.empty();
  return true;
}

// Reads the CURVE key pair and the allowed keys. An exit status if they are refused.
std::optional<int> ReadCurveFlags(const PsFlags& f, PsConfig& c) {
  if (f.curve_key_file.empty() != f.curve_allow.empty()) {
    return Fail("--curve-key and --curve-allow go together", kExitBadUsage);
  }
  if (f.curve_key_file.empty()) return std::nullopt;
  auto pair = ReadKeyPairFile(f.curve_key_file);
  if (!pair.ok()) return Fail(pair.status().message(), kExitBadUsage);
  c.curve_key = *pair;
  auto allowed = ReadPublicKeys(f.curve_allow);
  if (!allowed.ok()) return Fail(allowed.status().message(), kExitBadUsage);
  c.curve_allowed = std::move(allowed).value();
  return std::nullopt;
}

// Checks the flags together and resolves them into `c`. An exit status if they are refused.
std::optional<int> Validate(const PsFlags& f, PsConfig& c) {
  auto spec = ResolveClusterSpecFromEnvironment(f.cluster, "ps");
  if (!spec.ok()) return Fail(spec.status().message(), kExitBadUsage);
  c.spec = *spec;
  // Both addresses this process binds, checked (and names resolved) before anything starts.
  c.address = f.bind.empty() ? c.spec.ps[static_cast<size_t>(c.spec.task_index)] : f.bind;
  auto endpoint = ToBindEndpoint(c.address);
  if (!endpoint.ok()) return Fail(endpoint.status().message(), kExitBadUsage);
  c.endpoint = *endpoint;
  if (!f.ipc.empty()) {
    auto local = IpcEndpoint(f.ipc, "--ipc", IpcSide::kServer);
    if (!local.ok()) return Fail(local.status().message(), kExitBadUsage);
    c.local_endpoint = *local;
  }
  auto metrics_ip = ResolveBindHost(f.metrics_bind, "--metrics-bind");
  if (!metrics_ip.ok()) return Fail(metrics_ip.status().message(), kExitBadUsage);
  c.metrics_ip = *metrics_ip;
  auto training_mode = TrainingMode::Parse(f.mode);
  if (!training_mode.ok()) return Fail(training_mode.status().message(), kExitBadUsage);
  c.mode = *training_mode;
  c.num_workers = static_cast<int>(c.spec.workers.size());
  if (f.durability != "periodic" && f.durability != "every-update") {
    return Fail("--durability must be periodic or every-update, not '" + f.durability + "'",
                kExitBadUsage);
  }
  if (!f.table_expire_after.empty() &&
      !ParseExpiry(f.table_expire_after, &c.table_expire_after, &c.table_expire_in_seconds)) {
    return Fail("--table-expire-after takes a count of versions (100000) or a time (90s, 30m, "
                "12h, 7d) above 0, not '" + f.table_expire_after + "'",
                kExitBadUsage);
  }
  if (f.table_evict == "demote" && f.state_dir.empty()) {
    return Fail("--table-evict demote needs --state-dir (the store is where demoted rows go)",
                kExitBadUsage);
  }
  if (f.durability == "every-update" && f.state_dir.empty()) {
    return Fail("--durability every-update needs --state-dir", kExitBadUsage);
  }
  if (f.replicas_to_aggregate > c.num_workers) {
    return Fail("--replicas-to-aggregate " + std::to_string(f.replicas_to_aggregate) +
                    " is more than the " + std::to_string(c.num_workers) + " workers",
                kExitBadUsage);
  }
  return ReadCurveFlags(f, c);
}

// The port of a host:port address (0 if it has none).
int PortOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? 0 : std::atoi(address.c_str() + colon + 1);
}

std::string HostOf(const std::string& address) { return address.substr(0, address.rfind(':')); }

// --check: why --state-dir cannot be created ("" if it can).
std::string StateDirNotWritable(const PsFlags& f) {
  // The store creates the whole path: its nearest existing ancestor must be a writable
  // directory.
  std::error_code ec;
  auto existing = std::filesystem::absolute(f.state_dir, ec);
  while (!std::filesystem::exists(existing, ec) && existing.has_parent_path() &&
         existing != existing.parent_path()) {
    existing = existing.parent_path();
  }
  if (std::filesystem::is_directory(existing, ec) && access(existing.c_str(), W_OK) == 0) return "";
  return "--state-dir " + f.state_dir + " cannot be created (" + existing.string() +
         " is not a writable directory)";
}

// --check: what the start would refuse in what --state-dir holds ("" if nothing).
std::string StoreProblem(const PsFlags& f, const PsConfig& c) {
  // Anything but this shard's store of this --mode is refused (a store locked by a running
  // server too: it is in use).
  std::error_code ec;
  if (!std::filesystem::exists(f.state_dir, ec) || std::filesystem::is_empty(f.state_dir, ec)) {
    return "";
  }
  auto opened = CheckpointStore::Open(f.state_dir, c.spec.task_index,
                                      static_cast<int>(c.spec.ps.size()), nullptr, c.mode);
  Status found = opened.status();
  if (opened.ok()) {
    auto loaded = (*opened)->Load();
    if (!loaded.ok() && loaded.status().code() != StatusCode::kNotFound) found = loaded.status();
  }
  if (found.ok()) return "";
  const std::string& m = found.message();
  return m.starts_with("--state-dir") ? m : "--state-dir " + m;
}

// --check: the preflight, one line per problem.
int RunCheck(const PsFlags& f, const PsConfig& c) {
  std::vector<std::string> problems;
  const std::string me = "ps" + std::to_string(c.spec.task_index);
  if (std::string p = BindProblem(HostOf(c.address), PortOf(c.address)); !p.empty()) {
    problems.push_back(me + ": " + p);
  }
  if (f.metrics_port != 0) {
    if (std::string p = BindProblem(f.metrics_bind, f.metrics_port); !p.empty()) {
      problems.push_back(me + " metrics: " + p);
    }
  }
  if (!f.state_dir.empty()) {
    if (std::string p = StateDirNotWritable(f); !p.empty()) problems.push_back(me + ": " + p);
    if (std::string p = StoreProblem(f, c); !p.empty()) problems.push_back(me + ": " + p);
  }
  return ReportCheck(problems);
}

// Before anything starts: the ports are free (a port in use is refused naming the flag: a
// retry would find it taken again), logging and --log-dir are set up, signals handled
// (SetUpServiceProcess, as parasync-worker).
std::optional<int> PrepareProcess(const PsFlags& f, const PsConfig& c) {
  if (!f.ready_file.empty()) {
    if (Status s = RemoveStaleReadyFile(f.ready_file); !s.ok()) {
      return Fail("--ready-file: " + s.message(), kExitBadUsage);
    }
  }
  if (std::string p = BindProblem(HostOf(c.address), PortOf(c.address)); !p.empty()) {
    return Fail((f.bind.empty() ? "shard " + std::to_string(c.spec.task_index) +
                                      "'s address in --ps-hosts, " + c.address
                                : "--bind " + c.address) +
                    ": " + p,
                kExitBadUsage);
  }
  std::optional<std::string> log_dir;
  if (!f.log_dir.empty()) log_dir = f.log_dir;
  if (Status s = SetUpServiceProcess({.role = "ps",
                                       .index = c.spec.task_index,
                                       .log_level = f.log_level,
                                       .log_dir = log_dir,
                                       .metrics_bind = f.metrics_bind,
                                       .metrics_port = f.metrics_port});
      !s.ok()) {
    return Fail(s.message(), StartupExitCode(s));
  }
  return std::nullopt;
}

// The server's options from the flags (the store's are set by OpenStore).
ServerOptions MakeServerOptions(const PsFlags& f, const PsConfig& c) {
  ServerOptions options;
  options.endpoint = c.endpoint;
  options.local_endpoint = c.local_endpoint;
  options.allow_remote_shutdown = f.allow_remote_shutdown;
  options.drop_push_reply_every = f.drop_push_reply_every;
  options.num_workers = c.num_workers;
  options.mode = c.mode;
  options.replicas_to_aggregate = f.replicas_to_aggregate;
  options.worker_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(f.worker_timeout_s * 1000));
  options.barrier_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(f.barrier_timeout_s * 1000));
  options.straggler_log_seconds = f.straggler_log_s;
  options.shard_index = c.spec.task_index;
  options.num_shards = static_cast<int>(c.spec.ps.size());
  options.max_message_bytes = f.max_message_bytes;
  options.max_gather_bytes = f.max_gather_bytes;
  options.max_unread_reply_bytes = f.max_unread_reply_bytes;
  options.max_model_bytes = f.max_model_bytes;
  options.max_delta_copies = f.max_delta_copies;
  if (options.max_model_bytes == 0) {
    // A registration is a remote request: it must not be able to exhaust this machine.
    options.max_model_bytes = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) / 5 * 4 *
                              static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  }
  options.apply_threads = f.apply_threads;
  options.max_table_rows =
      f.max_table_rows >= 0 ? f.max_table_rows : (f.table_memory > 0 ? 0 : int64_t{1} << 22);
  options.table_memory_bytes = f.table_memory;
  options.table_demote = f.table_evict.empty() ? !f.state_dir.empty() : f.table_evict == "demote";
  options.table_admit_after = f.table_admit_after;
  options.table_expire_after = c.table_expire_after;
  options.table_expire_in_seconds = c.table_expire_in_seconds;
  return options;
}

// Starts /metrics (kept until exit) and sets `port` to the port it serves on. An exit status
// if it cannot.
std::optional<int> StartMetrics(const PsFlags& f, const PsConfig& c, PsMetrics& metrics,
                                int* port) {
  // Before the store: /metrics answers, and /healthz says "ok", while a large store is
  // verified and restored (the probes of deploy/k8s rely on it); /readyz waits for the
  // request loop. A store refused below exits before the server binds.
  Result<int> bound =
      MetricsServer::ServeUntilExit(c.metrics_ip, f.metrics_bind, f.metrics_port, metrics.registry,
                                    {.loop = &metrics.loop, .stale_after = kPsLoopStaleAfter});
  // Checked free a moment ago (above): taken since, or refused for another reason.
  if (!bound.ok()) return Fail(bound.status().message(), StartupExitCode(bound.status()));
  *port = *bound;
  return std::nullopt;
}

// The store of --state-dir, opened, and what it held.
struct OpenedStore {
  std::unique_ptr<CheckpointStore> store;
  std::optional<ShardSnapshot> restored;
  double restore_seconds = 0;
};

// Loads the opened store's snapshot into `out` (none in a new store). An exit status if it
// cannot be restored or belongs to another --mode.
std::optional<int> LoadStore(const PsFlags& f, const PsConfig& c, bool tiered, OpenedStore& out) {
  const auto t0 = std::chrono::steady_clock::now();
  // Tiered tables leave their rows in the store (the cold tier): only their count is read.
  auto loaded = out.store->Load(/*with_rows=*/!tiered);
  if (loaded.ok()) {
    out.restored = std::move(loaded).value();
  } else if (loaded.status().code() != StatusCode::kNotFound) {
    return Fail("cannot restore from " + f.state_dir + ": " + loaded.status().message(),
                kExitBadUsage);
  }
  // A store of another mode would refuse every worker's Register. Open refused it before
  // writing anything; checked again here under the store's lock, as Open checks its shard.
  if (out.restored) {
    if (Status s = CheckStoredMode(out.restored->registration.mode, c.mode, f.state_dir);
        !s.ok()) {
      return Fail(s.message(), kExitBadUsage);
    }
  }
  out.restore_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return std::nullopt;
}

// Opens --state-dir (when set) and loads its snapshot; sets the store's server options. An
// exit status if the store is refused.
std::optional<int> OpenStore(const PsFlags& f, const PsConfig& c, ServerOptions& options,
                             OpenedStore& out) {
  if (f.state_dir.empty()) return std::nullopt;
  auto faults = StorageFaultsFromEnvironment();
  if (!faults.ok()) return Fail(faults.status().message(), kExitBadUsage);
  if (*faults) {
    spdlog::warn("FAULT INJECTION: {}={} makes the store's disk fail on purpose",
                 kStorageFaultsVariable, std::getenv(kStorageFaultsVariable));
  }
  auto opened =
      CheckpointStore::Open(f.state_dir, c.spec.task_index, options.num_shards, *faults, c.mode);
  if (!opened.ok()) {
    // Unavailable: the store is locked by another process, or the disk is full or failing,
    // which may pass; anything else (a foreign directory, another shard's or mode's store,
    // damage, a path that cannot be a directory) stays.
    const std::string m = opened.status().message();  // status() is a copy
    return Fail(m.starts_with("--state-dir ") ? m
                : "--state-dir " + (m.starts_with(f.state_dir) ? m : f.state_dir + ": " + m),
                opened.status().code() == StatusCode::kUnavailable ? kExitRetryable
                                                                   : kExitBadUsage);
  }
  out.store = std::move(opened).value();
  if (auto exit = LoadStore(f, c, options.table_demote, out)) return exit;
  options.store = out.store.get();
  options.every_update = f.durability == "every-update";
  options.checkpoint_every =
      std::chrono::milliseconds(static_cast<int64_t>(f.checkpoint_every_s * 1000));
  options.checkpoint_every_versions = f.checkpoint_every_versions;
  if (c.mode.kind == TrainingMode::Kind::kSync && f.checkpoint_every_versions == 0 &&
      !options.every_update) {
    spdlog::warn("sync mode with time-based snapshots: shards may hold different steps; "
                 "--checkpoint-every-versions N keeps them aligned");
  }
  return std::nullopt;
}

// CURVE (with --curve-key): starts the ZAP handler that admits the --curve-allow keys and
// counts every peer. An exit status if it cannot start.
std::optional<int> StartAuthenticator(zmq::context_t& context, const PsConfig& c,
                                      PsMetrics& metrics, std::atomic<uint64_t>& refusals,
                                      ServerOptions& options,
                                      std::unique_ptr<ZapAuthenticator>& out) {
  if (!c.curve_key) return std::nullopt;
  options.curve_secret_key = c.curve_key->secret_key;
  PsMetrics* m = &metrics;
  std::atomic<uint64_t>* n = &refusals;
  auto started = ZapAuthenticator::Start(
      context, c.curve_allowed,
      [m, n](std::optional<CurveRefusal> refusal, const std::string& peer) {
        if (!refusal) {
          m->auth_accepted->Increment();
        } else {
          CountRefusal(m, n, *refusal, peer, "");
        }
      });
  if (!started.ok()) return Fail(started.status().message());
  out = std::move(started).value();
  spdlog::info("CURVE on: encrypted, {} client key(s) allowed", c.curve_allowed.size());
  return std::nullopt;
}

// CURVE: refusals inside the handshake (a plain-text client, a key pair that does not
// match) never reach the ZAP handler: libzmq reports them only as monitor events. They are
// read on a thread of their own rather than in the server loop, so that they are drained
// (the monitor queue drops what overflows) even while the loop is busy applying a large
// gradient, and the loop's code stays as it is. An exit status if it cannot start.
std::optional<int> WatchRefusals(const PsConfig& c, Server& server, PsMetrics& metrics,
                                 std::atomic<uint64_t>& refusals,
                                 std::unique_ptr<CurveRefusalWatcher>& out) {
  if (!c.curve_key) return std::nullopt;
  PsMetrics* m = &metrics;
  std::atomic<uint64_t>* n = &refusals;
  auto watching = CurveRefusalWatcher::Start(
      server.TakeHandshakeMonitor(),
      [m, n](CurveRefusal reason, const std::string& peer, const std::string& detail) {
        CountRefusal(m, n, reason, peer, detail);
      });
  if (!watching.ok()) return Fail(watching.status().message());
  out = std::move(watching).value();
  return std::nullopt;
}

// Hands the store's snapshot to the server (and lets go of it). An exit status if it does
// not fit.
std::optional<int> RestoreServer(const PsFlags& f, Server& server, OpenedStore& opened) {
  if (opened.restored) {
    if (Status s = server.Restore(*opened.restored); !s.ok()) {
      return Fail("cannot restore from " + f.state_dir + ": " + s.message(), kExitBadUsage);
    }
    // Tiered tables left their rows in the store: counted, not loaded.
    int64_t rows = static_cast<int64_t>(opened.restored->rows.size());
    for (int64_t n : opened.restored->stored_row_counts) rows += n;
    spdlog::info("restored from {}: version {}, {} examples, {} slices, {} embedding rows{}, {} "
                 "bytes on disk, in {:.3f} s",
                 f.state_dir, opened.restored->version, opened.restored->examples,
                 opened.restored->slices.size(), rows,
                 opened.restored->stored_row_counts.empty() ? "" : " (in the store, read as used)",
                 opened.store->ApproximateBytes(), opened.restore_seconds);
    opened.restored.reset();  // the shard holds its own copy now; do not keep the model twice
  } else if (opened.store) {
    spdlog::info("new data directory {} (durability {})", f.state_dir, f.durability);
  }
  return std::nullopt;
}

void LogServing(const PsFlags& f, const PsConfig& c, const Server& server, int metrics_port) {
  spdlog::info("shard {}/{} serving {} worker(s) on {} (mode {}{}), metrics on "
               "http://{}:{}/metrics",
               c.spec.task_index, static_cast<int>(c.spec.ps.size()), c.num_workers,
               server.endpoint(), f.mode,
               c.mode.kind == TrainingMode::Kind::kSync
                   ? ", " + std::to_string(f.replicas_to_aggregate > 0 ? f.replicas_to_aggregate
                                                                       : c.num_workers) +
                         " gradients per step"
                   : std::string(),
               c.metrics_ip, metrics_port);
}

// After Run: a final snapshot (a graceful stop keeps everything applied so far), the last
// log lines and the metrics snapshot. Returns the exit status.
int Finish(const PsFlags& f, const PsConfig& c, Server& server, const PsMetrics& metrics,
           bool has_store, const Status& run) {
  if (Status s = server.SaveSnapshot(); !s.ok()) {
    spdlog::error("final snapshot failed: {}", s.ToString());
  } else if (has_store) {
    spdlog::info("on disk: version {}", server.shard().version());
  }
  if (int sig = ShutdownSignal(); sig != 0) spdlog::info("signal {} received, shutting down", sig);
  const Shard& s = server.shard();
  spdlog::info("stopped: version {}, {} examples applied, {} elements held", s.version(),
               s.examples(), s.num_elements());
  if (!f.log_dir.empty()) {
    const std::string path =
        MetricsSnapshotPath(f.log_dir, "ps" + std::to_string(c.spec.task_index));
    if (Status w = WriteMetricsSnapshot(*metrics.registry, path); !w.ok()) {
      spdlog::warn("metrics snapshot not written: {}", w.message());
    }
  }
  if (!run.ok()) return Fail(run.ToString());
  return 0;
}

// Starts everything in order, serves until stopped, and stops. Returns the exit status.
int Serve(const PsFlags& f, const PsConfig& c) {
  PsMetrics metrics(c.spec.task_index, c.num_workers);
  ServerOptions options = MakeServerOptions(f, c);
  int metrics_port = 0;
  if (auto exit = StartMetrics(f, c, metrics, &metrics_port)) return *exit;
  OpenedStore opened;
  if (auto exit = OpenStore(f, c, options, opened)) return *exit;
  zmq::context_t context(1);
  // Bound before the server socket, so no connection is ever admitted without it; destroyed
  // (declared after the context) before the context.
  std::unique_ptr<ZapAuthenticator> authenticator;
  std::atomic<uint64_t> refusals{0};  // every refused CURVE peer, for the log's rate limit
  if (auto exit = StartAuthenticator(context, c, metrics, refusals, options, authenticator)) {
    return *exit;
  }
  // A socket directory this server makes, it removes at exit if it is empty by then.
  const bool makes_socket_dir =
      !f.ipc.empty() && !std::filesystem::exists(std::filesystem::path(f.ipc).parent_path());
  auto server = Server::Create(context, options, &metrics);
  if (!server.ok()) {
    return Fail(server.status().message(), server.status().code() == StatusCode::kInvalidArgument
                                               ? kExitBadUsage
                                               : kExitRetryable);
  }
  std::unique_ptr<CurveRefusalWatcher> refusal_watcher;  // destroyed before the server
  if (auto exit = WatchRefusals(c, **server, metrics, refusals, refusal_watcher)) return *exit;
  if (auto exit = RestoreServer(f, **server, opened)) return *exit;
  LogServing(f, c, **server, metrics_port);
  if (!f.ready_file.empty()) {
    const ReadyInfo ready{.role = "ps",
                          .task_index = c.spec.task_index,
                          .pid = getpid(),
                          .address = AddressOfEndpoint((*server)->endpoint()),
                          .metrics_port = metrics_port};
    if (Status s = WriteReadyFile(f.ready_file, ready); !s.ok()) {
      return Fail("--ready-file: " + s.message());
    }
  }
  const Status run = (*server)->Run([] { return ShutdownRequested(); });
  if (!f.ipc.empty()) {
    // Ours since the bind (which replaced whatever a crashed predecessor left there).
    std::error_code ignored;
    std::filesystem::remove(f.ipc, ignored);
    if (makes_socket_dir) {
      std::filesystem::remove(std::filesystem::path(f.ipc).parent_path(), ignored);
    }
  }
  return Finish(f, c, **server, metrics, opened.store != nullptr, run);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app;
  PsFlags flags;
  AddFlags(app, flags);
  if (auto done = ParseCommandLine(app, argc, argv)) return *done;
  PsConfig config;
  if (auto exit = Validate(flags, config)) return *exit;
  if (flags.check) return RunCheck(flags, config);
  if (auto exit = PrepareProcess(flags, config)) return *exit;
  return Serve(flags, config);
}
