// Shard: one parameter server's part of the model — its slices' values and optimizer slots —
// and the rules for changing them. No sockets here: ps/server.h feeds it decoded requests.
//
// Every request is validated completely before anything is touched, so a rejected request
// changes nothing. Not thread-safe: one thread (the server loop) owns a Shard; a large push
// is applied by that thread and up to apply_threads - 1 helpers, each slice by one of them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "common/model_spec.h"
#include "common/parallel_for.h"
#include "common/slice_map.h"
#include "common/status.h"
#include "common/wire.h"
#include "ps/checkpoint_store.h"
#include "ps/embedding_table.h"
#include "ps/lendable_floats.h"
#include "ps/reject_reason.h"

namespace parasync {

// A push's or a pull's embedding rows: per RowRange, its ids (sorted, from the ids frame) and,
// for a push, its gradient rows as float32 (ids.size() * dim each).
struct RowsRequest {
  std::span<const RowRange> ranges;
  std::span<const std::vector<uint64_t>> ids;
  std::span<const float* const> grads;  // push only
  bool empty() const { return ranges.empty(); }
};

// The initial values a creating registration carries for its kProvided variables
// (common/variable.h): one range per slice of those variables on this shard, whole and in
// increasing slice order, each with its float32 values as raw (possibly unaligned) bytes.
struct ProvidedValues {
  std::span<const SliceRange> ranges;
  std::span<const std::span<const uint8_t>> bytes;
  bool empty() const { return ranges.empty(); }
};

class Shard {
 public:
  // Shard `shard_index` of `num_shards`. Precondition: 0 <= shard_index < num_shards.
  // `max_bytes` bounds the memory a registration may claim here (values, one spare copy of
  // them for copy-on-write under pull replies, and the optimizer slots); 0 means no bound.
  // A push of at least kParallelApplyElements over two or more slices is checked and applied
  // by `apply_threads` threads (the caller and the helpers that are free), a slice each at a
  // time.
  // `max_table_rows` bounds the embedding rows held here, all tables together (0: no bound
  // but EmbeddingTables::kMaxRowsHeld); creating one more evicts the least recently touched.
  Shard(int shard_index, int num_shards, int64_t max_bytes = 0, int apply_threads = 1,
        int64_t max_table_rows = 0);
  // Replaces the embedding tables' options (the budget, the cold tier, admission) before
  // anything is registered; shard_index and num_shards must be this shard's.
  void set_table_options(const EmbeddingTables::Options& options);
  // The tables' expiry clock now: this shard's version + 1 (the one a push makes), or Unix
  // seconds with EmbeddingTables::Options::expire_in_seconds.
  int64_t ExpiryNow() const;
  static constexpr int64_t kParallelApplyElements = int64_t{1} << 18;  // 1 MiB of float32
  // A registration whose push to this shard (its values and a header) would pass this many
  // bytes is refused (InvalidArgument naming --max-message-bytes); 0: no bound.
  void set_max_message_bytes(int64_t bytes) { max_message_bytes_ = bytes; }
  // An SGD push of at least this many elements writes its new values with streaming stores
  // (ApplySgdIfFiniteStreaming): they would be out of the cache by the time a pull reply
  // reads them anyway, and skipping the read-for-ownership saves a quarter of the traffic.
  static constexpr int64_t kStreamingApplyElements = int64_t{1} << 21;  // 8 MiB of float32

  // First call: validates `reg`, builds the slice map, creates and initializes this shard's
  // slices (deterministically from reg.seed, or from `values` for kProvided variables) and
  // zeroes their slots. Later calls succeed only if `reg` equals the first (else
  // FailedPrecondition naming the difference); their `values` are ignored. A model whose
  // share here exceeds max_bytes gets InvalidArgument (reason kBadRegistration). A first call
  // without `values` while this shard holds slices of kProvided variables gets Unavailable
  // (reason kNotRegistered: it joins a model rank 0 has not created yet); `values` that do
  // not cover exactly this shard's slices of those variables, or hold a NaN or Inf, get
  // InvalidArgument. On failure sets *reason and changes nothing.
  Status Register(const ModelRegistration& reg, RejectReason* reason,
                  const ProvidedValues& values = {});

  // Checks that every range names a slice on this shard and fits in it, that slice ids are
  // strictly increasing (one range per slice, so a request can never ask for more than the
  // shard holds), that the format is a wire format (the values are float32; a push's frames
  // or a pull's reply may be narrower; top-k keeps 1..255 per chunk), and — when
  // `frame_bytes` is given (push) — that there is one frame per range of exactly
  // WireBytes(wire, count, where it begins) bytes. On failure sets *reason.
  Status ValidateRanges(std::span<const SliceRange> ranges, WireFormat wire,
                        std::optional<std::span<const size_t>> frame_bytes,
                        RejectReason* reason) const;

