// PsClient: a worker's connection to every parameter-server shard — the push/pull API.
//
// One ZeroMQ DEALER per shard. Each call fans out one request per shard (all variables'
// slices of that shard batched into one message), then waits for every shard's reply, so
// shards work in parallel. Replies are matched by request id; a late reply to an earlier,
// timed-out request is dropped. Every call is bounded — by the request timeout, or for pulls
// that may wait at a barrier by the blocking timeout and the `interrupted` callback — and
// returns TimedOut naming the silent shard rather than hang.
//
// Not thread-safe: one thread (the training loop) uses a PsClient.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "common/curve.h"
#include "common/model_spec.h"
#include "common/parallel_for.h"
#include "common/slice_map.h"
#include "common/status.h"
#include "common/transport.h"
#include "common/wire.h"
#include "worker/local_group.h"

namespace parasync {

class LoopHeartbeat;  // common/metrics.h
class RequestTracker;  // worker/request_tracker.h

struct PsClientOptions {
  std::vector<std::string> ps_addresses;  // "host:port", shard i = index i
  int rank = -1;
  std::chrono::milliseconds request_timeout{30000};
  // How long a pull may wait for a sync step or the ssp bound (the servers answer with an
  // error naming the missing ranks after their --barrier-timeout, normally well before).
  std::chrono::milliseconds blocking_timeout{std::chrono::hours(25)};
  // The cluster's mode lets a pull wait (sync, ssp): pulls get blocking_timeout. Otherwise
  // only a pull with a min_version does.
  bool pulls_may_wait = false;
  // Polled every 100 ms while waiting for replies; when it returns true the call gives up
  // with Aborted (e.g. on SIGTERM). Optional.
  std::function<bool()> interrupted;
  // The incarnation a shard currently announces (from heartbeats; 0: unknown). When it
  // differs from the one a request went to, the server restarted: the client registers
  // again with it (idempotent) and resends. Optional.
  std::function<uint64_t(int shard)> incarnation_of;
  // An unanswered request is sent again after this long, then after twice as long, and so
  // on up to resend_max (same request id; pushes carry a sequence number so the server
  // applies each at most once). A restarted server gets it again at once.
  std::chrono::milliseconds resend_after{1000};
  std::chrono::milliseconds resend_max{10000};
  // CURVE keys (common/curve.h); nullopt: plain text.
  std::optional<CurveClientKeys> curve;
  // How tensors travel (common/float_codec.h): float32 as they are, or narrowed to bfloat16
  // or float16 (half the bytes; values and gradients are rounded once per transfer, the
  // parameters the servers keep stay float32), or int8 (common/int8_codec.h): pushes
  // quantized with error feedback (this client keeps what each push did not send and adds
  // it to the next); pulls of a worker-side aggregate in int8 too (the servers keep that
  // residual), pulls of parameters as changes to a copy this client holds, in the same format
  // (`delta_pulls`), or in bfloat16 without them. Or top-k (common/topk_codec.h: `keep` of every 256 elements, in int8), with
  // error feedback the same way, pulls of a worker-side aggregate in top-k too. Not with
  // embedding tables (Register refuses int8 and top-k).
  WireFormat wire_dtype = DType::kFloat32;
  // Compressed pushes check that they pay (the probe, on by default). After `start_after`
  // steps a top-k client pushes `window` steps in top-k and `window` in int8, `rounds` times
  // over; then every lossy format (int8, int4, top-k) gets `window` steps in float32 (`float32`;
  // left after its first step when that one took over twice the best median so far: a slow
  // link). The formats are preferred in that order (the configured one, int8, float32), and
  // each stays only if its median step (from one step's end to the next's: compute and
  // exchange) was at least `margin` (a fraction) shorter than every later one's, so float32
  // — compression off — is chosen where no compressed format paid back its CPU. One log line
  // says which and why. The residual carries over every switch; a float32 push after
  // compressed ones sends what it held too (and the servers' average residual likewise).
  // With a worker-side aggregate (sync, the workers' optimizer: the servers quantize the
  // step's average as it was pushed and every rank pulls it so) the ranks switch at the same
  // steps and decide together: each offers its medians through a Gather and all compare the
  // sums, so they push and pull one format (the gather failing: int8, and a warning).
  struct TopKProbe {
    bool enabled = true;
    int start_after = 20;
    int window = 16;
    int rounds = 2;
    double margin = 0.0;
    bool float32 = true;
  };
  TopKProbe topk_probe;
  // With int8 or top-k pushes to a server-side optimizer, parameters are pulled as int8
  // changes to a copy of them this client keeps (ps/delta_pulls.h: the servers keep the
  // same copy; what a pull does not send stays in the difference for the next), a quarter
  // of float32's bytes and closer to the servers' parameters than bfloat16. Off: parameters
  // in bfloat16 (half of float32's bytes).
  bool delta_pulls = true;
  // Threads that copy a pull reply of at least PsClient::kParallelCopyElements into the
  // caller's parameters: the calling thread and copy_threads - 1 helpers, a slice at a time
  // each (common/parallel_for.h). A helper that is not scheduled in time leaves its share to
  // the caller, so on a busy machine this costs nothing but the wake-up.
  int copy_threads = 1;
  // Beaten on every turn of a call's wait for replies (at least every 100 ms) from the
  // calling thread: the worker's /healthz tells a training thread that waits at a barrier
  // from one that is stuck (common/metrics.h). Not owned; optional.
  LoopHeartbeat* loop = nullptr;
  // Local aggregation (worker/local_group.h): this worker's group on its host. Its steps
  // (PushPull, FinishStep) then go through the group's leader, which pushes the group's sum
  // once and pulls once for all; sync modes only (the servers refuse a group's push
  // otherwise), dense variables only (Register refuses embedding tables), and a gradient
  // goes with its step's pull (Push alone is refused). Every other call (Register, Pull,
  // Gather, Stats, Leave, ...) is this worker's own, as without a group.
  std::optional<LocalGroupOptions> local_group;
};

// Embedding rows one call moves for one table (common/embedding.h), a RowSet listing tables in
// increasing order, each once: `ids` sorted ascending and unique (else InvalidArgument, nothing
// sent); `values` ids.size() * dim floats, caller-owned — filled by a pull (row i at
// values + i * dim), read by a push (the gradient rows, each id's summed over the batch).
struct RowsOf {
  uint32_t table = 0;
  std::span<const uint64_t> ids;
  float* values = nullptr;
};
using RowSet = std::span<const RowsOf>;

class PsClient {
 public:
  // Pull(..., kNextStep): each shard answers once it has applied the step after the one this
  // client last pushed to it (sync mode). Push(..., kLastRead): each shard's gradient carries
  // the version this client last pulled from that shard. Shards keep versions of their own.
  static constexpr int64_t kNextStep = -1;
  static constexpr int64_t kLastRead = -1;
  // A pull reply of at least this many elements is copied by options.copy_threads threads.
  static constexpr int64_t kParallelCopyElements = int64_t{1} << 18;  // 1 MiB of float32
  // A float32 pull reply of at least this many elements is copied with streaming stores
  // (CopyFloatsStreaming): a third less memory traffic than memcpy's cached stores, for
  // parameters too large to stay cached until the trainer reads them.
  static constexpr int64_t kStreamingCopyElements = int64_t{1} << 21;  // 8 MiB of float32

