/* parasync's C API: a parameter-server client for programs not written in C++ (the Python
 * package worker/python/parasync is built on it, through ctypes). It is a thin layer over
 * the C++ worker's own PsClient (worker/ps_client.h), heartbeats and metrics, so a program
 * using it is a parasync worker like parasync-worker: same wire, same modes (async, sync with
 * backup workers, ssp), same resends across a server restart with pushes applied exactly
 * once, same /metrics, /healthz and eval.jsonl.
 *
 * Conventions (after RocksDB's include/rocksdb/c.h):
 *  - Objects are opaque handles; every create has its destroy, which accepts NULL. A create
 *    returns NULL when out of memory.
 *  - A call that can fail returns a parasync_code (PARASYNC_OK = 0) and, on failure, sets
 *    *errmsg (when errmsg is not NULL) to a malloc'ed one-line message the caller frees with
 *    parasync_free(); on success *errmsg is left as it was. No C++ exception crosses this
 *    boundary: anything unexpected (out of memory included) becomes PARASYNC_INTERNAL with
 *    its message.
 *  - A NULL handle, or NULL where a call needs a pointer (an output, a text, an array), is
 *    refused, never dereferenced: with PARASYNC_INVALID_ARGUMENT and a message naming it.
 *    Where a pointer may be NULL, its call says so. A call without errmsg (returning nothing
 *    or a value) that is refused, or meets anything unexpected, does nothing, logs one error
 *    line naming itself and why (as parasync_log("error", ...) would) and returns its
 *    refusal value: -1 for a number (0 for parasync_model_num_variables and
 *    parasync_stop_requested), "" for a text, NULL for a handle.
 *  - Buffers are the caller's: the library reads gradients and writes parameters in place
 *    and keeps no pointer past the call, except where a call says so (the step calls).
 *  - Blocking calls wait on the network without holding anything of the caller's (Python's
 *    ctypes releases the GIL around every call). Each is bounded: by the request timeout, or
 *    for pulls that may wait at a sync barrier or an ssp bound, by the servers' barrier
 *    timeout, by a server going silent, and by SIGINT/SIGTERM (parasync_install_signal_
 *    handlers), after which it returns PARASYNC_ABORTED within 100 ms.
 *  - A client is used by one thread at a time: every call on one client, each getter
 *    included, holds the client's lock for its whole length, so a call from another thread
 *    waits until the one in flight returns (a pull waiting at a barrier included). Distinct
 *    clients are independent. parasync_client_destroy takes no lock: no other call on that
 *    client may be in flight or follow.
 */
#ifndef PARASYNC_C_API_H_
#define PARASYNC_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What the shared library exports: this API and nothing else. */
#if defined(__GNUC__)
#define PARASYNC_API __attribute__((visibility("default")))
#else
#define PARASYNC_API
#endif

/* Status codes: the numbers of parasync::StatusCode and of the wire's Code. */
enum {
  PARASYNC_OK = 0,
  PARASYNC_INVALID_ARGUMENT = 1,
  PARASYNC_NOT_FOUND = 2,
  PARASYNC_UNAVAILABLE = 3,
  PARASYNC_TIMED_OUT = 4,
  PARASYNC_ABORTED = 5,
  PARASYNC_CORRUPTION = 6,
  PARASYNC_INTERNAL = 7,
  PARASYNC_NOT_SUPPORTED = 8,
  PARASYNC_FAILED_PRECONDITION = 9,
};

/* Initializers of a variable or table (common/variable.h). PROVIDED: the registering rank 0
 * sends the values (parasync_client_register's initial_values); dense variables only. */
enum {
  PARASYNC_INIT_ZEROS = 0,
  PARASYNC_INIT_CONSTANT = 1, /* every element = value */
  PARASYNC_INIT_UNIFORM = 2,  /* uniform in [-value, value), from the seed */
  PARASYNC_INIT_PROVIDED = 3,
};

/* A pull's min_version: wait until each shard has applied the step after this client's last
 * push to it (sync mode). */
#define PARASYNC_NEXT_STEP (-1)

typedef struct parasync_options_t parasync_options_t;
typedef struct parasync_model_t parasync_model_t;
typedef struct parasync_client_t parasync_client_t;

/* Rows of one embedding table a call moves: `ids` sorted ascending as unsigned 64-bit
 * values and unique (else PARASYNC_INVALID_ARGUMENT, nothing sent); `values` count * dim
 * floats, row i at values + i * dim: filled by a pull, read by a push (each id's gradient
 * summed over the batch). Tables are listed in increasing order, each at most once. */
