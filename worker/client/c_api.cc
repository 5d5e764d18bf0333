// The C API (worker/client/c_api.h) over PsClient, the heartbeats and the worker metrics.
// Every entry point converts: C arguments in, a Status out as a code and a malloc'ed message;
// nothing thrown crosses (Guard).
#include "worker/client/c_api.h"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <future>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>
#include <zmq.hpp>

#include "common/cluster_spec.h"
#include "common/curve.h"
#include "common/metrics.h"
#include "common/mode.h"
#include "common/model_spec.h"
#include "common/process.h"
#include "common/version.h"
#include "worker/chief.h"
#include "worker/data/dataset.h"
#include "worker/heartbeater.h"
#include "worker/ps_client.h"
#include "worker/worker_metrics.h"

namespace {

using namespace parasync;
using std::chrono::milliseconds;

milliseconds Millis(double seconds) { return milliseconds(std::llround(seconds * 1000)); }

char* CopyString(const std::string& text) {
  char* copy = static_cast<char*>(std::malloc(text.size() + 1));
  if (copy != nullptr) std::memcpy(copy, text.c_str(), text.size() + 1);
  return copy;
}

int Report(const Status& s, char** errmsg) {
  if (s.ok()) return PARASYNC_OK;
  if (errmsg != nullptr) *errmsg = CopyString(s.message());
  return static_cast<int>(s.code());
}

// What was thrown, as kInternal; with no memory left even for its message, the code alone.
int ReportUnexpected(const char* what, char** errmsg) noexcept {
  try {
    return Report(Status::Internal(std::string("unexpected error: ") + what), errmsg);
  } catch (...) {
    return PARASYNC_INTERNAL;
  }
}

// Runs `body` (returning a Status) and reports it; an exception becomes kInternal.
template <typename Body>
int Guard(char** errmsg, Body&& body) {
  try {
    return Report(body(), errmsg);
  } catch (const std::exception& e) {
    return ReportUnexpected(e.what(), errmsg);
  } catch (...) {
    return ReportUnexpected("unknown exception", errmsg);
  }
}

// An entry point without errmsg says why it refused in one error line of the library's log.
void LogRefusal(const char* call, const char* why, bool unexpected = false) noexcept {
  try {
    spdlog::error("{}: {}{}", call, unexpected ? "unexpected error: " : "", why);
  } catch (...) {  // nowhere left to say it
  }
}

// Guard for an entry point that returns a value and has no errmsg: `body` returns a
// Result<T>; its error, or anything thrown, is logged naming `call`, and `refused` returned.
template <typename T, typename Body>
T GuardValue(const char* call, T refused, Body&& body) {
  try {
    Result<T> result = body();
    if (result.ok()) return *result;
    LogRefusal(call, result.status().message().c_str());
  } catch (const std::exception& e) {
    LogRefusal(call, e.what(), /*unexpected=*/true);
  } catch (...) {
    LogRefusal(call, "unknown exception", /*unexpected=*/true);
  }
  return refused;
}

// GuardValue for an entry point that returns nothing: `body` returns a Status.
template <typename Body>
void GuardVoid(const char* call, Body&& body) {
  GuardValue(call, 0, [&]() -> Result<int> {
    PARASYNC_RETURN_IF_ERROR(body());
    return 0;
  });
}

// A pointer the call needs (a handle, an output, a text): InvalidArgument naming it if NULL.
Status Need(const void* pointer, const char* what) {
  if (pointer == nullptr) return Status::InvalidArgument(std::string(what) + " is NULL");
  return Status::Ok();
}

// `n` arrays, one per variable, each needed; `what` is their parameter's name.
template <typename T>
Status NeedArrays(T* const* arrays, size_t n, const char* what) {
  if (n == 0) return Status::Ok();
  PARASYNC_RETURN_IF_ERROR(Need(arrays, what));
  for (size_t v = 0; v < n; ++v) {
    if (arrays[v] == nullptr) {
      return Status::InvalidArgument(std::string(what) + "[" + std::to_string(v) + "] is NULL");
    }
  }
  return Status::Ok();
}

// ---- Signals ----------------------------------------------------------------------------
std::atomic<int> g_stop_signal{0};
struct sigaction g_previous_int {};
struct sigaction g_previous_term {};

// Sets the flag, then does what was installed before: calls its handler; takes the default
// action (restored and raised again: the signal, unblocked when this returns, ends the process
// as it would have without the library); or nothing more, where the signal was ignored.
void OnStopSignal(int number, siginfo_t* info, void* context) {
  g_stop_signal.store(number, std::memory_order_relaxed);
  const struct sigaction& previous = number == SIGINT ? g_previous_int : g_previous_term;
  if (previous.sa_handler == SIG_IGN) return;
  if (previous.sa_handler == SIG_DFL) {
    struct sigaction default_action {};
    default_action.sa_handler = SIG_DFL;
    sigemptyset(&default_action.sa_mask);
    sigaction(number, &default_action, nullptr);
    raise(number);
    return;
  }
  if ((previous.sa_flags & SA_SIGINFO) != 0) {
    previous.sa_sigaction(number, info, context);
  } else {
    previous.sa_handler(number);
  }
}

}  // namespace

// ---- The handles --------------------------------------------------------------------------

struct parasync_options_t {
  std::optional<ClusterSpec> cluster;
  std::string mode = "async";
  double request_seconds = 120;
  double connect_seconds = 60;
  double heartbeat_seconds = 1;
  std::string key_file;
  std::string server_key_file;
  WireFormat wire = DType::kFloat32;
  std::string metrics_bind = "127.0.0.1";
  int metrics_port = -1;
  std::string log_dir = ".";
  std::string log_level = "info";
  bool joining = false;  // a restarted worker not yet back in the run
  bool topk_probe = true;
  bool delta_pulls = true;
  std::string local_group;           // this host's ranks ("0,1"); empty: no local aggregation
  std::string local_group_endpoint;  // empty: DefaultLocalGroupEndpoint
};

struct parasync_model_t {
  ModelRegistration reg;
  std::string name;
};

