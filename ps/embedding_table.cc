#include "ps/embedding_table.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include "common/float_codec.h"

namespace parasync {

namespace {

std::string TableName(const std::vector<TableSpec>& tables, uint32_t t) {
  return "table " + std::to_string(t) + " ('" + tables[t].name + "')";
}

// Bookkeeping per row besides the Row struct, its floats, its index entries and its arena
// owner link: the dirty list's int32.
constexpr int64_t kDirtyEntryBytes = 4;
// How many ids ahead Read and Apply prefetch the index: enough to overlap several cache misses
// (a lookup is one once the index outgrows the caches), few enough that what was loaded is
// still cached when its id comes. (Prefetching the slab entry and floats too, in further
// stages, measured slower: the extra lookups cost more than the misses they hid.)
constexpr size_t kPrefetchAhead = 8;
// The rows the index has room for before its first doubling.
constexpr int64_t kInitialIndexRows = int64_t{1} << 16;

}  // namespace

EmbeddingTables::EmbeddingTables(const Options& options)
    : options_(options),
      shard_index_(options.shard_index),
      num_shards_(options.num_shards),
      capacity_(options.max_rows > 0 ? std::min(options.max_rows, kMaxRowsHeld) : kMaxRowsHeld),
      admission_(options.admit_after) {}

void EmbeddingTables::ClearRows() {
  rows_.clear();
  free_.clear();
  updated_at_.clear();
  sweep_after_.reset();
  index_.Clear();
  for (RowArena& a : arenas_) a.Clear();
  head_ = tail_ = kNil;
  dirty_.clear();
  evicted_.clear();
  pending_.clear();
}

void EmbeddingTables::Configure(const std::vector<TableSpec>& tables,
                                const OptimizerSpec& optimizer, uint64_t seed) {
  ClearRows();
  tables_ = tables;
  optimizer_ = optimizer;
  seed_ = seed;
  stats_.assign(tables_.size(), TableStats{});
  rows_total_.assign(tables_.size(), 0);
  admission_.Clear();
  capacity_ = options_.max_rows > 0 ? std::min(options_.max_rows, kMaxRowsHeld) : kMaxRowsHeld;
  if (options_.memory_bytes > 0 && !tables_.empty()) {
    int64_t widest = 0;
    for (const TableSpec& t : tables_) widest = std::max(widest, t.dim);
    capacity_ = std::min(capacity_,
                         std::max<int64_t>(1, options_.memory_bytes /
                                                  BytesPerRow(widest, num_slots(), expiring())));
  }
  arenas_.clear();
  for (const TableSpec& t : tables_) arenas_.emplace_back(t.dim * (1 + num_slots()));
  if (capacity_ < kMaxRowsHeld) {
    // A bounded shard reaches its bound in a long run: reserve the slab now rather than move
    // it (a pause of the server loop) on the way; untouched, the reservation costs no
    // memory. The index is written whole when it is sized (2 entries a row), so it starts at
    // kInitialIndexRows and doubles as rows come (128 MiB at once for the default 4M rows
    // was most of a small model's server). The arenas grow by chunks that never move.
    rows_.reserve(static_cast<size_t>(capacity_));
    index_.Reserve(std::min(capacity_, kInitialIndexRows));
  }
}

Status EmbeddingTables::Validate(uint32_t table, std::span<const uint64_t> ids,
                                 std::optional<size_t> value_bytes, DType dtype,
                                 RejectReason* reason) const {
  if (table >= tables_.size()) {
    *reason = RejectReason::kUnknownSlice;
    return Status::InvalidArgument("table " + std::to_string(table) + " is not registered (" +
                                   std::to_string(tables_.size()) + " tables)");
  }
  const TableSpec& spec = tables_[table];
  // Built only for a refusal: the loop runs once per id of every request.
  const auto where = [&](size_t i) {
    return TableName(tables_, table) + " id " + std::to_string(ids[i]) + " at position " +
           std::to_string(i);
  };
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0 && ids[i] <= ids[i - 1]) {
      *reason = RejectReason::kOrder;
      return Status::InvalidArgument(where(i) + ": ids must be strictly increasing (follows " +
                                     std::to_string(ids[i - 1]) + ")");
    }
    if (spec.rows > 0 && ids[i] >= static_cast<uint64_t>(spec.rows)) {
      *reason = RejectReason::kRange;
      return Status::InvalidArgument(where(i) + " is outside the table's " +
                                     std::to_string(spec.rows) + " rows");
    }
    if (const int owner = ShardOfRow(table, ids[i], num_shards_); owner != shard_index_) {
      *reason = RejectReason::kRange;
      return Status::InvalidArgument(where(i) + " belongs to shard " + std::to_string(owner) +
                                     ", not " + std::to_string(shard_index_));
    }
  }
  const size_t want = ids.size() * static_cast<size_t>(spec.dim) * DTypeSize(dtype);
  if (value_bytes && *value_bytes != want) {
    *reason = RejectReason::kByteLength;
    return Status::InvalidArgument(TableName(tables_, table) + ": values frame has " +
                                   std::to_string(*value_bytes) + " bytes, expected " +
                                   std::to_string(want) + " (" + std::to_string(ids.size()) +
                                   " rows of " + std::to_string(spec.dim) + ")");
  }
  return Status::Ok();
}