  // Creates the sockets; connections are made in the background. `context` must outlive the
  // client. InvalidArgument for no addresses, Unavailable if a socket cannot be made.
  static Result<std::unique_ptr<PsClient>> Connect(zmq::context_t& context,
                                                   const PsClientOptions& options);
  ~PsClient();
  PsClient(const PsClient&) = delete;
  PsClient& operator=(const PsClient&) = delete;

  // Registers `reg` with every shard (reg.num_shards must equal the number of shards) and
  // builds the slice map. Waits up to `timeout` for servers that are still starting. Returns
  // the first error that arrives (e.g. FailedPrecondition for a model, mode or protocol
  // mismatch).
  // `initial_values` (one array per variable, caller-owned, read during the call): the values
  // of reg's kProvided variables, for the registration that creates the model (rank 0's;
  // ignored by servers that hold it already). Without them a model with kProvided variables
  // is only joined: the call waits, within `timeout`, until rank 0 has created it.
  Status Register(const ModelRegistration& reg, std::chrono::milliseconds timeout,
                  std::span<const float* const> initial_values = {});

  // After Register: where the shards recorded this rank to be in its data with the updates
  // they hold — the earliest over the shards that hold slices (a crash can leave one shard a
  // push ahead of another), empty when one of them recorded nothing. A restarted worker
  // goes on from here.
  const DataProgress& recorded_progress() const { return recorded_progress_; }