struct parasync_client_t {
  mutable std::mutex mu;  // one call at a time, getters included
  parasync_options_t options;
  TrainingMode mode;
  std::string mode_text;
  int rank = 0;
  int num_workers = 1;
  int num_shards = 1;
  milliseconds silence_limit{0};
  std::unique_ptr<WorkerMetrics> metrics;
  std::unique_ptr<MetricsServer> metrics_server;
  // Destroyed in reverse: the client, the heartbeats, then the context they use.
  zmq::context_t context{1};
  std::unique_ptr<Heartbeater> heartbeater;
  std::unique_ptr<PsClient> client;
  // The collectives' own connections (made at the first gather), so that a collective may
  // run while a step's pushes are out on `client`'s (SyncBatchNorm in backward, a metric
  // allreduced between backward and step).
  PsClientOptions client_options;
  std::unique_ptr<PsClient> gather_client;
  std::optional<ModelRegistration> registration;
  // The last gather's payloads, by rank (absent: the rank took no part), and its round.
  std::vector<std::optional<zmq::message_t>> gathered;
  int64_t gathered_round = 0;
  // parasync_client_step_launch (sync:delayed): the step's exchange on a thread of its own,
  // its times and, once awaited (Settle), its outcome until parasync_client_step_wait reports
  // it; and the read point of the parameters the caller computes its next gradient at (the
  // next step_begin's). Every call that uses `client` settles the exchange first. Declared
  // last: destroyed, and so awaited, before everything the exchange uses.
  mutable PsClient::PushPullTimes launched_times;
  mutable std::optional<DataProgress> progress_after;  // set_progress's, while in flight
  mutable std::optional<Status> launched_outcome;
  std::optional<PsClient::ReadPoint> launched_from;
  mutable std::future<Status> launched;
};

namespace {

// "float32", "bfloat16", "float16", "int8", "int4", "topk" or "topk:R" (NULL or anything else:
// InvalidArgument naming it).
Result<WireFormat> ParseWireDType(const char* dtype) {
  PARASYNC_RETURN_IF_ERROR(Need(dtype, "dtype"));
  const std::optional<WireFormat> parsed = ParseWireFormat(dtype);
  if (!parsed) {
    return Status::InvalidArgument(
        "the wire dtype must be float32, bfloat16, float16, int8, int4, topk or topk:R with R in "
        "(0, 1], not '" + std::string(dtype) + "'");
  }
  return *parsed;
}

// Waits for the exchange parasync_client_step_launch started, if one is in flight, and keeps
// its outcome for parasync_client_step_wait. Under the client's lock.
void Settle(const parasync_client_t& c) {
  if (!c.launched.valid()) return;
  c.launched_outcome = c.launched.get();
  if (c.progress_after) c.client->set_progress(*std::exchange(c.progress_after, std::nullopt));
}

// The client's PsClient, once no launched exchange uses it any more.
PsClient& Ps(const parasync_client_t& c) {
  Settle(c);
  return *c.client;
}

// The last push's outcome and the client's resends in the worker metrics.
void ObservePush(const parasync_client_t& c) {
  WorkerMetrics& m = *c.metrics;
  m.ObservePush(Ps(c).last_push_dropped(), Ps(c).last_push_staleness());
  m.FollowClient(Ps(c).resends(), Ps(c).reconnects());
}

Status NeedRegistered(const parasync_client_t* c) {
  if (!c->registration) return Status::FailedPrecondition("the model is not registered yet");
  return Status::Ok();
}

// The C rows as PsClient's; `what` (their parameter's name) names them in an error: NULL
// rows, or a row's ids or values.
Result<std::vector<RowsOf>> RowsOfC(const parasync_rows_t* rows, size_t n, const char* what) {
  std::vector<RowsOf> out;
  if (n == 0) return out;
  PARASYNC_RETURN_IF_ERROR(Need(rows, what));
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (rows[i].count > 0 && (rows[i].ids == nullptr || rows[i].values == nullptr)) {
      return Status::InvalidArgument(std::string(what) + "[" + std::to_string(i) +
                                     "]: ids or values is NULL (count " +
                                     std::to_string(rows[i].count) + ")");
    }
    out.push_back({rows[i].table, std::span<const uint64_t>(rows[i].ids, rows[i].count),
                   rows[i].values});
  }
  return out;
}

// GuardValue for a getter of a client: refused for a NULL client, else `read` under its lock.
template <typename T, typename Read>
T ReadClient(const char* call, const parasync_client_t* client, T refused, Read&& read) {
  return GuardValue(call, refused, [&]() -> Result<T> {
    PARASYNC_RETURN_IF_ERROR(Need(client, "client"));
    std::lock_guard lock(client->mu);
    return read(*client);
  });
}

// GuardVoid for a call that changes a client: refused for a NULL client, else `update` under
// its lock.
template <typename Update>
void UpdateClient(const char* call, parasync_client_t* client, Update&& update) {
  GuardVoid(call, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(client, "client"));
    std::lock_guard lock(client->mu);
    update(*client);
    return Status::Ok();
  });
}

Status CheckCount(size_t given, const parasync_client_t* c, const char* what) {
  const size_t want = c->registration->variables.size();
  if (given != want) {
    return Status::InvalidArgument(std::to_string(given) + " " + what + " for a model of " +
                                   std::to_string(want) + " variables");
  }
  return Status::Ok();
}

