// EmbeddingTables: one parameter server's rows of every embedding table (common/embedding.h) —
// each row's values, optimizer slots and update count — and the rules for reading and
// changing them. No sockets here: ps/server.h feeds it decoded row ranges.
//
// A row exists here only once something updated it; until then it reads as its initial
// value, InitializeRow(seed, table, id), so pulls never fill memory. Rows held in memory are
// bounded by Options::max_rows and Options::memory_bytes over all tables: bringing in one
// more evicts the least recently touched row with its optimizer state. Where it goes:
//  - with a cold tier (Options::cold, the server's store): there — demoted, not lost; a
//    push of it promotes it back bitwise as it was, a pull reads it there without bringing
//    it in (HugeCTR's hierarchical parameter server, Persia);
//  - without one: nowhere — it comes back as its initial value, as in Monolith's expiring
//    hash tables.
// With Options::admit_after > 1 an id gets a row only at its admit_after-th push (counted in
// a sketch, ps/admission.h); before that its gradients are dropped and counted. With
// Options::expire_after, rows not updated for that long are deleted (Expire).
//
// Not thread-safe: one thread (the server loop) owns an EmbeddingTables, as it owns a Shard.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <vector>

#include "common/embedding.h"
#include "common/model_spec.h"
#include "common/status.h"
#include "common/variable.h"
#include "ps/admission.h"
#include "ps/cold_tier.h"
#include "ps/optimizer.h"
#include "ps/reject_reason.h"
#include "ps/row_index.h"
#include "ps/row_snapshot.h"

namespace parasync {

class EmbeddingTables {
 public:
  struct Options {
    int shard_index = 0;  // 0 <= shard_index < num_shards
    int num_shards = 1;
    // Rows held at most, over all tables on this shard; 0: no bound but kMaxRowsHeld.
    int64_t max_rows = 0;
    // Memory for rows, over all tables (BytesPerRow of the widest table each); 0: no bound.
    int64_t memory_bytes = 0;
    // Where evicted rows go (not owned; must outlive this object); null: forgotten.
    ColdTier* cold = nullptr;
    // Pushes an id needs before it gets a row (AdmissionFilter); <= 1: every id at once.
    int admit_after = 0;
    // Rows not updated for more than this long on the clock SetNow gives are deleted, in
    // memory and in the cold tier (Expire); 0: never. The unit is the caller's: the Shard
    // gives its version, or Unix seconds with expire_in_seconds.
    int64_t expire_after = 0;
    bool expire_in_seconds = false;
  };
  // The most rows one EmbeddingTables holds whatever max_rows says (row links are 32-bit).
  static constexpr int64_t kMaxRowsHeld = INT32_MAX;

  explicit EmbeddingTables(const Options& options);
  const Options& options() const { return options_; }

  // Sets the tables (already validated by ValidateRegistration) and the optimizer and seed
  // of the registration, and forgets every row, accumulator, dirty mark and statistic.
  void Configure(const std::vector<TableSpec>& tables, const OptimizerSpec& optimizer,
                 uint64_t seed);
  int num_tables() const { return static_cast<int>(tables_.size()); }
  // Precondition: t < num_tables().
  const TableSpec& table(uint32_t t) const { return tables_[t]; }
  // The most rows held in memory at once: max_rows, or kMaxRowsHeld when that is 0 or
  // larger, and at most memory_bytes / BytesPerRow(the widest table) once configured.
  int64_t capacity() const { return capacity_; }
  bool tiered() const { return options_.cold != nullptr; }
  bool expiring() const { return options_.expire_after > 0; }
  // The expiry clock's reading now (see Options::expire_after): stamps the rows updated
  // from here on. Not checked to move forward.
  void SetNow(int64_t now) { now_ = now; }
  // Deletes rows last updated before now - expire_after, a bounded amount of work a call:
  // the kExpireBatch least recently touched rows in memory are looked at, and, tiered, the
  // next kExpireBatch rows of the cold tier (a sweep that wraps round). A deleted row reads
  // as its initial value again; one the store may hold is listed by the next TakeDirty as
  // evicted, so the store drops it. A cold row read when expired counts as deleted too.
  // Returns the cold tier's error (the rows deleted in memory before it stay deleted; the
  // server rolls back to its store then). No-op unless expiring().
  Status Expire();
  static constexpr size_t kExpireBatch = 256;