  // The position every later Push and PushPull reports: where this worker is in its data
  // once that gradient counts.
  void set_progress(const DataProgress& progress) { progress_ = progress; }

  // Takes the model the servers already hold (e.g. from Stats().registration) without
  // registering it, so a tool can pull. InvalidArgument if it does not fit the shard count.
  Status Adopt(const ModelRegistration& reg);

  // Fills params[v] (num_elements of variable v, caller-owned) with the current values from
  // all shards. Precondition: Register succeeded. Blocks until every shard replied; in sync
  // mode a shard answers once it reaches `min_version` (or, for kNextStep, the step after
  // this client's last push to it), in ssp mode once this rank may read (bounded by
  // blocking_timeout). last_version() then holds the lowest version read.
  // `rows`: embedding rows to read as well, each from the shard that holds it (a row nobody
  // has updated reads as its initial value). With tables registered, every pull and push
  // goes to every shard (each holds rows), with or without rows for it. With `params` empty
  // and rows given, only the rows are read (and last_version() is the lowest version
  // their shards answered with).
  Status Pull(std::span<float* const> params, int64_t min_version = 0, RowSet rows = {});

  // Sends grads[v] (one array per variable, caller-owned, read only) to every shard; blocks
  // until every shard acknowledged. The gradients are not copied: ZeroMQ sends them from
  // the caller's memory, and Push (like PushPull) returns only once it no longer reads them,
  // also when it fails. `batch_examples` is how many examples the gradient
  // averages over; `read_version` the version it was computed from — by default (kLastRead)
  // each shard's own version at this client's last pull. last_push_dropped() then says
  // whether a shard dropped it as stale.
  Status Push(std::span<const float* const> grads, int64_t batch_examples,
              int64_t read_version = kLastRead, RowSet rows = {});

  // Push, then Pull, pipelined: both go out at once and, on a live connection, each shard
  // answers the pull after it handled the push (a connection keeps its order), so one round
  // trip does both — what a training step needs (the parameters for the next batch). With
  // kNextStep the pull waits for the step this push contributes to. Caveats: if a connection
  // drops between the two, the pull may be answered before the resent push is applied
  // (async: parameters without this gradient; sync waits for it anyway); and when the call
  // fails, the push may have been applied — the caller cannot tell, so it must not retry
  // the same gradient (the trainer stops on any error). The push must be acknowledged
  // within request_timeout even when the pull may wait longer. `times`, if given, splits the
  // wait: until the last push acknowledgement, and from there until the last pull reply.
  struct PushPullTimes {
    using Clock = std::chrono::steady_clock;
    double push_seconds = 0;
    double pull_seconds = 0;
    // FinishStep (and so PushPull) also tells when the step's pushes went out: the first and
    // the last (GradientReady's early ones included), when the last was acknowledged and
    // when the last pull reply came, and how many shards' pushes went out before FinishStep.
    Clock::time_point first_push_sent{};
    Clock::time_point last_push_sent{};
    Clock::time_point pushes_acked{};
    Clock::time_point pulled{};
    int early_pushes = 0;
  };
  // Where a pull read the parameters: each shard's version and incarnation. PushPull and
  // BeginStep take one for a gradient computed from parameters older than the last pull
  // (sync:delayed, whose workers compute while the step before is exchanged).
  struct ReadPoint {
    std::vector<int64_t> versions;
    std::vector<uint64_t> incarnations;
  };
  // The latest pull's.
  ReadPoint read_point() const { return {read_versions_, read_incarnation_}; }