double MonotonicSeconds(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

void CopyTimes(const PsClient::PushPullTimes& t, parasync_step_times_t* times) {
  times->first_push_sent = MonotonicSeconds(t.first_push_sent);
  times->last_push_sent = MonotonicSeconds(t.last_push_sent);
  times->pushes_acked = MonotonicSeconds(t.pushes_acked);
  times->pulled = MonotonicSeconds(t.pulled);
  times->push_seconds = t.push_seconds;
  times->pull_seconds = t.pull_seconds;
  times->early_pushes = t.early_pushes;
}

// The logger parasync-worker uses (common/process.h), once per process and rank.
void SetUpLogging(int rank, const std::string& level) {
  if (spdlog::get("worker" + std::to_string(rank)) != nullptr) {
    spdlog::set_default_logger(spdlog::get("worker" + std::to_string(rank)));
    spdlog::set_level(spdlog::level::from_str(level));
    return;
  }
  InitLogging("worker", rank, level);
}

Status StartClient(parasync_client_t* c) {
  const parasync_options_t& o = c->options;
  c->metrics = std::make_unique<WorkerMetrics>(c->rank);
  if (o.metrics_port >= 0) {
    PARASYNC_ASSIGN_OR_RETURN(
        c->metrics_server,
        MetricsServer::Start(o.metrics_bind, o.metrics_port, c->metrics->registry,
                             {.loop = &c->metrics->loop, .stale_after = kWorkerLoopStaleAfter}));
  }
  PARASYNC_ASSIGN_OR_RETURN(std::optional<CurveClientKeys> curve,
                            LoadCurveClientKeys(o.key_file, o.server_key_file,
                                                o.cluster->ps.size()));
  PARASYNC_ASSIGN_OR_RETURN(
      c->heartbeater,
      Heartbeater::Start(c->context, o.cluster->ps, c->rank, Millis(o.heartbeat_seconds), curve,
                         o.joining));
  PsClientOptions client_options;
  client_options.ps_addresses = o.cluster->ps;
  client_options.rank = c->rank;
  client_options.request_timeout = Millis(o.request_seconds);
  client_options.curve = curve;
  client_options.wire_dtype = o.wire;
  client_options.topk_probe.enabled = o.topk_probe;
  client_options.delta_pulls = o.delta_pulls;
  client_options.copy_threads = 2;
  // A blocked pull gives up when asked to stop, or when a server has stopped answering
  // heartbeats for longer than the request plus connect timeouts (it died: waiting would
  // never end), as parasync-worker's does.
  c->silence_limit = Millis(o.request_seconds) + Millis(o.connect_seconds);
  Heartbeater* beats = c->heartbeater.get();
  client_options.interrupted = [beats, limit = c->silence_limit] {
    return g_stop_signal.load(std::memory_order_relaxed) != 0 || beats->LongestSilence() > limit;
  };
  client_options.incarnation_of = [beats](int shard) { return beats->Incarnation(shard); };
  client_options.pulls_may_wait = c->mode.kind != TrainingMode::Kind::kAsync;
  client_options.loop = &c->metrics->loop;
  c->client_options = client_options;  // the collectives' client: never in the local group
  if (!o.local_group.empty()) {
    auto group = LocalGroupFor(o.local_group, o.local_group_endpoint, c->rank, c->num_workers,
                               c->mode, o.cluster->ps);
    if (!group.ok()) return Status::InvalidArgument("local group: " + group.status().message());
    client_options.local_group = *group;
  }
  PARASYNC_ASSIGN_OR_RETURN(c->client, PsClient::Connect(c->context, client_options));
  c->client->SetJoining(o.joining);
  return Status::Ok();
}

// A failed wait says so when a server went silent (as parasync-worker's last line does).
Status Explain(const parasync_client_t* c, Status s) {
  if (s.ok() || !c->heartbeater) return s;
  if (c->heartbeater->LongestSilence() > c->silence_limit) {
    return Status(s.code(), "a parameter server has not answered for " +
                                std::to_string(c->heartbeater->LongestSilence().count() / 1000) +
                                " s (" + s.message() + ")");
  }
  if (g_stop_signal.load(std::memory_order_relaxed) != 0 && s.code() == StatusCode::kAborted) {
    return Status::Aborted("stopped by signal " + std::to_string(g_stop_signal.load()));
  }
  return s;
}

}  // namespace

extern "C" {

// Every entry point runs inside Guard (a coded call), GuardValue or GuardVoid: nothing thrown
// crosses, and a NULL handle or needed pointer is refused, not dereferenced.

void parasync_free(void* p) {
  GuardVoid(__func__, [&] {
    std::free(p);
    return Status::Ok();
  });
}

const char* parasync_version(void) {
  return GuardValue(__func__, "unknown", []() -> Result<const char*> {
    static const std::string version = BuildVersion();
    return version.c_str();
  });
}

// ---- Options ------------------------------------------------------------------------------

parasync_options_t* parasync_options_create(void) {
  return GuardValue(__func__, static_cast<parasync_options_t*>(nullptr),
                    []() -> Result<parasync_options_t*> { return new parasync_options_t; });
}

void parasync_options_destroy(parasync_options_t* options) {
  GuardVoid(__func__, [&] {
    delete options;
    return Status::Ok();
  });
}

int parasync_options_set_cluster(parasync_options_t* options, const char* ps_hosts,
                                 int num_workers, int rank, char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(options, "options"));
    ClusterFlags flags;
    if (ps_hosts != nullptr) flags.ps_hosts = ps_hosts;
    if (num_workers > 0) {
      // Worker addresses are only counted (the world size), never contacted.
      std::string hosts;
      for (int i = 0; i < num_workers; ++i) {
        hosts += (i > 0 ? "," : "") + std::string("127.0.0.1:") + std::to_string(i + 1);
      }
      flags.worker_hosts = hosts;
    }
    if (rank >= 0) flags.task_index = rank;
    PARASYNC_ASSIGN_OR_RETURN(ClusterSpec spec, ResolveClusterSpecFromEnvironment(flags, "worker"));
    options->cluster = std::move(spec);
    return Status::Ok();
  });
}

int parasync_options_set_mode(parasync_options_t* options, const char* mode, char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(options, "options"));
    PARASYNC_RETURN_IF_ERROR(Need(mode, "mode"));
    PARASYNC_ASSIGN_OR_RETURN(TrainingMode parsed, TrainingMode::Parse(mode));
    options->mode = parsed.ToString();
    return Status::Ok();
  });
}

int parasync_options_set_timeouts(parasync_options_t* options, double request_seconds,
                                  double connect_seconds, double heartbeat_seconds,
                                  char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(options, "options"));
    for (double s : {request_seconds, connect_seconds, heartbeat_seconds}) {
      if (!std::isfinite(s) || s > 86400.0) {
        return Status::InvalidArgument("a timeout must be a finite number of seconds <= 86400");
      }
    }
    if (request_seconds > 0) options->request_seconds = std::max(0.1, request_seconds);
    if (connect_seconds > 0) options->connect_seconds = std::max(0.1, connect_seconds);
    if (heartbeat_seconds > 0) options->heartbeat_seconds = std::max(0.01, heartbeat_seconds);
    if (options->heartbeat_seconds * 3 > options->request_seconds + options->connect_seconds) {
      return Status::InvalidArgument(
          "the heartbeat interval must be under a third of the request plus connect timeouts "
          "(a silent server is detected from missing heartbeats)");
    }
    return Status::Ok();
  });
}

int parasync_options_set_curve(parasync_options_t* options, const char* key_file,
                               const char* server_key_file, char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(options, "options"));
    if ((key_file == nullptr) != (server_key_file == nullptr)) {
      return Status::InvalidArgument("CURVE needs both this client's key file and the servers' "
                                     "public key file, or neither");
    }
    options->key_file = key_file == nullptr ? "" : key_file;
    options->server_key_file = server_key_file == nullptr ? "" : server_key_file;
    return Status::Ok();
  });
}

int parasync_options_set_topk_probe(parasync_options_t* options, int on, char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(options, "options"));
    options->topk_probe = on != 0;
    return Status::Ok();
  });
}

int parasync_options_set_delta_pulls(parasync_options_t* options, int on, char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(options, "options"));
    options->delta_pulls = on != 0;
    return Status::Ok();
  });
}