typedef struct parasync_rows_t {
  uint32_t table; /* index in the order parasync_model_add_table was called */
  const uint64_t* ids;
  size_t count;
  float* values;
} parasync_rows_t;

/* When a step's traffic happened, on the CLOCK_MONOTONIC clock in seconds (Python's
 * time.monotonic()), and how many shards' pushes went out before parasync_client_step_finish
 * (early, from parasync_client_step_gradient). */
typedef struct parasync_step_times_t {
  double first_push_sent;
  double last_push_sent;
  double pushes_acked;
  double pulled;
  double push_seconds; /* within step_finish: until the last push was acknowledged */
  double pull_seconds; /* from there until the last pull reply */
  int early_pushes;
} parasync_step_times_t;

/* One evaluation for <log-dir>/eval.jsonl (parasync_client_log_eval); NaN: none. */
typedef struct parasync_eval_t {
  int epoch;
  double train_loss;
  double test_loss;
  double test_accuracy;
  double test_auc;
  double chief_examples_per_sec;
  double wall_seconds; /* since training started */
  int batch_size;
  /* The optimizer the worker applies itself (parasync.horovod: "AdamW") and its current
   * learning rate; NULL: the servers' (the registered optimizer and rate). */
  const char* optimizer;
  double learning_rate;
  /* > 0: an evaluation within epoch `epoch`, at this many epochs done (epoch - 1 + the
   * fraction done), written as "epoch" with "within_epoch": true (as parasync-worker
   * --eval-every); 0: the row of a whole epoch. */
  double epoch_progress;
} parasync_eval_t;

PARASYNC_API void parasync_free(void* p);
/* "0.1.0 (schema <sha256 prefix>)": the library's build, as the binaries' --version says. */
PARASYNC_API const char* parasync_version(void);

/* ---- Options ------------------------------------------------------------------------- */
PARASYNC_API parasync_options_t* parasync_options_create(void);
PARASYNC_API void parasync_options_destroy(parasync_options_t* options);
/* The cluster: `ps_hosts` comma-separated host:port of every server shard in shard order,
 * `num_workers` the world size, `rank` this worker's (0 is the chief). NULL, <= 0 and < 0
 * take that part from TF_CONFIG (common/cluster_spec.h), as parasync-worker does. Checked
 * now: PARASYNC_INVALID_ARGUMENT naming the problem (a bad address, a rank out of range, no
 * cluster anywhere). */
PARASYNC_API int parasync_options_set_cluster(parasync_options_t* options, const char* ps_hosts,
                                 int num_workers, int rank, char** errmsg);
/* "async" (the default), "sync", "sync:delayed" or "ssp:K": must be the servers' --mode.
   Under sync:delayed a push may carry a gradient of the parameters one step older than the
   latest pull: parasync_client_step_launch's (else a push is of the latest pull's). */
PARASYNC_API int parasync_options_set_mode(parasync_options_t* options, const char* mode, char** errmsg);
/* Seconds: the wait for a reply (120; resending meanwhile), for the servers at start (60),
 * between heartbeats (1). A value <= 0 leaves that one as it is. */
PARASYNC_API int parasync_options_set_timeouts(parasync_options_t* options, double request_seconds,
                                  double connect_seconds, double heartbeat_seconds,
                                  char** errmsg);
/* CURVE: this client's key-pair file and the servers' public key file (parasync-keygen's
 * format; one key for all or one per server). Both NULL: plain text. */
PARASYNC_API int parasync_options_set_curve(parasync_options_t* options, const char* key_file,
                               const char* server_key_file, char** errmsg);
/* "float32" (default), "bfloat16", "float16", "int8", "int4", "topk" or "topk:R" (R in
 * (0, 1]): how tensors travel (int8, int4 and topk: pushes compressed with error feedback, a server-side
 * optimizer's parameters pulled as changes to this client's copy of them — delta pulls —
 * or in bfloat16; docs/compression.md). */
PARASYNC_API int parasync_options_set_wire_dtype(parasync_options_t* options, const char* dtype,
                                    char** errmsg);
/* int8, int4 or topk: 1 (the default) tries, after the first 20 steps, top-k against int8
 * and then float32, and keeps whichever made the shorter step, logging which (compression
 * off where it does not pay); 0 keeps the format given (docs/compression.md). */