  // Checks one row range of a request: `table` known (else kUnknownSlice), ids strictly
  // increasing (kOrder), every id held by this shard
  // (ShardOfRow(table, id, num_shards) == shard_index) and below the row count of a fixed
  // table (kRange), and, when `value_bytes` is given (a push's values frame; none for a
  // pull), value_bytes == ids.size() * dim * DTypeSize(dtype) (kByteLength). Returns Ok, or
  // InvalidArgument naming the table and the offending id and position with *reason set.
  // Changes nothing either way. Precondition: `dtype` is a wire dtype (Shard::ValidateRanges
  // checks it for the whole request).
  Status Validate(uint32_t table, std::span<const uint64_t> ids,
                  std::optional<size_t> value_bytes, DType dtype, RejectReason* reason) const;

  // Copies each row (dim floats) into out, in ids' order (out holds ids.size() * dim). A row
  // not held reads from the cold tier, or as its initial value if it has none there, and is
  // not brought in; a held row read becomes the most recently touched. Returns the cold
  // tier's error (out is then unspecified). Precondition: Validate ok.
  Status Read(uint32_t table, std::span<const uint64_t> ids, float* out);

  // True if no gradient value (ids.size() * dim floats) is NaN or +-Inf.
  bool AllFinite(uint32_t table, std::span<const uint64_t> ids, const float* grads) const;

  // Applies one gradient row per id (grads holds ids.size() * dim floats, in ids' order) with
  // ApplyUpdate(effective, ...), `effective` being the registered optimizer with the learning
  // rate the caller scheduled and scaled. A row not held is brought in first — promoted from
  // the cold tier, or created (initial value, zero slots, 0 updates) if the admission filter
  // lets it (else its gradient is dropped and counted) — evicting the least recently touched
  // row when capacity() rows are held. Each row's update count goes up by one and is its
  // Adam step (lazy: rows not in `ids` and their slots do not change). Rows become dirty and
  // most recently touched. Returns the cold tier's error, with the rows before the failing
  // one updated (the server rolls back to its store then).
  // Precondition: Validate ok, AllFinite true, effective.kind == the registered kind.
  Status Apply(uint32_t table, std::span<const uint64_t> ids, const float* grads,
               const OptimizerSpec& effective);

  // Sync mode: keeps `rank`'s gradient rows (ids.size() * dim floats) apart until the step
  // ends; changes no row. A rank pushes at most once per step (the server guarantees it).
  // Precondition: Validate ok, AllFinite true, rank >= 0.
  void Accumulate(int rank, uint32_t table, std::span<const uint64_t> ids, const float* grads);
  // Sync mode: applies, in ascending (table, id) order, to every row some rank pushed this
  // step, the sum of the pushed gradients in rank order divided by the number of ranks that
  // pushed that row (TensorFlow's SparseConditionalAccumulator averaging), as one Apply each;
  // then clears the accumulators. The result does not depend on the order of the pushes.
  // Errors as Apply's (the accumulators are cleared either way).
  Status ApplyAccumulated(const OptimizerSpec& effective);
  // Sync mode: clears the accumulators without applying them.
  void DropAccumulated() { pending_.clear(); }
  // Distinct rows with an accumulated gradient waiting for ApplyAccumulated.
  int64_t accumulated_rows() const { return static_cast<int64_t>(pending_.size()); }