int parasync_options_set_wire_dtype(parasync_options_t* options, const char* dtype,
                                    char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(options, "options"));
    PARASYNC_ASSIGN_OR_RETURN(options->wire, ParseWireDType(dtype));
    return Status::Ok();
  });
}

int parasync_options_set_local_group(parasync_options_t* options, const char* ranks,
                                     const char* endpoint, char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(options, "options"));
    options->local_group = ranks == nullptr ? "" : ranks;
    options->local_group_endpoint = endpoint == nullptr ? "" : endpoint;
    if (!options->local_group.empty()) {
      PARASYNC_RETURN_IF_ERROR(ParseLocalGroupRanks(options->local_group).status());
    }
    return Status::Ok();
  });
}

int parasync_options_set_joining(parasync_options_t* options, int joining, char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(options, "options"));
    options->joining = joining != 0;
    return Status::Ok();
  });
}

int parasync_options_set_metrics(parasync_options_t* options, const char* bind, int port,
                                 const char* log_dir, char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(options, "options"));
    if (port > 65535) return Status::InvalidArgument("metrics port " + std::to_string(port));
    if (bind != nullptr) options->metrics_bind = bind;
    options->metrics_port = port;
    if (log_dir != nullptr) options->log_dir = log_dir;
    return Status::Ok();
  });
}

int parasync_options_set_log_level(parasync_options_t* options, const char* level,
                                   char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(options, "options"));
    PARASYNC_RETURN_IF_ERROR(Need(level, "log level"));
    const std::string text = level;
    if (text != "debug" && text != "info" && text != "warn" && text != "error") {
      return Status::InvalidArgument("log level must be debug, info, warn or error, not '" +
                                     text + "'");
    }
    options->log_level = text;
    return Status::Ok();
  });
}

// ---- The model ------------------------------------------------------------------------------

parasync_model_t* parasync_model_create(void) {
  return GuardValue(__func__, static_cast<parasync_model_t*>(nullptr),
                    []() -> Result<parasync_model_t*> { return new parasync_model_t; });
}

void parasync_model_destroy(parasync_model_t* model) {
  GuardVoid(__func__, [&] {
    delete model;
    return Status::Ok();
  });
}

int parasync_model_add_variable(parasync_model_t* model, const char* name, const int64_t* shape,
                                size_t ndim, int init_kind, float init_value, char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(model, "model"));
    PARASYNC_RETURN_IF_ERROR(Need(name, "variable name"));
    if (init_kind < PARASYNC_INIT_ZEROS || init_kind > PARASYNC_INIT_PROVIDED) {
      return Status::InvalidArgument("unknown initializer " + std::to_string(init_kind));
    }
    VariableSpec v;
    v.name = name;
    if (ndim > 0 && shape == nullptr) return Status::InvalidArgument("shape is NULL");
    v.shape.assign(shape, shape + ndim);
    v.init = {static_cast<InitKind>(init_kind), init_value};
    model->reg.variables.push_back(std::move(v));
    return Status::Ok();
  });
}

int parasync_model_add_table(parasync_model_t* model, const char* name, int64_t rows,
                             int64_t dim, int init_kind, float init_value, char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(model, "model"));
    PARASYNC_RETURN_IF_ERROR(Need(name, "table name"));
    if (init_kind < PARASYNC_INIT_ZEROS || init_kind > PARASYNC_INIT_PROVIDED) {
      return Status::InvalidArgument("unknown initializer " + std::to_string(init_kind));
    }
    model->reg.tables.push_back(
        {name, rows, dim, {static_cast<InitKind>(init_kind), init_value}});
    return Status::Ok();
  });
}

int parasync_model_set_optimizer(parasync_model_t* model, const char* name, double lr,
                                 char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(model, "model"));
    PARASYNC_RETURN_IF_ERROR(Need(name, "optimizer"));
    PARASYNC_ASSIGN_OR_RETURN(OptimizerKind kind, ParseOptimizerKind(name));
    model->reg.optimizer.kind = kind;
    model->reg.optimizer.learning_rate = static_cast<float>(lr);
    return Status::Ok();
  });
}

int parasync_model_set(parasync_model_t* model, const char* key, double value, char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(model, "model"));
    PARASYNC_RETURN_IF_ERROR(Need(key, "setting"));
    OptimizerSpec& o = model->reg.optimizer;
    const std::string k = key;
    const auto f = static_cast<float>(value);
    if (k == "momentum") {
      o.momentum = f;
    } else if (k == "beta1") {
      o.beta1 = f;
    } else if (k == "beta2") {
      o.beta2 = f;
    } else if (k == "epsilon") {
      o.epsilon = f;
    } else if (k == "initial_accumulator") {
      o.initial_accumulator = f;
    } else if (k == "staleness_aware") {
      o.staleness_aware = value != 0;
    } else if (k == "cosine_decay_examples") {
      o.schedule = value > 0 ? LrSchedule::kCosine : LrSchedule::kConstant;
      o.decay_examples = static_cast<int64_t>(std::llround(value));
    } else if (k == "final_lr_fraction") {
      o.final_lr_fraction = f;
    } else if (k == "max_slice_elements") {
      model->reg.max_slice_elements = static_cast<int64_t>(std::llround(value));
    } else {
      return Status::InvalidArgument(
          "unknown setting '" + k + "' (momentum, beta1, beta2, epsilon, initial_accumulator, "
          "staleness_aware, cosine_decay_examples, final_lr_fraction, max_slice_elements)");
    }
    return Status::Ok();
  });
}

void parasync_model_set_seed(parasync_model_t* model, uint64_t seed) {
  GuardVoid(__func__, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(model, "model"));
    model->reg.seed = seed;
    return Status::Ok();
  });
}

void parasync_model_set_name(parasync_model_t* model, const char* name) {
  GuardVoid(__func__, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(model, "model"));
    model->name = name == nullptr ? "" : name;
    return Status::Ok();
  });
}

void parasync_model_set_description(parasync_model_t* model, const char* description) {
  GuardVoid(__func__, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(model, "model"));
    model->reg.model = description == nullptr ? "" : description;
    return Status::Ok();
  });
}

size_t parasync_model_num_variables(const parasync_model_t* model) {
  return GuardValue(__func__, size_t{0}, [&]() -> Result<size_t> {
    PARASYNC_RETURN_IF_ERROR(Need(model, "model"));
    return model->reg.variables.size();
  });
}

int parasync_model_validate(const parasync_model_t* model, char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(model, "model"));
    // The mode is the client's, known at parasync_client_register (which checks it then).
    ModelRegistration reg = model->reg;
    reg.mode.clear();
    return ValidateRegistration(reg);
  });
}