PARASYNC_API int parasync_options_set_topk_probe(parasync_options_t* options, int on,
                                                 char** errmsg);
/* int8, int4 or topk with the servers' optimizer: 1 (the default) pulls parameters as
 * changes to a copy this client keeps, in the pushes' format (int8: a quarter of float32's
 * bytes, int4 an eighth); 0
 * pulls them in bfloat16
 * (docs/compression.md). */
PARASYNC_API int parasync_options_set_delta_pulls(parasync_options_t* options, int on,
                                                  char** errmsg);
/* Local aggregation (sync modes): `ranks` ("0,1") are the workers on this machine, this one
 * among them; each step goes through the lowest, which pushes their summed gradients once and
 * pulls once for all. `endpoint`: where it listens for the others (NULL: a unix socket in
 * /tmp named after the first server's port and that rank). NULL or "" ranks: none (the
 * default). Steps must then be parasync_client_step_begin ... step_finish (a push alone is
 * refused) and the model dense (no tables). */
PARASYNC_API int parasync_options_set_local_group(parasync_options_t* options, const char* ranks,
                                     const char* endpoint, char** errmsg);
/* /metrics, /healthz and /readyz of this worker on bind:port (port 0: a free one, see
 * parasync_client_metrics_port; port < 0: none, the default), and the directory of the
 * metrics snapshot at parasync_client_finish and of eval.jsonl (default "."). */
/* A worker restarted into a running job (parasync.horovod.elastic): its heartbeats and
 * requests do not make the servers count it live until a gather admits it back
 * (parasync_client_set_joining(client, 0) then). */
PARASYNC_API int parasync_options_set_joining(parasync_options_t* options, int joining, char** errmsg);
PARASYNC_API int parasync_options_set_metrics(parasync_options_t* options, const char* bind,
                                              int port, const char* log_dir, char** errmsg);
/* "debug", "info" (default), "warn" or "error": the library's log lines on stderr, in
 * parasync-worker's format. */
PARASYNC_API int parasync_options_set_log_level(parasync_options_t* options, const char* level,
                                   char** errmsg);

/* ---- The model ----------------------------------------------------------------------- */
/* What a worker registers: variables (dense, cut into slices over the shards) and tables
 * (row-sparse, rows spread by id), the optimizer the servers apply, the seed. */
PARASYNC_API parasync_model_t* parasync_model_create(void);
PARASYNC_API void parasync_model_destroy(parasync_model_t* model);
/* Variable i (in call order) with `shape` (ndim dims, each >= 1; 0 dims: a scalar). */
PARASYNC_API int parasync_model_add_variable(parasync_model_t* model, const char* name, const int64_t* shape,
                                size_t ndim, int init_kind, float init_value, char** errmsg);
/* Table t (in call order): `rows` 0 for any uint64 id, `dim` floats per row. */
PARASYNC_API int parasync_model_add_table(parasync_model_t* model, const char* name, int64_t rows,
                             int64_t dim, int init_kind, float init_value, char** errmsg);
/* "sgd", "momentum", "adam" or "adagrad" at learning rate `lr`. */
PARASYNC_API int parasync_model_set_optimizer(parasync_model_t* model, const char* name, double lr,
                                 char** errmsg);
/* One more setting: "momentum", "beta1", "beta2", "epsilon", "initial_accumulator",
 * "staleness_aware" (0 or 1), "cosine_decay_examples" (> 0: the cosine schedule over that
 * many applied examples), "final_lr_fraction", "max_slice_elements". */
PARASYNC_API int parasync_model_set(parasync_model_t* model, const char* key, double value, char** errmsg);
PARASYNC_API void parasync_model_set_seed(parasync_model_t* model, uint64_t seed);
/* The model's name: the label of parasync_worker_model_parameters once registered (NULL:
 * none). */
PARASYNC_API void parasync_model_set_name(parasync_model_t* model, const char* name);
/* Kept by the servers for parasync-export; opaque to them (JSON by convention; NULL: none). */
PARASYNC_API void parasync_model_set_description(parasync_model_t* model, const char* description);
PARASYNC_API size_t parasync_model_num_variables(const parasync_model_t* model);
/* Checks the whole model (names, shapes, optimizer) as a server would. */
PARASYNC_API int parasync_model_validate(const parasync_model_t* model, char** errmsg);