  // `computed_from`: the read point of the parameters the gradient was computed from (null:
  // the latest pull's). The pull still waits, with kNextStep, for the step after the latest
  // pull: the step this push contributes to.
  Status PushPull(std::span<const float* const> grads, int64_t batch_examples,
                  std::span<float* const> params, int64_t min_version = 0,
                  PushPullTimes* times = nullptr, RowSet push_rows = {},
                  RowSet pull_rows = {}, const ReadPoint* computed_from = nullptr);

  // PushPull in parts, so that the pushes overlap what is left of backward (as Horovod and
  // BytePS start a tensor's reduction from its gradient hook): BeginStep; GradientReady(v)
  // as each variable's gradient is complete — once every variable a shard holds slices of
  // is, that shard's push is sent at once, and the call returns without waiting for it —
  // then FinishStep, which sends the pushes not sent yet and the pulls, and waits for every
  // reply. Together they are one PushPull: one sequence number, one whole push per shard (a
  // sync step sees no difference), and each shard's pull answered after its push. With
  // tables registered every shard's push carries rows, so all go at FinishStep.
  // Errors: BeginStep while a step is open, GradientReady outside a step, for a variable out
  // of range or marked twice, and FinishStep with a variable never marked get
  // FailedPrecondition or InvalidArgument and send nothing more; the step stays open until
  // FinishStep returns (whatever its outcome: pushes already sent are then settled).
  Status BeginStep(int64_t batch_examples, const ReadPoint* computed_from = nullptr);
  // `grad`: the variable's num_elements floats, caller-owned, valid and unchanged until
  // FinishStep returns (ZeroMQ sends from it).
  Status GradientReady(size_t variable, const float* grad);
  Status FinishStep(std::span<float* const> params, int64_t min_version = 0,
                    PushPullTimes* times = nullptr, RowSet push_rows = {},
                    RowSet pull_rows = {});
  // Ends the open step without exchanging it, as FinishStep does when it refuses its
  // arguments: the pushes already sent are awaited and settled (the caller may reuse its
  // gradients' memory once this returns), nothing more is sent. Returns `why`, the reason
  // the caller gives up the step (with no step open too).
  Status AbandonStep(Status why);
  bool in_step() const { return step_.open; }
  // How pushes travel now (wire_dtype, or int8 where the probe chose it).
  WireFormat push_format() const { return options_.wire_dtype; }

  // Tells every shard this worker is done, so barriers stop waiting for it. Best effort:
  // waits for the acknowledgements up to `timeout`, even when `interrupted` says stop.
  Status Leave(std::chrono::milliseconds timeout);

  // Each shard's statistics, in shard order.
  Result<std::vector<ShardStats>> Stats();

  // How later pushes and pulls travel (PsClientOptions::wire_dtype). Before Register or
  // Adopt only: FailedPrecondition after.
  Status SetWireDType(WireFormat dtype);

  // A collective's exchange (ps/gather_board.h): offers `payload` (caller-owned, read during
  // the call) for round `round` (1, 2, ...) of `key` to shard 0 and waits, up to
  // blocking_timeout, until every live rank has offered. Fills `ranks` with the ranks that
  // took part, in increasing order, and `payloads` with theirs in the same order. Works
  // before Register too. Errors: the server's (a rank out of step, the payload bound, a
  // round that timed out naming the missing ranks) or TimedOut/Aborted here.
  // `admitted` (optional): the joiners this round admitted back (ps/gather_board.h); `round`
  // (optional): the round answered — for a joining offer, the one it was admitted at.
  Status Gather(const std::string& key, int64_t round, std::span<const uint8_t> payload,
                std::vector<int32_t>* ranks, std::vector<zmq::message_t>* payloads,
                std::vector<int32_t>* admitted = nullptr, int64_t* answered_round = nullptr);