void EmbeddingTables::Unlink(int32_t index) {
  Row& r = rows_[static_cast<size_t>(index)];
  (r.prev == kNil ? head_ : rows_[static_cast<size_t>(r.prev)].next) = r.next;
  (r.next == kNil ? tail_ : rows_[static_cast<size_t>(r.next)].prev) = r.prev;
  r.prev = r.next = kNil;
}

void EmbeddingTables::LinkFront(int32_t index) {
  Row& r = rows_[static_cast<size_t>(index)];
  r.prev = kNil;
  r.next = head_;
  (head_ == kNil ? tail_ : rows_[static_cast<size_t>(head_)].prev) = index;
  head_ = index;
}

void EmbeddingTables::Touch(int32_t index) {
  if (index == head_) return;
  Unlink(index);
  LinkFront(index);
}

void EmbeddingTables::MarkDirty(int32_t index) {
  Row& r = rows_[static_cast<size_t>(index)];
  r.dirty = true;
  if (!r.listed) {
    r.listed = true;
    dirty_.push_back(index);
  }
}

Status EmbeddingTables::ReadCold(std::vector<ColdRead>* reads) {
  std::vector<RowKey> keys;
  keys.reserve(reads->size());
  for (const ColdRead& r : *reads) keys.push_back(r.key);
  std::vector<std::optional<RowSnapshot>> rows;
  const auto t0 = std::chrono::steady_clock::now();
  PARASYNC_RETURN_IF_ERROR(options_.cold->Read(keys, &rows));
  // One call for all: its time is shared among the keys' tables by their count.
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (rows.size() != keys.size()) {
    return Status::Internal("the cold tier answered " + std::to_string(rows.size()) +
                            " rows for " + std::to_string(keys.size()) + " keys");
  }
  for (size_t j = 0; j < keys.size(); ++j) {
    const RowKey& key = keys[j];
    std::optional<RowSnapshot>& row = rows[j];
    TableStats& st = stats_[key.table];
    ++st.cold_reads;
    st.cold_read_seconds += seconds / static_cast<double>(keys.size());
    if (row && (static_cast<int64_t>(row->values.size()) != dim(key.table) ||
                static_cast<int>(row->slots.size()) != num_slots())) {
      return Status::Corruption("the cold tier's row of table " + std::to_string(key.table) +
                                " id " + std::to_string(key.id) + " has the wrong size");
    }
    // Expired, or deleted by expiry and not yet dropped by the store: as if it were not there.
    if (row && expiring() &&
        (evicted_.count(key) > 0 ||
         (row->touched != 0 && row->touched < now_ - options_.expire_after))) {
      ExpireCold(key);
      row = std::nullopt;
    }
    (*reads)[j].row = std::move(row);
  }
  return Status::Ok();
}

