// The two containers under EmbeddingTables (ps/embedding_table.h), written for a shard holding
// millions of rows: RowIndex finds a row's slab entry by (table, id) in one flat array, and
// RowArena keeps one table's row floats in large chunks instead of a heap block per row.
//
// Not thread-safe: each is owned by one EmbeddingTables, used by one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "ps/row_snapshot.h"

namespace parasync {

// A hash map from RowKey to an int32 slab index: open addressing with linear probing over a
// power-of-two array of 16-byte entries (key inline, so a lookup that misses touches one
// cache line, usually), kept at most half full, deletion by backward shift (no tombstones).
class RowIndex {
 public:
  static constexpr int32_t kNone = -1;
  // Bytes of index per row, counted as two entries a row: exact when the rows reserved are a
  // power of two; up to twice that otherwise (the array is a power of two at most half full).
  static constexpr int64_t kBytesPerRow = 2 * 16;

  // The slab index stored for `key`, or kNone if it has none.
  int32_t Find(const RowKey& key) const;
  // Starts loading the cache line where Find(key) begins: a caller walking a batch of keys
  // asks a few keys ahead so that their cache misses overlap instead of queueing.
  void Prefetch(const RowKey& key) const {
    if (!entries_.empty()) __builtin_prefetch(&entries_[Home(key.table, key.id)]);
  }
  // Stores `slot` (>= 0) for `key`. Precondition: Find(key) == kNone.
  void Insert(const RowKey& key, int32_t slot);
  // Removes `key`'s entry. Precondition: Find(key) != kNone.
  void Erase(const RowKey& key);
  // Sizes the array so that `rows` keys fit without growing (a grow rehashes every key).
  void Reserve(int64_t rows);
  // Forgets every key; keeps the array.
  void Clear();
  int64_t size() const { return size_; }

 private:
  struct Entry {
    uint64_t id = 0;
    uint32_t table = 0;
    int32_t slot = kNone;  // kNone: empty
  };
  static_assert(sizeof(Entry) == 16);
  // Decorrelated from ShardOfRow (common/embedding.cc, SplitMix64's finalizer, top bits): a
  // shard's ids all share their shard bits, which must not pick the bucket.
  static uint64_t Hash(uint32_t table, uint64_t id);
  size_t Home(uint32_t table, uint64_t id) const { return Hash(table, id) & mask_; }
  // The bucket holding `key`; precondition: it is present.
  size_t Locate(const RowKey& key) const;
  void Rehash(size_t buckets);

  std::vector<Entry> entries_;  // empty, or a power of two
  size_t mask_ = 0;
  int64_t size_ = 0;
};

// One table's row floats, `stride` floats a row, dense: cells 0 .. size() - 1 in chunks of
// kChunkRows rows that never move once allocated (growing copies nothing). Removing a cell
// moves the last one into it, so the arena holds no holes and shrinks back a chunk at a time.
// Each cell carries its owner's int32 (the slab index) so the caller can follow a move.
class RowArena {
 public:
  static constexpr int32_t kNone = -1;
  static constexpr int64_t kChunkRows = 1024;
  // Bytes per row besides the floats: the owner int32.
  static constexpr int64_t kBytesPerRow = 4;

  explicit RowArena(int64_t stride) : stride_(stride) {}

  int64_t stride() const { return stride_; }
  int32_t size() const { return static_cast<int32_t>(owners_.size()); }
  // The floats of `cell` (stride() of them). Precondition: 0 <= cell < size().
  float* at(int32_t cell) {
    return chunks_[static_cast<size_t>(cell / kChunkRows)].get() + (cell % kChunkRows) * stride_;
  }
  const float* at(int32_t cell) const { return const_cast<RowArena*>(this)->at(cell); }
  // Appends a cell owned by `owner` and returns its index; its floats are unspecified.
  int32_t Add(int32_t owner);
  // Removes `cell` by moving the last cell's floats and owner into it. Returns the owner of
  // the cell that moved (now at `cell`), or kNone when `cell` was the last.
  int32_t Remove(int32_t cell);
  // Removes every cell and frees the chunks.
  void Clear();

 private:
  int64_t stride_;
  std::vector<std::unique_ptr<float[]>> chunks_;
  std::vector<int32_t> owners_;  // by cell
};

}  // namespace parasync
