#include "ps/row_index.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <utility>

namespace parasync {

uint64_t RowIndex::Hash(uint32_t table, uint64_t id) {
  // MurmurHash3's fmix64 of the id folded with the table times an odd constant.
  uint64_t x = id ^ (uint64_t{table} * 0xd6e8feb86659fd93ULL + 0x52dce729da3ed2b5ULL);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}

int32_t RowIndex::Find(const RowKey& key) const {
  if (size_ == 0) return kNone;
  for (size_t i = Home(key.table, key.id);; i = (i + 1) & mask_) {
    const Entry& e = entries_[i];
    if (e.slot == kNone) return kNone;
    if (e.id == key.id && e.table == key.table) return e.slot;
  }
}

size_t RowIndex::Locate(const RowKey& key) const {
  size_t i = Home(key.table, key.id);
  while (entries_[i].id != key.id || entries_[i].table != key.table ||
         entries_[i].slot == kNone) {
    i = (i + 1) & mask_;
  }
  return i;
}

void RowIndex::Insert(const RowKey& key, int32_t slot) {
  if (static_cast<size_t>(size_ + 1) * 2 > entries_.size()) {
    Rehash(std::max<size_t>(16, entries_.size() * 2));
  }
  size_t i = Home(key.table, key.id);
  while (entries_[i].slot != kNone) i = (i + 1) & mask_;
  entries_[i] = Entry{key.id, key.table, slot};
  ++size_;
}

void RowIndex::Erase(const RowKey& key) {
  size_t hole = Locate(key);
  // Backward shift: pull each later entry of the run into the hole unless its home lies
  // cyclically after the hole (it would then sit before its home).
  for (size_t j = (hole + 1) & mask_; entries_[j].slot != kNone; j = (j + 1) & mask_) {
    const size_t home = Home(entries_[j].table, entries_[j].id);
    if (((j - home) & mask_) >= ((j - hole) & mask_)) {
      entries_[hole] = entries_[j];
      hole = j;
    }
  }
  entries_[hole].slot = kNone;
  --size_;
}

void RowIndex::Reserve(int64_t rows) {
  const size_t want = std::bit_ceil(static_cast<size_t>(std::max<int64_t>(rows, 8)) * 2);
  if (want > entries_.size()) Rehash(want);
}

void RowIndex::Clear() {
  for (Entry& e : entries_) e.slot = kNone;
  size_ = 0;
}

void RowIndex::Rehash(size_t buckets) {
  std::vector<Entry> old = std::exchange(entries_, std::vector<Entry>(buckets));
  mask_ = buckets - 1;
  for (const Entry& e : old) {
    if (e.slot == kNone) continue;
    size_t i = Home(e.table, e.id);
    while (entries_[i].slot != kNone) i = (i + 1) & mask_;
    entries_[i] = e;
  }
}

int32_t RowArena::Add(int32_t owner) {
  const int32_t cell = size();
  if (static_cast<size_t>(cell / kChunkRows) == chunks_.size()) {
    // Uninitialized on purpose: the caller writes every float of a new row.
    chunks_.emplace_back(new float[static_cast<size_t>(kChunkRows * stride_)]);
  }
  owners_.push_back(owner);
  return cell;
}

int32_t RowArena::Remove(int32_t cell) {
  const int32_t last = size() - 1;
  int32_t moved = kNone;
  if (cell != last) {
    std::memcpy(at(cell), at(last), static_cast<size_t>(stride_) * sizeof(float));
    moved = owners_[static_cast<size_t>(last)];
    owners_[static_cast<size_t>(cell)] = moved;
  }
  owners_.pop_back();
  // Keep one spare chunk beyond the one in use, so that a size moving back and forth across
  // a chunk boundary does not allocate and free each time.
  const size_t in_use = (owners_.size() + kChunkRows - 1) / kChunkRows;
  if (chunks_.size() > in_use + 1) chunks_.pop_back();
  return moved;
}

void RowArena::Clear() {
  owners_.clear();
  chunks_.clear();
}

}  // namespace parasync