template <typename KeyAt>
Status EmbeddingTables::ColdMisses(size_t n, const KeyAt& key_at, std::vector<ColdRead>* out) {
  out->clear();
  for (size_t i = 0; i < n; ++i) {
    if (i + kPrefetchAhead < n) index_.Prefetch(key_at(i + kPrefetchAhead));
    const RowKey key = key_at(i);
    if (index_.Find(key) == RowIndex::kNone) out->push_back(ColdRead{i, key, std::nullopt});
  }
  return out->empty() ? Status::Ok() : ReadCold(out);
}

Status EmbeddingTables::Read(uint32_t table, std::span<const uint64_t> ids, float* out) {
  const int64_t d = dim(table);
  // Rows not held read as their initial values, or, tiered, as the cold tier has them, read
  // in place (a pull promotes nothing) in one call after the held ones are copied.
  std::vector<ColdRead> cold;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i + kPrefetchAhead < ids.size()) index_.Prefetch(RowKey{table, ids[i + kPrefetchAhead]});
    float* row_out = out + static_cast<int64_t>(i) * d;
    const int32_t index = index_.Find(RowKey{table, ids[i]});
    if (index == RowIndex::kNone) {
      if (tiered()) {
        cold.push_back(ColdRead{i, RowKey{table, ids[i]}, std::nullopt});
      } else {
        InitializeRow(tables_[table].init, seed_, table, ids[i], row_out, d);
      }
      continue;
    }
    std::memcpy(row_out, DataOf(rows_[static_cast<size_t>(index)]),
                static_cast<size_t>(d) * sizeof(float));
    Touch(index);
  }
  if (!cold.empty()) {
    PARASYNC_RETURN_IF_ERROR(ReadCold(&cold));
    for (const ColdRead& r : cold) {
      float* row_out = out + static_cast<int64_t>(r.at) * d;
      if (r.row) {
        std::copy(r.row->values.begin(), r.row->values.end(), row_out);
      } else {
        InitializeRow(tables_[table].init, seed_, table, r.key.id, row_out, d);
      }
    }
  }
  stats_[table].rows_read += static_cast<int64_t>(ids.size());
  return Status::Ok();
}

bool EmbeddingTables::AllFinite(uint32_t table, std::span<const uint64_t> ids,
                                const float* grads) const {
  return IsAllFinite(grads, static_cast<int64_t>(ids.size()) * dim(table));
}

void EmbeddingTables::Evict(int32_t index) {
  Row& r = rows_[static_cast<size_t>(index)];
  Unlink(index);
  index_.Erase(r.key);
  if (tail_ != kNil) {
    // The next eviction comes with the next new row: start loading its index entry and the
    // slab entry after it (the new tail's own entry is cached: Unlink just wrote it).
    const Row& next = rows_[static_cast<size_t>(tail_)];
    index_.Prefetch(next.key);
    if (next.prev != kNil) __builtin_prefetch(&rows_[static_cast<size_t>(next.prev)]);
  }
  // The arena fills the hole with its last cell: follow that row.
  if (const int32_t moved = arenas_[r.key.table].Remove(r.cell); moved != RowArena::kNone) {
    rows_[static_cast<size_t>(moved)].cell = r.cell;
  }
  r.cell = kNil;
  // Forgotten: the store may hold it, and its deletion must be persisted (a row never stored
  // needs nothing). Demoted: the cold tier has it.
  if (r.stored && !tiered()) evicted_.insert(r.key);
  r.dirty = false;  // stays `listed`: the entry is reused by the row that takes its place
  ++stats_[r.key.table].rows_evicted;
}

int32_t EmbeddingTables::TakeSlot(Status* status) {
  if (!free_.empty()) {
    const int32_t index = free_.back();
    free_.pop_back();
    return index;
  }
  if (static_cast<int64_t>(rows_.size()) < capacity_) {
    rows_.emplace_back();
    if (expiring()) updated_at_.push_back(0);
    return static_cast<int32_t>(rows_.size() - 1);
  }
  const int32_t victim = tail_;
  // Unchanged since it was last stored (or promoted): the cold tier has it as it is.
  if (tiered() && rows_[static_cast<size_t>(victim)].dirty) {
    *status = CleanTail();
    if (!status->ok()) return kNil;
  }
  Evict(victim);
  return victim;
}