/* ---- The client ---------------------------------------------------------------------- */
/* Starts the heartbeats, the sockets (connections are made in the background) and, when
 * options asked for one, the metrics server; does not wait for the servers. */
PARASYNC_API int parasync_client_connect(const parasync_options_t* options, parasync_client_t** client,
                            char** errmsg);
/* Closes everything. Does not leave (parasync_client_finish does). Takes no lock: no other
 * call on this client may be in flight. */
PARASYNC_API void parasync_client_destroy(parasync_client_t* client);
PARASYNC_API int parasync_client_rank(const parasync_client_t* client);
PARASYNC_API int parasync_client_num_workers(const parasync_client_t* client);
PARASYNC_API int parasync_client_num_shards(const parasync_client_t* client);
/* "async", "sync", "sync:delayed" or "ssp:K"; owned by the client. */
PARASYNC_API const char* parasync_client_mode(const parasync_client_t* client);
/* The metrics port bound (0: none). */
PARASYNC_API int parasync_client_metrics_port(const parasync_client_t* client);

/* Registers `model` with every server, waiting up to the connect timeout for servers still
 * starting. `initial_values`: NULL, or one float array per variable (the variables' values,
 * read during the call; NULL for a variable that is not PROVIDED) for the rank that creates
 * the model; a registration without them waits until rank 0 has created a model with
 * PROVIDED variables. PARASYNC_FAILED_PRECONDITION when the servers hold another model (the
 * message names the first variable that differs) or run another mode. */
PARASYNC_API int parasync_client_register(parasync_client_t* client, const parasync_model_t* model,
                             const float* const* initial_values, char** errmsg);
/* Where the servers recorded this rank in its data (the last push's position): epoch 0 when
 * nothing was recorded. A restarted worker goes on from there. */
PARASYNC_API void parasync_client_recorded_progress(const parasync_client_t* client, int* epoch,
                                       int64_t* done, int64_t* of);
/* The position every later push reports: epoch (1-based), examples of it done, examples of
 * this rank's shard per epoch. */
PARASYNC_API void parasync_client_set_progress(parasync_client_t* client, int epoch, int64_t done,
                                  int64_t of);

/* Fills params[v] (one array per variable, num_params = the model's variable count) with the
 * servers' values, and `rows`; with num_params 0 and rows, only the rows (params may then be
 * NULL, as rows may with num_rows 0). min_version: 0, a version, or PARASYNC_NEXT_STEP. */
PARASYNC_API int parasync_client_pull(parasync_client_t* client, float* const* params, size_t num_params,
                         int64_t min_version, const parasync_rows_t* rows, size_t num_rows,
                         char** errmsg);
/* Sends grads[v] and `rows` (the gradient of `batch_examples` examples); returns once every
 * shard acknowledged it. */
PARASYNC_API int parasync_client_push(parasync_client_t* client, const float* const* grads, size_t num_grads,
                         int64_t batch_examples, const parasync_rows_t* rows, size_t num_rows,
                         char** errmsg);

/* A training step in parts, so that pushes overlap the rest of backward:
 *   parasync_client_step_begin(client, batch_examples)
 *   parasync_client_step_gradient(client, v, grad)   for every variable, as each is ready:
 *       once every variable a server shard holds is ready (and the model has no tables),
 *       that shard's push goes out at once and the call returns without waiting
 *   parasync_client_step_finish(client, ...)         sends the rest of the push and the pull
 *       of the next parameters (in sync mode it waits for the step this push completes),
 *       waits for every reply.
 * Together: one push per shard per step, applied exactly once, as parasync-worker's step.
 * A gradient must stay valid and unchanged until step_finish returns. A step must be
 * finished before the next begins (PARASYNC_FAILED_PRECONDITION). step_finish ends the step
 * whatever it returns (arguments it refused included: nothing more is sent, and the pushes
 * already out are awaited first). */
PARASYNC_API int parasync_client_step_begin(parasync_client_t* client, int64_t batch_examples, char** errmsg);
PARASYNC_API int parasync_client_step_gradient(parasync_client_t* client, size_t variable, const float* grad,
                                  char** errmsg);
/* `push_rows`: the tables' gradient rows; `params`: where the next parameters go (as
 * parasync_client_pull); `pull_rows`: rows to read with them; `times` may be NULL, and so
 * may an array whose count is 0. */