  // Persistence. Returns the rows changed since the last TakeDirty, Restore or Configure as
  // snapshots sorted by (table, id), and sets *evicted (sorted) to the keys of rows that were
  // evicted since then, were not created again, and may be in the store: rows the last
  // TakeDirty returned or the last Restore was given (a row created and evicted between two
  // calls never reached the store and is not listed; this keeps the list bounded by the
  // store's size). Then forgets the dirty and evicted marks.
  std::vector<RowSnapshot> TakeDirty(std::vector<RowKey>* evicted);
  // Every row held, sorted by (table, id).
  std::vector<RowSnapshot> SnapshotAll() const;
  // Replaces every row by `rows` (a restart, after Configure); they count as stored and not
  // dirty, least recently touched first in the order given. Returns Corruption naming the
  // first bad row, and changes nothing, if a row is for an unknown table, has the wrong
  // number of values, slots or slot values, a negative update count, is not on this shard or
  // beyond a fixed table's rows, is listed twice, or if there are more than capacity().
  // Tiered: `rows` may be empty and `cold_rows` (by table) say how many rows the cold tier
  // holds (for the statistics); rows beyond capacity() are then left to the cold tier.
  Status Restore(std::span<const RowSnapshot> rows, std::span<const int64_t> cold_rows = {});

  // Rows held in memory over all tables, and an estimate of the memory they take
  // (BytesPerRow each).
  int64_t rows_held() const { return index_.size(); }
  // Tiered: the least recently touched rows whose changes one demotion writes together (the
  // rows after it go out without a write of their own).
  static constexpr size_t kCleanBatch = 128;
  int64_t bytes_held() const;
  // The memory one row of `dim` floats with `slots` optimizer slots takes here: its floats in
  // its table's arena plus the bookkeeping (slab entry with key, LRU links, arena cell and
  // flags; the arena's owner link; two hash index entries; its dirty-list entry). For
  // stating a bound before any row exists: capacity() * BytesPerRow(widest table). Not
  // counted: up to two spare arena chunks a table, and, below a power-of-two capacity, up to
  // twice the index entries (row_index.h).
  // With `expiring`, the row's stamp and free-list entry too.
  static int64_t BytesPerRow(int64_t dim, int slots, bool expiring = false);

  struct TableStats {
    int64_t rows_held = 0;     // its arena's rows (filled in by stats())
    int64_t rows_created = 0;  // since Configure, re-creations after eviction included
    int64_t rows_evicted = 0;  // forgotten, or demoted to the cold tier
    int64_t rows_read = 0;     // ids read, held or not
    int64_t rows_updated = 0;  // row updates applied
    int64_t bytes = 0;         // rows_held * BytesPerRow
    // Tiered: rows only in the cold tier (filled in by stats()), rows promoted from it, and
    // rows read there (pulls and promotions) with the seconds those reads took.
    int64_t rows_cold = 0;
    int64_t rows_promoted = 0;
    int64_t cold_reads = 0;
    double cold_read_seconds = 0;
    int64_t rows_refused = 0;  // gradient rows dropped by the admission filter
    int64_t rows_expired = 0;  // rows deleted by Expire (or read expired in the cold tier)
  };
  // Precondition: t < num_tables().
  TableStats stats(uint32_t t) const;

 private:
  static constexpr int32_t kNil = -1;
  // One held row in the slab; slots are reused in place on eviction, so the slab never grows
  // beyond capacity() entries and needs no free list. Its floats live in its table's arena.
  struct Row {
    RowKey key;
    int64_t updates = 0;
    int32_t prev = kNil;  // towards the most recently touched
    int32_t next = kNil;  // towards the least recently touched
    int32_t cell = kNil;  // in arenas_[key.table]: values, then each optimizer slot (dim each)
    bool dirty = false;   // changed since the last TakeDirty
    bool listed = false;  // in dirty_
    bool stored = false;  // may be in the store: an eviction must be reported
  };