void EmbeddingTables::Remove(int32_t index) {
  Row& r = rows_[static_cast<size_t>(index)];
  Unlink(index);
  index_.Erase(r.key);
  if (const int32_t moved = arenas_[r.key.table].Remove(r.cell); moved != RowArena::kNone) {
    rows_[static_cast<size_t>(moved)].cell = r.cell;
  }
  r.cell = kNil;
  // The store may hold it (a snapshot, a demotion): the next TakeDirty has it deleted there.
  if (r.stored) evicted_.insert(r.key);
  r.dirty = false;  // stays `listed` if it is: TakeDirty skips a clean row
  --rows_total_[r.key.table];
  ++stats_[r.key.table].rows_expired;
  free_.push_back(index);
}

void EmbeddingTables::ExpireCold(const RowKey& key) {
  if (key.table >= rows_total_.size() || !evicted_.insert(key).second) return;
  --rows_total_[key.table];
  ++stats_[key.table].rows_expired;
}

Status EmbeddingTables::Expire() {
  if (!expiring()) return Status::Ok();
  const int64_t cutoff = now_ - options_.expire_after;  // updated before it: deleted
  size_t seen = 0;
  for (int32_t i = tail_; i != kNil && seen < kExpireBatch; ++seen) {
    const int32_t prev = rows_[static_cast<size_t>(i)].prev;
    if (updated_at_[static_cast<size_t>(i)] < cutoff) Remove(i);
    i = prev;
  }
  if (!tiered()) return Status::Ok();
  std::vector<ColdTier::Stamp> stamps;
  bool at_end = false;
  PARASYNC_RETURN_IF_ERROR(options_.cold->Scan(sweep_after_, kExpireBatch, &stamps, &at_end));
  for (const ColdTier::Stamp& s : stamps) {
    // Held in memory, its stamp there decides; a record from before expiry has none.
    if (s.touched == 0 || s.touched >= cutoff || index_.Find(s.key) != RowIndex::kNone) continue;
    ExpireCold(s.key);
  }
  if (at_end || stamps.empty()) {
    sweep_after_.reset();
  } else {
    sweep_after_ = stamps.back().key;
  }
  return Status::Ok();
}

Status EmbeddingTables::CleanTail() {
  // One write of the changed rows among the kCleanBatch least recently touched, not one per
  // demotion: they stay in memory, clean, and go out as the next evictions without a write
  // of their own (a row touched again before that is written again when it next goes).
  std::vector<int32_t> batch;
  std::vector<RowSnapshot> snaps;
  size_t seen = 0;
  for (int32_t i = tail_; i != kNil && seen < kCleanBatch; i = rows_[static_cast<size_t>(i)].prev) {
    ++seen;
    const Row& r = rows_[static_cast<size_t>(i)];
    if (!r.dirty) continue;
    batch.push_back(i);
    snaps.push_back(SnapshotOf(r));
  }
  PARASYNC_RETURN_IF_ERROR(options_.cold->Write(snaps));
  for (const int32_t i : batch) {
    Row& r = rows_[static_cast<size_t>(i)];
    r.dirty = false;  // stays `listed` if it is: TakeDirty skips a clean row
    r.stored = true;
  }
  return Status::Ok();
}

int32_t EmbeddingTables::Resident(const RowKey& key, ColdRead* pre, Status* status) {
  if (const int32_t index = index_.Find(key); index != RowIndex::kNone) return index;
  std::optional<RowSnapshot> cold;
  if (pre != nullptr) {
    cold = std::move(pre->row);
  } else if (tiered()) {
    std::vector<ColdRead> one = {ColdRead{0, key, std::nullopt}};
    *status = ReadCold(&one);
    if (!status->ok()) return kNil;
    cold = std::move(one[0].row);
  }
  if (!cold && !admission_.CountAndAdmit(key)) return kNil;
  const int32_t index = TakeSlot(status);
  if (index == kNil) return kNil;
  CreateRow(key, index);
  if (!cold) {
    ++stats_[key.table].rows_created;
    ++rows_total_[key.table];
    return index;
  }
  // Promoted: bitwise as it was demoted, and as stored (clean) until it changes.
  Row& r = rows_[static_cast<size_t>(index)];
  r.updates = cold->updates;
  r.stored = true;
  CopyIn(*cold, DataOf(r));
  ++stats_[key.table].rows_promoted;
  return index;
}