PARASYNC_API int parasync_client_step_finish(parasync_client_t* client, const parasync_rows_t* push_rows,
                                size_t num_push_rows, float* const* params, size_t num_params,
                                const parasync_rows_t* pull_rows, size_t num_pull_rows,
                                parasync_step_times_t* times, char** errmsg);
/* sync:delayed: the step's exchange behind the next gradient's compute, as parasync-worker
 * does in that mode:
 *   parasync_client_step_begin ... step_gradient ...
 *   parasync_client_step_launch(client, params)     starts step_finish's exchange on a thread
 *       of the client's own and returns at once; it writes the next parameters into `params`
 *   ... compute the next gradient from the parameters held before (not `params`) ...
 *   parasync_client_step_wait(client, times)        waits for it: its outcome and times
 *   parasync_client_step_begin ...                  the gradient counts as computed from the
 *       parameters read before the launched exchange (one version old: sync:delayed takes it)
 * The gradients handed over and `params` stay the library's until step_wait returns. Dense
 * models only (tables: PARASYNC_FAILED_PRECONDITION, as in any mode but sync:delayed; the
 * step is ended). While an exchange is in flight, every call that talks to the servers or
 * reads the client's state first waits for it (observe_step included; beat, set_epoch and
 * a collective's gather do not); an exchange's failure is returned by step_wait, or by the
 * next step_begin when nobody waited. */
PARASYNC_API int parasync_client_step_launch(parasync_client_t* client, float* const* params,
                                             size_t num_params, char** errmsg);
/* The launched exchange's outcome (PARASYNC_FAILED_PRECONDITION when none was launched since
 * the last wait); `times` (may be NULL) as step_finish's, filled when it succeeded. */
PARASYNC_API int parasync_client_step_wait(parasync_client_t* client, parasync_step_times_t* times,
                                           char** errmsg);
/* The last push: whether a shard dropped it as stale (sync backup workers), and the largest
 * staleness a shard reported (-1: none). */
PARASYNC_API int parasync_client_last_push_dropped(const parasync_client_t* client);
PARASYNC_API int64_t parasync_client_last_push_staleness(const parasync_client_t* client);
/* The lowest shard version seen in the latest pull or push reply. */
PARASYNC_API int64_t parasync_client_last_version(const parasync_client_t* client);

/* ---- What a worker reports ----------------------------------------------------------- */
/* A step ended: `examples` of it, its loss, and the seconds spent pulling, computing and
 * pushing (parasync_worker_step_seconds by phase, examples, steps, loss, the last push's
 * dropped/staleness and the client's retries/reconnects; the /healthz heartbeat). */
PARASYNC_API void parasync_client_observe_step(parasync_client_t* client, int64_t examples, double loss,
                                  double pull_seconds, double compute_seconds,
                                  double push_seconds);
/* The training thread is alive (for /healthz) while it does something long, e.g. evaluate. */
PARASYNC_API void parasync_client_beat(parasync_client_t* client);
PARASYNC_API void parasync_client_set_epoch(parasync_client_t* client, int epoch);
/* Chief: appends a row to <log-dir>/eval.jsonl (the servers' global step and examples are
 * read now) and sets the eval gauges. */
PARASYNC_API int parasync_client_log_eval(parasync_client_t* client, const parasync_eval_t* eval,
                             char** errmsg);
/* The highest epoch <log-dir>/eval.jsonl holds, -1 for none (a resumed chief skips those). */
PARASYNC_API int parasync_client_last_logged_epoch(const parasync_client_t* client);
/* Chief after its last epoch: leaves, then waits up to `seconds` for every other worker to
 * leave the servers (done or declared dead), as parasync-worker --wait-for-workers. */
PARASYNC_API int parasync_client_wait_for_workers(parasync_client_t* client, double seconds, char** errmsg);
/* Leaves (best effort within `seconds`): no sync step, ssp bound or collective waits for
 * this rank any more, until it pulls, pushes or registers again (parasync.horovod's join). */
PARASYNC_API int parasync_client_leave(parasync_client_t* client, double seconds, char** errmsg);
/* For each rank r of the cluster, `live[r]` (num_workers entries) is 1 while some server
 * still counts it as training (neither left nor declared dead), else 0. */
PARASYNC_API int parasync_client_live_ranks(parasync_client_t* client, uint8_t* live, char** errmsg);
/* The cluster's progress as the servers count it: optimizer steps applied (the largest
 * version over the shards) and the examples they were computed from. */