  // A restarted worker not yet back in the run (parasync.horovod.elastic): every request
  // says so, and the servers do not count this rank live for it; a Gather then waits to be
  // admitted at its key's next round. Off again once admitted.
  void SetJoining(bool joining) { joining_ = joining; }
  bool joining() const { return joining_; }

  // Asks every shard to save a snapshot now (cluster-wide checkpoint); returns when all did.
  // FailedPrecondition from a shard started without --data-dir.
  Status Checkpoint();

  // Asks shard `shard` to stop serving; returns when it acknowledged.
  Status Shutdown(int shard);

  const SliceMap& slice_map() const { return *map_; }
  int num_shards() const { return static_cast<int>(sockets_.size()); }
  // The lowest shard version seen in the latest Pull or Push reply.
  int64_t last_version() const { return last_version_; }
  // Some shard dropped the last push (shards decide alone: with backup workers one shard may
  // aggregate a gradient another drops).
  bool last_push_dropped() const { return last_push_dropped_; }
  // The largest staleness a shard reported for the last push (versions it applied between
  // this client's read and the gradient's acceptance); -1 when no shard accepted it afresh
  // (dropped, or a resend of a push already applied).
  int64_t last_push_staleness() const { return last_push_staleness_; }
  // Times a request had to be sent again (a server restarted or a reply was lost).
  int64_t resends() const { return resends_; }
  // Times a shard was found restarted (a new incarnation) and registered with again.
  int64_t reconnects() const { return reconnects_; }

 private:
  struct Outgoing {
    Header header;
    std::vector<zmq::message_t> frames;
    // Sent before the exchange that waits for its reply (GradientReady): when, and to which
    // incarnation; header.request_id is then its id.
    std::optional<std::chrono::steady_clock::time_point> sent_at;
    uint64_t sent_to = 0;
  };
  // The step BeginStep opened: its sequence number, the gradients marked so far and the
  // pushes already sent (in the order sent).
  struct OpenStep {
    bool open = false;
    uint64_t seq = 0;
    int64_t batch_examples = 0;
    std::vector<const float*> grads;  // by variable; null: not marked yet
    std::vector<int> missing;         // by shard: variables not marked yet
    std::vector<int> sent_shards;
    std::vector<Outgoing> sent;
    std::optional<ReadPoint> computed_from;  // BeginStep's; nullopt: the latest pull's
  };
  PsClient(std::vector<std::unique_ptr<Socket>> sockets, const PsClientOptions& options)
      : sockets_(std::move(sockets)),
        options_(options),
        copy_threads_(options.copy_threads > 1 ? std::make_unique<ParallelFor>(options.copy_threads)
                                               : nullptr) {}
  // One Register request per shard; with `initial_values`, each carries the values of its
  // slices of kProvided variables (copied into frames).
  std::vector<Outgoing> RegisterRequests(const ModelRegistration& reg, const SliceMap& map,
                                         std::span<const float* const> initial_values) const;
  // Register's and Adopt's common end: the slice map, the variable sizes, and room for a
  // narrowed push.
  void UseModel(const ModelRegistration& reg, SliceMap map);
  static Result<std::unique_ptr<Socket>> OpenSocket(zmq::context_t& context,
                                                    const PsClientOptions& options, size_t shard);
  // Push frames point into the caller's gradients (no copy). Waits until ZeroMQ released
  // every one, so the caller may reuse its memory; a push stuck in a socket's queue (its
  // server gone) is dropped by closing that socket, which is then opened again. `answered`:
  // the exchange succeeded (frames drain by themselves; waited for up to request_timeout).
  // Returns an error only if a socket cannot be reopened (it stays closed: requests to that
  // shard then fail with Unavailable).
  Status ReleasePushFrames(bool answered);
  // ReleasePushFrames after an exchange whose outcome was `exchange`: returns that outcome's
  // error if there was one (logging a reopen error), else ReleasePushFrames's.
  Status SettlePushFrames(const Status& exchange);
  // Waits for the replies to a step's pushes already sent (BeginStep's early ones) and
  // settles their frames, the outcome aside: what ends a step that is not exchanged.
  void SettleSentPushes(const std::vector<int>& shards, std::vector<Outgoing> requests);
  bool AwaitFramesReleased(std::chrono::steady_clock::duration limit);
  int64_t Unreleased() const;  // frames not yet released, all shards