// ---- The client -----------------------------------------------------------------------------

int parasync_client_connect(const parasync_options_t* options, parasync_client_t** client,
                            char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(client, "client"));
    *client = nullptr;
    PARASYNC_RETURN_IF_ERROR(Need(options, "options"));
    auto c = std::make_unique<parasync_client_t>();
    c->options = *options;
    if (!c->options.cluster) {
      // No explicit cluster: TF_CONFIG alone.
      PARASYNC_ASSIGN_OR_RETURN(ClusterSpec spec, ResolveClusterSpecFromEnvironment({}, "worker"));
      c->options.cluster = std::move(spec);
    }
    c->rank = c->options.cluster->task_index;
    c->num_workers = static_cast<int>(c->options.cluster->workers.size());
    c->num_shards = static_cast<int>(c->options.cluster->ps.size());
    PARASYNC_ASSIGN_OR_RETURN(c->mode, TrainingMode::Parse(c->options.mode));
    c->mode_text = c->mode.ToString();
    SetUpLogging(c->rank, c->options.log_level);
    PARASYNC_RETURN_IF_ERROR(StartClient(c.get()));
    *client = c.release();
    return Status::Ok();
  });
}

void parasync_client_destroy(parasync_client_t* client) {
  GuardVoid(__func__, [&] {
    delete client;
    return Status::Ok();
  });
}

int parasync_client_rank(const parasync_client_t* client) {
  return ReadClient(__func__, client, -1, [](const parasync_client_t& c) { return c.rank; });
}

int parasync_client_num_workers(const parasync_client_t* client) {
  return ReadClient(__func__, client, -1, [](const parasync_client_t& c) { return c.num_workers; });
}

int parasync_client_num_shards(const parasync_client_t* client) {
  return ReadClient(__func__, client, -1, [](const parasync_client_t& c) { return c.num_shards; });
}

const char* parasync_client_mode(const parasync_client_t* client) {
  return ReadClient(__func__, client, "",
                    [](const parasync_client_t& c) { return c.mode_text.c_str(); });
}

int parasync_client_metrics_port(const parasync_client_t* client) {
  return ReadClient(__func__, client, -1, [](const parasync_client_t& c) {
    return c.metrics_server ? c.metrics_server->port() : 0;
  });
}

int parasync_client_register(parasync_client_t* client, const parasync_model_t* model,
                             const float* const* initial_values, char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(client, "client"));
    PARASYNC_RETURN_IF_ERROR(Need(model, "model"));
    std::lock_guard lock(client->mu);
    ModelRegistration reg = model->reg;
    reg.num_shards = client->num_shards;
    reg.mode = client->mode_text;
    PARASYNC_RETURN_IF_ERROR(ValidateRegistration(reg));
    std::span<const float* const> values;
    if (initial_values != nullptr) {
      values = {initial_values, reg.variables.size()};
      for (size_t v = 0; v < values.size(); ++v) {
        if (values[v] == nullptr && reg.variables[v].init.kind == InitKind::kProvided) {
          return Status::InvalidArgument("initial_values[" + std::to_string(v) + "] is NULL, and " +
                                         reg.variables[v].name + " is PROVIDED");
        }
      }
    }
    PARASYNC_RETURN_IF_ERROR(
        Explain(client, Ps(*client).Register(reg, Millis(client->options.connect_seconds),
                                             values)));
    client->registration = std::move(reg);
    int64_t parameters = 0;
    for (const VariableSpec& v : client->registration->variables) parameters += v.num_elements();
    client->metrics->DescribeModel(model->name, parameters);
    spdlog::info("registered {} variables and {} tables as {} slices on {} parameter server(s)",
                 client->registration->variables.size(), client->registration->tables.size(),
                 Ps(*client).slice_map().slices().size(), client->num_shards);
    return Status::Ok();
  });
}

void parasync_client_recorded_progress(const parasync_client_t* client, int* epoch,
                                       int64_t* done, int64_t* of) {
  GuardVoid(__func__, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(epoch, "epoch"));
    PARASYNC_RETURN_IF_ERROR(Need(done, "done"));
    PARASYNC_RETURN_IF_ERROR(Need(of, "of"));
    PARASYNC_RETURN_IF_ERROR(Need(client, "client"));
    std::lock_guard lock(client->mu);
    const DataProgress p = Ps(*client).recorded_progress();
    *epoch = p.epoch;
    *done = p.done;
    *of = p.of;
    return Status::Ok();
  });
}

void parasync_client_set_progress(parasync_client_t* client, int epoch, int64_t done,
                                  int64_t of) {
  UpdateClient(__func__, client,
               [&](parasync_client_t& c) {
                 // The exchange in flight reports the position before: this one is for the
                 // next step's push.
                 if (c.launched.valid()) {
                   c.progress_after = DataProgress{epoch, done, of};
                 } else {
                   c.client->set_progress({epoch, done, of});
                 }
               });
}

int parasync_client_pull(parasync_client_t* client, float* const* params, size_t num_params,
                         int64_t min_version, const parasync_rows_t* rows, size_t num_rows,
                         char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(client, "client"));
    std::lock_guard lock(client->mu);
    PARASYNC_RETURN_IF_ERROR(NeedRegistered(client));
    // No parameter arrays but rows: the rows alone.
    if (num_params > 0 || num_rows == 0) {
      PARASYNC_RETURN_IF_ERROR(CheckCount(num_params, client, "parameter arrays"));
    }
    PARASYNC_RETURN_IF_ERROR(NeedArrays(params, num_params, "params"));
    PARASYNC_ASSIGN_OR_RETURN(const std::vector<RowsOf> r, RowsOfC(rows, num_rows, "rows"));
    PARASYNC_RETURN_IF_ERROR(
        Explain(client, Ps(*client).Pull({params, num_params}, min_version, r)));
    // The caller's next gradient comes from these parameters, not from those it held while
    // a launched exchange ran.
    if (num_params > 0) client->launched_from.reset();
    return Status::Ok();
  });
}

int parasync_client_push(parasync_client_t* client, const float* const* grads, size_t num_grads,
                         int64_t batch_examples, const parasync_rows_t* rows, size_t num_rows,
                         char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(client, "client"));
    std::lock_guard lock(client->mu);
    PARASYNC_RETURN_IF_ERROR(NeedRegistered(client));
    PARASYNC_RETURN_IF_ERROR(CheckCount(num_grads, client, "gradient arrays"));
    PARASYNC_RETURN_IF_ERROR(NeedArrays(grads, num_grads, "grads"));
    PARASYNC_ASSIGN_OR_RETURN(const std::vector<RowsOf> r, RowsOfC(rows, num_rows, "rows"));
    return Explain(client, Ps(*client).Push({grads, num_grads}, batch_examples,
                                            PsClient::kLastRead, r));
  });
}