  // Checks a request's row ranges (EmbeddingTables::Validate for each): tables in strictly
  // increasing order (kOrder), each range's count equal to its ids' (kByteLength), and, when
  // `value_bytes` is given (a push), each values frame's length. On failure sets *reason.
  // Precondition: ValidateRanges ok for the same request (it checks the dtype).
  Status ValidateRows(std::span<const RowRange> ranges,
                      std::span<const std::vector<uint64_t>> ids, DType dtype,
                      std::optional<std::span<const size_t>> value_bytes,
                      RejectReason* reason) const;
  // Reads rows `ids` of `table` into out (ids.size() * dim floats); a row nobody updated reads
  // as its initial value and is not created; a demoted one reads from the cold tier, whose
  // error is returned. Precondition: ValidateRows ok.
  Status ReadRows(uint32_t table, std::span<const uint64_t> ids, float* out) {
    tables_.SetNow(ExpiryNow());
    return tables_.Read(table, ids, out);
  }

  // Copies each range into out[i] (ranges[i].count floats). Precondition: ValidateRanges ok.
  void Read(std::span<const SliceRange> ranges, std::span<float* const> out) const;

  // Read without a copy, for a pull reply sent from another thread: out[i] points at range
  // i's current values, which stay valid and unchanged until ReturnLoan(out[i].token)
  // (exactly once per range, from any thread, even after the Shard is gone); later updates
  // write into another buffer meanwhile (copy-on-write). Precondition: ValidateRanges ok.
  struct Loan {
    const float* data = nullptr;
    int64_t count = 0;
    void* token = nullptr;
    int64_t pinned = 0;  // floats the loan keeps alive: the whole slice, whatever the range
  };
  void Lend(std::span<const SliceRange> ranges, std::vector<Loan>& out) const;
  static void ReturnLoan(void* token) noexcept { LendableFloats::Return(token); }

  // Applies the optimizer to each range with gradient grads[i] (ranges[i].count floats),
  // after checking every gradient is finite (InvalidArgument + kNonFinite otherwise, nothing
  // applied). Increments each touched slice's update count (Adam's t) by one, version() by
  // one and examples() by batch_examples. The learning rate is the registered one times its
  // schedule's factor at examples() (before this update) times `lr_scale` (staleness-aware
  // async). Precondition: ValidateRanges ok.
  // `rows` are checked as finite with the slices (nothing changes if any is not) and applied
  // with the same learning rate, each row's own update count being its Adam step. A failure
  // of the tables' cold tier is returned with *reason kStoreFailed, after the slices were
  // updated (the caller rolls back to its store).
  Status Apply(std::span<const SliceRange> ranges, std::span<const float* const> grads,
               int64_t batch_examples, RejectReason* reason, float lr_scale = 1.0f,
               const RowsRequest& rows = {});

  // Sync mode. Checks the push names every slice of this shard whole (kPartial otherwise)
  // and, unless the workers apply the optimizer (aggregate: their AMP scaler judges an
  // overflow), that the gradient is finite (kNonFinite), then adds it to the current step's
  // gradient from `rank` (>= 0). Nothing is changed on failure. Precondition:
  // ValidateRanges ok.
  //
  // Each rank's gradient is kept apart until the step completes and the sum is then taken
  // in rank order, so a step's result never depends on the order the pushes arrived in
  // (float addition is not associative): a sync run is reproducible bit for bit. The cost
  // is one buffer per contributing rank, (contributors) x the shard's elements.
  // A push's rows are kept apart per rank too; the step applies to each row the average over
  // the ranks that pushed it (TensorFlow's SyncReplicasOptimizer for IndexedSlices).
  //
  // `wire`: the push's format. When a step of a worker-side aggregate (OptimizerKind::
  // kAggregate) had an int8 or top-k push, its average is quantized as such a pull would
  // carry it (the step's last such push's format), with the shard's residual (error
  // feedback, common/int8_codec.h, common/topk_codec.h), and that is the value every worker
  // reads: the part not sent goes into the next step, and a pull in that format sends
  // exactly what is stored.
  Status Accumulate(std::span<const SliceRange> ranges, std::span<const float* const> grads,
                    int64_t batch_examples, RejectReason* reason, int rank,
                    const RowsRequest& rows = {}, WireFormat wire = DType::kFloat32);
  // Sync mode: applies the optimizer once with the average of the `count` accumulated
  // gradients (summed in rank order) at the scheduled learning rate, clears them, and
  // increments version() by one and examples() by the accumulated examples. Precondition:
  // count >= 1 gradients were accumulated. Returns the tables' cold-tier error, the step
  // being applied but for rows from the failing one on (the caller rolls back to its store).
  Status ApplyAccumulated(int count);

  bool registered() const { return registration_.has_value(); }
  int64_t version() const { return version_; }
  int64_t examples() const { return examples_; }
  int shard_index() const { return shard_index_; }
  // Elements held (0 before Register).
  int64_t num_elements() const;
  int num_slices() const { return static_cast<int>(owned_.size()); }
  // The registered model (nullptr before Register).
  const ModelRegistration* registration() const {
    return registration_ ? &*registration_ : nullptr;
  }
  // The slice map (nullptr before Register).
  const SliceMap* slice_map() const { return map_ ? &*map_ : nullptr; }
  // Values of slice `id` (for tests and checkpoints); empty if not held here.
  std::span<const float> SliceValues(uint32_t id) const;