void EmbeddingTables::CopyIn(const RowSnapshot& snap, float* data) {
  std::copy(snap.values.begin(), snap.values.end(), data);
  for (size_t k = 0; k < snap.slots.size(); ++k) {
    std::copy(snap.slots[k].begin(), snap.slots[k].end(), data + (k + 1) * snap.values.size());
  }
}

void EmbeddingTables::CreateRow(const RowKey& key, int32_t index) {
  Row& r = rows_[static_cast<size_t>(index)];
  r.key = key;
  r.updates = 0;
  // Evicted since the last TakeDirty yet back: the store has its old value, which this
  // row's next TakeDirty overwrites (it is dirty from its first update on).
  r.stored = evicted_.erase(key) > 0;
  const int64_t d = dim(key.table);
  RowArena& arena = arenas_[key.table];
  r.cell = arena.Add(index);
  float* data = arena.at(r.cell);
  InitializeRow(tables_[key.table].init, seed_, key.table, key.id, data, d);
  std::fill(data + d, data + arena.stride(), 0.0f);
  index_.Insert(key, index);
  LinkFront(index);
  if (expiring()) updated_at_[static_cast<size_t>(index)] = now_;
}

void EmbeddingTables::ApplyRow(int32_t index, const float* grad, const OptimizerSpec& effective) {
  Row& r = rows_[static_cast<size_t>(index)];
  const int64_t d = dim(r.key.table);
  std::array<float*, kMaxOptimizerSlots> slots{};
  const int n = num_slots();
  float* data = DataOf(r);
  for (int k = 0; k < n; ++k) slots[static_cast<size_t>(k)] = data + d * (1 + k);
  ++r.updates;
  if (expiring()) updated_at_[static_cast<size_t>(index)] = now_;
  ApplyUpdate(effective, r.updates, data, data, grad,
              std::span<float* const>(slots.data(), static_cast<size_t>(n)), d);
  Touch(index);
  MarkDirty(index);
  ++stats_[r.key.table].rows_updated;
}

Status EmbeddingTables::Apply(uint32_t table, std::span<const uint64_t> ids, const float* grads,
                              const OptimizerSpec& effective) {
  const int64_t d = dim(table);
  // Tiered: the rows not held are read from the cold tier in one call first.
  std::vector<ColdRead> cold;
  if (tiered()) {
    PARASYNC_RETURN_IF_ERROR(
        ColdMisses(ids.size(), [&](size_t i) { return RowKey{table, ids[i]}; }, &cold));
  }
  auto next = cold.begin();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i + kPrefetchAhead < ids.size()) index_.Prefetch(RowKey{table, ids[i + kPrefetchAhead]});
    ColdRead* pre = next != cold.end() && next->at == i ? &*next++ : nullptr;
    Status status;
    const int32_t index = Resident(RowKey{table, ids[i]}, pre, &status);
    PARASYNC_RETURN_IF_ERROR(status);
    if (index == kNil) {
      ++stats_[table].rows_refused;
      continue;
    }
    ApplyRow(index, grads + static_cast<int64_t>(i) * d, effective);
  }
  return Status::Ok();
}

void EmbeddingTables::Accumulate(int rank, uint32_t table, std::span<const uint64_t> ids,
                                 const float* grads) {
  const size_t d = static_cast<size_t>(dim(table));
  for (size_t i = 0; i < ids.size(); ++i) {
    std::vector<float>& g = pending_[RowKey{table, ids[i]}][rank];
    const float* src = grads + i * d;
    // A second push of one row by one rank is outside the contract; adding keeps it harmless.
    if (g.empty()) {
      g.assign(src, src + d);
    } else {
      for (size_t k = 0; k < d; ++k) g[k] += src[k];
    }
  }
}