int parasync_client_step_begin(parasync_client_t* client, int64_t batch_examples, char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(client, "client"));
    std::lock_guard lock(client->mu);
    PARASYNC_RETURN_IF_ERROR(NeedRegistered(client));
    if (batch_examples < 0) return Status::InvalidArgument("a negative number of examples");
    PsClient& ps = Ps(*client);
    // A launched exchange that failed, not yet reported by step_wait: reported now.
    if (client->launched_outcome && !client->launched_outcome->ok()) {
      const Status failed = *std::exchange(client->launched_outcome, std::nullopt);
      client->launched_from.reset();
      return failed;
    }
    client->launched_outcome.reset();
    // After a launch, the gradient comes from the parameters the caller held while the
    // exchange ran: those read before it.
    const std::optional<PsClient::ReadPoint> from =
        std::exchange(client->launched_from, std::nullopt);
    return ps.BeginStep(batch_examples, from ? &*from : nullptr);
  });
}

int parasync_client_step_gradient(parasync_client_t* client, size_t variable, const float* grad,
                                  char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(client, "client"));
    std::lock_guard lock(client->mu);
    return Ps(*client).GradientReady(variable, grad);
  });
}

int parasync_client_step_finish(parasync_client_t* client, const parasync_rows_t* push_rows,
                                size_t num_push_rows, float* const* params, size_t num_params,
                                const parasync_rows_t* pull_rows, size_t num_pull_rows,
                                parasync_step_times_t* times, char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(client, "client"));
    std::lock_guard lock(client->mu);
    Result<std::vector<RowsOf>> pushed = RowsOfC(push_rows, num_push_rows, "push_rows");
    Result<std::vector<RowsOf>> pulled = RowsOfC(pull_rows, num_pull_rows, "pull_rows");
    Status refused = NeedArrays(params, num_params, "params");
    if (refused.ok()) refused = pushed.ok() ? pulled.status() : pushed.status();
    // Refused arguments (NULL arrays) end the step anyway, as FinishStep ends it on any error.
    if (!refused.ok()) return Ps(*client).AbandonStep(refused);
    // Sync: the next parameters are those of the step this push completes.
    const int64_t wait = client->mode.kind == TrainingMode::Kind::kSync ? PsClient::kNextStep : 0;
    PsClient::PushPullTimes t;
    PARASYNC_RETURN_IF_ERROR(Explain(
        client, Ps(*client).FinishStep({params, num_params}, wait, &t, *pushed, *pulled)));
    if (times != nullptr) CopyTimes(t, times);
    return Status::Ok();
  });
}

int parasync_client_step_launch(parasync_client_t* client, float* const* params,
                                size_t num_params, char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(client, "client"));
    std::lock_guard lock(client->mu);
    PsClient& ps = Ps(*client);
    Status refused = NeedRegistered(client);
    if (refused.ok()) refused = NeedArrays(params, num_params, "params");
    if (refused.ok() && !(client->mode.kind == TrainingMode::Kind::kSync && client->mode.delay > 0)) {
      refused = Status::FailedPrecondition(
          "step_launch overlaps a step's exchange with the next gradient, which only "
          "sync:delayed accepts (this client runs " + client->mode_text + "): use step_finish");
    }
    if (refused.ok() && !client->registration->tables.empty()) {
      refused = Status::FailedPrecondition(
          "step_launch is for dense models: a model with tables pulls the next batch's rows "
          "with step_finish");
    }
    if (!refused.ok()) return ps.AbandonStep(refused);
    if (!ps.in_step()) return Status::FailedPrecondition("step_launch without step_begin");
    // The caller computes its next gradient from the parameters it holds now.
    client->launched_from = ps.read_point();
    client->launched_times = {};
    client->launched = std::async(
        std::launch::async, [client, p = std::vector<float*>(params, params + num_params)] {
          return Explain(client, client->client->FinishStep(p, PsClient::kNextStep,
                                                            &client->launched_times));
        });
    return Status::Ok();
  });
}

int parasync_client_step_wait(parasync_client_t* client, parasync_step_times_t* times,
                              char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(client, "client"));
    std::lock_guard lock(client->mu);
    Settle(*client);
    if (!client->launched_outcome) {
      return Status::FailedPrecondition("step_wait: no step was launched since the last wait");
    }
    const Status outcome = *std::exchange(client->launched_outcome, std::nullopt);
    if (!outcome.ok()) {
      client->launched_from.reset();
      return outcome;
    }
    if (times != nullptr) CopyTimes(client->launched_times, times);
    ObservePush(*client);
    return Status::Ok();
  });
}

int parasync_client_last_push_dropped(const parasync_client_t* client) {
  return ReadClient(__func__, client, -1, [](const parasync_client_t& c) {
    return Ps(c).last_push_dropped() ? 1 : 0;
  });
}

int64_t parasync_client_last_push_staleness(const parasync_client_t* client) {
  return ReadClient(__func__, client, int64_t{-1},
                    [](const parasync_client_t& c) { return Ps(c).last_push_staleness(); });
}

int64_t parasync_client_last_version(const parasync_client_t* client) {
  return ReadClient(__func__, client, int64_t{-1},
                    [](const parasync_client_t& c) { return Ps(c).last_version(); });
}

// ---- What a worker reports --------------------------------------------------------------------

void parasync_client_observe_step(parasync_client_t* client, int64_t examples, double loss,
                                  double pull_seconds, double compute_seconds,
                                  double push_seconds) {
  UpdateClient(__func__, client, [&](parasync_client_t& c) {
    WorkerMetrics& m = *c.metrics;
    m.ObserveStep(examples, loss, pull_seconds, compute_seconds, push_seconds);
    // With an exchange in flight (step_launch) its push is observed by step_wait instead:
    // the step goes on without waiting for it.
    if (!c.launched.valid()) ObservePush(c);
    m.loop.Beat();
  });
}

void parasync_client_beat(parasync_client_t* client) {
  UpdateClient(__func__, client, [](parasync_client_t& c) { c.metrics->loop.Beat(); });
}

void parasync_client_set_epoch(parasync_client_t* client, int epoch) {
  UpdateClient(__func__, client, [&](parasync_client_t& c) { c.metrics->epoch->Set(epoch); });
}