  // The whole shard state — registration, version, examples, every slice with its optimizer
  // slots and update count — as a copy (ranks left empty: the server adds them). Embedding
  // rows are not in it: TakeRowChanges adds what changed since the last time.
  // Precondition: registered().
  ShardSnapshot Snapshot() const;
  // Moves the embedding rows changed since the last call (and the keys of stored rows evicted
  // since) into snap->rows and snap->deleted_rows, for a store that holds the rest.
  void TakeRowChanges(ShardSnapshot* snap);
  const EmbeddingTables& tables() const { return tables_; }
  // One slice's state as a copy. Precondition: `id` is held here.
  SliceSnapshot SnapshotOfSlice(uint32_t id) const;
  // Replaces everything with `snap` (a restart), its embedding rows included. Checks it is a
  // valid registration for this shard and that it holds exactly this shard's slices with the
  // right sizes, and rows that belong here; Corruption naming the problem otherwise, and
  // nothing changes.
  Status Restore(const ShardSnapshot& snap);

 private:
  // Register's check of `values` against this shard's slices of reg's kProvided variables
  // (all of them, whole, in order; float32 bytes; finite). InvalidArgument naming the first
  // problem; sets *reason.
  Status CheckInitialValues(const ModelRegistration& reg, const SliceMap& map,
                            const ProvidedValues& values, RejectReason* reason) const;
  // Whether this shard's part of a model cut by `map`, with `num_slots` optimizer slots, fits
  // --max-model-bytes and --max-message-bytes (InvalidArgument naming the limit if not).
  Status CheckModelFits(const SliceMap& map, int num_slots) const;
  struct SliceState {
    LendableFloats values;
    // The previous values buffer, kept for reuse by out-of-place updates (it may still be
    // lent); empty until the first update that went out of place (a lent slice, or SGD of
    // whole slices).
    LendableFloats spare;
    std::vector<std::vector<float>> slots;
    // sync: the current step's gradient from each rank (allocated on first use, kept
    // zeroed between steps)
    std::vector<std::vector<float>> by_rank;
    int64_t updates = 0;
    int64_t offset = 0;  // of its first element in its variable
    // A worker-side optimizer's steps pushed in int8, int4 or top-k: what the step's average
    // lost to the quantization of the value the workers pull, added to the next step's — a
    // float32 step's (the probe's) included, which sends it whole (allocated on the first
    // such step; not durable: a restarted server starts it at zero).
    std::vector<float> pull_residual;
  };
  // InvalidArgument + kNonFinite naming the first range whose gradient has a NaN or Inf;
  // the ranges are checked on the apply threads when `parallel`.
  Status CheckFinite(std::span<const SliceRange> ranges, std::span<const float* const> grads,
                     RejectReason* reason, bool parallel = false) const;
  Status CheckRowsFinite(const RowsRequest& rows, RejectReason* reason) const;
  // The registered optimizer at this learning-rate scale (what ApplyToSlice uses).
  OptimizerSpec Effective(float lr_scale) const;
  // Calls fn(i) for every i in [0, n): on the apply threads (each taking the next i not yet
  // taken) when `parallel`, else in order on this thread.
  void ForEachRange(size_t n, bool parallel, const std::function<void(size_t)>& fn) const;
  void ApplyToSlice(SliceState& s, int64_t begin, const float* grad, int64_t count,
                    float lr_scale);
  // average_ (the step's, of slice `s`) quantized to what a pull in `wire` sends, with the
  // slice's pull residual (Accumulate's `wire`).
  void QuantizeAverage(SliceState& s, WireFormat wire);
  // The buffer an out-of-place update of `s` writes into: its spare when no reply still
  // reads it, else a new one.
  static LendableFloats TakeSpare(SliceState& s);
  // Apply's update for SGD when every range is a whole slice: check and update in one pass
  // per slice, out of place (ApplySgdIfFinite), swapping the results in only when all are
  // finite. Leaves version and examples to Apply.
  Status ApplySgdWhole(std::span<const SliceRange> ranges, std::span<const float* const> grads,
                       RejectReason* reason, float lr_scale, bool parallel, bool streaming);

  int shard_index_;
  int num_shards_;
  int64_t max_bytes_;
  int64_t max_message_bytes_ = 0;
  std::unique_ptr<ParallelFor> apply_threads_;  // null when 1
  std::optional<ModelRegistration> registration_;
  std::optional<SliceMap> map_;
  std::vector<int32_t> local_index_;  // slice id -> index in owned_, or -1
  std::vector<SliceState> owned_;
  std::optional<WireFormat> step_wire_;  // the open sync step's int8 or top-k push format
  std::vector<int8_t> quantized_;        // QuantizeAverage's wire bytes
  int64_t version_ = 0;
  int64_t examples_ = 0;
  int64_t pending_examples_ = 0;  // sync: examples behind the current step's sum
  std::vector<float> average_;    // sync: scratch for sum / count
  std::vector<bool> contributed_;  // sync: ranks with a gradient in the current step
  EmbeddingTables tables_;
};

}  // namespace parasync