  // Sends requests[i] to shard shards[i] and waits for their replies (same order), each
  // checked for an ok status. A shard may get several requests (they are matched by id).
  // TimedOut after `timeout`, or after `short_timeout` if one of the first `short_count`
  // requests is still unanswered. `answered_at`, if given, gets each reply's arrival time.
  Result<std::vector<Inbound>> Exchange(
      std::vector<int> shards, std::vector<Outgoing> requests, std::chrono::milliseconds timeout,
      bool interruptible = true,
      std::vector<std::chrono::steady_clock::time_point>* answered_at = nullptr,
      size_t short_count = 0, std::chrono::milliseconds short_timeout = {});

  // Exchange's steps. "ps shard N (host:port)", as errors and logs name a shard.
  std::string ShardName(int shard) const;
  // Sends request i of `tracker` (again), copying its frames so it can be resent.
  Status SendRequest(RequestTracker& tracker, size_t i, Outgoing& request);
  // The send itself, to `shard`, addressed to its incarnation as last heard.
  Status SendFrames(int shard, Outgoing& request);
  // Sends again every unanswered request that is due (re-registering with a restarted
  // server first).
  Status ResendDue(RequestTracker& tracker, std::vector<Outgoing>& requests,
                   std::chrono::steady_clock::time_point now);
  // Waits until every request is answered, an error arrives, or the tracker times out.
  Status AwaitReplies(RequestTracker& tracker, std::vector<Outgoing>& requests,
                      bool interruptible, std::vector<std::optional<Inbound>>& replies);
  // Takes every reply queued at `shard`'s socket, matching them to tracked requests.
  Status TakeReplies(RequestTracker& tracker, int shard,
                     std::vector<std::optional<Inbound>>& replies);

