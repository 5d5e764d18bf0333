// parasync-ps: one parameter-server shard. See --help.
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include <spdlog/spdlog.h>

#include "common/address.h"
#include "common/cli.h"
#include "common/cluster_spec.h"
#include "common/curve.h"
#include "common/metrics.h"
#include "common/mode.h"
#include "common/preflight.h"
#include "common/process.h"
#include "common/version.h"
#include "common/transport.h"
#include "ps/checkpoint_store.h"
#include "ps/ps_metrics.h"
#include "ps/server.h"
#include "ps/storage_faults.h"

namespace {

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

}  // namespace

int main(int argc, char** argv) {
  using namespace parasync;
  CLI::App app;
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
           "--max-message-bytes, plus (4 + 1) x --max-message-bytes + 1 MiB per connected peer. "
           "It holds whatever a peer sends or leaves unread — a pull past the unread-reply bound "
           "and a message past --max-message-bytes are refused — with one gap: libzmq holds a "
           "message of many frames whole before it can be refused (docs/reliability.md).",
       .exit_status = "Status 2 also for a port in use (--bind / --ps-hosts, --metrics-port) and "
                      "a --state-dir that holds something else or a store of another shard, "
                      "shard count or --mode; 1 for a --state-dir locked by another process. "
                      "SIGINT and SIGTERM stop the server after a final snapshot, status 0.",
       .examples = "parasync-ps --ps-hosts 127.0.0.1:5000,127.0.0.1:5001 --worker-hosts "
                   "127.0.0.1:6000 --task-index 0\n"
                   "parasync-ps --ps-hosts 127.0.0.1:5000 --worker-hosts 127.0.0.1:6000,127.0.0.1:6001 "
                   "\\\n      --task-index 0 --mode sync --state-dir /var/lib/parasync/ps0"});
  ClusterFlags cluster;
  std::string mode = "async";
  std::string bind;
  std::string metrics_bind = "127.0.0.1";
  int metrics_port = 0;
  std::string log_dir;
  std::string log_level = "info";
  int64_t max_message_bytes = int64_t{1} << 30;
  int64_t max_model_bytes = 0;
  int64_t max_unread_reply_bytes = 0;
  int apply_threads = 2;
  int replicas_to_aggregate = 0;
  std::string state_dir;
  std::string durability = "periodic";
  double checkpoint_every_s = 30;
  int64_t checkpoint_every_versions = 0;
  double worker_timeout_s = 10;
  double barrier_timeout_s = 300;
  double straggler_log_s = 1.0;
  bool allow_remote_shutdown = false;
  int64_t drop_push_reply_every = 0;

  app.add_option("--ps-hosts", cluster.ps_hosts,
                 "Comma-separated host:port of every PS shard (IP addresses or host names, "
                 "ports 1-65535, each address once)");
  app.add_option("--worker-hosts", cluster.worker_hosts,
                 "Comma-separated host:port of every worker (as --ps-hosts)");
  app.add_option("--task-index", cluster.task_index, "This shard's index in --ps-hosts")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--mode", mode,
                 "async (apply each gradient on arrival), sync (average R gradients per step, "
                 "then apply) or ssp:K (async, but no worker more than K steps ahead of the "
                 "slowest live one)");
  app.add_option("--replicas-to-aggregate", replicas_to_aggregate,
                 "sync: gradients per step (default 0 = the number of workers); fewer than the "
                 "workers makes the rest backup workers whose late gradients are dropped")
      ->check(CLI::NonNegativeNumber);
  AddSecondsOption(app, "--worker-timeout", worker_timeout_s,
                   "Seconds of silence after which a worker is declared dead and leaves the "
                   "barrier / staleness set (workers heartbeat meanwhile)",
                   0.1, 86400.0);
  AddSecondsOption(app, "--barrier-timeout", barrier_timeout_s,
                   "Seconds a pull may wait for a sync step or the ssp bound before it fails "
                   "with an error naming the ranks it waited for",
                   0.1, 86400.0);
  AddSecondsOption(app, "--straggler-log-seconds", straggler_log_s,
                   "Log the rank a barrier waited for when one wait on it alone exceeds this "
                   "(at most every 10 s per rank; 0: never). Always exported as "
                   "parasync_ps_barrier_waited_for_seconds_total{rank} and "
                   "parasync_ps_straggler{rank}",
                   0.0, 86400.0);
  app.add_option("--bind", bind,
                 "Address to bind, host:port (default: this task's address in the cluster; "
                 "use 0.0.0.0:PORT to listen on all interfaces; a host name must resolve)");
  // The last of repeated metrics flags wins, so a user's --ps-arg/--worker-arg overrides
  // the launcher's.
  app.add_option("--metrics-port", metrics_port, "Port of /metrics; 0 picks a free one and logs it")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
      ->check(CLI::Range(0, 65535));
  app.add_option("--metrics-bind", metrics_bind,
                 "Address the metrics server listens on: an IP address (checked: four octets "
                 "0-255), * or a host name that resolves")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--log-dir", log_dir, "Directory for the metrics snapshot written at exit");
  app.add_option("--log-level", log_level, "debug, info, warn or error");
  app.add_option("--max-message-bytes", max_message_bytes,
                 "Largest message accepted, all its frames together; bigger ones are refused")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-unread-reply-bytes", max_unread_reply_bytes,
                 "Most bytes of pull replies that peers have not read yet, all together; a "
                 "pull past it, or from a peer with twice the shard's values unread, is "
                 "refused (0 = 2 x (workers + 2) x the shard's values; at least (workers + 1) x "
                 "them)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-model-bytes", max_model_bytes,
                 "Most memory a registered model may take on this shard (values, one spare "
                 "copy of them for zero-copy pull replies, and the optimizer slots); 0 = 80% "
                 "of physical memory")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--apply-threads", apply_threads,
                 "Threads that check and apply a pushed gradient of 1 MiB or more spread over "
                 "several slices, this server's loop included (1: the loop alone)")
      ->check(CLI::Range(1, 64));
  app.add_option("--state-dir", state_dir,
                 "Keep this shard's state in a RocksDB store here and restore it at start "
                 "(empty: memory only). A directory holding anything else is refused, never "
                 "overwritten, and so is a store of another shard or --mode (old name: "
                 "--data-dir)")
      ->type_name("DIR");
  AddHiddenAlias(app, "--data-dir", state_dir);
  app.add_option("--durability", durability,
                 "periodic: snapshots every --checkpoint-every seconds / versions (a crash loses "
                 "at most that much); every-update: each applied update is on disk (WAL synced) "
                 "before it is acknowledged");
  AddSecondsOption(app, "--checkpoint-every", checkpoint_every_s,
                   "periodic: seconds between snapshots (0: off)", 0.0, 86400.0);
  app.add_option("--checkpoint-every-versions", checkpoint_every_versions,
                 "periodic: versions between snapshots (0: off); in sync mode snapshots fall on "
                 "multiples of it, so all shards hold the same step")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--allow-remote-shutdown", allow_remote_shutdown,
               "Accept Shutdown messages from non-loopback peers (default: loopback only)");
  app.add_option("--fault-drop-push-reply-every", drop_push_reply_every,
                 "Testing only: do not reply to every Nth applied push (as if the connection "
                 "broke between apply and acknowledgement)")
      ->check(CLI::NonNegativeNumber)
      ->group("Fault injection");
  std::string curve_key_file;
  std::string curve_allow;
  app.add_option("--curve-key", curve_key_file,
                 "CURVE: this server's key pair file (parasync-keygen); with it every "
                 "connection is encrypted and only --curve-allow keys are admitted (every "
                 "refused one is logged and counted in parasync_ps_auth_refused_total{reason})")
      ->group("Security");
  app.add_option("--curve-allow", curve_allow,
                 "CURVE: the public keys admitted, a directory of .pub files or a file of keys "
                 "(the workers' and parasync-export's)")
      ->group("Security");
  bool check = false;
  app.add_flag("--check", check,
               "Preflight: validate the flags, try binding this shard's address and metrics port "
               "and print `check version ...` and one `check problem ...` line per problem, then "
               "exit (0: fine); parasync-launch --check runs it on every host");
  if (auto done = ParseCommandLine(app, argc, argv)) return *done;

  auto spec = ResolveClusterSpecFromEnvironment(cluster, "ps");
  if (!spec.ok()) return Fail(spec.status().message(), kExitBadUsage);
  // Both addresses this process binds, checked (and names resolved) before anything starts.
  auto endpoint =
      ToBindEndpoint(bind.empty() ? spec->ps[static_cast<size_t>(spec->task_index)] : bind);
  if (!endpoint.ok()) return Fail(endpoint.status().message(), kExitBadUsage);
  auto metrics_ip = ResolveBindHost(metrics_bind, "--metrics-bind");
  if (!metrics_ip.ok()) return Fail(metrics_ip.status().message(), kExitBadUsage);
  auto training_mode = TrainingMode::Parse(mode);
  if (!training_mode.ok()) return Fail(training_mode.status().message(), kExitBadUsage);
  const int num_workers = static_cast<int>(spec->workers.size());
  if (durability != "periodic" && durability != "every-update") {
    return Fail("--durability must be periodic or every-update, not '" + durability + "'",
                kExitBadUsage);
  }
  if (durability == "every-update" && state_dir.empty()) {
    return Fail("--durability every-update needs --state-dir", kExitBadUsage);
  }
  if (replicas_to_aggregate > num_workers) {
    return Fail("--replicas-to-aggregate " + std::to_string(replicas_to_aggregate) +
                    " is more than the " + std::to_string(num_workers) + " workers",
                kExitBadUsage);
  }
  std::optional<CurveKeyPair> curve_key;
  std::vector<std::string> curve_allowed;
  if (curve_key_file.empty() != curve_allow.empty()) {
    return Fail("--curve-key and --curve-allow go together", kExitBadUsage);
  }
  if (!curve_key_file.empty()) {
    auto pair = ReadKeyPairFile(curve_key_file);
    if (!pair.ok()) return Fail(pair.status().message(), kExitBadUsage);
    curve_key = *pair;
    auto allowed = ReadPublicKeys(curve_allow);
    if (!allowed.ok()) return Fail(allowed.status().message(), kExitBadUsage);
    curve_allowed = std::move(allowed).value();
  }
  if (check) {
    std::vector<std::string> problems;
    const std::string address = bind.empty() ? spec->ps[static_cast<size_t>(spec->task_index)] : bind;
    const size_t colon = address.rfind(':');
    const int port = colon == std::string::npos ? 0 : std::atoi(address.c_str() + colon + 1);
    if (std::string p = BindProblem(address.substr(0, colon), port); !p.empty()) {
      problems.push_back("ps" + std::to_string(spec->task_index) + ": " + p);
    }
    if (metrics_port != 0) {
      if (std::string p = BindProblem(metrics_bind, metrics_port); !p.empty()) {
        problems.push_back("ps" + std::to_string(spec->task_index) + " metrics: " + p);
      }
    }
    if (!state_dir.empty()) {
      // The store creates the whole path: its nearest existing ancestor must be a writable
      // directory.
      std::error_code ec;
      auto existing = std::filesystem::absolute(state_dir, ec);
      while (!std::filesystem::exists(existing, ec) && existing.has_parent_path() &&
             existing != existing.parent_path()) {
        existing = existing.parent_path();
      }
      if (!std::filesystem::is_directory(existing, ec) || access(existing.c_str(), W_OK) != 0) {
        problems.push_back("ps" + std::to_string(spec->task_index) + ": --state-dir " + state_dir +
                           " cannot be created (" + existing.string() +
                           " is not a writable directory)");
      }
      // What it holds, as the start would find it: anything but this shard's store of this
      // --mode is refused (a store locked by a running server too: it is in use).
      if (std::filesystem::exists(state_dir, ec) && !std::filesystem::is_empty(state_dir, ec)) {
        auto opened = CheckpointStore::Open(state_dir, spec->task_index,
                                            static_cast<int>(spec->ps.size()));
        Status found = opened.status();
        if (opened.ok()) {
          auto loaded = (*opened)->Load();
          if (loaded.ok()) {
            found = CheckStoredMode(loaded->registration.mode, *training_mode, state_dir);
          } else if (loaded.status().code() != StatusCode::kNotFound) {
            found = loaded.status();
          }
        }
        if (!found.ok()) {
          const std::string& m = found.message();
          problems.push_back("ps" + std::to_string(spec->task_index) + ": " +
                             (m.starts_with("--state-dir") ? m : "--state-dir " + m));
        }
      }
    }
    return ReportCheck(problems);
  }
  // A port in use is refused before anything starts, naming the flag: a retry would find it
  // taken again (kExitBadUsage).
  {
    const std::string address =
        bind.empty() ? spec->ps[static_cast<size_t>(spec->task_index)] : bind;
    const size_t colon = address.rfind(':');
    const int port = colon == std::string::npos ? 0 : std::atoi(address.c_str() + colon + 1);
    if (std::string p = BindProblem(address.substr(0, colon), port); !p.empty()) {
      return Fail((bind.empty() ? "shard " + std::to_string(spec->task_index) +
                                      "'s address in --ps-hosts, " + address
                                : "--bind " + address) +
                      ": " + p,
                  kExitBadUsage);
    }
    if (metrics_port != 0) {
      if (std::string p = BindProblem(metrics_bind, metrics_port); !p.empty()) {
        return Fail("--metrics-port " + std::to_string(metrics_port) + ": " + p, kExitBadUsage);
      }
    }
  }
  if (!InitLogging("ps", spec->task_index, log_level)) {
    return Fail("unknown --log-level " + log_level, kExitBadUsage);
  }
  if (!log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(log_dir, ec);
    if (ec) return Fail("cannot create --log-dir " + log_dir + ": " + ec.message(), kExitBadUsage);
  }
  InstallShutdownSignalHandlers();
  KeepFreedMessageBuffers();

  const int shard = spec->task_index;
  PsMetrics metrics(shard, num_workers);

  ServerOptions options;
  options.endpoint = *endpoint;
  options.allow_remote_shutdown = allow_remote_shutdown;
  options.drop_push_reply_every = drop_push_reply_every;
  options.num_workers = num_workers;
  options.mode = *training_mode;
  options.replicas_to_aggregate = replicas_to_aggregate;
  options.worker_timeout = std::chrono::milliseconds(static_cast<int64_t>(worker_timeout_s * 1000));
  options.barrier_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(barrier_timeout_s * 1000));
  options.straggler_log_seconds = straggler_log_s;
  options.shard_index = shard;
  options.num_shards = static_cast<int>(spec->ps.size());
  options.max_message_bytes = max_message_bytes;
  options.max_unread_reply_bytes = max_unread_reply_bytes;
  if (max_model_bytes == 0) {
    // A registration is a remote request: it must not be able to exhaust this machine.
    max_model_bytes = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) / 5 * 4 *
                      static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  }
  options.max_model_bytes = max_model_bytes;
  options.apply_threads = apply_threads;
  // Before the store: /metrics answers, and /healthz says "ok", while a large store is
  // verified and restored (the probes of deploy/k8s rely on it); /readyz waits for the
  // request loop. A store refused below exits before the server binds.
  auto metrics_server =
      MetricsServer::Start(*metrics_ip, metrics_port, metrics.registry,
                           {.loop = &metrics.loop, .stale_after = kPsLoopStaleAfter});
  if (!metrics_server.ok()) {
    // Checked free a moment ago (above): taken since, or refused for another reason.
    return Fail("cannot serve metrics on --metrics-bind " + metrics_bind + " --metrics-port " +
                    std::to_string(metrics_port) + ": " + metrics_server.status().message(),
                metrics_port != 0 ? kExitBadUsage : kExitRetryable);
  }
  const int bound_metrics_port = (*metrics_server)->port();
  MetricsServer::KeepUntilExit(std::move(metrics_server).value());
  std::unique_ptr<CheckpointStore> store;
  std::optional<ShardSnapshot> restored;
  double restore_seconds = 0;
  if (!state_dir.empty()) {
    auto faults = StorageFaultsFromEnvironment();
    if (!faults.ok()) return Fail(faults.status().message(), kExitBadUsage);
    if (*faults) {
      spdlog::warn("FAULT INJECTION: {}={} makes the store's disk fail on purpose",
                   kStorageFaultsVariable, std::getenv(kStorageFaultsVariable));
    }
    auto opened = CheckpointStore::Open(state_dir, shard, options.num_shards, *faults);
    if (!opened.ok()) {
      // Unavailable: the store is locked by another process (or the disk failed), which
      // may pass; anything else (a foreign directory, another shard's store, damage) stays.
      const std::string m = opened.status().message();  // status() is a copy
      return Fail("--state-dir " + (m.starts_with(state_dir) ? m : state_dir + ": " + m),
                  opened.status().code() == StatusCode::kUnavailable ? kExitRetryable
                                                                     : kExitBadUsage);
    }
    store = std::move(opened).value();
    const auto t0 = std::chrono::steady_clock::now();
    auto loaded = store->Load();
    if (loaded.ok()) {
      restored = std::move(loaded).value();
    } else if (loaded.status().code() != StatusCode::kNotFound) {
      return Fail("cannot restore from " + state_dir + ": " + loaded.status().message(),
                  kExitBadUsage);
    }
    // A store of another mode would refuse every worker's Register: say so now.
    if (restored) {
      if (Status s = CheckStoredMode(restored->registration.mode, *training_mode, state_dir);
          !s.ok()) {
        return Fail(s.message(), kExitBadUsage);
      }
    }
    restore_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    options.store = store.get();
    options.every_update = durability == "every-update";
    options.checkpoint_every =
        std::chrono::milliseconds(static_cast<int64_t>(checkpoint_every_s * 1000));
    options.checkpoint_every_versions = checkpoint_every_versions;
    if (training_mode->kind == TrainingMode::Kind::kSync && checkpoint_every_versions == 0 &&
        !options.every_update) {
      spdlog::warn("sync mode with time-based snapshots: shards may hold different steps; "
                   "--checkpoint-every-versions N keeps them aligned");
    }
  }

  zmq::context_t context(1);
  // Bound before the server socket, so no connection is ever admitted without it; destroyed
  // (declared after the context) before the context.
  std::unique_ptr<ZapAuthenticator> authenticator;
  std::atomic<uint64_t> refusals{0};  // every refused CURVE peer, for the log's rate limit
  if (curve_key) {
    options.curve_secret_key = curve_key->secret_key;
    PsMetrics* m = &metrics;
    std::atomic<uint64_t>* n = &refusals;
    auto started = ZapAuthenticator::Start(
        context, curve_allowed,
        [m, n](std::optional<CurveRefusal> refusal, const std::string& peer) {
          if (!refusal) {
            m->auth_accepted->Increment();
          } else {
            CountRefusal(m, n, *refusal, peer, "");
          }
        });
    if (!started.ok()) return Fail(started.status().message());
    authenticator = std::move(started).value();
    spdlog::info("CURVE on: encrypted, {} client key(s) allowed", curve_allowed.size());
  }
  auto server = Server::Create(context, options, &metrics);
  if (!server.ok()) {
    return Fail(server.status().message(), server.status().code() == StatusCode::kInvalidArgument
                                               ? kExitBadUsage
                                               : kExitRetryable);
  }
  // Refusals inside the CURVE handshake (a plain-text client, a key pair that does not
  // match) never reach the ZAP handler: libzmq reports them only as monitor events. They
  // are read on a thread of their own rather than in the server loop, so that they are
  // drained (the monitor queue drops what overflows) even while the loop is busy applying a
  // large gradient, and the loop's code stays as it is. Destroyed before the server.
  std::unique_ptr<CurveRefusalWatcher> refusal_watcher;
  if (curve_key) {
    PsMetrics* m = &metrics;
    std::atomic<uint64_t>* n = &refusals;
    auto watching = CurveRefusalWatcher::Start(
        (*server)->TakeHandshakeMonitor(),
        [m, n](CurveRefusal reason, const std::string& peer, const std::string& detail) {
          CountRefusal(m, n, reason, peer, detail);
        });
    if (!watching.ok()) return Fail(watching.status().message());
    refusal_watcher = std::move(watching).value();
  }
  if (restored) {
    if (Status s = (*server)->Restore(*restored); !s.ok()) {
      return Fail("cannot restore from " + state_dir + ": " + s.message(), kExitBadUsage);
    }
    spdlog::info("restored from {}: version {}, {} examples, {} slices, {} bytes on disk, in "
                 "{:.3f} s",
                 state_dir, restored->version, restored->examples, restored->slices.size(),
                 store->ApproximateBytes(), restore_seconds);
    restored.reset();  // the shard holds its own copy now; do not keep the model twice
  } else if (store) {
    spdlog::info("new data directory {} (durability {})", state_dir, durability);
  }
  spdlog::info("shard {}/{} serving {} worker(s) on {} (mode {}{}), metrics on "
               "http://{}:{}/metrics",
               shard, options.num_shards, num_workers, (*server)->endpoint(), mode,
               training_mode->kind == TrainingMode::Kind::kSync
                   ? ", " + std::to_string(replicas_to_aggregate > 0 ? replicas_to_aggregate
                                                                     : num_workers) +
                         " gradients per step"
                   : std::string(),
               *metrics_ip, bound_metrics_port);

  Status run = (*server)->Run([] { return ShutdownRequested(); });
  // A graceful stop keeps everything applied so far.
  if (Status s = (*server)->SaveSnapshot(); !s.ok()) {
    spdlog::error("final snapshot failed: {}", s.ToString());
  } else if (store) {
    spdlog::info("on disk: version {}", (*server)->shard().version());
  }
  if (int sig = ShutdownSignal(); sig != 0) spdlog::info("signal {} received, shutting down", sig);
  const Shard& s = (*server)->shard();
  spdlog::info("stopped: version {}, {} examples applied, {} elements held", s.version(),
               s.examples(), s.num_elements());
  if (!log_dir.empty()) {
    const std::string path = MetricsSnapshotPath(log_dir, "ps" + std::to_string(shard));
    if (Status w = WriteMetricsSnapshot(*metrics.registry, path); !w.ok()) {
      spdlog::warn("metrics snapshot not written: {}", w.message());
    }
  }
  if (!run.ok()) return Fail(run.ToString());
  return 0;
}