PARASYNC_API int parasync_client_global_progress(parasync_client_t* client, int64_t* step,
                                                 int64_t* examples, char** errmsg);
/* How tensors travel from now on: "float32", "bfloat16", "float16", "int8", "int4", "topk" or
 * "topk:R" (parasync.horovod's Compression); before parasync_client_register only. */
PARASYNC_API int parasync_client_set_wire_dtype(parasync_client_t* client, const char* dtype,
                                                char** errmsg);
/* A collective's exchange (parasync.horovod's allreduce, allgather, broadcast): offers the
 * `size` bytes at `data` (NULL when 0) for round `round` (1, 2, ... per key, on every rank
 * alike) of `key`, and waits until every live rank has offered (a dead or departed rank is
 * not waited for; the servers' --barrier-timeout bounds the wait). Then, for each rank r of
 * the cluster, `contributed[r]` is 1 if it took part, 2 if the round admitted it back (a
 * joining rank: no payload), else 0, and `sizes[r]` its payload's bytes (0 if none); both
 * arrays hold num_workers entries. parasync_client_gather_copy copies a rank's payload out.
 * Works before parasync_client_register too. A joining client (parasync_options_set_joining)
 * offers no round: its gather waits until the key's next round completes and admits it. */
PARASYNC_API int parasync_client_gather(parasync_client_t* client, const char* key,
                                        int64_t round, const void* data, size_t size,
                                        uint8_t* contributed, uint64_t* sizes, char** errmsg);
/* The round the last gather answered (for a joining client: the one that admitted it). */
PARASYNC_API int64_t parasync_client_gather_round(const parasync_client_t* client);
/* Joining on (1) or off (0) for every later request and heartbeat. */
PARASYNC_API int parasync_client_set_joining(parasync_client_t* client, int joining, char** errmsg);
/* Rank `rank`'s payload of the last gather into `out`, whose `size` must be its size. */
PARASYNC_API int parasync_client_gather_copy(parasync_client_t* client, int rank, void* out,
                                             size_t size, char** errmsg);
/* Asks every server to save a snapshot now (they need --state-dir). */
PARASYNC_API int parasync_client_checkpoint(parasync_client_t* client, char** errmsg);
/* The end: leaves (so barriers stop waiting for this rank; best effort within `seconds`),
 * sets parasync_worker_finished and writes <log-dir>/metrics-worker<rank>.prom. */
PARASYNC_API int parasync_client_finish(parasync_client_t* client, double seconds, char** errmsg);
/* Resends and reconnects so far (a restarted server registered with again). */
PARASYNC_API int64_t parasync_client_resends(const parasync_client_t* client);
PARASYNC_API int64_t parasync_client_reconnects(const parasync_client_t* client);

/* ---- Process-wide -------------------------------------------------------------------- */
/* This rank's example indices of a data set of n examples in epoch `epoch`'s order, as
 * parasync-worker walks them (i % num_workers == rank, then shuffled per seed, rank and
 * epoch unless shuffle is 0). `out` has room for `capacity`; *count gets the shard's size
 * (call with capacity 0, and `out` NULL if you like, to learn it). */
PARASYNC_API int parasync_shard_indices(int64_t n, int rank, int num_workers, uint64_t seed, int epoch,
                           int shuffle, int64_t* out, size_t capacity, size_t* count,
                           char** errmsg);
/* Makes SIGINT and SIGTERM also set a flag that every blocked call of every client checks
 * (they return PARASYNC_ABORTED), then do what was installed before: call its handler (e.g.
 * Python's); take the default action, the process ending as it would have without the
 * library (the handler restores SIG_DFL and raises the signal again); or, where the signal
 * was ignored, nothing more. Call after the program installed its own handlers: one that
 * wants its blocked calls to return PARASYNC_ABORTED, rather than to end, installs one
 * first (it may do nothing). */
PARASYNC_API void parasync_install_signal_handlers(void);
/* Whether SIGINT or SIGTERM arrived since parasync_install_signal_handlers (or
 * parasync_request_stop was called): the signal's number, else 0. */
PARASYNC_API int parasync_stop_requested(void);
PARASYNC_API void parasync_request_stop(int signal_number);
/* One log line in parasync's format at level "debug", "info", "warn" or "error" (another,
 * or NULL: "info"). */
PARASYNC_API void parasync_log(const char* level, const char* message);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PARASYNC_C_API_H_ */