Status EmbeddingTables::ApplyAccumulated(const OptimizerSpec& effective) {
  std::vector<float> mean;
  const auto pending = std::move(pending_);
  pending_.clear();
  // Tiered: the rows not held are read from the cold tier in one call first.
  std::vector<RowKey> keys;
  std::vector<ColdRead> cold;
  if (tiered()) {
    keys.reserve(pending.size());
    for (const auto& entry : pending) keys.push_back(entry.first);
    PARASYNC_RETURN_IF_ERROR(ColdMisses(keys.size(), [&](size_t i) { return keys[i]; }, &cold));
  }
  auto next = cold.begin();
  size_t i = 0;
  for (const auto& [key, by_rank] : pending) {
    ColdRead* pre = next != cold.end() && next->at == i ? &*next++ : nullptr;
    ++i;
    Status status;
    const int32_t index = Resident(key, pre, &status);
    PARASYNC_RETURN_IF_ERROR(status);
    if (index == kNil) {
      stats_[key.table].rows_refused += static_cast<int64_t>(by_rank.size());
      continue;
    }
    mean.assign(static_cast<size_t>(dim(key.table)), 0.0f);
    for (const auto& [rank, g] : by_rank) {  // rank order, whatever order the pushes came in
      for (size_t k = 0; k < mean.size(); ++k) mean[k] += g[k];
    }
    const float count = static_cast<float>(by_rank.size());
    for (float& m : mean) m /= count;
    ApplyRow(index, mean.data(), effective);
  }
  return Status::Ok();
}

RowSnapshot EmbeddingTables::SnapshotOf(const Row& row) const {
  const size_t d = static_cast<size_t>(dim(row.key.table));
  RowSnapshot out;
  out.table = row.key.table;
  out.id = row.key.id;
  out.updates = row.updates;
  if (expiring()) out.touched = updated_at_[static_cast<size_t>(&row - rows_.data())];
  const float* data = DataOf(row);
  out.values.assign(data, data + d);
  for (int k = 0; k < num_slots(); ++k) {
    const float* begin = data + d * static_cast<size_t>(1 + k);
    out.slots.emplace_back(begin, begin + d);
  }
  return out;
}

namespace {
bool ByKey(const RowSnapshot& a, const RowSnapshot& b) {
  return RowKey{a.table, a.id} < RowKey{b.table, b.id};
}
}  // namespace

std::vector<RowSnapshot> EmbeddingTables::TakeDirty(std::vector<RowKey>* evicted) {
  std::vector<RowSnapshot> out;
  for (const int32_t index : dirty_) {
    Row& r = rows_[static_cast<size_t>(index)];
    r.listed = false;
    if (!r.dirty) continue;  // evicted since it was listed, its entry not reused
    r.dirty = false;
    r.stored = true;
    out.push_back(SnapshotOf(r));
  }
  dirty_.clear();
  std::sort(out.begin(), out.end(), ByKey);
  evicted->assign(evicted_.begin(), evicted_.end());
  evicted_.clear();
  return out;
}

std::vector<RowSnapshot> EmbeddingTables::SnapshotAll() const {
  std::vector<RowSnapshot> out;
  out.reserve(rows_.size());
  for (const Row& r : rows_) {
    if (r.cell != kNil) out.push_back(SnapshotOf(r));  // not an expired row's free entry
  }
  std::sort(out.begin(), out.end(), ByKey);
  return out;
}