  // A RowSet split by shard: for shard s, its RowRanges, their ids and where each row sits
  // in the caller's RowsOf (entry `of`, row `pos`).
  struct ShardRows {
    std::vector<RowRange> ranges;
    std::vector<std::vector<uint64_t>> ids;
    std::vector<std::vector<uint32_t>> pos;
    std::vector<size_t> of;
  };
  Result<std::vector<ShardRows>> SplitRows(RowSet rows) const;
  int64_t TableDim(uint32_t table) const;
  // Whether requests go to shard s: it holds slices, or tables are registered.
  bool SendsTo(int s) const;
  // The requests of a pull (min_versions by shard) / a push, one per shard SendsTo,
  // appended to shards and requests; and what their replies tell.
  void AddPullRequests(const std::vector<int64_t>& min_versions, std::vector<int>* shards,
                       std::vector<Outgoing>* requests, const std::vector<ShardRows>& rows,
                       bool with_slices = true) const;
  void AddPushRequests(std::span<const float* const> grads, int64_t batch_examples,
                       int64_t read_version, std::vector<int>* shards,
                       std::vector<Outgoing>* requests, RowSet rows,
                       const std::vector<ShardRows>& split);
  // The push of shard s with sequence number `seq`; its frames point into `grads` (or into
  // narrowed_, at the shard's own run). An int8 push moves push_residual_ on: called once
  // per push (a resend sends the same frames again).
  // InvalidArgument where the wire dtype cannot carry `reg` (int8 with embedding tables).
  Status CheckWireDType(const ModelRegistration& reg) const;
  Outgoing PushRequest(int s, std::span<const float* const> grads, int64_t batch_examples,
                       int64_t read_version, uint64_t seq, RowSet rows, const ShardRows& split);
  // A push's rows for one shard: an ids frame and a values frame per range (copies, each row
  // encoded once, straight into its frame).
  void AddPushRowFrames(const ShardRows& split, RowSet rows, Outgoing& o) const;
  Status TakePullReplies(std::span<float* const> params, std::span<const int> shards,
                         std::span<Inbound> replies, RowSet rows,
                         const std::vector<ShardRows>& split);
  // A delta pull's reply from `shard` (reply.delta_pull) must be int8 and change the copy
  // this client holds (or zeros); Corruption naming both generations otherwise.
  Status CheckDeltaReply(int shard, const Header& reply) const;
  // TakePullReplies' part for rows: checks reply i's row frames (after its `first` slice
  // frames) and copies them into `rows`.
  Status TakePullRows(int shard, Inbound& in, size_t first, RowSet rows,
                      const ShardRows& split) const;
  void TakePushReplies(int64_t read_version, std::span<const int> shards,
                       std::span<const Inbound> replies);
  // FinishStep's exchange with the servers (without a local group, or as its leader with
  // the group's sum in step_.grads).
  Status ExchangeStep(std::span<float* const> params, int64_t min_version,
                      PushPullTimes* times, RowSet push_rows, RowSet pull_rows);
  // FinishStep in a local group: a member hands its gradients to the leader and takes the
  // parameters it answers; the leader gathers the group's sum, exchanges it, answers.
  Status GroupStep(std::span<float* const> params, int64_t min_version, PushPullTimes* times);
  // Each shard's min_version for a pull with `min_version` (kNextStep: next_step_).
  std::vector<int64_t> PullVersions(int64_t min_version) const;

  // How long an unanswered request waits before its first resend: resend_after, or twice the
  // slowest push reply of late (push_reply_) where that is longer, within resend_max. A push
  // is answered once the server took it, so its wait is the link's transfer time; on a slow
  // link that outlasts resend_after, and a resend then only doubles the bytes on the wire.
  std::chrono::milliseconds FirstResendAfter() const;
  // Exchange of the same tensor-less request with every shard.
  Result<std::vector<Inbound>> Broadcast(const Header& header, std::chrono::milliseconds timeout,
                                         bool interruptible = true);