  int num_slots() const { return NumOptimizerSlots(optimizer_.kind); }
  int64_t dim(uint32_t t) const { return tables_[t].dim; }
  float* DataOf(const Row& row) { return arenas_[row.key.table].at(row.cell); }
  const float* DataOf(const Row& row) const { return arenas_[row.key.table].at(row.cell); }
  // A key of a request that is not held, and what the cold tier has for it.
  struct ColdRead {
    size_t at = 0;  // its position in the request
    RowKey key;
    std::optional<RowSnapshot> row;  // filled in by ReadCold
  };
  // Tiered: the keys of a request (key_at(i) for i < n) that are not held, by position, with
  // their rows read from the cold tier in one call.
  template <typename KeyAt>
  Status ColdMisses(size_t n, const KeyAt& key_at, std::vector<ColdRead>* out);
  // The slab index of row `key`, brought in if not held: promoted from the cold tier, or
  // created (counted in rows_created) if the admission filter lets it. kNil when refused
  // (*status ok) or when the cold tier failed (*status says why; nothing changed). `pre`:
  // the key's ColdRead when ColdMisses read it, else null, and then the cold tier is read
  // here for a key not held (one held when ColdMisses looked may have been evicted since,
  // by an earlier key's promotion).
  int32_t Resident(const RowKey& key, ColdRead* pre, Status* status);
  // Holds `key` (not held) in slab entry `index` (from TakeSlot) at its initial value with
  // zero slots.
  void CreateRow(const RowKey& key, int32_t index);
  // Copies a snapshot's values and slots into a row's floats.
  static void CopyIn(const RowSnapshot& snap, float* data);
  // Takes the slab entry for a new row: a fresh one below capacity(), else the evicted LRU
  // (written to the cold tier first when it changed since it was last stored). kNil, and
  // *status set with nothing changed, when that write failed.
  int32_t TakeSlot(Status* status);
  // Writes to the cold tier, in one write, the changed rows among the kCleanBatch least
  // recently touched, and marks them clean (stored). Nothing changes if the write fails.
  Status CleanTail();
  void Evict(int32_t index);
  // Deletes held row `index` (expired): its slab entry goes to free_, and the store is told
  // to drop it if it may hold it.
  void Remove(int32_t index);
  // Counts `key` (not held, in the cold tier) as expired, once until the next TakeDirty.
  void ExpireCold(const RowKey& key);
  // Reads the keys of `reads` from the cold tier in one call (timed, and counted by table):
  // each one's row, nullopt when the tier has none or it has expired.
  Status ReadCold(std::vector<ColdRead>* reads);
  void Unlink(int32_t index);
  void LinkFront(int32_t index);
  void Touch(int32_t index);
  void MarkDirty(int32_t index);
  void ApplyRow(int32_t index, const float* grad, const OptimizerSpec& effective);
  RowSnapshot SnapshotOf(const Row& row) const;
  // Corruption naming the problem if `row` (the i-th) cannot be held here.
  Status CheckRestoredRow(const RowSnapshot& row, size_t i) const;
  void ClearRows();

  Options options_;
  int shard_index_;
  int num_shards_;
  int64_t capacity_;
  AdmissionFilter admission_;
  std::vector<int64_t> rows_total_;  // by table, tiered: rows in memory or in the cold tier
  std::vector<TableSpec> tables_;
  OptimizerSpec optimizer_;
  uint64_t seed_ = 0;
  std::vector<Row> rows_;  // the slab: at most capacity_ entries, held but those in free_
  std::vector<int32_t> free_;       // slab entries of expired rows, to be reused first
  std::vector<int64_t> updated_at_;  // expiring(): by slab entry, when it was last updated
  int64_t now_ = 0;                  // the expiry clock (SetNow)
  std::optional<RowKey> sweep_after_;  // where the cold tier's expiry sweep goes on
  RowIndex index_;                 // key -> slab index, for every row held
  std::vector<RowArena> arenas_;   // by table: the floats of its rows held
  int32_t head_ = kNil;  // most recently touched
  int32_t tail_ = kNil;  // least recently touched: the next to go
  std::vector<int32_t> dirty_;  // slab indices with `listed` set; at most capacity_
  std::set<RowKey> evicted_;    // stored rows evicted since the last TakeDirty
  // sync: this step's gradient rows by row, then by rank (rank order for the sum)
  std::map<RowKey, std::map<int, std::vector<float>>> pending_;
  std::vector<TableStats> stats_;  // by table; `bytes` is filled in by stats()
};

}  // namespace parasync