Status EmbeddingTables::CheckRestoredRow(const RowSnapshot& row, size_t i) const {
  const std::string which = "restored row " + std::to_string(i) + " (table " +
                            std::to_string(row.table) + ", id " + std::to_string(row.id) + ")";
  if (row.table >= tables_.size()) {
    return Status::Corruption(which + ": no such table (" + std::to_string(tables_.size()) +
                              " registered)");
  }
  const TableSpec& spec = tables_[row.table];
  if (spec.rows > 0 && row.id >= static_cast<uint64_t>(spec.rows)) {
    return Status::Corruption(which + ": beyond the table's " + std::to_string(spec.rows) +
                              " rows");
  }
  if (ShardOfRow(row.table, row.id, num_shards_) != shard_index_) {
    return Status::Corruption(which + ": not a row of shard " + std::to_string(shard_index_));
  }
  bool sizes_ok = static_cast<int64_t>(row.values.size()) == spec.dim &&
                  static_cast<int>(row.slots.size()) == num_slots();
  for (const std::vector<float>& s : row.slots) sizes_ok = sizes_ok && s.size() == row.values.size();
  if (!sizes_ok) {
    return Status::Corruption(which + ": expected " + std::to_string(spec.dim) + " values and " +
                              std::to_string(num_slots()) + " slots of as many");
  }
  if (row.updates < 0) return Status::Corruption(which + ": negative update count");
  return Status::Ok();
}

Status EmbeddingTables::Restore(std::span<const RowSnapshot> rows,
                                std::span<const int64_t> cold_rows) {
  if (!tiered() && static_cast<int64_t>(rows.size()) > capacity_) {
    return Status::Corruption(std::to_string(rows.size()) + " restored rows exceed the " +
                              std::to_string(capacity_) + " this shard may hold");
  }
  std::vector<RowKey> keys;
  keys.reserve(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    if (Status s = CheckRestoredRow(rows[i], i); !s.ok()) return s;
    keys.push_back(RowKey{rows[i].table, rows[i].id});
  }
  std::sort(keys.begin(), keys.end());
  if (const auto dup = std::adjacent_find(keys.begin(), keys.end()); dup != keys.end()) {
    return Status::Corruption("restored rows list table " + std::to_string(dup->table) +
                              " id " + std::to_string(dup->id) + " twice");
  }
  ClearRows();
  std::fill(rows_total_.begin(), rows_total_.end(), 0);
  for (size_t t = 0; t < cold_rows.size() && t < rows_total_.size(); ++t) {
    rows_total_[t] = cold_rows[t];
  }
  for (const RowSnapshot& snap : rows) {
    // Tiered, the rows beyond the budget stay in the cold tier (the store they came from).
    if (cold_rows.empty()) ++rows_total_[snap.table];
    if (static_cast<int64_t>(rows_.size()) >= capacity_) continue;
    Status unused;
    const int32_t index = TakeSlot(&unused);  // below capacity: never evicts
    CreateRow(RowKey{snap.table, snap.id}, index);
    Row& r = rows_[static_cast<size_t>(index)];
    r.updates = snap.updates;
    r.stored = true;
    CopyIn(snap, DataOf(r));
    // A row stored before its table expired has no stamp: its clock starts now.
    if (expiring()) {
      updated_at_[static_cast<size_t>(index)] = snap.touched != 0 ? snap.touched : now_;
    }
  }
  return Status::Ok();
}

int64_t EmbeddingTables::BytesPerRow(int64_t dim, int slots, bool expiring) {
  return dim * (1 + slots) * static_cast<int64_t>(sizeof(float)) +
         static_cast<int64_t>(sizeof(Row)) + RowArena::kBytesPerRow + RowIndex::kBytesPerRow +
         kDirtyEntryBytes +
         (expiring ? static_cast<int64_t>(sizeof(int64_t) + sizeof(int32_t)) : 0);
}

int64_t EmbeddingTables::bytes_held() const {
  int64_t bytes = 0;
  for (uint32_t t = 0; t < tables_.size(); ++t) bytes += stats(t).bytes;
  return bytes;
}

EmbeddingTables::TableStats EmbeddingTables::stats(uint32_t t) const {
  TableStats s = stats_[t];
  s.rows_held = arenas_[t].size();
  s.rows_cold = tiered() ? std::max<int64_t>(0, rows_total_[t] - s.rows_held) : 0;
  s.bytes = s.rows_held * BytesPerRow(tables_[t].dim, num_slots(), expiring());
  return s;
}

}  // namespace parasync