  std::vector<std::unique_ptr<Socket>> sockets_;
  PsClientOptions options_;
  std::unique_ptr<ParallelFor> copy_threads_;  // null when options_.copy_threads <= 1
  zmq::context_t* context_ = nullptr;
  // Per shard (options_.ps_addresses.size()): push frames handed to ZeroMQ and not yet
  // released (ReleaseFrame). On the heap: ZeroMQ may release a frame after a socket is gone.
  std::unique_ptr<std::atomic<int64_t>[]> unreleased_;
  std::optional<SliceMap> map_;
  // A push's gradients encoded in wire_dtype when it is not float32 (sized by UseModel: each
  // slice's WireBytes), one run of bytes per shard, its slices in order; the push frames
  // point into it (so it is only written once every frame was released).
  // The probe (PsClientOptions::topk_probe: top-k against int8, each against float32): steps ended, the step periods seen with
  // each format, whether the step in progress was pushed in top-k, and the format to go
  // back to.
  struct Probe {
    bool configured = false;
    bool active = false;
    bool agree = false;  // a worker-side aggregate: the verdict is every rank's (a Gather)
    int64_t steps = 0;
    // The formats tried, in order of preference (the configured one, int8, float32), and
    // the step periods seen with each.
    std::vector<WireFormat> formats;
    std::vector<std::vector<double>> periods;
    int now = -1;  // the format of the step in progress, -1 when it is not the probe's
    std::chrono::steady_clock::time_point last_end;
  };
  // After a step that ended well: the probe's sample, and the next step's push format.
  void ProbePushFormat();
  // Pushes from now on in `format` (int8 or top-k: the residual carries over), and pulls
  // too where they follow the pushes (delta pulls, a worker-side aggregate).
  void SetPushFormat(WireFormat format);
  // Each tried format's median step (infinity for none), summed over every rank's through a
  // Gather (round `round`) when the ranks decide together; the number of ranks in *ranks.
  Status ProbeMedians(int64_t round, std::vector<double>* medians, size_t* ranks);
  // The verdict from those medians: the push format from now on, and one log line.
  void ConcludeProbe(const std::vector<double>& medians, size_t ranks);
  // The gather failed: int8 from now on, and a warning.
  void FailProbe(const Status& why);
  void SizePushBuffers();  // narrowed_ and narrowed_at_ for options_.wire_dtype
  Probe probe_;
  std::vector<uint8_t> narrowed_;
  std::vector<size_t> narrowed_at_;  // by shard: where its run starts in narrowed_ (bytes)
  // int8 and top-k pushes: what each element's pushes have not sent yet, a run of elements
  // per shard as narrowed_'s (error feedback); zero until the first push.
  std::vector<float> push_residual_;
  std::vector<size_t> residual_at_;  // by shard: where its run starts in push_residual_
  WireFormat pull_dtype_ = DType::kFloat32;  // what pulls ask for (wire_dtype; int8: above)
  // Delta pulls (PsClientOptions::delta_pulls): the copy of the parameters the servers
  // changed (shard by shard as residual_at_ lays them out) and its generation on each shard
  // (0: none; the next pull starts from zeros).
  bool delta_pulls_ = false;
  bool pull_follows_push_ = false;  // delta pulls, or a worker-side aggregate's in its format
  // By shard: the next float32 push adds the residual and zeroes it (the probe chose float32).
  std::vector<bool> fold_residual_;
  std::vector<float> pull_base_;
  std::vector<uint64_t> pull_generation_;
  std::vector<int64_t> var_sizes_;
  // The variables each shard holds slices of (each once), and the shards of each variable.
  std::vector<std::vector<size_t>> shard_vars_;
  std::vector<std::vector<int>> var_shards_;
  OpenStep step_;
  std::unique_ptr<LocalGroup> group_;       // null without local aggregation
  std::vector<std::vector<float>> group_sum_;  // leader: the step's summed gradients
  std::vector<int32_t> group_ranks_;  // leader: the members whose gradients the push sums
  bool finishing_step_ = false;  // FinishStep's own exchange (others are refused in a step)
  uint64_t next_request_id_ = 1;
  int64_t last_version_ = 0;
  bool joining_ = false;
  std::vector<int64_t> read_versions_;  // per shard: version at the last pull
  std::vector<int64_t> next_step_;      // per shard: version a kNextStep pull waits for
  std::vector<uint64_t> incarnation_;   // per shard: the server incarnation last heard
  std::vector<uint64_t> read_incarnation_;  // per shard: incarnation of the last pull reply
  std::optional<ModelRegistration> registration_;  // re-sent to a restarted shard
  uint32_t push_incarnation_ = 0;       // this client's random PushSeq incarnation, not 0
  DataProgress recorded_progress_;       // from Register's replies
  DataProgress progress_;                // sent with every push
  uint64_t pushes_ = 0;
  int64_t resends_ = 0;
  int64_t reconnects_ = 0;
  // The slowest push reply of late: each exchange's longest, or 7/8 of the last figure.
  std::chrono::milliseconds push_reply_{0};
  int64_t last_push_staleness_ = -1;
  bool last_push_dropped_ = false;
};

// The top-k probe's verdict: whether top-k's median step (seconds) is at least `margin` (a
// fraction) shorter than int8's. Either list empty: true (nothing to go on).
bool TopKPays(std::vector<double> topk_steps, std::vector<double> int8_steps, double margin);
// The same for medians (or their sums over ranks) already taken.
inline bool TopKPays(double topk_median, double int8_median, double margin) {
  return topk_median <= int8_median * (1.0 - margin);
}

}  // namespace parasync