int parasync_client_log_eval(parasync_client_t* client, const parasync_eval_t* eval,
                             char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(client, "client"));
    std::lock_guard lock(client->mu);
    PARASYNC_RETURN_IF_ERROR(Need(eval, "eval"));
    PARASYNC_RETURN_IF_ERROR(NeedRegistered(client));
    EvalRecord row{.mode = client->mode_text,
                   .workers = client->num_workers,
                   .ps = client->num_shards,
                   .epoch = eval->epoch,
                   .wall = eval->wall_seconds,
                   .train_loss = eval->train_loss,
                   .test_loss = eval->test_loss,
                   .test_accuracy = eval->test_accuracy,
                   .test_auc = eval->test_auc,
                   .chief_examples_per_sec = eval->chief_examples_per_sec,
                   .batch_size = eval->batch_size,
                   .optimizer = client->registration->optimizer,
                   .seed = client->registration->seed,
                   .worker_optimizer = eval->optimizer != nullptr ? eval->optimizer : "",
                   .worker_learning_rate = eval->learning_rate};
    if (eval->epoch_progress > 0) row.epoch_progress = eval->epoch_progress;
    PARASYNC_RETURN_IF_ERROR(Explain(client, ReadGlobalProgress(Ps(*client), &row)));
    PARASYNC_RETURN_IF_ERROR(AppendEvalRow(client->options.log_dir + "/eval.jsonl", row));
    WorkerMetrics& m = *client->metrics;
    if (m.eval_accuracy != nullptr) m.eval_accuracy->Set(row.test_accuracy);
    if (m.eval_loss != nullptr) m.eval_loss->Set(row.test_loss);
    spdlog::info("eval epoch {}: test accuracy {:.4f}, test loss {:.4f}{} (global step {}, {} "
                 "examples, {:.1f} s)",
                 std::isfinite(row.epoch_progress) ? fmt::format("{:.2f}", row.epoch_progress)
                                                   : std::to_string(row.epoch),
                 row.test_accuracy, row.test_loss,
                 std::isfinite(row.test_auc) ? fmt::format(", test AUC {:.4f}", row.test_auc) : "",
                 row.global_step, row.global_examples, row.wall);
    return Status::Ok();
  });
}

int parasync_client_last_logged_epoch(const parasync_client_t* client) {
  return ReadClient(__func__, client, -1, [](const parasync_client_t& c) {
    return LastLoggedEpoch(c.options.log_dir + "/eval.jsonl");
  });
}

int parasync_client_wait_for_workers(parasync_client_t* client, double seconds, char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(client, "client"));
    std::lock_guard lock(client->mu);
    PARASYNC_RETURN_IF_ERROR(NeedRegistered(client));
    return Explain(client, WaitForOtherWorkers(Ps(*client), client->num_workers, seconds, [] {
                     return g_stop_signal.load(std::memory_order_relaxed) != 0;
                   }));
  });
}

int parasync_client_leave(parasync_client_t* client, double seconds, char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(client, "client"));
    std::lock_guard lock(client->mu);
    PARASYNC_RETURN_IF_ERROR(NeedRegistered(client));
    return Explain(client, Ps(*client).Leave(Millis(std::max(0.0, seconds))));
  });
}

int parasync_client_live_ranks(parasync_client_t* client, uint8_t* live, char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(client, "client"));
    PARASYNC_RETURN_IF_ERROR(Need(live, "live"));
    std::lock_guard lock(client->mu);
    PARASYNC_RETURN_IF_ERROR(NeedRegistered(client));
    PARASYNC_ASSIGN_OR_RETURN(const std::vector<int> ranks,
                              LiveRanks(Ps(*client), client->num_workers));
    std::fill(live, live + client->num_workers, uint8_t{0});
    for (int r : ranks) live[r] = 1;
    return Status::Ok();
  });
}

int parasync_client_global_progress(parasync_client_t* client, int64_t* step,
                                    int64_t* examples, char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(client, "client"));
    std::lock_guard lock(client->mu);
    PARASYNC_RETURN_IF_ERROR(Need(step, "step"));
    PARASYNC_RETURN_IF_ERROR(Need(examples, "examples"));
    PARASYNC_RETURN_IF_ERROR(NeedRegistered(client));
    EvalRecord row;
    PARASYNC_RETURN_IF_ERROR(Explain(client, ReadGlobalProgress(Ps(*client), &row)));
    *step = row.global_step;
    *examples = row.global_examples;
    return Status::Ok();
  });
}

int parasync_client_set_wire_dtype(parasync_client_t* client, const char* dtype,
                                   char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(client, "client"));
    std::lock_guard lock(client->mu);
    PARASYNC_ASSIGN_OR_RETURN(const WireFormat parsed, ParseWireDType(dtype));
    if (client->registration) {
      return Status::FailedPrecondition("the wire dtype is chosen before the model is registered");
    }
    PARASYNC_RETURN_IF_ERROR(Ps(*client).SetWireDType(parsed));
    client->options.wire = parsed;
    return Status::Ok();
  });
}

int parasync_client_gather(parasync_client_t* client, const char* key, int64_t round,
                           const void* data, size_t size, uint8_t* contributed,
                           uint64_t* sizes, char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(client, "client"));
    std::lock_guard lock(client->mu);
    PARASYNC_RETURN_IF_ERROR(Need(key, "key"));
    PARASYNC_RETURN_IF_ERROR(Need(contributed, "contributed"));
    PARASYNC_RETURN_IF_ERROR(Need(sizes, "sizes"));
    if (data == nullptr && size > 0) return Status::InvalidArgument("data is NULL");
    std::vector<int32_t> ranks;
    std::vector<zmq::message_t> payloads;
    const auto* bytes = static_cast<const uint8_t*>(data);
    if (!client->gather_client) {
      PARASYNC_ASSIGN_OR_RETURN(client->gather_client,
                                PsClient::Connect(client->context, client->client_options));
    }
    // A plain flag only this thread sets: read without waiting for a launched exchange, so a
    // collective runs beside it.
    client->gather_client->SetJoining(client->client->joining());
    std::vector<int32_t> admitted;
    PARASYNC_RETURN_IF_ERROR(Explain(
        client, client->gather_client->Gather(key, round, {bytes, bytes == nullptr ? 0 : size},
                                              &ranks, &payloads, &admitted,
                                              &client->gathered_round)));
    const auto n = static_cast<size_t>(client->num_workers);
    client->gathered.clear();
    client->gathered.resize(n);
    std::fill(contributed, contributed + n, uint8_t{0});
    std::fill(sizes, sizes + n, uint64_t{0});
    for (size_t i = 0; i < ranks.size(); ++i) {
      const auto r = static_cast<size_t>(ranks[i]);
      if (ranks[i] < 0 || r >= n) {
        return Status::Corruption("gather reply names rank " + std::to_string(ranks[i]));
      }
      contributed[r] = 1;
      sizes[r] = payloads[i].size();
      client->gathered[r] = std::move(payloads[i]);
    }
    for (int32_t a : admitted) {
      if (a < 0 || static_cast<size_t>(a) >= n) {
        return Status::Corruption("gather reply admits rank " + std::to_string(a));
      }
      contributed[static_cast<size_t>(a)] = 2;
    }
    return Status::Ok();
  });
}

int64_t parasync_client_gather_round(const parasync_client_t* client) {
  return ReadClient(__func__, client, int64_t{-1},
                    [](const parasync_client_t& c) { return c.gathered_round; });
}

int parasync_client_set_joining(parasync_client_t* client, int joining, char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(client, "client"));
    std::lock_guard lock(client->mu);
    Ps(*client).SetJoining(joining != 0);
    if (client->gather_client) client->gather_client->SetJoining(joining != 0);
    client->heartbeater->SetJoining(joining != 0);
    return Status::Ok();
  });
}

int parasync_client_gather_copy(parasync_client_t* client, int rank, void* out, size_t size,
                                char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(client, "client"));
    std::lock_guard lock(client->mu);
    if (rank < 0 || static_cast<size_t>(rank) >= client->gathered.size() ||
        !client->gathered[static_cast<size_t>(rank)]) {
      return Status::InvalidArgument("rank " + std::to_string(rank) +
                                     " took no part in the last gather");
    }
    const zmq::message_t& m = *client->gathered[static_cast<size_t>(rank)];
    if (size != m.size()) {
      return Status::InvalidArgument("rank " + std::to_string(rank) + "'s payload is " +
                                     std::to_string(m.size()) + " bytes, not " +
                                     std::to_string(size));
    }
    if (size > 0) {
      PARASYNC_RETURN_IF_ERROR(Need(out, "out"));
      std::memcpy(out, m.data(), size);
    }
    return Status::Ok();
  });
}

int parasync_client_checkpoint(parasync_client_t* client, char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(client, "client"));
    std::lock_guard lock(client->mu);
    PARASYNC_RETURN_IF_ERROR(NeedRegistered(client));
    return Explain(client, Ps(*client).Checkpoint());
  });
}

int parasync_client_finish(parasync_client_t* client, double seconds, char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(client, "client"));
    std::lock_guard lock(client->mu);
    Settle(*client);
    if (client->launched_outcome && !client->launched_outcome->ok()) {
      spdlog::warn("the step launched last failed: {}", client->launched_outcome->message());
    }
    Status left;
    if (client->registration) left = Ps(*client).Leave(Millis(std::max(0.0, seconds)));
    if (!left.ok()) spdlog::warn("leave not acknowledged: {}", left.message());
    WorkerMetrics& m = *client->metrics;
    m.FollowClient(Ps(*client).resends(), Ps(*client).reconnects());
    m.finished->Set(1);
    const std::string path =
        MetricsSnapshotPath(client->options.log_dir, "worker" + std::to_string(client->rank));
    return WriteMetricsSnapshot(*m.registry, path);
  });
}

int64_t parasync_client_resends(const parasync_client_t* client) {
  return ReadClient(__func__, client, int64_t{-1},
                    [](const parasync_client_t& c) { return Ps(c).resends(); });
}

int64_t parasync_client_reconnects(const parasync_client_t* client) {
  return ReadClient(__func__, client, int64_t{-1},
                    [](const parasync_client_t& c) { return Ps(c).reconnects(); });
}

// ---- Process-wide -----------------------------------------------------------------------------

int parasync_shard_indices(int64_t n, int rank, int num_workers, uint64_t seed, int epoch,
                           int shuffle, int64_t* out, size_t capacity, size_t* count,
                           char** errmsg) {
  return Guard(errmsg, [&]() -> Status {
    if (n < 0 || num_workers < 1 || rank < 0 || rank >= num_workers || epoch < 1) {
      return Status::InvalidArgument("shard indices need n >= 0, 0 <= rank < workers, epoch >= 1");
    }
    PARASYNC_RETURN_IF_ERROR(Need(count, "count"));
    if (capacity > 0) PARASYNC_RETURN_IF_ERROR(Need(out, "out"));
    std::vector<int64_t> shard = ShardIndices(n, rank, num_workers);
    *count = shard.size();
    if (capacity == 0) return Status::Ok();
    if (capacity < shard.size()) {
      return Status::InvalidArgument("room for " + std::to_string(capacity) + " indices, the shard has " +
                                     std::to_string(shard.size()));
    }
    // The shuffles are cumulative: the order of epoch e is that of e - 1, shuffled again.
    for (int e = 1; e <= epoch && shuffle != 0; ++e) ShuffleForEpoch(&shard, seed, rank, e);
    std::memcpy(out, shard.data(), shard.size() * sizeof(int64_t));
    return Status::Ok();
  });
}

void parasync_install_signal_handlers(void) {
  GuardVoid(__func__, [] {
    struct sigaction sa {};
    sa.sa_sigaction = OnStopSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    struct sigaction previous {};
    if (sigaction(SIGINT, &sa, &previous) == 0 && previous.sa_sigaction != OnStopSignal) {
      g_previous_int = previous;
    }
    if (sigaction(SIGTERM, &sa, &previous) == 0 && previous.sa_sigaction != OnStopSignal) {
      g_previous_term = previous;
    }
    return Status::Ok();
  });
}

int parasync_stop_requested(void) {
  return GuardValue(__func__, 0, []() -> Result<int> {
    return g_stop_signal.load(std::memory_order_relaxed);
  });
}

void parasync_request_stop(int signal_number) {
  GuardVoid(__func__, [&] {
    g_stop_signal.store(signal_number, std::memory_order_relaxed);
    return Status::Ok();
  });
}

void parasync_log(const char* level, const char* message) {
  GuardVoid(__func__, [&]() -> Status {
    PARASYNC_RETURN_IF_ERROR(Need(message, "message"));
    const std::string l = level == nullptr ? "info" : level;
    if (l == "debug") {
      spdlog::debug("{}", message);
    } else if (l == "warn") {
      spdlog::warn("{}", message);
    } else if (l == "error") {
      spdlog::error("{}", message);
    } else {
      spdlog::info("{}", message);
    }
    return Status::Ok();
  });
}

}  // extern "C"
